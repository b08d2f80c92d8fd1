"""Exactly-once with time on real Spark (issue 11): the chaos test's shape — three SIGKILLs at
random moments, a restart budget of exactly three — on a job whose output is made by event
time: tumbling event-time windows and event-time timers over out-of-order input. The committed
output must equal a failure-free run's, which a plain-Python reference computes here.

More seeds: STREAMSNAP_EVENT_TIME_CHAOS_SEEDS=1,2,3 (the default suite runs one).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import defaultdict

import pytest

import streamsnap as ss
from streamsnap.api.environment import TEST_HOOKS_ENV
from streamsnap.time.watermarks import MAX_WATERMARK
from tests.integration import support
from tests.integration.support import wait_completed, wait_status
from tests.integration.test_event_time import read_parquet_rows
from tests.integration.test_failover import causes, wait_restarted
from tests.integration.test_windows import CountSum, WithWindow

pytestmark = pytest.mark.spark

N = 32_000               # 16 s of input at RATE: the source still runs at the third kill
RATE = 2_000
SPLITS = 4               # splits 0, 1 run ahead in event time, 2, 3 hold the watermark back
KEYS = 8                 # key k comes from split k % SPLITS only
OUT_OF_ORDER = 1_500     # ms of jitter inside a split: within the strategy's 2 s bound
WINDOW = 5_000           # ms: tumbling window size
BUCKET = 7_000           # ms: the timer function's buckets (not aligned with the windows)
SEEDS = [int(s) for s in os.environ.get("STREAMSNAP_EVENT_TIME_CHAOS_SEEDS", "11").split(",")]


def event(i: int) -> dict:
    """Out of order inside a split (bounded jitter); splits 0, 1 run at twice the event-time
    speed of 2, 3, which hold the watermark back: the keys of the fast splits have tens of
    complete windows and timers pending in every checkpoint, which only a correct restore of
    window contents and timers fires later, exactly once."""
    split, position = i % SPLITS, i // SPLITS
    step = 40 if split < 2 else 20              # ms of event time per row of the split
    jitter = (i * 7919) % OUT_OF_ORDER
    return {"key": i % KEYS, "value": i + 1, "ts": position * step + jitter}


# ---------------------------------------------------------------- plain-Python reference
def reference_windows(n: int) -> set[tuple]:
    windows = defaultdict(lambda: [0, 0])
    for i in range(n):
        e = event(i)
        w = windows[(e["key"], e["ts"] // WINDOW * WINDOW)]
        w[0] += 1
        w[1] += e["value"]
    return {(key, start, start + WINDOW, count, total) for (key, start), (count, total) in windows.items()}


def reference_timers(n: int) -> set[tuple]:
    """(key, bucket, the bucket's sum, the key's running total over its fired buckets)."""
    buckets = defaultdict(int)
    for i in range(n):
        e = event(i)
        buckets[(e["key"], e["ts"] // BUCKET * BUCKET)] += e["value"]
    rows, running = set(), defaultdict(int)
    for (key, bucket), total in sorted(buckets.items()):   # a key's timers fire in time order
        running[key] += total
        rows.add((key, bucket, total, running[key]))
    return rows


# ---------------------------------------------------------------- the job's functions
class BucketTotals(ss.KeyedProcessFunction):
    """Per-key bucket sums in keyed state; an event-time timer at a bucket's end emits the
    bucket's sum and the key's running total over all buckets fired so far. A timer lost or
    fired twice across a restore, or timer state out of step with the timers, changes the
    running totals of every later bucket of that key."""

    def open(self, ctx):
        self.sums = ctx.get_state(ss.MapStateDescriptor("sums"))
        self.running = ctx.get_state(ss.ValueStateDescriptor("running", default=0))

    def process_element(self, row, ctx):
        ts, timers = ctx.timestamp(), ctx.timer_service()
        if ts <= timers.current_watermark():   # never with this input: the reference has no late rows
            yield {"key": ctx.current_key, "bucket": -1, "sum": row["value"], "total": ts,
                   "watermark": timers.current_watermark()}
            return
        bucket = ts // BUCKET * BUCKET
        self.sums.put(bucket, (self.sums.get(bucket) or 0) + row["value"])
        timers.register_event_time_timer(bucket + BUCKET - 1)

    def on_timer(self, timestamp, ctx):
        assert ctx.time_domain() is ss.TimeDomain.EVENT_TIME
        bucket = timestamp - BUCKET + 1
        total = self.sums.get(bucket)
        running = self.running.value() + total
        self.running.update(running)
        self.sums.remove(bucket)
        yield {"key": ctx.current_key, "bucket": bucket, "sum": total, "total": running,
               "watermark": ctx.timer_service().current_watermark()}


def restored_id(client):
    restored = client.checkpoint_stats().latest_restored
    return None if restored is None else restored.checkpoint_id


def run_event_time_chaos(spark, tmp_path, monkeypatch, seed: int):
    """As test_failover.run_chaos: three SIGKILLs, each on a running attempt — a random subtask
    at a random moment, a task in its checkpoint's asynchronous phase, a sink task between the
    checkpoint's completion and its commit — with a budget of exactly three restarts. Each kill
    comes after its attempt completed a checkpoint, so every restore brings back window
    contents and timers (not an empty start)."""
    rng = random.Random(seed)
    out, ckpt, phases = tmp_path / "out", tmp_path / "ckpt", tmp_path / "phases"
    phases.mkdir()
    monkeypatch.setenv(TEST_HOOKS_ENV, json.dumps({
        "phase_dir": str(phases), "async_delay": 0.2, "notify_delay": 0.2}))
    config = ss.CheckpointConfig(interval=0.5, directory=str(ckpt), mode="exactly_once", num_retained=2)
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, auto_watermark_interval=0.05,
                               restart=ss.RestartStrategy.fixed_delay(attempts=3, delay=0.1))
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(2.0).with_timestamp_assigner("ts")
    source = ss.sources.Generator(event, count=N, rate=RATE, splits=SPLITS, batch_size=40)
    keyed = (env.from_source(source, name="events", uid="events", watermark_strategy=strategy)
             .key_by("key"))
    (keyed.window(ss.windows.TumblingEventTimeWindows.of(WINDOW / 1000))
        .aggregate(CountSum(), WithWindow(), name="windows", uid="windows")
        .sink_to(ss.sinks.FileSink(str(out / "windows"), format="parquet"), name="window-files",
                 uid="window-files"))
    (keyed.process(BucketTotals(), name="timers", uid="timers")
        .sink_to(ss.sinks.FileSink(str(out / "timers"), format="parquet"), name="timer-files",
                 uid="timer-files"))
    client = env.execute_async(f"event-time chaos seed {seed}")
    wait_status(client, "RUNNING")
    restores = []
    # 1: any subtask at a random moment
    wait_completed(client, 1)
    time.sleep(rng.uniform(0.0, 1.5))
    victim = rng.choice(client.subtasks())
    os.kill(victim.pid, signal.SIGKILL)
    wait_restarted(client, 1)
    restores.append(restored_id(client))
    # 2: a task while its checkpoint's asynchronous phase runs (window and timer state written)
    wait_completed(client, client.checkpoint_stats().counts.completed + 1)
    time.sleep(rng.uniform(0.0, 1.0))
    support.kill_in_phase(client, phases, "async", rng.choice(["events", "windows", "timers"]))
    wait_restarted(client, 2)
    restores.append(restored_id(client))
    # 3: a sink task after the checkpoint completed, before it committed (pre-commit → commit)
    time.sleep(rng.uniform(0.0, 1.0))
    support.kill_in_phase(client, phases, "commit", rng.choice(["windows", "timers"]))
    result = client.wait(180)
    restores.append(result.checkpoints.latest_restored.checkpoint_id)
    assert result.restarts == 3 and len(result.recoveries) == 3, causes(client)
    # Every failover restored a newer completed checkpoint, none started over.
    assert None not in restores and restores == sorted(set(restores)), restores
    assert support.stray_checkpoint_files(ckpt) == []
    for sink in ("windows", "timers"):
        assert not [f for f in os.listdir(out / sink) if f.startswith(".inprogress")]
    return read_parquet_rows(out / "windows"), read_parquet_rows(out / "timers")


@pytest.mark.parametrize("seed", SEEDS)
def test_event_time_chaos_windows_and_timers_equal_a_failure_free_run(spark, tmp_path, monkeypatch, seed):
    windows, timers = run_event_time_chaos(spark, tmp_path, monkeypatch, seed)

    got_windows = [(r["key"], r["start"], r["end"], r["count"], r["sum"]) for r in windows]
    expected_windows = reference_windows(N)
    assert len(got_windows) == len(set(got_windows)), "a window result was committed twice"
    assert set(got_windows) == expected_windows, (
        f"windows: missing {sorted(expected_windows - set(got_windows))[:5]}, "
        f"unexpected {sorted(set(got_windows) - expected_windows)[:5]}")

    got_timers = [(r["key"], r["bucket"], r["sum"], r["total"]) for r in timers]
    expected_timers = reference_timers(N)
    assert len(got_timers) == len(set(got_timers)), "a timer's output was committed twice"
    assert set(got_timers) == expected_timers, (
        f"timers: missing {sorted(expected_timers - set(got_timers))[:5]}, "
        f"unexpected {sorted(set(got_timers) - expected_timers)[:5]}")

    # Windows and timers fired on watermarks while the input ran, so the kills fell between
    # firings (not only at the end of input, whose watermark is the maximum).
    assert sum(1 for r in windows if r["watermark"] < MAX_WATERMARK) >= KEYS
    assert sum(1 for r in timers if r["watermark"] < MAX_WATERMARK) >= KEYS
