"""A keyed window aggregate in two phases (runtime/operators/local_windows.py) on real Spark:
its state is the one-phase operator's under the same uid, so a savepoint taken by either
restores into the other, every window coming out once with all its rows."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.runtime.operators import local_windows
from tests.integration.support import HeldGenerator, wait_held, wait_status

pytestmark = pytest.mark.spark

N, KEYS, SPLITS = 8_000, 7, 2
SCHEMA = pa.schema([("ts", pa.int64()), ("k", pa.int64()), ("v", pa.int64())])


def event(i: int) -> dict:
    return {"ts": i * 10 + i // 1000 * 5_000, "k": i % KEYS, "v": i}    # (a 5 s pause every 1,000 rows)


def build(env, source, assigner):
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(0).with_timestamp_assigner("ts")
    (env.from_source(source, name="events", uid="events", watermark_strategy=strategy)
        .key_by("k").window(assigner)
        .aggregate_columns({"n": "count", "total": ("sum", "v")}, name="windows")
        .sink_to(ss.sinks.Collect(), name="out", uid="out"))
    return {n.name for n in env._graph.nodes.values()}


def expected(sessions: bool) -> Counter:
    """(key, window start, rows, total) of every window: 1 s tumbling ones, or sessions of 1 s
    gap (a new one where a key's next row comes more than the gap after its last)."""
    totals: dict = {}
    last: dict = {}
    for i in range(N):
        e = event(i)
        if sessions:
            start = e["ts"] if e["ts"] - last.get(e["k"], (None, -10**9))[1] > 1_000 else last[e["k"]][0]
            last[e["k"]] = (start, e["ts"])
        else:
            start = e["ts"] // 1000 * 1000
        n, total = totals.get((e["k"], start), (0, 0))
        totals[(e["k"], start)] = (n + 1, total + i)
    return Counter((k, start, n, total) for (k, start), (n, total) in totals.items())


@pytest.mark.parametrize("sessions", [False, True], ids=["tumbling", "sessions"])
@pytest.mark.parametrize("first_splits", [False, True], ids=["one-phase-then-two", "two-phases-then-one"])
def test_a_savepoint_of_either_phase_count_restores_into_the_other(spark, tmp_path, monkeypatch, first_splits,
                                                                   sessions):
    assigner = ss.windows.EventTimeSessionWindows.with_gap(1) if sessions else \
        ss.windows.TumblingEventTimeWindows.of(1)
    real = local_windows.splits

    def phases(split: bool):
        monkeypatch.setattr(local_windows, "splits", real if split else (lambda *a: False))

    def environment():
        return ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=ss.CheckpointConfig(
            interval=0.5, directory=str(tmp_path / "ckpt")))

    phases(first_splits)
    env = environment()
    assert ("windows (local)" in build(env, HeldGenerator(event, count=N, rate=8000, splits=SPLITS, schema=SCHEMA,
                                                          gate=tmp_path / "gate", hold_at=N // SPLITS // 2),
                                       assigner)) \
        is first_splits
    client = env.execute_async("first")
    wait_status(client, "RUNNING")
    wait_held(tmp_path / "gate", SPLITS, client)
    savepoint = client.stop_with_savepoint(str(tmp_path / "savepoints"))
    before = client.wait(10).rows()

    phases(not first_splits)
    env = environment()
    assert ("windows (local)" in build(env, ss.sources.Generator(event, count=N, splits=SPLITS, schema=SCHEMA),
                                       assigner)) \
        is not first_splits
    after = env.execute("second", restore_from=savepoint).rows()
    got = Counter((r["k"], r["window_start"], r["n"], r["total"]) for r in before + after)
    assert got == expected(sessions)      # every window once, with all its rows: none lost, none twice
    assert before and after
