"""Sliding windows kept as slices on real Spark: exact per key and window through a
stop-with-savepoint resumed at another parallelism (the slices and each key group's progress
restored), and on RocksDB through a SIGKILL of one subtask's process (no window fires twice,
none is lost)."""

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
SIZE, SLIDE = 2_000, 500


def event(i: int) -> dict:
    """100 events per second of event time over 5 keys."""
    return {"key": i % 5, "ts": i * 10, "value": (i * 7_919) % 101}


def reference(n: int) -> dict:
    windows = defaultdict(list)
    for e in map(event, range(n)):
        last = e["ts"] // SLIDE * SLIDE
        for start in range(last, e["ts"] - SIZE, -SLIDE):
            windows[(e["key"], start)].append(e["value"])
    return {w: (len(v), sum(v), max(v)) for w, v in windows.items()}


def job(spark, tmp_path, parallelism, **options):
    env = ss.StreamEnvironment(
        parallelism=parallelism, spark=spark, auto_watermark_interval=0.05,
        checkpointing=ss.CheckpointConfig(interval=0.2, directory=str(tmp_path / "ckpt")), **options)
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(0.5).with_timestamp_assigner("ts")
    (env.from_source(ss.sources.Generator(event, count=N, rate=RATE), name="events", uid="events",
                     watermark_strategy=strategy)
        .key_by("key").window(ss.windows.SlidingEventTimeWindows.of(SIZE / 1000, SLIDE / 1000))
        .aggregate_columns({"n": "count", "total": ("sum", "value"), "top": ("max", "value")},
                           name="windows", uid="windows")
        .sink_to(ss.sinks.FileSink(str(tmp_path / "out")), name="files", uid="files"))
    return env


def windows_of(tmp_path) -> dict:
    rows = pq.read_table(tmp_path / "out").to_pylist()
    got = {(r["key"], r["window_start"]): (r["n"], r["total"], r["top"]) for r in rows}
    assert len(got) == len(rows), "a window fired twice"
    return got


def test_sliced_windows_stay_exact_through_a_savepoint_resumed_at_another_parallelism(spark, tmp_path):
    client = job(spark, tmp_path, 2).execute_async("sliced windows")
    wait_status(client, "RUNNING")
    wait_completed(client, 3)
    savepoint = client.stop_with_savepoint(str(tmp_path / "savepoints"))
    client.wait(60)
    before = pq.read_table(tmp_path / "out").num_rows
    job(spark, tmp_path, 3).execute("sliced windows resumed", restore_from=savepoint)
    got = windows_of(tmp_path)
    assert 0 < before < len(got)                # the stop fell mid-input
    assert got == reference(N)


def test_on_rocksdb_sliced_windows_stay_exact_through_a_sigkill(spark, tmp_path):
    env = job(spark, tmp_path, 2, state_backend=ss.RocksDBConfig(),
              restart=ss.RestartStrategy.fixed_delay(attempts=1, delay=0.1))
    sigkill_one_subtask_and_finish(env, "sliced windows on rocksdb, killed", seed=4)
    assert windows_of(tmp_path) == reference(N)
