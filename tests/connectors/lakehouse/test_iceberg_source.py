"""ss.sources.Iceberg: an Iceberg table (SQL catalog over SQLite) read bounded or continuously.

As test_delta_source.py: readers as real SourceOperators without Spark, then on Spark a continuous
job whose table is appended to while a reader is SIGKILLed.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog

import streamsnap as ss
from streamsnap.errors import ConfigurationError, StreamsnapError
from tests.connectors.lakehouse.support import appended_while_running
from tests.connectors.test_files import Subtask, assert_exactly_once, snapshot_and_assign

SCHEMA = pa.schema([("i", pa.int64()), ("key", pa.string()), ("ms", pa.int64())])


def rows(first: int, n: int) -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table({"i": ids, "key": [f"k{i % 3}" for i in ids], "ms": [i * 1000 for i in ids]}, schema=SCHEMA)


def ids_of(subtasks) -> list[int]:
    return [i for s in subtasks for b in s.out.batches for i in b.column("i").to_pylist()]


@pytest.fixture
def catalog(tmp_path):
    (tmp_path / "warehouse").mkdir()
    properties = {"name": "test", "type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                  "warehouse": f"file://{tmp_path}/warehouse"}
    loaded = load_catalog(**properties)
    loaded.create_namespace("db")
    table = loaded.create_table("db.events", schema=SCHEMA)
    table.append(rows(0, 30))
    table.append(rows(30, 20))
    return properties


def append(catalog: dict, first: int, n: int) -> None:
    load_catalog(**catalog).load_table("db.events").append(rows(first, n))


# ===================================================================== bounded
def test_bounded_reads_the_current_snapshot(catalog):
    source = ss.sources.Iceberg("db.events", catalog=catalog, batch_size=7)
    source.validate()
    subtasks = [Subtask(source, i, 2) for i in range(2)]
    for s in subtasks:
        s.run_dry()
    read = pa.Table.from_batches([b for s in subtasks for b in s.out.batches]).sort_by("i")
    assert read.schema == source.schema    # pyiceberg's Arrow types: strings are large_string
    assert read.equals(rows(0, 50).cast(read.schema))


def test_snapshot_id_reads_that_snapshot_and_a_catalog_object_is_accepted(catalog):
    loaded = load_catalog(**catalog)
    first = loaded.load_table("db.events").snapshots()[0].snapshot_id
    source = ss.sources.Iceberg("db.events", catalog=loaded, snapshot_id=first)
    source.validate()
    subtask = Subtask(source, 0, 1)
    subtask.run_dry()
    assert sorted(ids_of([subtask])) == list(range(30))


# ===================================================================== continuous
def test_continuous_reads_each_appended_snapshot_once_across_a_rescale(catalog, tmp_path):
    source = ss.sources.Iceberg("db.events", catalog=catalog, bounded=False, batch_size=6)
    source.validate()
    first = [Subtask(source, i, 2) for i in range(2)]
    append(catalog, 50, 25)
    first[1].step(100)
    assignment, url = snapshot_and_assign(first, 3, tmp_path / "chk")
    append(catalog, 75, 25)
    rest = [Subtask(source, i, 3, assignment[i], url) for i in range(3)]
    for s in rest:
        s.run_dry()
    assert_exactly_once(ids_of(first) + ids_of(rest), list(range(100)))


def test_a_delete_fails_naming_the_snapshot_and_the_option(catalog):
    source = ss.sources.Iceberg("db.events", catalog=catalog, bounded=False)
    source.validate()
    load_catalog(**catalog).load_table("db.events").delete("i < 5")
    subtask = Subtask(source, 0, 1)
    with pytest.raises(StreamsnapError, match=r"version 3 of the table is a 'overwrite' snapshot .*"
                                              r"skip_change_commits=True"):
        subtask.run_dry()


def test_skip_change_commits_skips_the_change_and_streams_later_appends(catalog):
    source = ss.sources.Iceberg("db.events", catalog=catalog, bounded=False, skip_change_commits=True)
    source.validate()
    load_catalog(**catalog).load_table("db.events").delete("i < 5")
    append(catalog, 50, 10)
    subtask = Subtask(source, 0, 1)
    subtask.run_dry()
    assert sorted(ids_of([subtask])) == list(range(60))


# ===================================================================== bad input
def test_a_missing_catalog_is_named():
    with pytest.raises(ConfigurationError, match="catalog= is missing"):
        ss.sources.Iceberg("db.events")
    with pytest.raises(ConfigurationError, match="the catalog 'default' .* cannot be loaded"):
        ss.sources.Iceberg("db.events", catalog={"type": "no-such-type", "uri": "x"}).validate()


def test_a_missing_table_is_named(catalog):
    with pytest.raises(ConfigurationError, match=r"the table 'db.nothing' does not exist in the catalog 'test'"):
        ss.sources.Iceberg("db.nothing", catalog=catalog).validate()
    with pytest.raises(ConfigurationError, match="must be an identifier 'namespace.table'"):
        ss.sources.Iceberg("events", catalog=catalog)


def test_unknown_snapshot_and_event_time_column_are_named_when_the_pipeline_is_built(catalog):
    env = ss.StreamEnvironment(parallelism=1)
    with pytest.raises(ConfigurationError, match=r"snapshot_id=42 is not a snapshot of 'db.events'"):
        env.from_source(ss.sources.Iceberg("db.events", catalog=catalog, snapshot_id=42))
    with pytest.raises(ConfigurationError, match=r"event_time column 'ts' is not in the table"):
        env.from_source(ss.sources.Iceberg("db.events", catalog=catalog, event_time="ts"))


# ===================================================================== on Spark
@pytest.mark.spark
def test_rows_appended_while_a_reader_is_killed_are_read_exactly_once(spark, catalog, tmp_path):
    source = ss.sources.Iceberg("db.events", catalog=catalog, bounded=False, poll_interval=0.1,
                                batch_size=32, event_time="ms")
    appended_while_running(spark, tmp_path, source, lambda first, n: append(catalog, first, n),
                           first=50, per_append=100, appends=8)
