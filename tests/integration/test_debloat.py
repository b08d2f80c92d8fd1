"""Buffer debloating on real Spark: behind a slow keyed operator the senders are asked for
small frames (so an aligned barrier queues behind little data), checkpoints complete, a SIGKILL
restores, and the output is exactly the failure-free one."""

from __future__ import annotations

import os
import signal
import time

import pytest

import streamsnap as ss
from tests.integration.support import wait_status
from tests.integration.test_unaligned import N, SlowSum, check_exactly_once, event

pytestmark = pytest.mark.spark

BATCH = 1024


def _sender_frame_rows(client) -> list:
    """The frame size each source subtask's receivers asked of it (None: no ask yet)."""
    master = client._master
    master.request_metrics()
    time.sleep(0.1)
    return [m.get("frame_rows") for (vertex, _), m in master.operator_metrics().items() if vertex == "events"]


def test_a_slow_receiver_shrinks_its_senders_frames_and_the_job_stays_exactly_once(spark, tmp_path):
    env = ss.StreamEnvironment(
        parallelism=2, spark=spark,
        checkpointing=ss.CheckpointConfig(interval=0.3, directory=str(tmp_path / "ckpt")),
        restart=ss.RestartStrategy.fixed_delay(1, 0.0),
        network=ss.NetworkConfig(batch_size=BATCH, debloat_target=0.1))
    (env.from_source(ss.sources.Generator(event, count=N), name="events", uid="events")
        .key_by("key").process(SlowSum(carry=("i",)), name="sum", uid="sum")
        .sink_to(ss.sinks.Collect(), name="out", uid="out"))
    client = env.execute_async("debloated under backpressure")
    wait_status(client, "RUNNING")
    # ~1,000 rows/s per keyed subtask, 0.1 s of it over 2 channels x 8 frames: the floor, 64 rows.
    deadline = time.monotonic() + 60
    while not (asked := _sender_frame_rows(client)) or not all(a is not None and a < BATCH for a in asked):
        assert time.monotonic() < deadline, f"the senders were never asked for smaller frames: {asked}"
    assert all(a >= 64 for a in asked)
    victim = [s for s in client.subtasks() if s.vertex != "events" and s.state == "RUNNING"][0]
    os.kill(victim.pid, signal.SIGKILL)
    result = client.wait(180)
    assert result.restarts == 1 and client.checkpoint_stats().counts.completed >= 1
    check_exactly_once(result.rows())
