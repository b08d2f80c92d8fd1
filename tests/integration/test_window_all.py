"""window_all on real Spark: the local/global window aggregate and the window Top-N over the
whole stream, with the global stage's process SIGKILLed mid-input — restored from the last
checkpoint, every window emitted exactly once (two-phase-commit file sinks) and equal to a
plain-Python reference."""

from __future__ import annotations

import os
import signal
from collections import defaultdict

import pyarrow.parquet as pq
import pytest

import streamsnap as ss
from tests.integration.support import wait_completed, wait_status

pytestmark = pytest.mark.spark

N = 4_500
RATE = 1_500


def event(i: int) -> dict:
    """100 events per second of event time; prices repeat, so windows have ties at the top."""
    return {"ts": i * 10, "price": (i * 7_919) % 50, "i": i}


def reference(n: int):
    windows = defaultdict(list)
    for e in map(event, range(n)):
        windows[e["ts"] // 1_000 * 1_000].append(e)
    sums = {s: (len(m), sum(e["price"] for e in m), max(e["price"] for e in m)) for s, m in windows.items()}
    top = sorted((s, e["i"]) for s, m in windows.items() for e in m if e["price"] == max(x["price"] for x in m))
    return sums, top


def test_window_all_is_exactly_once_through_a_sigkill(spark, tmp_path):
    env = ss.StreamEnvironment(
        parallelism=2, spark=spark, auto_watermark_interval=0.05,
        checkpointing=ss.CheckpointConfig(interval=0.3, directory=str(tmp_path / "ckpt")),
        restart=ss.RestartStrategy.fixed_delay(attempts=2, delay=0.1))
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(0.5).with_timestamp_assigner("ts")
    stream = env.from_source(ss.sources.Generator(event, count=N, rate=RATE), name="events", uid="events",
                             watermark_strategy=strategy)
    windows = stream.window_all(ss.windows.TumblingEventTimeWindows.of(1))
    (windows.aggregate_columns({"n": "count", "total": ("sum", "price"), "high": ("max", "price")},
                               name="totals", uid="totals")
        .sink_to(ss.sinks.FileSink(str(tmp_path / "totals")), name="totals out", uid="totals-out"))
    (windows.top_n(1, by="price", name="top", uid="top")
        .sink_to(ss.sinks.FileSink(str(tmp_path / "top")), name="top out", uid="top-out"))
    client = env.execute_async("window_all with a kill")
    wait_status(client, "RUNNING")
    wait_completed(client, 2)
    victim = next(s for s in client.subtasks() if s.vertex.startswith("totals") and "local" not in s.vertex)
    assert victim.state == "RUNNING"
    os.kill(victim.pid, signal.SIGKILL)
    result = client.wait(180)
    assert result.restarts == 1

    sums, top = reference(N)
    rows = pq.read_table(tmp_path / "totals").to_pylist()
    got = {r["window_start"]: (r["n"], r["total"], r["high"]) for r in rows}
    assert len(got) == len(rows), "a window was emitted twice"
    assert got == sums
    ranked = pq.read_table(tmp_path / "top").to_pylist()
    assert sorted((r["window_start"], r["i"]) for r in ranked) == top
    assert {r["rank"] for r in ranked} == {1} and len(top) > len(sums)     # ties all kept
