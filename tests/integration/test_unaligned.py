"""Unaligned checkpoints on real Spark: a backpressured job checkpoints while data is in flight,
a SIGKILL restores from such a checkpoint, and the output equals the failure-free run."""

from __future__ import annotations

import os
import signal
import time

import pytest

import streamsnap as ss
from tests.integration.support import RunningSum, wait_status

N = 6000
KEYS = 7


def event(i):
    return {"key": i % KEYS, "i": i, "value": i % 13}


class SlowSum(RunningSum):
    """A running sum that takes ~1 ms a row: the source outruns it, so queues stay full."""

    def process_element(self, row, ctx):
        time.sleep(0.001)
        yield from super().process_element(row, ctx)


def _job(spark, tmp_path, config, restarts=1, network=None):
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               restart=ss.RestartStrategy.fixed_delay(restarts, 0.0),
                               network=network or ss.NetworkConfig(batch_size=64, credits=2, output_queue_frames=2))
    (env.from_source(ss.sources.Generator(event, count=N), name="events", uid="events")
        .key_by("key").process(SlowSum(carry=("i",)), name="sum", uid="sum")
        .sink_to(ss.sinks.Collect(), name="out", uid="out"))
    return env


def check_exactly_once(rows):
    """Every row once, and per key a running sum that some interleaving of the source splits
    gives: sorted by total, each row adds its value to the one before, and each split's rows
    keep their order (per-key order holds per split, not across splits)."""
    assert sorted(r["i"] for r in rows) == list(range(N))
    by_key = {}
    for r in rows:
        by_key.setdefault(r["key"], []).append(r)
    for key, mine in by_key.items():
        mine.sort(key=lambda r: r["total"])
        total, last_of_split = 0, {}
        for r in mine:
            total += event(r["i"])["value"]
            assert r["total"] == total, (key, r)
            split = r["i"] % 2
            assert r["i"] > last_of_split.get(split, -1), (key, r)
            last_of_split[split] = r["i"]


@pytest.mark.parametrize("aligned_timeout", [None, 0.01], ids=["unaligned", "aligned-timeout"])
def test_backpressured_unaligned_checkpoints_persist_in_flight_data_and_restore_exactly(
        spark, tmp_path, aligned_timeout):
    config = ss.CheckpointConfig(interval=0.2, directory=str(tmp_path / "ckpt"), unaligned=True,
                                 aligned_timeout=aligned_timeout)
    client = _job(spark, tmp_path, config).execute_async("unaligned under backpressure")
    wait_status(client, "RUNNING")
    seen = _completed_with_in_flight_data(client)
    _kill_a_keyed_subtask_and_check_the_output(client)
    stats = client.checkpoint_stats()
    completed = [c for c in stats.history if c.status.name == "COMPLETED"]
    unaligned = [s for c in completed for s in c.subtasks if s.unaligned]
    assert unaligned, "no subtask took an unaligned checkpoint"
    assert stats.latest_restored.checkpoint_id >= seen


def _kill_a_keyed_subtask_and_check_the_output(client) -> None:
    victim = [s for s in client.subtasks() if s.vertex != "events" and s.state == "RUNNING"][0]
    os.kill(victim.pid, signal.SIGKILL)
    result = client.wait(180)
    assert result.restarts == 1
    check_exactly_once(result.rows())


def _completed_with_in_flight_data(client, timeout=60) -> int:
    """Wait until the latest completed checkpoint persisted in-flight data; its id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = client.checkpoint_stats().latest_completed
        if latest is not None and sum(s.bytes_persisted_of_in_flight_data for s in latest.subtasks) > 0:
            return latest.checkpoint_id
        time.sleep(0.02)
    raise AssertionError("no completed checkpoint persisted in-flight data")


def test_barriers_held_in_backpressured_output_queues_go_unaligned_after_the_timeout(spark, tmp_path):
    """Aligned barriers queue behind all the data the sources could buffer (seconds of the slow
    operator's work); with a 50 ms timeout counted from each checkpoint's trigger, the sources'
    output queues put them ahead of that data, which becomes the sources' channel state."""
    config = ss.CheckpointConfig(interval=0.2, directory=str(tmp_path / "ckpt"), unaligned=True,
                                 aligned_timeout=0.05)
    # One frame of credit per channel: the data waits in the sources' output queues.
    network = ss.NetworkConfig(batch_size=128, credits=1, output_queue_frames=8)
    client = _job(spark, tmp_path, config, network=network).execute_async("aligned timeout under backpressure")
    wait_status(client, "RUNNING")
    converted = _completed_with_converted_barriers(client)
    _kill_a_keyed_subtask_and_check_the_output(client)
    assert client.checkpoint_stats().latest_restored.checkpoint_id >= converted.checkpoint_id
    # An aligned checkpoint would wait for ~1 s of queued rows per channel; this one did not.
    assert converted.end_to_end_duration < 1.5, converted.end_to_end_duration


def _completed_with_converted_barriers(client, timeout=60):
    """The first completed checkpoint in which a source subtask persisted the data its
    barrier overtook in its output queues."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in client.checkpoint_stats().history:
            if c.status.name == "COMPLETED" and any(
                    s.vertex_id.startswith("events") and s.unaligned and s.bytes_persisted_of_in_flight_data > 0
                    for s in c.subtasks):
                return c
        time.sleep(0.02)
    raise AssertionError("no completed checkpoint had a source's barrier overtake its queued output")
