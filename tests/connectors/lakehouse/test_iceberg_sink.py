"""`ss.sinks.Iceberg` on real Spark, with pyiceberg's SQL catalog over SQLite: exactly-once through
SIGKILLs of slot processes (one between a checkpoint's completion and the sink task's commit
notification) and of the JobMaster's process before its commit, across a stop-with-savepoint
resumed at another parallelism, one snapshot per committed checkpoint recording it in the
snapshot summary, and a missing catalog, a schema mismatch and an uncreatable table named
before the job runs. Read back with pyiceberg, and with DuckDB over the data files the snapshot
lists."""

from __future__ import annotations

import json
import os
import random

import duckdb
import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog

import streamsnap as ss
from streamsnap.api.environment import TEST_HOOKS_ENV
from streamsnap.connectors.lakehouse.iceberg_sink import SUMMARY_PREFIX
from tests.connectors.lakehouse.test_delta_sink import keyed_job, kill_job_master_before_commit
from tests.integration import support
from tests.integration.support import wait_status
from tests.integration.test_failover import RunningSum, causes, event, expected_rows, wait_restarted

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("key", pa.int64()), ("total", pa.int64()), ("i", pa.int64())])


def _catalog(tmp_path) -> dict:
    (tmp_path / "warehouse").mkdir(exist_ok=True)
    return {"name": "test", "type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": f"file://{tmp_path}/warehouse"}


def _create(properties: dict, name: str = "db.sums", schema: pa.Schema = SCHEMA):
    props = dict(properties)
    catalog = load_catalog(props.pop("name"), **props)
    catalog.create_namespace_if_not_exists(name.rsplit(".", 1)[0])
    return catalog.create_table(name, schema=schema)


def test_chaos_into_iceberg_leaves_exactly_the_failure_free_rows_one_snapshot_per_committed_checkpoint(
        spark, tmp_path, monkeypatch):
    n, phases, catalog = 8_000, tmp_path / "phases", _catalog(tmp_path)
    phases.mkdir()
    table = _create(catalog)
    monkeypatch.setenv(TEST_HOOKS_ENV, json.dumps({"phase_dir": str(phases), "notify_delay": 0.2}))
    env = keyed_job(spark, tmp_path, ss.sinks.Iceberg("db.sums", catalog=catalog), n, uid="iceberg",
                    interval=0.5, attempts=2, delay=0.1)
    client = env.execute_async("iceberg chaos")
    rng = random.Random(3)
    wait_status(client, "RUNNING")
    support.wait_completed(client, 1)
    os.kill(rng.choice(client.subtasks()).pid, 9)
    wait_restarted(client, 1)
    support.kill_in_phase(client, phases, "commit", "sum")
    result = client.wait(180)
    assert result.restarts == 2, causes(client)
    table = table.refresh()
    arrow = table.scan().to_arrow()
    rows = list(zip(*(arrow.column(c).to_pylist() for c in ("key", "total", "i"))))
    assert len(rows) == len(set(rows)), "duplicates in the table"
    assert set(rows) == expected_rows(n)
    files = [task.file.file_path for task in table.scan().plan_files()]
    assert sorted(duckdb.sql(f"select key, total, i from read_parquet({files!r})").fetchall()) == sorted(rows)
    recorded = [(key, int(value)) for s in table.snapshots() for key, value in s.summary.additional_properties.items()
                if key.startswith(SUMMARY_PREFIX)]
    assert recorded and len(recorded) == len(set(recorded)), f"a checkpoint committed twice: {recorded}"
    data = tmp_path / "warehouse"
    on_disk = {f for _, _, names in os.walk(data) for f in names if f.endswith(".parquet")}
    assert on_disk == {os.path.basename(f) for f in files}, "orphaned data files"


def test_a_sigkilled_job_master_between_a_checkpoints_completion_and_its_snapshot_loses_and_repeats_nothing(
        spark, tmp_path, monkeypatch):
    n, catalog = 16_000, _catalog(tmp_path)
    table = _create(catalog)

    def committed() -> list[int]:
        return [int(s.summary["streamsnap.checkpoint"]) for s in table.refresh().snapshots()
                if s.summary.get("streamsnap.checkpoint") is not None]

    kill_job_master_before_commit(spark, tmp_path, monkeypatch, ss.sinks.Iceberg("db.sums", catalog=catalog),
                                  committed, n)
    arrow = table.refresh().scan().to_arrow()
    rows = list(zip(*(arrow.column(c).to_pylist() for c in ("key", "total", "i"))))
    assert len(rows) == len(set(rows)) and set(rows) == expected_rows(n)


def test_a_missing_catalog_a_schema_mismatch_and_an_uncreatable_table_are_named_before_the_job_runs(tmp_path):
    def sink_to(sink, rows=({"key": 1, "total": 2, "i": 3},)):
        env = ss.StreamEnvironment(parallelism=1)
        env.from_collection(list(rows)).sink_to(sink, uid="iceberg")
        return env

    with pytest.raises(ss.ConfigurationError, match=r"(?s)catalog .nowhere. .*cannot be loaded: .*unable to open database file.*check catalog="):
        sink_to(ss.sinks.Iceberg("db.t", catalog={"name": "nowhere", "type": "sql",
                                                  "uri": f"sqlite:///{tmp_path}/no/such/dir/c.db"}))
    catalog = _catalog(tmp_path)
    _create(catalog, "db.t", pa.schema([("key", pa.string())]))
    with pytest.raises(ss.ConfigurationError, match=r"column 'key' is long in the stream but string in the table"):
        sink_to(ss.sinks.Iceberg("db.t", catalog=catalog))
    with pytest.raises(ss.ConfigurationError, match=r"column 'total'.*schema_mode='merge'"):
        sink_to(ss.sinks.Iceberg("db.t", catalog=catalog), rows=[{"key": "a", "total": 1}])
    with pytest.raises(ss.ConfigurationError, match="must be 'namespace.name'"):
        ss.sinks.Iceberg("t", catalog=catalog)
    with pytest.raises(ss.ConfigurationError, match="a dict of catalog properties .* or a catalog object"):
        ss.sinks.Iceberg("db.t", catalog="sqlite:///x")
    # A table to create needs the stream's schema at build time (a process function's is not known).
    env = ss.StreamEnvironment(parallelism=1)
    (env.from_source(ss.sources.Generator(event, count=10)).key_by("key").process(RunningSum())
        .sink_to(ss.sinks.Iceberg("db.new", catalog=catalog)))
    with pytest.raises(ss.ConfigurationError, match="does not exist and the stream's schema is not known"):
        env.execute("never runs")


def test_a_new_table_is_created_partitioned_with_faithful_types(spark, tmp_path):
    import datetime
    import decimal

    catalog = _catalog(tmp_path)
    schema = pa.schema([("day", pa.date32()), ("at", pa.timestamp("ms", "UTC")), ("price", pa.decimal128(9, 2)),
                        ("tags", pa.list_(pa.string()))])
    rows = [{"day": datetime.date(2026, 1, 1 + i % 2), "at": datetime.datetime(2026, 1, 1, i, tzinfo=datetime.timezone.utc),
             "price": decimal.Decimal(f"{i}.50"), "tags": [str(i)]} for i in range(4)]
    env = ss.StreamEnvironment(parallelism=1, spark=spark)
    env.from_collection(rows, schema=schema).sink_to(ss.sinks.Iceberg("db.typed", catalog=catalog, partition_by="day"))
    env.execute("iceberg types")
    props = dict(catalog)
    table = load_catalog(props.pop("name"), **props).load_table("db.typed")
    assert [f.name for f in table.spec().fields] == ["day"]
    assert {f.name: str(f.field_type) for f in table.schema().fields}["at"] == "timestamptz"
    back = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["at"])
    assert [r["at"] for r in back] == [r["at"] for r in rows] and [r["price"] for r in back] == [r["price"] for r in rows]


def test_stop_with_savepoint_then_resume_at_another_parallelism_continues_the_same_iceberg_table(spark, tmp_path):
    n, catalog = 6_000, _catalog(tmp_path)
    table = _create(catalog)

    def job(parallelism):
        return keyed_job(spark, tmp_path, ss.sinks.Iceberg("db.sums", catalog=catalog), n, uid="iceberg",
                         parallelism=parallelism)

    client = job(2).execute_async("iceberg rescale")
    wait_status(client, "RUNNING")
    support.wait_completed(client, 2)
    savepoint = client.stop_with_savepoint(str(tmp_path / "savepoints"))
    client.wait(60)
    assert 0 < table.refresh().scan().to_arrow().num_rows < n
    job(3).execute("iceberg rescale", restore_from=savepoint)
    arrow = table.refresh().scan().to_arrow()
    rows = list(zip(*(arrow.column(c).to_pylist() for c in ("key", "total", "i"))))
    assert len(rows) == len(set(rows)) and set(rows) == expected_rows(n)
    apps = {key for s in table.snapshots() for key in s.summary.additional_properties if key.startswith(SUMMARY_PREFIX)}
    assert len(apps) == 2   # one app id per run (the savepoint's files were committed once, by the first)
