"""ss.sources.Delta: a Delta Lake table read bounded or continuously, exactly once.

The readers run as real SourceOperators (their state snapshotted to disk and redistributed as a
restore does) without Spark; one job on Spark reads a table appended to while it runs, a reader
SIGKILLed, and checks that every row is read exactly once with its event time. Bounded reads run on
Spark in the docs' snippets (docs/how-to/lakehouse.md).
"""

from __future__ import annotations

import json
import os
import re
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

import streamsnap as ss
from streamsnap.errors import ConfigurationError, FileReadError, StreamsnapError
from streamsnap.runtime.operators.timestamps_and_watermarks import batch_timestamps
from tests.connectors.test_files import Subtask, assert_exactly_once, snapshot_and_assign
from tests.connectors.lakehouse.support import appended_while_running

SCHEMA = pa.schema([("i", pa.int64()), ("key", pa.string()), ("ts", pa.timestamp("us", tz="UTC")), ("ms", pa.int64())])


def rows(first: int, n: int) -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table({"i": ids, "key": [f"k{i % 3}" for i in ids], "ts": [i * 1_000_000 for i in ids],
                     "ms": [i * 1000 for i in ids]}, schema=SCHEMA)


def ids_of(subtasks) -> list[int]:
    return [i for s in subtasks for b in s.out.batches for i in b.column("i").to_pylist()]


@pytest.fixture
def table(tmp_path):
    path = str(tmp_path / "table")
    write_deltalake(path, rows(0, 30), partition_by=["key"])       # version 0
    write_deltalake(path, rows(30, 20), mode="append", partition_by=["key"])   # version 1
    return path


# ===================================================================== bounded
def test_bounded_reads_the_snapshot_with_its_partition_columns(table):
    source = ss.sources.Delta(table, batch_size=7)
    source.validate()
    subtasks = [Subtask(source, i, 2) for i in range(2)]
    for s in subtasks:
        s.run_dry()
    assert all(s.op.reader.is_finished() for s in subtasks)
    read = pa.Table.from_batches([b for s in subtasks for b in s.out.batches]).sort_by("i")
    assert read.schema == SCHEMA
    assert read.equals(rows(0, 50))


def test_starting_version_reads_that_snapshot(table):
    source = ss.sources.Delta(table, starting_version=0)
    source.validate()
    assert source.version == 0
    subtask = Subtask(source, 0, 1)
    subtask.run_dry()
    assert sorted(ids_of([subtask])) == list(range(30))


def test_bounded_restore_with_another_parallelism_continues_exactly(table, tmp_path):
    source = ss.sources.Delta(table, batch_size=4)
    source.validate()
    first = [Subtask(source, i, 2) for i in range(2)]
    for s in first:
        s.step(3)
    assignment, url = snapshot_and_assign(first, 3, tmp_path / "chk")
    rest = [Subtask(source, i, 3, assignment[i], url) for i in range(3)]
    for s in rest:
        s.run_dry()
    assert_exactly_once(ids_of(first) + ids_of(rest), list(range(50)))


# ===================================================================== continuous
def test_continuous_reads_each_appended_version_once_across_a_rescale(table, tmp_path):
    source = ss.sources.Delta(table, bounded=False, batch_size=6)
    source.validate()
    first = [Subtask(source, i, 2) for i in range(2)]
    write_deltalake(table, rows(50, 25), mode="append", partition_by=["key"])
    first[0].step(100)           # subtask 0 sees version 2, subtask 1 does not look yet
    assignment, url = snapshot_and_assign(first, 3, tmp_path / "chk")
    write_deltalake(table, rows(75, 25), mode="append", partition_by=["key"])
    rest = [Subtask(source, i, 3, assignment[i], url) for i in range(3)]
    for s in rest:
        s.run_dry()
    assert not any(s.op.reader.is_finished() for s in rest)     # continuous: never finished
    assert_exactly_once(ids_of(first) + ids_of(rest), list(range(100)))


def test_a_delete_fails_naming_the_version_and_the_option(table):
    source = ss.sources.Delta(table, bounded=False)
    source.validate()
    DeltaTable(table).delete("i < 5")                               # version 2
    subtask = Subtask(source, 0, 1)
    with pytest.raises(StreamsnapError, match=r"version 2 of the table removes or rewrites data "
                                              r"\(operation DELETE.*skip_change_commits=True"):
        subtask.run_dry()


def test_skip_change_commits_skips_the_change_and_streams_later_appends(table):
    source = ss.sources.Delta(table, bounded=False, skip_change_commits=True)
    source.validate()
    DeltaTable(table).update({"i": "i + 1000"}, predicate="i < 5")  # version 2: rewritten files
    DeltaTable(table).optimize.compact()                            # version 3: no data change
    write_deltalake(table, rows(50, 10), mode="append", partition_by=["key"])
    subtask = Subtask(source, 0, 1)
    subtask.run_dry()
    assert sorted(ids_of([subtask])) == list(range(60))


def test_a_timestamp_column_is_the_event_time_of_its_rows(table):
    source = ss.sources.Delta(table, event_time="ts", max_out_of_orderness=2)
    source.validate()
    strategy = source.default_watermark_strategy()
    subtask = Subtask(source, 0, 1)
    subtask.step(1)
    batch = subtask.out.batches[0]
    times = batch_timestamps(batch, strategy.timestamp_assigner, "table")
    assert list(times) == [i * 1000 for i in batch.column("i").to_pylist()]
    generator, emitted = strategy.create_watermark_generator(), []
    generator.on_batch(times, None)
    generator.on_periodic_emit(SimpleNamespace(emit_watermark=emitted.append))
    assert emitted == [max(times) - 2000 - 1]     # max_out_of_orderness=2 s


def test_a_data_file_cleaned_up_before_it_was_read_is_named_with_its_version(table):
    source = ss.sources.Delta(table, bounded=False)
    source.validate()
    write_deltalake(table, rows(50, 5), mode="append", partition_by=["key"])     # version 2
    with open(os.path.join(table, "_delta_log", f"{2:020d}.json")) as log:
        added = sorted(json.loads(line)["add"]["path"] for line in log if '"add"' in line)
    os.remove(os.path.join(table, added[0]))                        # as a too-early VACUUM
    subtask = Subtask(source, 0, 1)
    with pytest.raises(FileReadError, match=rf"data file '{re.escape(added[0])}' of version 2 is gone .*VACUUM"):
        subtask.run_dry()


def test_a_log_entry_cleaned_up_before_it_was_read_is_named(table):
    source = ss.sources.Delta(table, starting_version=0, bounded=False)
    source.validate()
    write_deltalake(table, rows(50, 5), mode="append", partition_by=["key"])     # version 2
    os.remove(os.path.join(table, "_delta_log", f"{1:020d}.json"))
    subtask = Subtask(source, 0, 1)
    with pytest.raises(StreamsnapError, match=r"log entry of version 1 .* is gone while later versions exist"):
        subtask.run_dry()


# ===================================================================== bad input
def test_a_path_that_is_not_a_delta_table_is_named(tmp_path):
    with pytest.raises(ConfigurationError, match="is not a Delta table: the path does not exist"):
        ss.sources.Delta(str(tmp_path / "missing")).validate()
    loose = tmp_path / "loose"
    loose.mkdir()
    pq.write_table(rows(0, 3), str(loose / "part-0.parquet"))
    with pytest.raises(ConfigurationError, match="loose Parquet files: read them with ss.sources.FileSource"):
        ss.sources.Delta(str(loose)).validate()
    (tmp_path / "ice" / "metadata").mkdir(parents=True)
    with pytest.raises(ConfigurationError, match="looks like an Apache Iceberg table"):
        ss.sources.Delta(str(tmp_path / "ice")).validate()


def test_unknown_starting_version_is_named(table):
    with pytest.raises(ConfigurationError, match=r"starting_version=5 does not exist .* latest version is 1"):
        ss.sources.Delta(table, starting_version=5).validate()


@pytest.mark.parametrize("kwargs, match", [
    (dict(event_time="when"), r"event_time column 'when' is not in the table \(columns \['i', 'key', 'ts', 'ms'\]\)"),
    (dict(event_time="key"), "event_time column 'key' has type string"),
    (dict(starting_version=-1), "starting_version must be a table version"),
    (dict(bounded="no"), "Delta.bounded must be True or False"),
    (dict(poll_interval=0), "poll_interval must be a number of seconds > 0"),
])
def test_bad_settings_are_named_when_the_pipeline_is_built(table, kwargs, match):
    env = ss.StreamEnvironment(parallelism=1)
    with pytest.raises(ConfigurationError, match=match):
        env.from_source(ss.sources.Delta(table, **kwargs))


# ===================================================================== on Spark
@pytest.mark.spark
def test_rows_appended_while_a_reader_is_killed_are_read_exactly_once(spark, tmp_path):
    path = str(tmp_path / "table")
    write_deltalake(path, rows(0, 200))
    source = ss.sources.Delta(path, bounded=False, poll_interval=0.1, batch_size=32,
                              event_time="ms")
    appended_while_running(spark, tmp_path, source,
                           lambda first, n: write_deltalake(path, rows(first, n), mode="append"),
                           first=200, per_append=100, appends=8)
