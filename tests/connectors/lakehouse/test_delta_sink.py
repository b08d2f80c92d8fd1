"""`ss.sinks.Delta` on real Spark (connectors/lakehouse): exactly-once through SIGKILLs of slot
processes and of the JobMaster's process, a stop-with-savepoint resumed at another parallelism,
faithful types and partitions, and bad input named before the job runs. The table is read back
as its users read it: with `deltalake`, and with DuckDB over the files the Delta log lists
(DuckDB's own delta extension has no build for DuckDB 2.0 on PyPI: the wheels there are built
for 1.4/1.5, and an extension loads only into its own DuckDB version)."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import glob
import json
import logging
import os
import random
import re
import signal
import subprocess
import time

import duckdb
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import streamsnap as ss
from streamsnap.api.environment import TEST_HOOKS_ENV
from streamsnap.cluster.registry import JobRegistry
from streamsnap.connectors.lakehouse.data_files import file_prefix
from tests.integration.support import wait_completed, wait_status
from tests.integration.test_failover import RunningSum, causes, event, expected_rows, three_kills

pytestmark = pytest.mark.spark

COLUMNS = ("key", "total", "i")


def _rows(table_path) -> list[tuple]:
    table = DeltaTable(str(table_path)).to_pyarrow_table(columns=list(COLUMNS))
    return list(zip(*(table.column(c).to_pylist() for c in COLUMNS)))


def _duckdb_rows(table_path) -> list[tuple]:
    files = DeltaTable(str(table_path)).file_uris()
    return duckdb.sql(f"select key, total, i from read_parquet({files!r}, hive_partitioning = true)").fetchall()


def _commits(table_path) -> list[dict]:
    """Every commit of the table's log: its checkpoint (commitInfo) and application transactions."""
    commits = []
    for path in sorted(glob.glob(os.path.join(str(table_path), "_delta_log", "*.json"))):
        actions = [json.loads(line) for line in open(path) if line.strip()]
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        commits.append({"checkpoint": info.get("streamsnap.checkpoint"),
                        "txns": [(a["txn"]["appId"], a["txn"]["version"]) for a in actions if "txn" in a],
                        "adds": sum("add" in a for a in actions)})
    return commits


def _assert_exact(table_path, n: int) -> list[dict]:
    rows = _rows(table_path)
    assert len(rows) == len(set(rows)), "duplicates in the table"
    expected = expected_rows(n)
    assert set(rows) == expected, f"missing {len(expected - set(rows))}, unexpected {len(set(rows) - expected)}"
    assert sorted(_duckdb_rows(table_path)) == sorted(rows)
    commits = _commits(table_path)
    versions = [(app, v) for c in commits for app, v in c["txns"]]
    assert len(versions) == len(set(versions)), f"a transaction version committed twice: {versions}"
    for app in {a for a, _ in versions}:
        mine = [v for a, v in versions if a == app]
        assert mine == sorted(mine), f"{app}: versions out of order {mine}"
    # No data file of the sink is left that the table does not reference (cleanup after restores).
    referenced = {os.path.basename(p) for p in DeltaTable(str(table_path)).file_uris()}
    on_disk = {os.path.basename(p) for p in glob.glob(os.path.join(str(table_path), "**", "*.parquet"), recursive=True)}
    assert on_disk == referenced, f"orphaned data files: {sorted(on_disk - referenced)[:5]}"
    return commits


def _completed_ids(caplog) -> set[int]:
    return {int(m.group(1)) for r in caplog.records
            if (m := re.match(r"completed (?:checkpoint|savepoint) (\d+) ", r.getMessage()))}


def keyed_job(spark, tmp_path, sink, n: int, *, uid: str, parallelism: int = 2, interval: float = 0.3,
              attempts: int = 0, delay: float = 0.0, **options) -> ss.StreamEnvironment:
    """The keyed job of these tests: `n` events at 2,000/s, a running sum per key, into `sink`;
    checkpoints every `interval` s into tmp_path/ckpt, `attempts` restarts allowed."""
    restart = ss.RestartStrategy.fixed_delay(attempts=attempts, delay=delay) if attempts else None
    env = ss.StreamEnvironment(parallelism=parallelism, spark=spark, restart=restart, **options,
                               checkpointing=ss.CheckpointConfig(interval=interval, directory=str(tmp_path / "ckpt")))
    (env.from_source(ss.sources.Generator(event, count=n, rate=2_000), name="events", uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(sink, name=uid, uid=uid))
    return env


def test_chaos_into_delta_leaves_exactly_the_failure_free_rows_and_commits_only_completed_checkpoints(
        spark, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="streamsnap.checkpoint.coordinator")
    n, phases, table = 24_000, tmp_path / "phases", tmp_path / "table"
    phases.mkdir()
    monkeypatch.setenv(TEST_HOOKS_ENV, json.dumps({"phase_dir": str(phases), "async_delay": 0.2, "notify_delay": 0.2}))
    env = keyed_job(spark, tmp_path, ss.sinks.Delta(str(table)), n, uid="delta", interval=0.5, attempts=3, delay=0.1)
    client = env.execute_async("delta chaos")
    three_kills(client, random.Random(7), str(phases))
    result = client.wait(180)
    assert result.restarts == 3, causes(client)
    commits = _assert_exact(table, n)
    completed = _completed_ids(caplog)
    assert commits and all(c["checkpoint"] in completed for c in commits), (
        f"a commit of an uncompleted checkpoint: {[c['checkpoint'] for c in commits]} vs {sorted(completed)}")


def kill_job_master_before_commit(spark, tmp_path, monkeypatch, sink, committed, n: int, pause_at: int = 3):
    """Run the keyed job into `sink` with the JobMaster in the cluster, SIGKILL the JobMaster's
    process once checkpoint `pause_at` completed and before its table commit (the committer's
    test hook holds it on the committer's thread), after a later checkpoint completed meanwhile
    (the commit does not hold up the JobMaster's loop), and return the job's result.
    `committed()`: the checkpoint ids the table has commits of; `n` rows at 2,000/s: enough that
    checkpoint `pause_at + 1` comes before the input ends (a slow table delays the commits)."""
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv(TEST_HOOKS_ENV, json.dumps({"table_commit_dir": str(markers),
                                                   "table_commit_pause_at": pause_at, "table_commit_pause": 120}))
    env = keyed_job(spark, tmp_path, sink, n, uid="table", attempts=2, job_master="cluster")
    client = env.execute_async("jobmaster kill before commit")
    marker = markers / f"table-commit-{pause_at}"
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline and client.status() not in ("FAILED", "FINISHED"), client.status()
        time.sleep(0.01)
    # The checkpoint completed (its metadata is written) and its commit waits; the loop goes on
    # completing checkpoints, whose sink state still holds the files of `pause_at` (the writers
    # hear of a completion only once the table has it).
    def later_completed() -> bool:   # the retained latest one: older ones are subsumed
        done = glob.glob(str(tmp_path / "ckpt" / client.job_id / "chk-*" / "_metadata"))
        return any(int(os.path.basename(os.path.dirname(p))[4:]) > pause_at for p in done)

    while not later_completed():
        assert time.monotonic() < deadline and client.status() not in ("FAILED", "FINISHED"), client.status()
        time.sleep(0.01)
    pid = int(marker.read_text())
    assert pid == JobRegistry(str(tmp_path / "ckpt"), client.job_id).read()["pid"] and pid != os.getpid()
    assert max(committed(), default=0) < pause_at
    os.kill(pid, signal.SIGKILL)
    result = client.wait(300)
    assert result.status == "FINISHED" and result.restarts == 1, result
    # The next JobMaster committed the held checkpoint's files from the restored (later) checkpoint's
    # sink state, with that checkpoint's commit: exactly once (the caller checks the rows).
    assert pause_at not in committed() and max(committed()) > pause_at
    return result


def test_a_sigkilled_job_master_between_a_checkpoints_completion_and_its_commit_loses_and_repeats_nothing(
        spark, tmp_path, monkeypatch):
    n, table = 16_000, tmp_path / "table"
    kill_job_master_before_commit(spark, tmp_path, monkeypatch, ss.sinks.Delta(str(table), partition_by="key"),
                                  lambda: [c["checkpoint"] for c in _commits(table)], n)
    _assert_exact(table, n)
    assert DeltaTable(str(table)).metadata().partition_columns == ["key"]


def test_a_task_sigkilled_while_a_commit_is_in_flight_loses_and_repeats_nothing(spark, tmp_path, monkeypatch):
    """The commit of checkpoint 2 is held on the committer's thread; a slot process dies meanwhile.
    The failover does not wait for it: the held commit then finishes, and the restore's commit,
    queued behind it, adds only what the table lacks."""
    n, table, markers = 16_000, tmp_path / "table", tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv(TEST_HOOKS_ENV, json.dumps({"table_commit_dir": str(markers),
                                                   "table_commit_pause_at": 2, "table_commit_pause": 3}))
    env = keyed_job(spark, tmp_path, ss.sinks.Delta(str(table)), n, uid="delta", attempts=1)
    client = env.execute_async("task kill during commit")
    deadline = time.monotonic() + 120
    while not (markers / "table-commit-2").exists():
        assert time.monotonic() < deadline and client.status() not in ("FAILED", "FINISHED"), client.status()
        time.sleep(0.01)
    os.kill(client.subtasks()[0].pid, signal.SIGKILL)
    result = client.wait(300)
    assert result.restarts == 1, causes(client)
    _assert_exact(table, n)


def test_stop_with_savepoint_then_resume_at_another_parallelism_continues_the_same_table(spark, tmp_path):
    n, table = 6_000, tmp_path / "table"

    def job(parallelism):
        return keyed_job(spark, tmp_path, ss.sinks.Delta(str(table)), n, uid="delta", parallelism=parallelism)

    client = job(2).execute_async("delta rescale")
    wait_status(client, "RUNNING")
    wait_completed(client, 2)
    savepoint = client.stop_with_savepoint(str(tmp_path / "savepoints"))
    client.wait(60)
    before = len(_rows(table))
    assert 0 < before < n
    job(3).execute("delta rescale", restore_from=savepoint)
    commits = _assert_exact(table, n)
    assert len({app for c in commits for app, _ in c["txns"]}) == 2   # one app id per run


def test_types_are_stored_faithfully_and_a_widening_stream_merges_its_new_column(spark, tmp_path):
    table = tmp_path / "table"
    paris = datetime.timezone(datetime.timedelta(hours=1))
    schema = pa.schema([("id", pa.int64()), ("at", pa.timestamp("ms", "Europe/Paris")), ("local", pa.timestamp("ns")),
                        ("price", pa.decimal128(12, 3)), ("tags", pa.list_(pa.string())),
                        ("point", pa.struct([("x", pa.float64()), ("seen", pa.timestamp("us", "UTC"))])),
                        ("small", pa.uint16()), ("day", pa.date32())])
    rows = [{"id": i, "at": datetime.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=paris), "local": datetime.datetime(2026, 1, 1),
             "price": decimal.Decimal(f"{i}.125"), "tags": ["a", str(i)],
             "point": {"x": i / 2, "seen": datetime.datetime(2026, 5, 1, tzinfo=datetime.timezone.utc)},
             "small": 65535, "day": datetime.date(2026, 1, i + 1)} for i in range(4)]
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    env.from_collection(rows, schema=schema).sink_to(ss.sinks.Delta(str(table), partition_by="day"), uid="delta")
    env.execute("delta types")
    dt = DeltaTable(str(table))
    fields = {f.name: json.loads(f.to_json())["type"] for f in dt.schema().fields}
    assert fields["at"] == "timestamp" and fields["local"] == "timestamp_ntz" and fields["price"] == "decimal(12,3)"
    assert fields["small"] == "integer" and fields["tags"]["type"] == "array" and fields["point"]["type"] == "struct"
    back = sorted(dt.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert [r["at"] for r in back] == [r["at"] for r in rows]          # the same instants (stored in UTC)
    assert [r["price"] for r in back] == [r["price"] for r in rows] and back[3]["tags"] == ["a", "3"]
    assert back[1]["point"]["seen"] == rows[1]["point"]["seen"] and back[0]["small"] == 65535
    assert back[2]["day"] == datetime.date(2026, 1, 3) and dt.metadata().partition_columns == ["day"]
    # A second job with one more column: refused by default, merged when asked.
    wider = [dict(r, note="n") for r in rows]
    with pytest.raises(ss.ConfigurationError, match=r"column 'note'.*schema_mode='merge'"):
        env2 = ss.StreamEnvironment(parallelism=1, spark=spark)
        env2.from_collection(wider, schema=schema.append(pa.field("note", pa.string()))).sink_to(
            ss.sinks.Delta(str(table)), uid="delta")
    env3 = ss.StreamEnvironment(parallelism=1, spark=spark)
    env3.from_collection(wider, schema=schema.append(pa.field("note", pa.string()))).sink_to(
        ss.sinks.Delta(str(table), schema_mode="merge"), uid="delta")
    env3.execute("delta merge")
    merged = DeltaTable(str(table)).to_pyarrow_table()
    assert merged.num_rows == 8 and sorted(merged.column("note").to_pylist(), key=str) == [None] * 4 + ["n"] * 4


def test_a_stream_whose_schema_shows_only_at_run_time_and_does_not_fit_the_table_fails_without_restarts(
        spark, tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"key": pa.array([1], pa.int64()), "total": pa.array(["x"]), "i": [1]}))
    env = ss.StreamEnvironment(parallelism=1, spark=spark,
                               checkpointing=ss.CheckpointConfig(interval=0.3, directory=str(tmp_path / "ckpt")),
                               restart=ss.RestartStrategy.fixed_delay(attempts=3, delay=0.0))
    # A process function's output schema is not known at build time: the first commit finds it.
    (env.from_source(ss.sources.Generator(event, count=200)).key_by("key").process(RunningSum())
        .sink_to(ss.sinks.Delta(path), uid="delta"))
    with pytest.raises(ss.JobExecutionError, match=r"(?s)without a restart.*column 'total' is \"long\" in the stream"):
        env.execute("never fits")
    assert DeltaTable(path).version() == 0


@contextlib.contextmanager
def _unwritable(directory):
    """No file can be created in `directory` meanwhile: a user's chmod, or for root (whom
    permissions do not stop) the immutable attribute."""
    as_root = os.geteuid() == 0
    if as_root:
        subprocess.run(["chattr", "+i", str(directory)], check=True)
    else:
        os.chmod(directory, 0o555)
    try:
        try:
            (directory / "probe").touch()
        except OSError:
            yield
        else:
            pytest.fail(f"{directory} could not be made unwritable")
    finally:
        if as_root:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        else:
            os.chmod(directory, 0o755)


def _empty_table(path) -> None:
    write_deltalake(str(path), pa.schema([(c, pa.int64()) for c in COLUMNS]).empty_table())


def test_a_final_commit_that_fails_fails_the_job_and_a_resume_from_its_checkpoint_commits_the_rows(
        spark, tmp_path, monkeypatch):
    """The table's log cannot be written: the commit of the final checkpoint (the only one; held
    2 s by the test hook, so the job's tasks are done when it fails) fails, and the job FAILS
    naming it and the checkpoint to resume from; resumed from it once the table can be written,
    the job commits exactly the rows."""
    n, table, markers = 400, tmp_path / "table", tmp_path / "markers"
    markers.mkdir()
    _empty_table(table)
    monkeypatch.setenv(TEST_HOOKS_ENV, json.dumps({"table_commit_dir": str(markers),
                                                   "table_commit_pause_at": 1, "table_commit_pause": 2}))
    job = keyed_job(spark, tmp_path, ss.sinks.Delta(str(table)), n, uid="delta", interval=60.0)
    with _unwritable(table / "_delta_log"):
        with pytest.raises(ss.JobExecutionError, match=r"(?s)commit (?:of checkpoint 1 )?failed.*Delta\(") as failed:
            job.execute("unwritable table")
    assert len(_rows(table)) == 0, "rows of a failed commit are visible"
    checkpoints = sorted(glob.glob(str(tmp_path / "ckpt" / "*" / "chk-*")))
    assert checkpoints, f"the failed job kept no checkpoint to resume from: {failed.value}"
    monkeypatch.delenv(TEST_HOOKS_ENV)
    keyed_job(spark, tmp_path, ss.sinks.Delta(str(table)), n, uid="delta", interval=60.0).execute(
        "resumed", restore_from=checkpoints[-1])
    _assert_exact(table, n)


def test_a_job_without_checkpoints_whose_commit_at_the_end_fails_does_not_end_finished(spark, tmp_path):
    table = tmp_path / "table"
    _empty_table(table)
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    env.from_collection([{"key": k, "total": k, "i": k} for k in range(10)]).sink_to(
        ss.sinks.Delta(str(table)), uid="delta")
    with _unwritable(table / "_delta_log"):
        with pytest.raises(ss.JobExecutionError, match=r"(?s)final table commit failed; run the job again once the "
                                                       r"table can be written.*sink Delta\(.*not in the table"):
            env.execute("unwritable, no checkpoints")
    assert DeltaTable(str(table)).version() == 0


# ===================================================================== bad input, before the job runs
def _sink_to(tmp_path, sink, rows=({"key": 1, "total": 2, "i": 3},)):
    env = ss.StreamEnvironment(parallelism=1)
    env.from_collection(list(rows)).sink_to(sink, uid="delta")
    return env


def test_a_path_holding_parquet_files_or_an_iceberg_table_or_a_file_is_refused_naming_it(tmp_path):
    parquet = tmp_path / "parquet"
    parquet.mkdir()
    (parquet / "part-0.parquet").write_bytes(b"PAR1")
    with pytest.raises(ss.ConfigurationError, match=r"not a Delta table .*1 Parquet file.*convert_to_deltalake"):
        _sink_to(tmp_path, ss.sinks.Delta(str(parquet)))
    iceberg = tmp_path / "iceberg"
    (iceberg / "metadata").mkdir(parents=True)
    (iceberg / "metadata" / "00000-a.metadata.json").write_text("{}")
    with pytest.raises(ss.ConfigurationError, match="an Apache Iceberg table"):
        _sink_to(tmp_path, ss.sinks.Delta(str(iceberg)))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ss.ConfigurationError, match="is a file, not a directory"):
        _sink_to(tmp_path, ss.sinks.Delta(str(tmp_path / "file")))


def test_a_schema_or_partitioning_that_disagrees_with_the_existing_table_is_named(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"key": pa.array([1], pa.int64()), "total": pa.array(["x"]), "i": [1]}),
                    partition_by=["key"])
    with pytest.raises(ss.ConfigurationError, match=r"column 'total' is \"long\" in the stream but \"string\""):
        _sink_to(tmp_path, ss.sinks.Delta(path))
    with pytest.raises(ss.ConfigurationError, match=r"partition_by=\['i'\] but the table is partitioned by \['key'\]"):
        _sink_to(tmp_path, ss.sinks.Delta(path, partition_by="i"), rows=[{"key": 1, "total": "y", "i": 3}])
    # The table changed between sink_to and execute(): execute() names it, before any Spark job.
    env = _sink_to(tmp_path, ss.sinks.Delta(str(tmp_path / "later")))
    write_deltalake(str(tmp_path / "later"), pa.table({"key": ["a"]}))
    with pytest.raises(ss.ConfigurationError, match=r"column 'key' is \"long\" in the stream but \"string\""):
        env.execute("never runs")


def test_bad_settings_and_types_are_named():
    with pytest.raises(ss.ConfigurationError, match="schema_mode must be one of 'error', 'merge', got 'add'"):
        ss.sinks.Delta("/tmp/t", schema_mode="add")
    with pytest.raises(ss.ConfigurationError, match="partition column 'nope' is not in the stream"):
        _sink_to(None, ss.sinks.Delta("/tmp/never-created-table", partition_by="nope"))
    with pytest.raises(ss.ConfigurationError, match="column 'big' is uint64"):
        env = ss.StreamEnvironment(parallelism=1)
        env.from_collection([{"big": 1}], schema=pa.schema([("big", pa.uint64())])).sink_to(
            ss.sinks.Delta("/tmp/never-created-table"))


def test_the_sinks_file_names_carry_its_uid_tag():
    assert file_prefix("delta") == file_prefix("delta") != file_prefix("other")
    assert re.fullmatch(r"part-[0-9a-f]{8}-", file_prefix("delta"))
