"""FileSource: replayable Parquet / JSON-lines / CSV directories, bounded and monitored.

Driven without Spark: readers directly, or the real SourceOperator with its operator state
snapshotted to disk and redistributed by `assign_operator_state` (what a restore does).
"""

from __future__ import annotations

import json
import os
import pickle
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.properties import examples

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.connectors.base import SourceOperator
from streamsnap.connectors.files import FileReadError, FileSource, FileSourceReader, owner_of
from streamsnap.errors import ConfigurationError
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.state.assignment import assign_operator_state

FORMATS = ["parquet", "jsonl", "csv"]
EXT = {"parquet": "parquet", "jsonl": "jsonl", "csv": "csv"}
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("value", pa.float64())])


# ===================================================================== helpers
def make_table(first_id: int, rows: int) -> pa.Table:
    ids = list(range(first_id, first_id + rows))
    return pa.table({"id": pa.array(ids, pa.int64()),
                     "name": pa.array([f"n{i}" for i in ids], pa.string()),
                     "value": pa.array([i * 0.5 for i in ids], pa.float64())})


def write_file(path: Path, fmt: str, table: pa.Table, row_group_size: int = 7) -> None:
    """Written under a hidden name and renamed into place, as the contract asks."""
    tmp = path.parent / f".{path.name}.tmp"
    if fmt == "parquet":
        pq.write_table(table, tmp, row_group_size=row_group_size)
    elif fmt == "jsonl":
        with open(tmp, "w") as f:
            for row in table.to_pylist():
                f.write(json.dumps(row) + "\n")
    else:
        if table.num_rows:
            pa_csv.write_csv(table, tmp)
        else:
            tmp.write_text("id,name,value\n")
    os.replace(tmp, path)


def make_dir(root: Path, fmt: str, sizes: list[int], prefix: str = "part") -> list[list[int]]:
    """Files `<prefix>-00i.<ext>` with the given row counts; returns each file's ids."""
    root.mkdir(parents=True, exist_ok=True)
    ids, next_id = [], 0
    for i, n in enumerate(sizes):
        write_file(root / f"{prefix}-{i:03d}.{EXT[fmt]}", fmt, make_table(next_id, n))
        ids.append(list(range(next_id, next_id + n)))
        next_id += 1000
    return ids


def ctx(index: int = 0, parallelism: int = 1, restore=None, base=None) -> OperatorContext:
    return OperatorContext(name="files", uid="files", subtask_index=index, parallelism=parallelism,
                           max_parallelism=128, attempt=0, job_id="job-1",
                           task_name=f"files ({index + 1}/{parallelism})", restore=restore,
                           restored_operator=restore is not None,
                           restore_base=base)


def ids_of(batches) -> list[int]:
    return [i for b in batches for i in b.column("id").to_pylist()]


def drain(reader, limit: int = 100_000) -> list[pa.RecordBatch]:
    """Poll until the reader has nothing more right now (or finished)."""
    out = []
    for _ in range(limit):
        batch = reader.poll()
        if batch is None:
            return out
        out.append(batch)
    raise AssertionError("reader never ran dry")


class Collector:
    def __init__(self):
        self.batches: list[pa.RecordBatch] = []

    def process(self, batch) -> None:
        self.batches.append(batch)


class Subtask:
    """A real SourceOperator running a FileSource, as a task would run it."""

    def __init__(self, source, index, parallelism, restore=None, base=None, clock=None):
        self.op = SourceOperator(ctx(index, parallelism, restore, base), source)
        if clock is not None:
            self.op.reader._clock = clock
        self.out = Collector()
        self.op.output = Output([self.out])
        self.op.initialize_state()
        self.op.open()

    def step(self, n: int) -> None:
        for _ in range(n):
            if not self.op.emit_next():
                return

    def run_dry(self) -> None:
        while self.op.emit_next():
            pass

    @property
    def ids(self) -> list[int]:
        return ids_of(self.out.batches)


def snapshot_and_assign(subtasks, new_parallelism, location: Path, checkpoint_id=1):
    location.mkdir(parents=True, exist_ok=True)
    url = "file://" + str(location)
    states = {i: s.op.snapshot_state(checkpoint_id, 0.0, url).run() for i, s in enumerate(subtasks)}
    for s in subtasks:
        s.op.close()
    return assign_operator_state(states, 128, new_parallelism), url


def assert_exactly_once(emitted: list[int], expected: list[int]) -> None:
    counts = Counter(emitted)
    dups = sorted(i for i, c in counts.items() if c > 1)
    lost = sorted(set(expected) - set(counts))
    extra = sorted(set(counts) - set(expected))
    assert not dups and not lost and not extra, f"duplicated {dups[:10]}, lost {lost[:10]}, unexpected {extra[:10]}"


# ===================================================================== round trips
@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_every_row_in_file_order(tmp_path, fmt):
    files = make_dir(tmp_path / "in", fmt, [25, 0, 1, 40])
    source = FileSource(str(tmp_path / "in"), fmt, batch_size=6)
    source.validate()
    assert source.bounded
    assert source.schema == SCHEMA
    reader = source.create_reader(ctx())
    reader.assign_splits(source.splits(1))
    reader.open()
    batches = drain(reader)
    assert reader.is_finished()
    assert all(isinstance(b, pa.RecordBatch) and 0 < b.num_rows <= 6 for b in batches)
    assert all(b.schema == SCHEMA for b in batches)
    assert ids_of(batches) == [i for f in files for i in f]
    table = pa.Table.from_batches(batches)
    assert table.column("name").to_pylist()[:2] == ["n0", "n1"]
    assert table.column("value").to_pylist()[-1] == 3039 * 0.5
    assert reader.snapshot_splits(1) == []
    reader.close()


def test_env_read_files_builds_a_source_node(tmp_path):
    make_dir(tmp_path / "in", "parquet", [3])
    env = ss.StreamEnvironment(parallelism=2)
    stream = env.read_files(str(tmp_path / "in"))
    assert isinstance(stream, ss.DataStream)
    node, = env._graph.nodes.values()
    assert node.name == "Source: files" and node.parallelism == 2
    assert env.read_files(str(tmp_path / "in"), name="mine", parallelism=1) is not None
    assert ss.sources.FileSource is FileSource
    with pytest.raises(ConfigurationError, match="does not exist"):
        env.read_files(str(tmp_path / "nope"), "jsonl")
    with pytest.raises(ConfigurationError, match="format"):
        env.read_files(str(tmp_path / "in"), "avro")


def test_splits_are_the_files_listed_at_build_time(tmp_path):
    """Bounded: every subtask deals the same list, even if the directory changes meanwhile."""
    make_dir(tmp_path / "in", "jsonl", [2, 2])
    source = FileSource(str(tmp_path / "in"), "jsonl")
    source.validate()
    write_file(tmp_path / "in" / "part-000a.jsonl", "jsonl", make_table(5000, 2))
    shipped = pickle.loads(pickle.dumps(source))
    assert [Path(p).name for p, _ in shipped.splits(2)] == ["part-000.jsonl", "part-001.jsonl"]
    assert shipped.schema == source.schema


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_splits_dealt_to_subtasks_cover_every_file_once(tmp_path, fmt, parallelism):
    files = make_dir(tmp_path / "in", fmt, [5, 9, 3, 12, 7])
    source = FileSource(str(tmp_path / "in"), fmt, batch_size=4)
    source.validate()
    subtasks = [Subtask(source, i, parallelism) for i in range(parallelism)]
    for s in subtasks:
        s.run_dry()
        assert s.op.reader.is_finished()
    assert_exactly_once([i for s in subtasks for i in s.ids], [i for f in files for i in f])
    for i, s in enumerate(subtasks):  # round robin, each subtask's files in name order
        assert s.ids == [x for f in files[i::parallelism] for x in f]


def test_hidden_files_and_subdirectories_are_ignored(tmp_path):
    files = make_dir(tmp_path / "in", "parquet", [4, 4])
    write_file(tmp_path / "in" / ".hidden.parquet", "parquet", make_table(9000, 3))
    write_file(tmp_path / "in" / "_partial.parquet", "parquet", make_table(9100, 3))
    (tmp_path / "in" / "_SUCCESS").write_text("")
    (tmp_path / "in" / ".inprogress-part-9.parquet").write_bytes(b"PAR1 half written")
    (tmp_path / "in" / "sub").mkdir()
    write_file(tmp_path / "in" / "sub" / "nested.parquet", "parquet", make_table(9200, 3))
    source = FileSource("file://" + str(tmp_path / "in") + "/")
    source.validate()
    assert [Path(p).name for p, _ in source.splits(1)] == ["part-000.parquet", "part-001.parquet"]
    reader = source.create_reader(ctx())
    reader.assign_splits(source.splits(1))
    assert ids_of(drain(reader)) == [i for f in files for i in f]


# ===================================================================== resume
@pytest.fixture(scope="module")
def resume_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    sizes = [0, 23, 1, 50, 8]
    return {fmt: (root / fmt, make_dir(root / fmt, fmt, sizes)) for fmt in FORMATS}


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(FORMATS), batch_before=st.integers(1, 30), batch_after=st.integers(1, 30),
       polls=st.integers(0, 90), snapshots=st.integers(1, 3))
def test_restore_emits_exactly_the_rows_after_the_snapshot(resume_dirs, fmt, batch_before, batch_after,
                                                           polls, snapshots):
    directory, files = resume_dirs[fmt]
    expected = [i for f in files for i in f]
    emitted = []
    splits, global_state = FileSource(str(directory), fmt).splits(1), None
    batch_size = batch_before
    # Several generations: read some, snapshot, restore into a fresh reader (new batch size).
    for generation in range(snapshots):
        source = FileSource(str(directory), fmt, batch_size=batch_size)
        reader = source.create_reader(ctx())
        if global_state is not None:
            reader.restore_global_state(global_state)
        reader.assign_splits(splits)
        for _ in range(polls // snapshots):
            batch = reader.poll()
            if batch is None:
                break
            assert batch.num_rows <= batch_size
            emitted.extend(batch.column("id").to_pylist())
        assert emitted == expected[:len(emitted)]
        splits = reader.snapshot_splits(generation)
        global_state = reader.snapshot_global_state(generation)
        assert pickle.loads(pickle.dumps(splits)) == splits
        # The position of the file being read is exactly what was emitted of it.
        if splits and splits[0][1]:
            name = Path(splits[0][0]).name
            index = int(name.split("-")[1].split(".")[0])
            assert expected[len(emitted) - 1] // 1000 == index
            assert splits[0][1] == sum(1 for i in emitted if i // 1000 == index)
        reader.close()
        batch_size = batch_after
    source = FileSource(str(directory), fmt, batch_size=batch_after)
    reader = source.create_reader(ctx())
    reader.restore_global_state(global_state)
    reader.assign_splits(splits)
    emitted.extend(ids_of(drain(reader)))
    assert reader.is_finished()
    assert emitted == expected


def test_parquet_restore_skips_whole_row_groups(tmp_path, monkeypatch):
    make_dir(tmp_path / "in", "parquet", [50])  # row groups of 7 rows
    seen = []
    original = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("row_groups"))
        return original(self, *args, **kwargs)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    source = FileSource(str(tmp_path / "in"), batch_size=5)
    (path, _), = source.splits(1)
    reader = source.create_reader(ctx())
    reader.assign_splits([[path, 30]])  # row 30 is the 3rd row of row group 4 (28..34)
    assert ids_of(drain(reader)) == list(range(30, 50))
    assert seen == [[4, 5, 6, 7]]
    reader = source.create_reader(ctx())
    reader.assign_splits([[path, 50]])  # fully read: nothing is decoded at all
    assert drain(reader) == [] and reader.is_finished()
    assert seen == [[4, 5, 6, 7]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_restore_beyond_the_end_of_a_changed_file_is_an_error(tmp_path, fmt):
    make_dir(tmp_path / "in", fmt, [10])
    source = FileSource(str(tmp_path / "in"), fmt)
    (path, _), = source.splits(1)
    reader = source.create_reader(ctx())
    reader.assign_splits([[path, 11]])
    with pytest.raises(FileReadError, match=r"has 10 rows, but the checkpoint recorded 11") as info:
        drain(reader)
    assert info.value.path == path and "part-000" in str(info.value)


def test_a_vanished_file_is_an_error_naming_it(tmp_path):
    make_dir(tmp_path / "in", "csv", [10, 10])
    source = FileSource(str(tmp_path / "in"), "csv")
    source.validate()
    reader = source.create_reader(ctx())
    reader.assign_splits(source.splits(1))
    os.remove(tmp_path / "in" / "part-001.csv")
    with pytest.raises(FileReadError, match=r"part-001\.csv.*vanished"):
        drain(reader)


@pytest.mark.parametrize("old,new", [(2, 3), (3, 2), (1, 3), (3, 1), (2, 2)])
@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_restore_with_another_parallelism_loses_and_duplicates_nothing(tmp_path, fmt, old, new):
    files = make_dir(tmp_path / "in", fmt, [11, 4, 17, 9, 6, 13, 2])
    source = FileSource(str(tmp_path / "in"), fmt, batch_size=3)
    source.validate()
    first = [Subtask(source, i, old) for i in range(old)]
    for i, s in enumerate(first):
        s.step(2 + 3 * i)  # mid-file in every subtask, at different points
    assert any(s.op.reader.snapshot_splits(1) and s.op.reader.snapshot_splits(1)[0][1] for s in first)
    before = [i for s in first for i in s.ids]
    assignment, url = snapshot_and_assign(first, new, tmp_path / "chk-1")
    second = [Subtask(source, i, new, assignment[i], url) for i in range(new)]
    for s in second:
        s.run_dry()
        assert s.op.reader.is_finished()
    assert_exactly_once(before + [i for s in second for i in s.ids], [i for f in files for i in f])


def test_restore_after_every_file_was_read_reads_nothing(tmp_path):
    make_dir(tmp_path / "in", "jsonl", [3, 3, 3])
    source = FileSource(str(tmp_path / "in"), "jsonl")
    source.validate()
    first = [Subtask(source, i, 2) for i in range(2)]
    for s in first:
        s.run_dry()
        assert s.op.reader.is_finished()
    assignment, url = snapshot_and_assign(first, 3, tmp_path / "chk")
    second = [Subtask(source, i, 3, assignment[i], url) for i in range(3)]
    for s in second:
        s.run_dry()
        assert s.op.reader.is_finished()
    assert [i for s in second for i in s.ids] == []


# ===================================================================== monitoring
def test_monitoring_picks_new_files_up_once_and_survives_rescaling(tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    clock = ManualScheduler()
    schema = SCHEMA
    source = FileSource(str(root), "jsonl", monitor_interval=5.0, batch_size=4, schema=schema)
    source.validate()
    assert not source.bounded and source.splits(3) == []
    expected: list[int] = []

    def add(name: str, first_id: int, rows: int) -> str:
        write_file(root / name, "jsonl", make_table(first_id, rows))
        expected.extend(range(first_id, first_id + rows))
        return str(root / name)

    for k in range(6):
        add(f"a-{k}.jsonl", 1000 * k, 5 + k)
    first = [Subtask(source, i, 3, clock=clock) for i in range(3)]
    for s in first:
        s.run_dry()
        assert not s.op.reader.is_finished()
    for k, s in enumerate(first):  # each file read by its owner, completely
        mine = [p for p in sorted(os.listdir(root)) if owner_of(str(root / p), 3) == k]
        assert Counter(i // 1000 for i in s.ids) == Counter({int(p[2]): 5 + int(p[2]) for p in mine})
    assert_exactly_once([i for s in first for i in s.ids], expected)

    # New files: nothing before the interval has passed, then exactly one reader each.
    new = [add(f"b-{k}.jsonl", 10_000 + 1000 * k, 9) for k in range(6)]
    clock.advance(4.0)
    for s in first:
        assert s.op.reader.next_available_in() == pytest.approx(1.0)
        assert not s.op.emit_next()
    clock.advance(1.0)
    for s in first:
        s.step(1)  # discovers, and reads one batch of its first new file
    taken = {p for s in first for p, _ in s.op.reader.snapshot_splits(1)}
    assert taken == set(new)
    for s in first:
        assert all(owner_of(p, 3) == s.op.ctx.subtask_index for p, _ in s.op.reader.snapshot_splits(1))
    before = [i for s in first for i in s.ids]

    # Checkpoint with files in progress and queued; restore at parallelism 2.
    assignment, url = snapshot_and_assign(first, 2, tmp_path / "chk-1")
    later = add("c-0.jsonl", 30_000, 3)
    second = [Subtask(source, i, 2, assignment[i], url, clock=clock) for i in range(2)]
    for s in second:
        s.run_dry()
    assert_exactly_once(before + [i for s in second for i in s.ids], expected)
    owner = second[owner_of(later, 2)]
    assert 30_000 in owner.ids

    # And once more, back to 3 subtasks: finished files are never read again.
    done = before + [i for s in second for i in s.ids]
    assignment, url = snapshot_and_assign(second, 3, tmp_path / "chk-2", checkpoint_id=2)
    third = [Subtask(source, i, 3, assignment[i], url, clock=clock) for i in range(3)]
    for s in third:
        s.run_dry()
    assert [i for s in third for i in s.ids] == []
    add("d-0.jsonl", 40_000, 2)
    clock.advance(5.0)
    for s in third:
        s.run_dry()
    assert_exactly_once(done + [i for s in third for i in s.ids], expected)
    # The union of the global state holds each known file once.
    known = [p for s in third for p in s.op.reader.snapshot_global_state(3)]
    assert sorted(known) == sorted(str(root / p) for p in os.listdir(root))


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parallelisms=st.lists(st.integers(1, 4), min_size=2, max_size=4),
       steps=st.lists(st.integers(0, 6), min_size=4, max_size=4),
       new_files=st.lists(st.integers(0, 3), min_size=4, max_size=4))
def test_monitoring_is_exactly_once_over_random_rescales(tmp_path_factory, parallelisms, steps, new_files):
    root = tmp_path_factory.mktemp("mon")
    data = root / "in"
    data.mkdir()
    clock = ManualScheduler()
    source = FileSource(str(data), "parquet", monitor_interval=1.0, batch_size=3, schema=SCHEMA)
    expected, emitted, counter = [], [], [0]

    def add(n):
        for _ in range(n):
            k = counter[0]
            counter[0] += 1
            write_file(data / f"f-{k:03d}.parquet", "parquet", make_table(k * 1000, 1 + (k * 7) % 11), 4)
            expected.extend(range(k * 1000, k * 1000 + 1 + (k * 7) % 11))

    add(2)
    assignment = url = None
    for generation, parallelism in enumerate(parallelisms):
        subtasks = [Subtask(source, i, parallelism, assignment[i] if assignment else None, url, clock)
                    for i in range(parallelism)]
        add(new_files[generation])
        clock.advance(1.0)
        for s in subtasks:
            s.step(steps[generation])
        emitted.extend(i for s in subtasks for i in s.ids)
        assignment, url = snapshot_and_assign(subtasks, parallelisms[generation + 1] if generation + 1 < len(parallelisms) else 1,
                                              root / f"chk-{generation}", generation + 1)
    final = [Subtask(source, i, 1, assignment[i], url, clock) for i in range(1)]
    clock.advance(1.0)
    final[0].run_dry()
    emitted.extend(final[0].ids)
    assert_exactly_once(emitted, expected)


def test_bounded_checkpoint_restored_as_monitored_does_not_reread(tmp_path):
    files = make_dir(tmp_path / "in", "parquet", [5, 5, 5])
    bounded = FileSource(str(tmp_path / "in"), batch_size=5)
    bounded.validate()
    s = Subtask(bounded, 0, 1)
    s.step(2)
    assignment, url = snapshot_and_assign([s], 2, tmp_path / "chk")
    monitored = FileSource(str(tmp_path / "in"), monitor_interval=1.0, batch_size=5)
    monitored.validate()
    rest = [Subtask(monitored, i, 2, assignment[i], url) for i in range(2)]
    for r in rest:
        r.run_dry()
    assert_exactly_once(s.ids + [i for r in rest for i in r.ids], [i for f in files for i in f])


def test_monitored_directory_may_start_empty_with_a_schema(tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    source = FileSource(str(root), "csv", monitor_interval=0.5, schema=SCHEMA)
    source.validate()
    assert source.schema == SCHEMA
    clock = ManualScheduler()
    reader = FileSourceReader(source, ctx(), clock=clock)
    reader.assign_splits([])
    assert reader.poll() is None and not reader.is_finished()
    assert reader.next_available_in() == pytest.approx(0.5)
    write_file(root / "x.csv", "csv", make_table(0, 3))
    clock.advance(0.5)
    batch = reader.poll()
    assert batch.schema == SCHEMA and batch.column("id").to_pylist() == [0, 1, 2]


# ===================================================================== schema, options
@pytest.mark.parametrize("fmt", FORMATS)
def test_given_schema_selects_and_converts_columns(tmp_path, fmt):
    make_dir(tmp_path / "in", fmt, [6, 3])
    schema = pa.schema([("value", pa.float32()), ("id", pa.int32())])
    source = FileSource(str(tmp_path / "in"), fmt, schema=schema, batch_size=4)
    source.validate()
    reader = source.create_reader(ctx())
    reader.assign_splits(source.splits(1))
    batches = drain(reader)
    assert all(b.schema == schema for b in batches)
    assert ids_of(batches) == [0, 1, 2, 3, 4, 5, 1000, 1001, 1002]


def test_later_files_are_read_with_the_first_files_schema(tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    (root / "a.jsonl").write_text('{"id": 1, "v": 1.5}\n')
    (root / "b.jsonl").write_text('{"v": 2, "id": 2, "extra": "x"}\n{"id": 3}\n')
    source = FileSource(str(root), "jsonl")
    source.validate()
    assert source.schema == pa.schema([("id", pa.int64()), ("v", pa.float64())])
    reader = source.create_reader(ctx())
    reader.assign_splits(source.splits(1))
    table = pa.Table.from_batches(drain(reader))
    assert table.to_pylist() == [{"id": 1, "v": 1.5}, {"id": 2, "v": 2.0}, {"id": 3, "v": None}]


def test_csv_options(tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    (root / "a.csv").write_text("id;name\n1;x\n2;NA\n")
    source = FileSource(str(root), "csv", csv_options={"delimiter": ";", "null_values": ["NA"],
                                                        "strings_can_be_null": True})
    source.validate()
    reader = source.create_reader(ctx())
    reader.assign_splits(source.splits(1))
    assert pa.Table.from_batches(drain(reader)).to_pylist() == [{"id": 1, "name": "x"}, {"id": 2, "name": None}]


def test_empty_files_hold_no_rows(tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    (root / "a.jsonl").write_text("")
    (root / "b.jsonl").write_text("\n\n")
    (root / "c.jsonl").write_text('{"id": 7}\n')
    source = FileSource(str(root), "jsonl")
    source.validate()
    assert source.schema == pa.schema([("id", pa.int64())])
    reader = source.create_reader(ctx())
    reader.assign_splits(source.splits(1))
    assert ids_of(drain(reader)) == [7]
    assert reader.is_finished()


def test_empty_bounded_directory(tmp_path):
    (tmp_path / "in").mkdir()
    source = FileSource(str(tmp_path / "in"), "parquet")
    source.validate()
    assert source.schema is None and source.splits(2) == []
    reader = source.create_reader(ctx())
    reader.assign_splits([])
    assert reader.poll() is None and reader.is_finished()


# ===================================================================== errors
@pytest.mark.parametrize("kwargs,match", [
    (dict(path=""), "FileSource.path"),
    (dict(path=None), "FileSource.path"),
    (dict(path="x", format="avro"), r"FileSource.format must be one of 'parquet', 'jsonl', 'csv'"),
    (dict(path="x", format="json"), "FileSource.format"),
    (dict(path="x", batch_size=0), "FileSource.batch_size must be an integer >= 1"),
    (dict(path="x", batch_size=True), "FileSource.batch_size"),
    (dict(path="x", batch_size=2.5), "FileSource.batch_size"),
    (dict(path="x", monitor_interval=0), r"FileSource.monitor_interval must be a number of seconds > 0"),
    (dict(path="x", monitor_interval=-1.0), "FileSource.monitor_interval"),
    (dict(path="x", monitor_interval=True), "FileSource.monitor_interval"),
    (dict(path="x", monitor_interval=float("nan")), "FileSource.monitor_interval"),
    (dict(path="x", monitor_interval="5"), "FileSource.monitor_interval"),
    (dict(path="x", schema={"id": "int"}), "FileSource.schema must be a pyarrow.Schema"),
    (dict(path="x", csv_options={"delimiter": ";"}), "only applies to format='csv'"),
    (dict(path="x", format="csv", csv_options={"delimitr": ";"}), r"unknown option\(s\) 'delimitr'; allowed: encoding"),
    (dict(path="x", format="csv", csv_options={"delimiter": ";;"}), "csv_options are invalid"),
    (dict(path="x", format="csv", csv_options=[("delimiter", ";")]), "csv_options must be a dict"),
])
def test_bad_configuration(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        FileSource(**kwargs)


def test_path_must_be_an_existing_directory(tmp_path):
    with pytest.raises(ConfigurationError, match=r"does not exist; it must be an existing directory"):
        FileSource(str(tmp_path / "missing"), "csv").validate()
    with pytest.raises(ConfigurationError, match="does not exist"):
        FileSource(str(tmp_path / "missing"), "csv", monitor_interval=1.0).validate()
    (tmp_path / "f.csv").write_text("a\n1\n")
    with pytest.raises(ConfigurationError, match="a file, not a directory"):
        FileSource(str(tmp_path / "f.csv"), "csv").validate()


@pytest.mark.parametrize("fmt,garbage", [("parquet", b"PAR1 this is not parquet"),
                                         ("jsonl", b'{"id": 1, "name": "a"}\n{"id": 2, "name": \n'),
                                         ("csv", b"id,name,value\n1,a\n")])
def test_corrupt_file_errors_name_the_file(tmp_path, fmt, garbage):
    if fmt == "parquet":
        # First file corrupt: the pipeline cannot be built.
        root = tmp_path / "first"
        root.mkdir()
        (root / f"a.{EXT[fmt]}").write_bytes(garbage)
        make_dir(root, fmt, [3], prefix="b")
        with pytest.raises(ConfigurationError, match=rf"could not read '.*a\.{fmt}' as {fmt}"):
            FileSource(str(root), fmt).validate()
    # A later file corrupt: reading it fails with an error naming it (after the good rows).
    root = tmp_path / "later"
    files = make_dir(root, fmt, [4])
    (root / f"z.{EXT[fmt]}").write_bytes(garbage)
    source = FileSource(str(root), fmt, batch_size=2)
    source.validate()
    reader = source.create_reader(ctx())
    reader.assign_splits(source.splits(1))
    got = []
    with pytest.raises(FileReadError, match=rf"file '.*z\.{fmt}' cannot be (opened|read).* as {fmt}") as info:
        for _ in range(100):
            batch = reader.poll()
            assert batch is not None
            got.extend(batch.column("id").to_pylist())
    assert got[:4] == files[0]
    assert info.value.path.endswith(f"z.{EXT[fmt]}")
    assert pickle.loads(pickle.dumps(info.value)).path == info.value.path


def test_first_file_unreadable_fails_validation_for_every_format(tmp_path):
    for fmt, garbage in [("jsonl", b"not json at all\n"), ("csv", b"\x00\x01\x02")]:
        root = tmp_path / fmt
        root.mkdir()
        (root / f"a.{fmt}").write_bytes(garbage)
        with pytest.raises(ConfigurationError, match=rf"a\.{fmt}"):
            FileSource(str(root), fmt).validate()
