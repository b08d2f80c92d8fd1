"""Event time on real Spark: in-band watermarks, timers, side outputs, failover, drain."""

from __future__ import annotations

import os
import signal
from collections import defaultdict

import numpy as np
import pytest

import streamsnap as ss
from streamsnap.time.watermarks import MAX_WATERMARK
from tests.integration.support import HeldGenerator, both_backends, release, wait_completed, wait_held, wait_status

pytestmark = pytest.mark.spark

BUCKET = 10_000          # ms
KEYS = 5
SPLITS = 4               # splits 0, 1 are fast in event time, 2, 3 slow
OUT_OF_ORDER = 1_500     # ms of jitter: within the strategy's bound


def event(i: int) -> dict:
    split, position = i % SPLITS, i // SPLITS
    step = 40 if split < 2 else 20          # ms of event time per row of the split
    jitter = (i * 7919) % OUT_OF_ORDER      # out of order inside the split, bounded
    return {"key": i % KEYS, "value": i, "ts": position * step + jitter}


def reference_buckets(n: int) -> dict:
    sums = defaultdict(int)
    for i in range(n):
        e = event(i)
        sums[(e["key"], e["ts"] // BUCKET * BUCKET)] += e["value"]
    return dict(sums)


class BucketSums(ss.KeyedProcessFunction):
    """Buffers per-bucket sums in keyed state; an event-time timer at the bucket's end emits it.

    A row at or behind the watermark is late: it is reported, so the test can see a bucket that
    fired before all its rows were in.
    """

    def open(self, ctx):
        self.sums = ctx.get_state(ss.MapStateDescriptor("sums"))

    def process_element(self, row, ctx):
        ts = ctx.timestamp()
        timers = ctx.timer_service()
        if ts <= timers.current_watermark():
            yield {"kind": "late", "key": ctx.current_key, "bucket": ts, "sum": row["value"],
                   "watermark": timers.current_watermark()}
            return
        bucket = ts // BUCKET * BUCKET
        self.sums.put(bucket, (self.sums.get(bucket) or 0) + row["value"])
        timers.register_event_time_timer(bucket + BUCKET - 1)

    def on_timer(self, timestamp, ctx):
        assert ctx.time_domain() is ss.TimeDomain.EVENT_TIME and ctx.timestamp() == timestamp
        bucket = timestamp - BUCKET + 1
        yield {"kind": "bucket", "key": ctx.current_key, "bucket": bucket, "sum": self.sums.get(bucket),
               "watermark": ctx.timer_service().current_watermark()}
        self.sums.remove(bucket)


class BatchBucketSums(ss.KeyedBatchFunction):
    """BucketSums vectorized: per-key bucket sums in one ValueState dict, one event-time timer
    per key and batch (its newest bucket's end) that emits every bucket it closes."""

    def open(self, ctx):
        self.sums = ctx.get_state(ss.ValueStateDescriptor("sums"))
        self.timers = ctx.timer_service()

    def process_batch(self, batch, keys):
        buckets = batch.column("ts").to_numpy() // BUCKET * BUCKET
        states = [dict(s or {}) for s in self.sums.get_many(keys)]
        for i, b, v in zip(keys.index.tolist(), buckets.tolist(), batch.column("value").to_pylist()):
            states[i][b] = states[i].get(b, 0) + v
        self.sums.put_many(keys, states)
        newest = np.full(len(keys), -1, dtype=np.int64)
        np.maximum.at(newest, keys.index, buckets)
        self.timers.register_event_time_timers(keys, newest + BUCKET - 1)

    def on_timers(self, timers, ctx):
        out = {"key": [], "bucket": [], "sum": []}
        kept = []
        for key, at, state in zip(timers.keys.unique, timers.timestamps.tolist(), self.sums.get_many(timers.keys)):
            state = dict(state or {})
            for b in sorted(b for b in state if b + BUCKET - 1 <= at):
                out["key"].append(key), out["bucket"].append(b), out["sum"].append(state.pop(b))
            kept.append(state or None)
        self.sums.put_many(timers.keys, kept)
        return out if out["key"] else None


def bucket_pipeline(env, n, rate, *, parallelism=None, sink=None, batch_sink=None, gate=None, hold_at=None):
    """With a `gate`, the source's splits hold before their row `hold_at` (HeldGenerator)."""
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(2.0).with_timestamp_assigner("ts")
    source = (ss.sources.Generator(event, count=n, rate=rate, splits=SPLITS, batch_size=40) if gate is None else
              HeldGenerator(event, count=n, rate=rate, splits=SPLITS, batch_size=40, gate=gate, hold_at=hold_at))
    keyed = (env.from_source(source, name="events", uid="events", watermark_strategy=strategy, parallelism=parallelism)
             .key_by("key"))
    (keyed.process(BucketSums(), name="buckets", uid="buckets", parallelism=parallelism)
        .sink_to(sink or ss.sinks.Collect(), name="out", uid="out", parallelism=parallelism))
    if batch_sink is not None:
        (keyed.process_batches(BatchBucketSums(), name="batch buckets", uid="batch-buckets", parallelism=parallelism)
            .sink_to(batch_sink, name="batch out", uid="batch-out", parallelism=parallelism))


def assert_exact_buckets(rows, n):
    late = [r for r in rows if r["kind"] == "late"]
    assert not late, f"{len(late)} late rows, e.g. {late[:3]}"
    fired = [(r["key"], r["bucket"]) for r in rows]
    assert len(fired) == len(set(fired)), "a bucket fired twice"
    assert {(r["key"], r["bucket"]): r["sum"] for r in rows} == reference_buckets(n)


def test_out_of_order_buckets_from_event_time_timers_equal_a_reference(spark):
    n = 4000
    env = ss.StreamEnvironment(parallelism=2, spark=spark, auto_watermark_interval=0.05)
    bucket_pipeline(env, n, rate=2500, batch_sink=ss.sinks.Collect())
    result = env.execute("event-time buckets")
    rows = result.rows("out")
    assert_exact_buckets(rows, n)
    # The same buckets from a KeyedBatchFunction's batch timers (on_timers).
    batch_rows = result.rows("batch out")
    fired = [(r["key"], r["bucket"]) for r in batch_rows]
    assert len(fired) == len(set(fired)) and {f: r["sum"] for f, r in zip(fired, batch_rows)} == reference_buckets(n)
    # Buckets fired while the input ran (watermarks, not only the end of input's MAX): the
    # slow splits held the watermark back, so nothing fired early and nothing was late.
    assert sum(1 for r in rows if r["watermark"] < MAX_WATERMARK) >= KEYS
    assert any(r["watermark"] == MAX_WATERMARK for r in rows)   # the tail fired at the end


AFTER = ss.OutputTag("after")


class TimerAt5000(ss.KeyedProcessFunction):
    """Every row up to 5 s registers the same timer; later rows go to a side output."""

    def open(self, ctx):
        self.seen = ctx.get_state(ss.ValueStateDescriptor("seen", default=0))

    def process_element(self, row, ctx):
        if ctx.timestamp() <= 5000:
            self.seen.update(self.seen.value() + 1)
            ctx.timer_service().register_event_time_timer(5000)
        else:
            ctx.output(AFTER, {"key": ctx.current_key, "ts": ctx.timestamp()})

    def on_timer(self, timestamp, ctx):
        yield {"key": ctx.current_key, "ts": ctx.timestamp(), "domain": ctx.time_domain().value,
               "seen": self.seen.value()}


def test_an_event_time_timer_fires_once_and_side_outputs_are_streams(spark):
    rows = [{"key": k, "ts": t} for t in range(0, 10_000, 500) for k in range(3)]
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    timed = (env.from_collection(rows).assign_timestamps_and_watermarks(strategy)
             .key_by("key").process(TimerAt5000(), name="timer"))
    timed.sink_to(ss.sinks.Collect(), name="fired")
    timed.get_side_output(AFTER).key_by("key").process(Count(), name="count").sink_to(
        ss.sinks.Collect(), name="after")
    result = env.execute("timer once")
    fired = sorted((r["key"], r["ts"], r["domain"], r["seen"]) for r in result.rows("fired"))
    # Once per key, although registered 11 times, and only after all its rows up to 5 s arrived.
    assert fired == [(k, 5000, "event_time", 11) for k in range(3)]
    after = result.rows("after")
    assert {(r["key"], r["count"]) for r in after} == {(k, c) for k in range(3) for c in range(1, 10)}


class Count(ss.KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ss.ValueStateDescriptor("count", default=0))

    def process_element(self, row, ctx):
        self.count.update(self.count.value() + 1)
        yield {"key": ctx.current_key, "count": self.count.value()}


class ProcessingTimeTimer(ss.KeyedProcessFunction):
    def open(self, ctx):
        self.scheduled = ctx.get_state(ss.ValueStateDescriptor("scheduled"))

    def process_element(self, row, ctx):
        if self.scheduled.value() is None:
            at = ctx.timer_service().current_processing_time() + 100
            self.scheduled.update(at)
            ctx.timer_service().register_processing_time_timer(at)
        assert ctx.timestamp() is None   # no timestamps on this stream

    def on_timer(self, timestamp, ctx):
        yield {"key": ctx.current_key, "scheduled": timestamp, "domain": ctx.time_domain().value,
               "fired_at": ctx.timer_service().current_processing_time()}


def test_a_processing_time_timer_fires_from_the_mailbox(spark):
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    (env.from_source(ss.sources.Generator(lambda i: {"key": i % 3}, count=60, rate=40), name="slow")
        .key_by("key").process(ProcessingTimeTimer()).sink_to(ss.sinks.Collect()))
    rows = env.execute("processing-time timer").rows()
    assert sorted(r["key"] for r in rows) == [0, 1, 2]
    for r in rows:
        assert r["domain"] == "processing_time" and r["scheduled"] <= r["fired_at"] < r["scheduled"] + 1000


def read_parquet_rows(path) -> list[dict]:
    import glob

    import pyarrow.parquet as pq

    rows = []
    for f in sorted(glob.glob(os.path.join(str(path), "part-*.parquet"))):
        rows.extend(pq.read_table(f).to_pylist())
    return rows


def test_timers_survive_a_sigkill_failover_exactly_once(spark, tmp_path):
    n = 4000
    out = tmp_path / "out"
    env = ss.StreamEnvironment(
        parallelism=2, spark=spark, auto_watermark_interval=0.05,
        checkpointing=ss.CheckpointConfig(interval=0.3, directory=str(tmp_path / "ckpt")),
        restart=ss.RestartStrategy.fixed_delay(attempts=2, delay=0.1))
    # The splits hold at 80% of the input until the kill: on a slow machine it cannot end first.
    bucket_pipeline(env, n, rate=1000, sink=ss.sinks.FileSink(str(out), format="parquet"), gate=tmp_path / "gate",
                    hold_at=n // SPLITS * 4 // 5)
    client = env.execute_async("buckets with a kill")
    wait_status(client, "RUNNING")
    wait_completed(client, 2)
    victim = next(s for s in client.subtasks() if s.vertex.startswith("buckets"))
    os.kill(victim.pid, signal.SIGKILL)
    release(tmp_path / "gate")
    result = client.wait(120)
    assert result.restarts == 1
    assert_exact_buckets(read_parquet_rows(out), n)


@both_backends
def test_a_savepoint_restored_at_another_parallelism_keeps_pending_timers(spark, tmp_path, state_backend):
    n = 6000
    config = ss.CheckpointConfig(interval=None, directory=str(tmp_path / "ckpt"))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, state_backend=state_backend, auto_watermark_interval=0.05)
    # The splits hold at row 1000 of 1500: the slow ones at ~20 s of event time, the first buckets fired.
    bucket_pipeline(env, n, rate=1500, gate=tmp_path / "gate", hold_at=1000)
    client = env.execute_async("buckets, first part")
    wait_held(tmp_path / "gate", SPLITS, client)
    savepoint = client.stop_with_savepoint(str(tmp_path / "savepoints"))   # no drain: timers stay
    first = client.wait(10).rows()
    assert 0 < len(first) < len(reference_buckets(n))

    env2 = ss.StreamEnvironment(parallelism=3, spark=spark, checkpointing=config, state_backend=state_backend, auto_watermark_interval=0.05)
    bucket_pipeline(env2, n, rate=None)
    second = env2.execute("buckets, restored at parallelism 3", restore_from=savepoint).rows()
    # Buckets half-summed before the savepoint fire after the restore with their whole sums:
    # their state and pending timers moved to the new subtasks with their key groups.
    assert_exact_buckets(first + second, n)


def test_a_draining_stop_fires_every_timer_into_the_savepoint(spark, tmp_path):
    n = 6000
    out = tmp_path / "out"
    config = ss.CheckpointConfig(interval=None, directory=str(tmp_path / "ckpt"))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, auto_watermark_interval=0.05)
    bucket_pipeline(env, n, rate=1500, sink=ss.sinks.FileSink(str(out), format="parquet"), gate=tmp_path / "gate",
                    hold_at=1000)
    client = env.execute_async("buckets, drained")
    wait_held(tmp_path / "gate", SPLITS, client)
    savepoint = client.stop_with_savepoint(str(tmp_path / "savepoints"), drain=True)
    first = read_parquet_rows(out)      # committed by the savepoint (two-phase commit)
    assert any(r["watermark"] == MAX_WATERMARK for r in first), "the drain fired no timer"

    env2 = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, auto_watermark_interval=0.05)
    bucket_pipeline(env2, n, rate=None, sink=ss.sinks.FileSink(str(out), format="parquet"))
    env2.execute("buckets after the drain", restore_from=savepoint)
    rows = read_parquet_rows(out)
    assert not [r for r in rows if r["kind"] == "late"]
    # Every row counted once: a bucket the drain cut in two fired twice, with parts summing up.
    totals = defaultdict(int)
    for r in rows:
        totals[(r["key"], r["bucket"])] += r["sum"]
    assert dict(totals) == reference_buckets(n)
    drained = {(r["key"], r["bucket"]) for r in first}
    assert all(r["watermark"] < MAX_WATERMARK or (r["key"], r["bucket"]) in drained for r in first)


def test_bad_timestamps_fail_at_build_or_name_operator_field_and_row(spark):
    env = ss.StreamEnvironment(parallelism=1, spark=spark)
    source = ss.sources.Generator(lambda i: {"key": 1, "ts": i}, count=10)
    with pytest.raises(ss.ConfigurationError, match="watermark_strategy must be an ss.WatermarkStrategy"):
        env.from_source(source, watermark_strategy="ts")
    with pytest.raises(ss.ConfigurationError, match="timestamp column 'time' is not in the stream's schema"):
        env.from_source(source, watermark_strategy=ss.WatermarkStrategy.for_monotonous_timestamps()
                        .with_timestamp_assigner("time"))
    with pytest.raises(ss.ConfigurationError, match="has no timestamp assigner"):
        env.from_source(source, watermark_strategy=ss.WatermarkStrategy.for_monotonous_timestamps())
    with pytest.raises(ss.ConfigurationError, match="need a keyed stream"):
        env.from_source(source).process(TimerAt5000())

    # At run time: row 3 lacks the field (the schema, sampled from row 0, has it).
    def row(i):
        return {"key": 1, "ts": i} if i != 3 else {"key": 1, "other": i}

    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    env = ss.StreamEnvironment(parallelism=1, spark=spark)
    (env.from_source(ss.sources.Generator(row, count=10), name="events", watermark_strategy=strategy)
        .sink_to(ss.sinks.Collect()))
    with pytest.raises(ss.JobExecutionError) as failure:
        env.execute("missing timestamps")
    text = f"{failure.value} {failure.value.cause}"
    assert "operator 'Source: events'" in text and "'ts'" in text and "split 0 of 1, offset 3" in text and "'other': 3" in text
