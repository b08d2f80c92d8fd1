"""count_distinct in the vectorized window aggregate on real Spark: exact per key and window
through a stop-with-savepoint resumed at another parallelism (the distinct sets restored), and
on RocksDB through a SIGKILL (the windows and sets restored: their lookup filters start over
from the restored index, the restored sets untracked)."""

from __future__ import annotations

from collections import defaultdict

import pyarrow.parquet as pq
import pytest

import streamsnap as ss
from tests.integration.support import wait_completed, wait_status
from tests.integration.test_failover import sigkill_one_subtask_and_finish

pytestmark = pytest.mark.spark

N = 6_000
RATE = 1_000


def event(i: int) -> dict:
    """100 events per second of event time, 3 keys; users repeat within and across windows."""
    return {"key": i % 3, "ts": i * 10, "user": (i * 7_919) % 37, "cheap": i % 5 == 0}


def reference(n: int) -> dict:
    groups = defaultdict(list)
    for e in map(event, range(n)):
        groups[(e["key"], e["ts"] // 1_000 * 1_000)].append(e)
    return {w: (len(m), len({e["user"] for e in m}), len({e["user"] for e in m if e["cheap"]}))
            for w, m in groups.items()}


def job(spark, tmp_path, parallelism, **options):
    env = ss.StreamEnvironment(
        parallelism=parallelism, spark=spark, auto_watermark_interval=0.05,
        checkpointing=ss.CheckpointConfig(interval=0.2, directory=str(tmp_path / "ckpt")), **options)
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(0.5).with_timestamp_assigner("ts")
    (env.from_source(ss.sources.Generator(event, count=N, rate=RATE), name="events", uid="events",
                     watermark_strategy=strategy)
        .key_by("key").window(ss.windows.TumblingEventTimeWindows.of(1))
        .aggregate_columns({"n": "count", "users": ("count_distinct", "user"),
                            "cheap_users": ("count_distinct", "user", "cheap")}, name="windows", uid="windows")
        .sink_to(ss.sinks.FileSink(str(tmp_path / "out")), name="files", uid="files"))
    return env


def test_distinct_counts_stay_exact_through_a_savepoint_resume(spark, tmp_path):
    client = job(spark, tmp_path, 2).execute_async("count distinct")
    wait_status(client, "RUNNING")
    wait_completed(client, 3)
    savepoint = client.stop_with_savepoint(str(tmp_path / "savepoints"))
    client.wait(60)
    before = pq.read_table(tmp_path / "out").num_rows
    job(spark, tmp_path, 3).execute("count distinct resumed", restore_from=savepoint)
    rows = pq.read_table(tmp_path / "out").to_pylist()
    got = {(r["key"], r["window_start"]): (r["n"], r["users"], r["cheap_users"]) for r in rows}
    assert len(got) == len(rows), "a window fired twice"
    assert 0 < before < len(rows)               # the stop fell mid-input
    assert got == reference(N)


def test_on_rocksdb_windows_and_distinct_counts_stay_exact_through_a_sigkill(spark, tmp_path):
    env = job(spark, tmp_path, 2, state_backend=ss.RocksDBConfig(),
              restart=ss.RestartStrategy.fixed_delay(attempts=1, delay=0.1))
    sigkill_one_subtask_and_finish(env, "count distinct on rocksdb, killed", seed=3)
    rows = pq.read_table(tmp_path / "out").to_pylist()
    got = {(r["key"], r["window_start"]): (r["n"], r["users"], r["cheap_users"]) for r in rows}
    assert len(got) == len(rows), "a window fired twice"
    assert got == reference(N)
