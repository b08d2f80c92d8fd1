"""Kafka → keyed running sum → Kafka on real Spark, against a real broker (scripts/kafka-broker)."""

from __future__ import annotations

import json
import os
import random
import signal
import time
import uuid

import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.api.environment import TEST_HOOKS_ENV
from benchmarks import local_kafka
from tests.integration.support import checkpoint_dirs, wait_completed, wait_status
from tests.integration.test_failover import RunningSum, causes, event, expected_rows, three_kills

pytestmark = pytest.mark.spark

N = 24_000


class SlowSum(RunningSum):
    """The running sum, slowed to ~8 s of work per subtask, so that all three kills land before it ends."""

    def process_element(self, row, ctx):
        if row["i"] % 3 == 0:
            time.sleep(0.002)
        yield from super().process_element(row, ctx)


def topics(bootstrap: str, partitions: int = 2) -> tuple[str, str]:
    """A fresh input topic holding the N events (keyed: a key's rows share a partition, in
    order, so every run computes the same running sums as `expected_rows`) and a fresh output topic."""
    name = uuid.uuid4().hex[:8]
    source, sink = f"in-{name}", f"out-{name}"
    local_kafka.create_topic(bootstrap, source, partitions)
    local_kafka.create_topic(bootstrap, sink, partitions)
    local_kafka.produce_json(bootstrap, source, [event(i) for i in range(N)], key="key")
    return source, sink


def output_rows(bootstrap: str, topic: str) -> list[tuple]:
    return to_rows(local_kafka.read_committed(bootstrap, topic, 2))


def to_rows(messages) -> list[tuple]:
    return [(r["key"], r["total"], r["i"]) for r in (json.loads(v) for _, _, v in messages)]


def job(spark, bootstrap, source, sink, tmp_path, mode="exactly_once", semantic="exactly_once", attempts=3,
        prefix=None, retention="delete_on_cancellation", interval=0.5, producer="librdkafka"):
    config = ss.CheckpointConfig(interval=interval, directory=str(tmp_path / "ckpt"), mode=mode, num_retained=2,
                                 retention=retention)
    # The source reads far ahead of the slow sum: small batches and few in flight keep the data
    # a barrier waits behind short, so checkpoints (and commits) keep completing.
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               restart=ss.RestartStrategy.fixed_delay(attempts=attempts, delay=0.1),
                               network=ss.NetworkConfig(batch_size=256, credits=2, output_queue_frames=2))
    (env.from_source(ss.sources.Kafka(bootstrap, [source], stop_at="latest", batch_size=256), name="events",
                     uid="events")
        .key_by("key").process(SlowSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.Kafka(bootstrap, sink, key="key", semantic=semantic, transactional_id_prefix=prefix,
                                producer=producer), name="kafka", uid="kafka"))
    return env


@pytest.mark.parametrize("producer", ["librdkafka", "columnar"])
def test_chaos_exactly_once_read_committed_sees_the_failure_free_output(spark, kafka_broker, tmp_path, monkeypatch,
                                                                         producer):
    rng = random.Random(7)
    source, sink = topics(kafka_broker)
    phases = tmp_path / "phases"
    phases.mkdir()
    monkeypatch.setenv(TEST_HOOKS_ENV, json.dumps({"phase_dir": str(phases), "async_delay": 0.2,
                                                   "notify_delay": 0.2}))
    client = job(spark, kafka_broker, source, sink, tmp_path, producer=producer).execute_async("kafka chaos")
    # The third kill lands between a completed checkpoint and its commit: the restored job must
    # commit that checkpoint's transaction itself (EndTxn with the stored producer id and epoch).
    three_kills(client, rng, str(phases), first_within=2.5, then_within=1.5)
    result = client.wait(240)
    assert result.restarts == 3, causes(client)
    rows = output_rows(kafka_broker, sink)
    expected = expected_rows(N)
    assert len(rows) == len(set(rows)), f"{len(rows) - len(set(rows))} duplicates for read_committed"
    assert set(rows) == expected, f"missing {len(expected - set(rows))}, unexpected {len(set(rows) - expected)}"


def test_chaos_at_least_once_loses_nothing(spark, kafka_broker, tmp_path):
    source, sink = topics(kafka_broker)
    client = job(spark, kafka_broker, source, sink, tmp_path, mode="at_least_once",
                 semantic="at_least_once").execute_async("kafka at least once")
    wait_status(client, "RUNNING")
    time.sleep(2.0)
    os.kill(random.Random(3).choice(client.subtasks()).pid, signal.SIGKILL)
    result = client.wait(240)
    assert result.restarts == 1, causes(client)
    assert {i for _, _, i in output_rows(kafka_broker, sink)} == set(range(N))


@pytest.mark.parametrize("producer", ["librdkafka", "columnar"])
def test_a_second_run_restored_from_a_cancelled_runs_checkpoint_ends_its_transactions(spark, kafka_broker, tmp_path,
                                                                                      producer):
    """Two execute() calls under one transactional-id prefix: the first Spark job is cancelled
    mid-transaction (its tasks die with transactions open), the second restores its latest
    checkpoint. The second commits what that checkpoint pre-committed and fences the first's
    transactional ids, which aborts the rest: no transaction stays open and a read_committed
    reader sees every row once."""
    source, sink = topics(kafka_broker)
    prefix = f"twice-{sink}"
    # No periodic checkpoints: two triggered ones, then nothing commits, so the transactions the
    # cancel leaves open cannot race a commit (cancelling right after a commit could find none open).
    first = job(spark, kafka_broker, source, sink, tmp_path, prefix=prefix, retention="retain_on_cancellation",
                attempts=0, interval=None, producer=producer).execute_async("kafka first run")
    wait_status(first, "RUNNING")
    first.trigger_checkpoint()
    first.trigger_checkpoint()
    time.sleep(0.5)  # the second checkpoint's commits land; the next transactions take rows
    deadline = time.monotonic() + 30
    while not local_kafka.read_log(kafka_broker, sink, 2)[1]:
        assert time.monotonic() < deadline, "no transaction of the first run reached the broker"
        time.sleep(0.1)
    first.cancel()
    _, left_open = local_kafka.read_log(kafka_broker, sink, 2)
    assert left_open, "the first run should have been cancelled with a transaction open"
    latest = checkpoint_dirs(tmp_path / "ckpt" / first.job_id)[-1]
    result = job(spark, kafka_broker, source, sink, tmp_path, prefix=prefix, producer=producer).execute(
        "kafka second run", restore_from=str(latest))
    assert result.restarts == 0
    rows, still_open = local_kafka.read_log(kafka_broker, sink, 2)
    assert still_open == {}, f"transactions of the first run left open: {still_open} (were {left_open})"
    rows = to_rows(rows)
    assert len(rows) == len(set(rows)), f"{len(rows) - len(set(rows))} duplicates for read_committed"
    assert set(rows) == expected_rows(N)


def test_an_unreachable_broker_or_a_missing_topic_fails_at_execute_naming_it(spark, kafka_broker, tmp_path):
    def pipeline(source, sink):
        env = ss.StreamEnvironment(parallelism=1, spark=spark,
                                   checkpointing=ss.CheckpointConfig(interval=1.0, directory=str(tmp_path / "c")))
        env.from_source(source, name="events").sink_to(sink, name="out")
        return env

    dead = "127.0.0.1:1"
    with pytest.raises(ss.PreflightError, match="127.0.0.1:1.*did not answer"):
        pipeline(ss.sources.Kafka(dead, ["t"], preflight_timeout=2.0), ss.sinks.Collect()).execute("no broker")
    with pytest.raises(ss.PreflightError, match="'no-such-topic' do not exist"):
        pipeline(ss.sources.Kafka(kafka_broker, ["no-such-topic"]), ss.sinks.Collect()).execute("no topic")
    source, _ = topics(kafka_broker, 1)
    with pytest.raises(ss.PreflightError, match="sink 'out'.*'missing-out' do not exist"):
        pipeline(ss.sources.Kafka(kafka_broker, [source], stop_at="latest"),
                 ss.sinks.Kafka(kafka_broker, "missing-out")).execute("no sink topic")


def test_a_poison_message_fails_the_job_at_once_naming_its_offset(spark, kafka_broker, tmp_path):
    source, _ = topics(kafka_broker, 1)                               # N good events at offsets 0..N-1
    local_kafka.produce_json(kafka_broker, source, [{"key": 1, "value": 1, "i": "not a number"}], partition=0)
    env = ss.StreamEnvironment(parallelism=1, spark=spark, restart=ss.RestartStrategy.fixed_delay(3, 1.0),
                               checkpointing=ss.CheckpointConfig(interval=1.0, directory=str(tmp_path / "c")))
    schema = pa.schema([("key", pa.int64()), ("value", pa.int64()), ("i", pa.int64())])
    (env.from_source(ss.sources.Kafka(kafka_broker, [source], stop_at="latest", schema=schema), name="events")
        .sink_to(ss.sinks.Discard(), name="out"))
    with pytest.raises(ss.JobExecutionError) as info:
        env.execute("poison")
    assert info.value.reason == "DATA_ERROR"
    text = str(info.value)
    assert "without a restart (0 earlier restart(s))" in text        # the restart budget is not spent
    assert f"message {source}[0]@{N} " in text and "Fix: " in text


# ===================================================================== event time
WINDOW = 1_000          # ms
BOUND = 2.0             # s of out-of-orderness
# s without records before a partition counts as idle: far longer than the pauses between the
# laggard's pieces, even when a loaded machine stretches them (an idle laggard would let the
# watermark jump to partition 0's flush row and make the rest of its rows late).
IDLE = 8.0
FLUSH_TS = 60_000       # a row per data partition this far ahead fires every data window


def partition_rows(partition: int) -> list[dict]:
    """Partition 0 covers 0..20 s of event time in 2000 rows, partition 1 the same span in 500
    (the test writes those while the job runs: it lags behind partition 0). Each ends with a
    flush row far ahead, which lets the watermark pass every data window."""
    step, n = (10, 2000) if partition == 0 else (40, 500)
    rows = [{"key": j % 5, "value": j * 3 + partition, "ts": j * step + (j * 7919) % 1_500} for j in range(n)]
    return rows + [{"key": 0, "value": 0, "ts": FLUSH_TS}]


def expected_windows() -> dict:
    sums: dict = {}
    for partition in (0, 1):
        for r in partition_rows(partition):
            if r["ts"] < FLUSH_TS:
                window = (r["key"], r["ts"] // WINDOW * WINDOW)
                sums[window] = sums.get(window, 0) + r["value"]
    return sums


def test_event_time_windows_over_partitions_with_a_lagging_and_an_idle_one(spark, kafka_broker, tmp_path):
    """Per-partition watermarks: tumbling windows over a 3-partition topic read by one source
    subtask, partition 1 lagging in event time and partition 2 empty. The source is unbounded,
    so the windows fire only because the idle partition stops holding the watermark back
    (with_idleness), and the laggard, written in small pieces while the job reads partition 0
    to its end, does hold it (one watermark over both partitions would make most of partition
    1's rows late): every window's sum equals the reference and no row is late."""
    name = uuid.uuid4().hex[:8]
    source, out, late = f"et-in-{name}", f"et-out-{name}", f"et-late-{name}"
    local_kafka.create_topic(kafka_broker, source, 3)
    for topic in (out, late):
        local_kafka.create_topic(kafka_broker, topic, 2)
    local_kafka.produce_json(kafka_broker, source, partition_rows(0), partition=0)
    lagging = partition_rows(1)
    local_kafka.produce_json(kafka_broker, source, lagging[:25], partition=1)
    schema = pa.schema([("key", pa.int64()), ("value", pa.int64()), ("ts", pa.int64())])
    strategy = (ss.WatermarkStrategy.for_bounded_out_of_orderness(BOUND).with_timestamp_assigner("ts")
                .with_idleness(IDLE))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, auto_watermark_interval=0.05,
                               checkpointing=ss.CheckpointConfig(interval=0.5, directory=str(tmp_path / "ckpt")))
    late_tag = ss.OutputTag("late")
    windows = (env.from_source(ss.sources.Kafka(kafka_broker, [source], schema=schema, batch_size=100),
                               name="events", uid="events", parallelism=1, watermark_strategy=strategy)
               .key_by("key").window(ss.windows.TumblingEventTimeWindows.of(WINDOW / 1000))
               .side_output_late_data(late_tag)
               .aggregate_columns({"sum": ("sum", "value")}, name="windows", uid="windows"))
    windows.sink_to(ss.sinks.Kafka(kafka_broker, out, key="key"), name="out", uid="out")
    windows.get_side_output(late_tag).sink_to(ss.sinks.Kafka(kafka_broker, late), name="late", uid="late")
    client = env.execute_async("kafka event time")
    expected = expected_windows()
    try:
        wait_status(client, "RUNNING")
        for start in range(25, len(lagging), 25):      # ~3 s, pieces well within the idle timeout
            time.sleep(0.15)
            local_kafka.produce_json(kafka_broker, source, lagging[start:start + 25], partition=1)
        deadline = time.monotonic() + 90
        while True:
            fired = [json.loads(v) for _, _, v in local_kafka.read_committed(kafka_broker, out, 2)]
            if len(fired) >= len(expected) or time.monotonic() > deadline:
                break
            assert client.status() == "RUNNING", causes(client)
            time.sleep(0.5)
        time.sleep(1.5)              # a few more checkpoints: late rows would be committed by now
        assert client.status() == "RUNNING"
    finally:
        client.cancel()
    fired = [json.loads(v) for _, _, v in local_kafka.read_committed(kafka_broker, out, 2)]
    assert local_kafka.read_committed(kafka_broker, late, 2) == []
    windows_fired = [(r["key"], r["window_start"]) for r in fired]
    assert len(windows_fired) == len(set(windows_fired)), "a window fired twice"
    assert all(r["window_end"] - r["window_start"] == WINDOW for r in fired)
    assert {(r["key"], r["window_start"]): r["sum"] for r in fired} == expected
