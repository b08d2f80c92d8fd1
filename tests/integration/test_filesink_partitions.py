"""FileSink partition_by on real Spark: Hive-style directories, exactly-once through a SIGKILL
and a stop-with-savepoint resumed at another parallelism, read back with pyarrow.dataset."""

from __future__ import annotations

import os
import signal

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

import streamsnap as ss
from tests.integration import test_failover as failover
from tests.integration.support import RunningSum, wait_completed, wait_status

pytestmark = pytest.mark.spark

RATE = 2_000
PARTITIONS = ds.partitioning(pa.schema([("bucket", pa.string()), ("hm", pa.string())]), flavor="hive")


def event(i: int) -> dict:
    e = failover.event(i)
    return {**e, "bucket": f"b{e['key'] % 3}", "hm": f"10:0{i % 2}"}


def job(spark, tmp_path, n, parallelism=2):
    env = ss.StreamEnvironment(
        parallelism=parallelism, spark=spark,
        checkpointing=ss.CheckpointConfig(interval=0.2, directory=str(tmp_path / "ckpt")),
        restart=ss.RestartStrategy.fixed_delay(attempts=1, delay=0.1))
    (env.from_source(ss.sources.Generator(event, count=n, rate=RATE), name="events", uid="events")
        .key_by("key").process(RunningSum(carry=("i", "bucket", "hm")), name="sum", uid="sum")
        .sink_to(ss.sinks.FileSink(str(tmp_path / "out"), partition_by=["bucket", "hm"]), name="files", uid="files"))
    return env


def written(out) -> list[tuple]:
    rows = ds.dataset(str(out), format="parquet", partitioning=PARTITIONS).to_table().to_pylist()
    assert all(r["bucket"] == f"b{r['key'] % 3}" and r["hm"] == f"10:0{r['i'] % 2}" for r in rows)
    return [(r["key"], r["total"], r["i"]) for r in rows]


def test_partitioned_output_stays_exact_through_a_kill_and_a_savepoint_resume(spark, tmp_path):
    n, out = 6 * RATE, tmp_path / "out"
    client = job(spark, tmp_path, n).execute_async("partitioned kill")
    wait_status(client, "RUNNING")
    wait_completed(client, 3)
    victim = next(s for s in client.subtasks() if s.vertex.startswith("sum") and s.index == 0)
    os.kill(victim.pid, signal.SIGKILL)
    failover.wait_restarted(client, 1)
    wait_completed(client, client.checkpoint_stats().counts.completed + 2)
    savepoint = client.stop_with_savepoint(str(tmp_path / "savepoints"))
    assert client.wait(60).restarts == 1
    before = written(out)
    assert len(before) == len(set(before)) and 0 < len(before) < n
    # six directories, files without the partition columns, nothing left hidden
    assert sorted(os.listdir(out)) == ["bucket=b0", "bucket=b1", "bucket=b2"]
    assert sorted(os.listdir(out / "bucket=b0")) == ["hm=10%3A00", "hm=10%3A01"]
    a_file = next(f for f in ds.dataset(str(out), format="parquet").files)
    assert ds.dataset(a_file, format="parquet").schema.names == ["key", "total", "i"]
    job(spark, tmp_path, n, parallelism=3).execute("partitioned resumed", restore_from=savepoint)
    rows = written(out)
    assert len(rows) == len(set(rows)), "duplicated rows"
    assert set(rows) == failover.expected_rows(n)
    assert not [f for _, _, names in os.walk(out) for f in names if f.startswith(".")]
