"""FileSink with a rolling policy on real Spark (issue 32, small files): short checkpoints, parts
that stay open across them — few files, exact output, through a SIGKILL and a savepoint."""

from __future__ import annotations

import os
import signal
import time

import pytest

import streamsnap as ss
from tests.integration.support import wait_completed, wait_status
from tests.integration.test_failover import RunningSum, event, expected_rows, read_output, wait_restarted

pytestmark = pytest.mark.spark

RATE = 2_000


def job(spark, tmp_path, n, interval, parallelism=2, compact=False):
    env = ss.StreamEnvironment(
        parallelism=parallelism, spark=spark,
        checkpointing=ss.CheckpointConfig(interval=0.2, directory=str(tmp_path / "ckpt")),
        restart=ss.RestartStrategy.fixed_delay(attempts=1, delay=0.1))
    rolling = ss.sinks.RollingPolicy(max_part_size=None, rollover_interval=interval, inactivity_interval=None)
    (env.from_source(ss.sources.Generator(event, count=n, rate=RATE), name="events", uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.FileSink(str(tmp_path / "out"), format="parquet", rolling=rolling, compact=compact),
                 name="files", uid="files"))
    return env


def hidden(path) -> list[str]:
    return [f for f in os.listdir(path) if f.startswith(".")]


def test_a_soak_at_short_checkpoints_leaves_one_file_per_subtask_per_rolling_interval(spark, tmp_path):
    n, interval = 8 * RATE, 2.0            # ~8 s at 0.2 s checkpoints: ~40 of them
    started = time.monotonic()
    result = job(spark, tmp_path, n, interval).execute("rolling soak")
    elapsed = time.monotonic() - started
    files = [f for f in os.listdir(tmp_path / "out") if not f.startswith(".")]
    # Each part spans at least `interval` of the run but the last: per subtask at most
    # elapsed // interval + 1 files (on-checkpoint rolling would leave ~2 x 40).
    assert result.checkpoints.counts.completed >= 20
    assert len(files) <= 2 * (int(elapsed // interval) + 1), (len(files), elapsed)
    rows = read_output(tmp_path / "out")
    assert len(rows) == len(set(rows)) and set(rows) == expected_rows(n)
    assert hidden(tmp_path / "out") == []


def test_a_kill_mid_part_and_a_savepoint_resume_keep_the_output_exact(spark, tmp_path):
    """With compaction too: the parts the subtasks roll for a checkpoint are merged by subtask 0,
    the one killed."""
    n, out = 8 * RATE, tmp_path / "out"
    client = job(spark, tmp_path, n, interval=2.0, compact=True).execute_async("rolling kill")
    wait_status(client, "RUNNING")
    wait_completed(client, 3)
    # Mid-part: while rows flow, a part is open and its closed segments are in the checkpoints.
    deadline = time.monotonic() + 60
    while not hidden(out):
        assert time.monotonic() < deadline, "no part was opened"
        time.sleep(0.05)
    # The sink is chained to "sum"; its subtask 0 is the compactor.
    victim = next(s for s in client.subtasks() if s.vertex.startswith("sum") and s.index == 0)
    os.kill(victim.pid, signal.SIGKILL)
    wait_restarted(client, 1)
    completed = client.checkpoint_stats().counts.completed
    wait_completed(client, completed + 3)
    savepoint = client.stop_with_savepoint(str(tmp_path / "savepoints"))
    result = client.wait(60)
    assert result.restarts == 1
    before = read_output(out)
    assert len(before) == len(set(before)) and len(before) < n
    # The stop rolled the open parts: what the job wrote is visible, nothing is left hidden.
    assert hidden(out) == [] and set(before) <= expected_rows(n)
    job(spark, tmp_path, n, interval=2.0, parallelism=3, compact=True).execute("rolling resumed", restore_from=savepoint)
    rows = read_output(out)
    assert len(rows) == len(set(rows)), "duplicated rows"
    assert set(rows) == expected_rows(n)
    assert hidden(out) == []
    assert all(f.startswith("part-compacted-") for f in os.listdir(out))
