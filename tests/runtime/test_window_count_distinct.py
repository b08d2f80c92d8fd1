"""count_distinct in the vectorized window aggregate (no Spark): its pure helpers, random
out-of-order batches against a plain-Python COUNT(DISTINCT x) [FILTER (WHERE p)], the distinct
sets cleaned with their windows, a snapshot restored at another parallelism on both state
backends, and the build-time checks."""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.runtime.operators.vectorized_windows import ColumnAggregate, VectorizedWindowOperator
from streamsnap.runtime.operators.window_distinct import DISTINCT, DistinctSpec, row_mask, seen_pairs
from streamsnap.state.assignment import assign_operator_state
from streamsnap.state.backends.rocksdb.config import RocksDBConfig
from streamsnap.state.key_groups import assign_key_groups
from streamsnap.time.watermarks import MAX_WATERMARK
from tests.runtime.test_window_operator import Sink

W = ss.windows
SCHEMA = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("user", pa.int64()),
                    ("name", pa.string()), ("cheap", pa.bool_()), ("rank1", pa.int64())])
AGGREGATES = (ColumnAggregate("n", "count", None), ColumnAggregate("users", "count_distinct", "user"),
              ColumnAggregate("names", "count_distinct", "name"),
              ColumnAggregate("cheap_users", "count_distinct", "user", "cheap"),
              ColumnAggregate("rank1_users", "count_distinct", "user", "rank1"),
              ColumnAggregate("top", "max", "user"))
OUTPUTS = ("n", "users", "names", "cheap_users", "rank1_users", "top")


def operator(assigner, backend="hashmap", lateness=0, *, subtask=0, parallelism=1, restore=None, base=None):
    clock = ManualScheduler()
    ctx = OperatorContext(name="distinct", uid="distinct", subtask_index=subtask, parallelism=parallelism,
                          max_parallelism=128, attempt=0, job_id="job", task_name="distinct",
                          timers=clock, clock=clock, state_backend=backend, restore=restore,
                          restore_base=base)
    op = VectorizedWindowOperator(ctx, KeySelector.of("key"), assigner, lateness, AGGREGATES, None, "ts")
    main = Sink()
    op.output = Output([main], {})
    op.initialize_state()
    op.open()
    return op, main


def random_rows(seed, count=2_000):
    rng = random.Random(seed)
    return [{"key": rng.randrange(4), "ts": i * 10 + rng.randrange(3_000),
             "user": None if rng.random() < 0.05 else rng.randrange(40),
             "name": rng.choice(["a", "b", "c", None, "dd"]),
             "cheap": None if rng.random() < 0.05 else rng.random() < 0.3, "rank1": rng.randrange(2)}
            for i in range(count)]


def reference(rows, assigner):
    """COUNT(*), COUNT(DISTINCT ...) [FILTER (WHERE ...)] and MAX per key and window."""
    groups = defaultdict(list)
    for r in rows:
        for w in assigner.assign_windows(r["ts"]):
            groups[(r["key"], w.start, w.end)].append(r)

    def distinct(members, column, where=None):
        return len({m[column] for m in members if m[column] is not None and (where is None or m[where])})

    return {window: (len(m), distinct(m, "user"), distinct(m, "name"), distinct(m, "user", "cheap"),
                     distinct(m, "user", "rank1"), max((x["user"] for x in m if x["user"] is not None), default=None))
            for window, m in groups.items()}


def fired(sink):
    out = {(r["key"], r["window_start"], r["window_end"]): tuple(r[o] for o in OUTPUTS) for r in sink.rows()}
    assert len(out) == len(sink.rows()), "a window fired twice"
    return out


def backends(tmp_path):
    return {"hashmap": "hashmap", "rocksdb": RocksDBConfig(local_dir=str(tmp_path / "db"))}


def seen_per_group(values, bits, groups, num):
    """`seen_pairs` as one {value: bits} dict per group."""
    out = [{} for _ in range(num)]
    pair_groups, codes, pair_bits, _, dictionary = seen_pairs(values, bits, groups)
    assert pair_groups.tolist() == sorted(pair_groups.tolist())         # sorted by group
    for g, v, b in zip(pair_groups.tolist(), codes.tolist(), pair_bits.tolist()):
        out[g][dictionary[v]] = b
    return out


def test_seen_pairs_ors_the_bits_of_each_value_and_the_row_mask():
    values = pa.array(["x", "y", "x", "z", "y", "x"])
    bits = np.array([1, 2, 2, 1, 3, 1])
    groups = np.array([0, 0, 0, 2, 2, 2])
    assert seen_per_group(values, bits, groups, 3) == [{"x": 3, "y": 2}, {}, {"z": 1, "y": 3, "x": 1}]
    assert seen_per_group(pa.array([], pa.int64()), np.array([], dtype=np.int64),
                          np.array([], dtype=np.int64), 2) == [{}, {}]
    batch = pa.RecordBatch.from_pylist([{"v": 1, "p": True}, {"v": None, "p": True}, {"v": 3, "p": None},
                                        {"v": 4, "p": False}, {"v": 5, "p": True}])
    assert row_mask(batch, DistinctSpec("v")).tolist() == [True, False, True, True, True]
    assert row_mask(batch, DistinctSpec("v", "p")).tolist() == [True, False, False, False, True]
    flags = pa.RecordBatch.from_pylist([{"v": 1, "p": 0}, {"v": 2, "p": 2}])
    assert row_mask(flags, DistinctSpec("v", "p")).tolist() == [False, True]


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
@pytest.mark.parametrize("assigner, lateness", [(W.TumblingEventTimeWindows.of(1), 0),
                                                (W.SlidingEventTimeWindows.of(2, 0.5), 800)])
def test_random_batches_count_distinct_exactly_and_clean_their_sets(assigner, lateness, backend, tmp_path):
    rows = random_rows(5)
    op, main = operator(assigner, backends(tmp_path)[backend], lateness)
    for start in range(0, len(rows), 150):
        op.process(pa.RecordBatch.from_pylist(rows[start:start + 150], schema=SCHEMA))
        op.process_watermark(max(r["ts"] for r in rows[:start + 150]) - 3_000)
    op.process_watermark(MAX_WATERMARK)
    # (the watermark trails the disorder: no row is late, each window fires once, exactly)
    got = fired(main)
    assert got == reference(rows, assigner)
    assert any(v[1] != v[3] for v in got.values()) and any(v[1] < v[0] for v in got.values())
    # the sets went with their windows
    assert [e for c in ("user", "name") for e in op.keyed_backend.iter_entries(f"{DISTINCT}.{op.distinct.columns.index(c)}")] == []
    op.close()


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_a_restore_at_another_parallelism_continues_the_distinct_sets(backend, tmp_path):
    """Values seen before the snapshot are not counted again after the restore."""
    assigner = W.TumblingEventTimeWindows.of(10)
    config = backends(tmp_path)[backend]
    rows = random_rows(8, 1_200)
    first, second = rows[:600], rows[600:]
    whole, whole_main = operator(assigner, config)
    for part in (first, second):
        whole.process(pa.RecordBatch.from_pylist(part, schema=SCHEMA))
    whole.process_watermark(MAX_WATERMARK)
    expected = fired(whole_main)
    assert expected == reference(rows, assigner)

    op, main = operator(assigner, config)
    op.process(pa.RecordBatch.from_pylist(first, schema=SCHEMA))
    state = op.snapshot_state(1, 0.0, str(tmp_path / "chk")).run()
    restored = assign_operator_state({0: state}, 128, 2)
    got = {}
    for i in range(2):
        new, new_main = operator(assigner, config, subtask=i, parallelism=2, restore=restored[i],
                                 base=str(tmp_path / "chk"))
        owned = new.keyed_backend.key_group_range
        mine = [r for r in second if assign_key_groups([r["key"]], 128)[0] in owned]
        new.process(pa.RecordBatch.from_pylist(mine, schema=SCHEMA))
        new.process_watermark(MAX_WATERMARK)
        got.update(fired(new_main))
        new.close()
    assert got == expected
    whole.close()
    op.close()


def _run(op, rows, size=150):
    for start in range(0, len(rows), size):
        op.process(pa.RecordBatch.from_pylist(rows[start:start + size], schema=SCHEMA))
        op.process_watermark(max(r["ts"] for r in rows[:start + size]) - 3_000)


def test_on_rocksdb_values_a_window_has_not_seen_skip_their_lookups(tmp_path):
    """Windows created in this process filter out lookups of values their sets have not seen
    (most of them here), with counts still exact; restored windows keep their lookups; the
    heap keeps no filter at all; sets and filters go with their windows."""
    assigner = W.SlidingEventTimeWindows.of(20, 5)
    rows = [dict(r, user=None if r["user"] is None else r["user"] * 37 + i % 500)
            for i, r in enumerate(random_rows(11, 3_000))]           # mostly values new to the set
    op, main = operator(assigner, backends(tmp_path)["rocksdb"])
    _run(op, rows)
    assert op.distinct.skipped > 2 * op.distinct.lookups > 0
    assert any(op.distinct.filters)                                  # windows still open
    op.process_watermark(MAX_WATERMARK)
    assert fired(main) == reference(rows, assigner)
    assert not any(op.distinct.filters) and not op.distinct.tracked  # gone with their windows
    op.close()

    first, second = rows[:1_500], rows[1_500:]
    op, _ = operator(assigner, backends(tmp_path / "a")["rocksdb"])
    _run(op, first)
    state = op.snapshot_state(1, 0.0, str(tmp_path / "chk")).run()
    restored, restored_main = operator(assigner, backends(tmp_path / "b")["rocksdb"],
                                       restore=assign_operator_state({0: state}, 128, 1)[0],
                                       base=str(tmp_path / "chk"))
    assert not restored.distinct.tracked
    _run(restored, second)
    assert restored.distinct.lookups > 0
    restored.process_watermark(MAX_WATERMARK)
    whole, after = reference(rows, assigner), fired(restored_main)
    assert after and after == {window: whole[window] for window in after}
    restored.close()
    op.close()

    heap, heap_main = operator(assigner, "hashmap")
    _run(heap, rows)
    heap.process_watermark(MAX_WATERMARK)
    assert not heap.distinct.filtered and fired(heap_main) == reference(rows, assigner)
    heap.close()


def test_a_filter_that_forgot_values_would_count_them_twice(tmp_path):
    """The check above can fail: a filter answering "not seen" for values it was given makes
    the counts wrong."""
    from streamsnap.runtime.operators.seen_filter import FiltersByStart

    class Forgetful(FiltersByStart):
        def might_contain(self, starts, hashes, unknown):
            return np.zeros(len(hashes), dtype=bool)

    assigner = W.TumblingEventTimeWindows.of(10)
    rows = random_rows(12, 1_500)
    op, main = operator(assigner, backends(tmp_path)["rocksdb"])
    op.distinct.filters = [Forgetful() for _ in op.distinct.filters]   # the distinct sets' only
    _run(op, rows)
    op.process_watermark(MAX_WATERMARK)
    assert fired(main) != reference(rows, assigner)
    op.close()


def test_build_time_checks_of_count_distinct():
    env = ss.StreamEnvironment()
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    source = ss.sources.Generator(lambda i: {"key": i % 2, "ts": i, "user": i, "price": 1.5, "when": [i]},
                                  count=10)
    tumbling = env.from_source(source, watermark_strategy=strategy).key_by("key") \
        .window(W.TumblingEventTimeWindows.of(1))
    with pytest.raises(ss.ConfigurationError, match="count_distinct's column 'nope' is not in"):
        tumbling.aggregate_columns({"u": ("count_distinct", "nope")})
    with pytest.raises(ss.ConfigurationError, match="count_distinct's filter column 'cheap' is not in"):
        tumbling.aggregate_columns({"u": ("count_distinct", "user", "cheap")})
    with pytest.raises(ss.ConfigurationError, match="filter column 'price' has type double.*boolean or integer"):
        tumbling.aggregate_columns({"u": ("count_distinct", "user", "price")})
    with pytest.raises(ss.ConfigurationError, match="'when' has type list.*cast it with map_batches"):
        tumbling.aggregate_columns({"u": ("count_distinct", "when")})
    with pytest.raises(ss.ConfigurationError, match="'count_distinct', column name, filter column name"):
        tumbling.aggregate_columns({"u": ("sum", "user", "key")})
    assert tumbling.aggregate_columns({"u": ("count_distinct", "user", "key")}) is not None


def test_on_rocksdb_windows_the_index_never_held_are_new_without_a_lookup(tmp_path, monkeypatch):
    """The vectorized window operator looks up only windows its filter of known windows may
    hold (every window with state is in its index, restored ones included): new windows cost
    no lookup, results stay exact; a filter that forgot windows would make them fire twice."""
    assigner = W.SlidingEventTimeWindows.of(2, 0.5)
    rows = random_rows(21, 2_000)
    op, main = operator(assigner, backends(tmp_path)["rocksdb"], 800)
    asked, groups = [], []

    class Counted:             # the windows' state, counting the windows each batch looks up
        def __init__(self, state):
            self.state = state

        def get_many(self, keys):
            asked.append(len(keys.unique))
            return self.state.get_many(keys)

        def __getattr__(self, name):
            return getattr(self.state, name)

    op.windows = Counted(op.windows)
    stored = op._stored
    looked = []

    def counted_stored(keys, starts, hashes):
        before = sum(asked)
        out = stored(keys, starts, hashes)
        groups.append(len(keys.unique))
        looked.append(sum(asked) - before)
        return out

    monkeypatch.setattr(op, "_stored", counted_stored)
    _run(op, rows)
    op.process_watermark(MAX_WATERMARK)
    assert fired(main) == reference(rows, assigner)
    assert 0 < sum(looked) < 0.8 * sum(groups)       # the windows new to a batch were not looked up
    assert not op._known                                                        # filters went with their windows
    op.close()

    from streamsnap.runtime.operators.seen_filter import SeenFilter

    monkeypatch.setattr(SeenFilter, "might_contain", lambda self, hashes: np.zeros(len(hashes), dtype=bool))
    broken, broken_main = operator(assigner, backends(tmp_path / "broken")["rocksdb"], 800)
    _run(broken, rows)
    broken.process_watermark(MAX_WATERMARK)
    with pytest.raises(AssertionError, match="fired twice"):
        fired(broken_main)
    broken.close()
