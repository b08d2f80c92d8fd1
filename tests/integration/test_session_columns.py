"""Vectorized session windows (`aggregate_columns` on event-time sessions) on real Spark: a
SIGKILL of a window subtask mid-input, recovered from the last checkpoint, and the output —
written exactly once by a two-phase-commit file sink — equal to a plain-Python reference of
the sessions, with the open sessions in heap and in RocksDB state."""

from __future__ import annotations

import os
import signal
from collections import defaultdict

import pytest

import streamsnap as ss
from tests.integration.support import HeldGenerator, both_backends, release, wait_completed, wait_status
from tests.integration.test_event_time import read_parquet_rows

pytestmark = pytest.mark.spark

N = 3_000
KEYS = 5
GAP_MS = 1_000


def event(i: int) -> dict:
    """A row per key every 50 ms of event time, a 2 s pause every 400 rows (each key's session
    closes there), out of order by up to 0.3 s (within the watermark's 0.5 s bound)."""
    return {"key": i % KEYS, "value": i, "ts": i * 10 + (i // 400) * 2_000 + (i * 7_919) % 300}


def reference(n: int) -> list[tuple]:
    times = defaultdict(list)
    for e in map(event, range(n)):
        times[e["key"]].append((e["ts"], e["value"]))
    out = []
    for key, rows in times.items():
        rows.sort()
        session = [rows[0]]
        for row in rows[1:] + [None]:
            if row is None or row[0] > session[-1][0] + GAP_MS:
                values = [v for _, v in session]
                out.append((key, session[0][0], session[-1][0] + GAP_MS, len(values), sum(values),
                            min(values), max(values)))
                session = []
            if row is not None:
                session.append(row)
    return sorted(out)


@both_backends
def test_sessions_survive_a_sigkill_exactly_once(spark, tmp_path, state_backend):
    out = tmp_path / "out"
    env = ss.StreamEnvironment(
        parallelism=2, spark=spark, auto_watermark_interval=0.05, state_backend=state_backend,
        checkpointing=ss.CheckpointConfig(interval=0.3, mode="exactly_once", directory=str(tmp_path / "ckpt")),
        restart=ss.RestartStrategy.fixed_delay(attempts=2, delay=0.1))
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(0.5).with_timestamp_assigner("ts")
    # The splits hold at 80 % of the input until the kill: on a slow machine it cannot end first.
    source = HeldGenerator(event, count=N, rate=1_000, splits=2, batch_size=50, gate=tmp_path / "gate",
                           hold_at=N // 2 * 4 // 5)
    (env.from_source(source, name="events", uid="events", watermark_strategy=strategy)
        .key_by("key").window(ss.windows.EventTimeSessionWindows.with_gap(GAP_MS / 1000))
        .aggregate_columns({"n": "count", "total": ("sum", "value"), "low": ("min", "value"),
                            "high": ("max", "value")}, name="sessions", uid="sessions")
        .sink_to(ss.sinks.FileSink(str(out), format="parquet"), name="files", uid="files"))
    client = env.execute_async("sessions with a kill")
    wait_status(client, "RUNNING")
    wait_completed(client, 2)
    victim = next(s for s in client.subtasks() if s.vertex.startswith("sessions"))
    os.kill(victim.pid, signal.SIGKILL)
    release(tmp_path / "gate")
    result = client.wait(120)
    assert result.restarts == 1
    rows = read_parquet_rows(out)
    got = sorted((r["key"], r["window_start"], r["window_end"], r["n"], r["total"], r["low"], r["high"])
                 for r in rows)
    assert got == reference(N)                     # each session once, with all its rows
    assert len(got) >= 7 * KEYS
