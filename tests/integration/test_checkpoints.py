"""Checkpoints on real Spark: the coordinator, barriers through real channels, async snapshots."""

from __future__ import annotations

import os
import time

import pytest

import streamsnap as ss
from streamsnap.checkpoint.listing import list_checkpoints
from streamsnap.checkpoint.metadata import read_metadata
from streamsnap.checkpoint.stats import CheckpointStatus
from tests.integration.support import (HeldGenerator, both_backends, checkpoint_dirs, final_by_key, release,
                                       stray_checkpoint_files, wait_completed, wait_held, wait_status)

pytestmark = pytest.mark.spark


class RunningSum(ss.KeyedProcessFunction):
    def open(self, ctx):
        self.total = ctx.get_state(ss.ValueStateDescriptor("total", default=0))
        self.seen = ctx.get_state(ss.ListStateDescriptor("recent"))

    def process_element(self, row, ctx):
        total = self.total.value() + row["value"]
        self.total.update(total)
        self.seen.add(row["value"] % 10)
        if len(self.seen.get()) > 5:
            self.seen.update(self.seen.get()[-5:])
        yield {"key": ctx.current_key, "total": total}


class SlowOnSubtaskZero:
    """A map that is slow only in its subtask 0: data queues up in front of that subtask, so
    its barrier reaches the keyed operator late and the other channel must wait (align)."""

    def open(self, ctx):
        self.slow = ctx.subtask_index == 0

    def __call__(self, row):
        if self.slow and row["value"] % 50 == 0:
            time.sleep(0.005)
        return row


def event(i: int) -> dict:
    return {"key": i % 17, "value": i + 1}


def build(env, rate=4000, slow=False, count=None, source=None):
    source = source or ss.sources.Generator(event, count=count, rate=rate)
    stream = env.from_source(source, name="events", uid="events")
    if slow:
        stream = stream.rebalance().map(SlowOnSubtaskZero(), name="slow", uid="slow")
    (stream.key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.Collect(), name="out", uid="out"))


def test_checkpoints_complete_at_the_interval_with_metadata_listing_every_operator(spark, tmp_path):
    interval = 0.4
    config = ss.CheckpointConfig(interval=interval, directory=str(tmp_path), num_retained=3,
                                 retention="retain_on_cancellation")
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config)
    build(env)
    client = env.execute_async("periodic checkpoints")
    wait_status(client, "RUNNING")
    stats = wait_completed(client, 6)
    client.cancel()
    completed = sorted((c for c in stats.history if c.status is CheckpointStatus.COMPLETED),
                       key=lambda c: c.checkpoint_id)
    triggers = [c.trigger_timestamp for c in completed]
    # Fixed-rate triggering: one late trigger shortens the next gap, the mean stays the interval.
    mean_gap = (triggers[-1] - triggers[0]) / (len(triggers) - 1)
    assert 0.75 * interval <= mean_gap, triggers
    # A trigger waits only while the checkpoint before it is in flight (max_concurrent=1): each
    # gap is the longer of the interval and that checkpoint's duration, plus latency. On a loaded
    # machine a checkpoint can take seconds, and the trigger queued behind it waits for its
    # `_metadata` to be written too; a slow trigger would be late every time: most triggers (the
    # median) are on time.
    late = sorted(b.trigger_timestamp - a.trigger_timestamp - max(interval, a.end_to_end_duration)
                  for a, b in zip(completed, completed[1:]) if b.checkpoint_id == a.checkpoint_id + 1)
    assert late and late[len(late) // 2] <= 0.5 * interval, \
        (late, [(c.checkpoint_id, c.trigger_timestamp, c.end_to_end_duration) for c in completed])
    # Retained on cancellation: the newest `num_retained` checkpoints, each complete on disk.
    job_dir = tmp_path / client.job_id
    chk_dirs = checkpoint_dirs(job_dir)
    assert len(chk_dirs) == 3
    for chk in chk_dirs:
        metadata = read_metadata(f"file://{chk}/_metadata")
        assert set(metadata.operators) == {"events", "sum", "out"}
        assert all(op.parallelism == 2 for op in metadata.operators.values())
        keyed = [h for s in metadata.operators["sum"].subtask_states.values() for h in s.keyed]
        assert keyed and sum(len(h.offsets) for h in keyed) > 0  # keyed state written per key group
        splits = [h for s in metadata.operators["events"].subtask_states.values() for h in s.operator]
        assert len(splits) == 2  # each source subtask snapshotted its split position
        for subtask in metadata.operators["sum"].subtask_states.values():
            for handle in subtask.keyed:
                assert os.path.getsize(chk / handle.file.path) == handle.file.size
    listed = list_checkpoints(str(tmp_path))
    assert [s.checkpoint_id for s in listed if s.status == "COMPLETED"] == [int(p.name[4:]) for p in chk_dirs]


def run_with_a_slow_channel(spark, tmp_path, mode):
    """Five checkpoints of a job whose subtask-0 channel is slow; (stats, the keyed subtasks' stats)."""
    config = ss.CheckpointConfig(interval=0.3, directory=str(tmp_path), mode=mode)
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               network=ss.NetworkConfig(buffer_timeout=0.01, batch_size=256))
    build(env, rate=20000, slow=True)
    client = env.execute_async(f"slow channel, {mode}")
    wait_status(client, "RUNNING")
    stats = wait_completed(client, 5)
    client.cancel()
    return stats, [s for c in stats.history if c.status is CheckpointStatus.COMPLETED
                   for s in c.subtasks if s.vertex_id == "sum"]


def test_alignment_shows_up_when_one_channel_is_slow(spark, tmp_path):
    stats, sum_subtasks = run_with_a_slow_channel(spark, tmp_path, "exactly_once")
    assert sum_subtasks
    assert max(s.alignment_duration for s in sum_subtasks) > 0.02
    assert any(s.bytes_processed_during_alignment > 0 for s in sum_subtasks)
    for s in sum_subtasks:
        assert s.sync_duration >= 0 and s.async_duration >= 0 and s.start_delay >= 0
    assert all(c.state_size > 0 for c in stats.history if c.status is CheckpointStatus.COMPLETED)


def test_at_least_once_never_aligns_and_completes(spark, tmp_path):
    stats, sum_subtasks = run_with_a_slow_channel(spark, tmp_path, "at_least_once")
    assert sum_subtasks and all(s.alignment_duration == 0 for s in sum_subtasks)
    assert stats.counts.failed == 0


@both_backends
def test_a_bounded_job_with_checkpoints_commits_everything_exactly_once(spark, tmp_path, state_backend):
    n = 30000
    config = ss.CheckpointConfig(interval=0.2, directory=str(tmp_path))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, state_backend=state_backend)
    build(env, rate=30000, count=n)
    result = env.execute("bounded with checkpoints")
    rows = result.rows()
    assert len(rows) == n  # the final checkpoint committed the tail, nothing twice
    assert final_by_key(rows, "key", "total") == {k: sum(i + 1 for i in range(n) if i % 17 == k) for k in range(17)}
    assert result.checkpoints.counts.completed >= 2
    # FINISHED with delete_on_cancellation: no checkpoint is left behind, only the record saying why.
    assert not [p for p in (tmp_path / result.job_id).iterdir() if p.name.startswith("chk-")]
    assert '"status": "FINISHED"' in (tmp_path / result.job_id / "_job_end").read_text()
    assert stray_checkpoint_files(tmp_path) == []    # incremental shared files went with them


class Stall:
    """Blocks one subtask once for a while, so a barrier cannot pass in time."""

    def open(self, ctx):
        self.stall = ctx.subtask_index == 0

    def __call__(self, row):
        if self.stall and row["value"] > 3000:
            self.stall = False
            time.sleep(4)
        return row


def test_an_expired_checkpoint_is_counted_and_fails_the_job_when_none_are_tolerated(spark, tmp_path):
    config = ss.CheckpointConfig(interval=0.3, timeout=1.0, tolerable_failures=0, directory=str(tmp_path))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, restart=ss.RestartStrategy.none())
    (env.from_source(ss.sources.Generator(event, rate=5000), name="events")
        .map(Stall(), name="stall").key_by("key").process(RunningSum(), name="sum")
        .sink_to(ss.sinks.Collect()))
    client = env.execute_async("expiring")
    with pytest.raises(ss.JobExecutionError) as info:
        client.wait(60)
    assert info.value.reason == "CHECKPOINT_EXPIRED"
    assert "CHECKPOINT_EXPIRED" in str(info.value)
    assert client.status() == "FAILED"


def test_expired_checkpoints_within_the_tolerance_do_not_fail_the_job(spark, tmp_path):
    # The 4 s stall expires about four checkpoints in a row; on a loaded machine the ones behind
    # the queue it leaves may expire too: the tolerance is far above either.
    config = ss.CheckpointConfig(interval=0.3, timeout=1.0, tolerable_failures=50, directory=str(tmp_path))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, restart=ss.RestartStrategy.none())
    (env.from_source(ss.sources.Generator(event, rate=5000, count=25000), name="events")
        .map(Stall(), name="stall").key_by("key").process(RunningSum(), name="sum")
        .sink_to(ss.sinks.Collect()))
    result = env.execute("tolerated")
    stats = result.checkpoints
    from streamsnap.checkpoint.reasons import CheckpointFailureReason
    assert stats.failures_by_reason.get(CheckpointFailureReason.CHECKPOINT_EXPIRED, 0) >= 1
    assert stats.counts.completed >= 1
    assert len(result.rows()) == 25000


def test_torn_and_corrupt_checkpoints_are_never_listed_as_completed(spark, tmp_path):
    config = ss.CheckpointConfig(interval=0.3, directory=str(tmp_path), num_retained=3,
                                 retention="retain_on_cancellation")
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config)
    build(env)
    client = env.execute_async("to be torn")
    wait_status(client, "RUNNING")
    wait_completed(client, 3)
    client.cancel()
    job_dir = tmp_path / client.job_id
    chk = checkpoint_dirs(job_dir)
    assert len(chk) == 3
    (chk[0] / "_metadata").unlink()                         # torn: never finalized
    data = bytearray((chk[1] / "_metadata").read_bytes())
    data[-5] ^= 0x01                                          # one flipped bit
    (chk[1] / "_metadata").write_bytes(bytes(data))
    listed = {s.checkpoint_id: s.status for s in list_checkpoints(str(tmp_path))}
    ids = [int(p.name[4:]) for p in chk]
    assert listed[ids[0]] != "COMPLETED" and listed[ids[1]] == "CORRUPT" and listed[ids[2]] == "COMPLETED"
    with pytest.raises(ss.RestoreError, match="checksum"):
        read_metadata(f"file://{chk[1]}/_metadata")


def test_cli_lists_checkpoints_and_verifies_checksums(spark, tmp_path, monkeypatch):
    from rich.console import Console
    from typer.testing import CliRunner

    from streamsnap import cli

    monkeypatch.setattr(cli, "console", Console(width=240))
    app = cli.app

    config = ss.CheckpointConfig(interval=0.3, directory=str(tmp_path), num_retained=2,
                                 retention="retain_on_cancellation")
    env = ss.StreamEnvironment(parallelism=1, spark=spark, checkpointing=config)
    build(env)
    client = env.execute_async("listed")
    wait_status(client, "RUNNING")
    wait_completed(client, 2)
    client.cancel()
    out = CliRunner().invoke(app, ["checkpoints", str(tmp_path)], terminal_width=200)
    assert out.exit_code == 0, out.output
    assert out.output.count("COMPLETED") == 2 and client.job_id[:12] in out.output


class Listener(ss.CheckpointListener):
    """Records the checkpoints it hears about, in the order it hears them."""

    def __init__(self):
        self.completed = []

    def notify_checkpoint_complete(self, checkpoint_id):
        self.completed.append(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id):
        raise AssertionError(f"no checkpoint should abort here, got {checkpoint_id}")

    def __call__(self, row):
        return {"i": row["value"], "completed": list(self.completed)}


def test_user_functions_hear_about_completed_checkpoints(spark, tmp_path):
    config = ss.CheckpointConfig(interval=0.2, directory=str(tmp_path))
    env = ss.StreamEnvironment(parallelism=1, spark=spark, checkpointing=config)
    (env.from_source(ss.sources.Generator(event, count=6000, rate=3000), name="events")
        .map(Listener(), name="listener").sink_to(ss.sinks.Collect()))
    result = env.execute("listener")
    heard = max((r["completed"] for r in result.rows()), key=len)
    assert len(heard) >= 2 and heard == sorted(heard)  # in order, and more than one
    history = result.checkpoints.history      # the newest ones only (bounded)
    completed_ids = {c.checkpoint_id for c in history if c.status is CheckpointStatus.COMPLETED}
    oldest_kept = min(c.checkpoint_id for c in history)
    assert {h for h in heard if h >= oldest_kept} <= completed_ids


def test_without_a_periodic_interval_only_requested_checkpoints_are_taken(spark, tmp_path):
    config = ss.CheckpointConfig(interval=None, directory=str(tmp_path))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config)
    # Held mid-input until the savepoint is taken: the input cannot end before it.
    gate = tmp_path / "gate"
    build(env, source=HeldGenerator(event, count=5000, rate=5000, splits=2, gate=gate, hold_at=1250))
    client = env.execute_async("no periodic checkpoints")
    wait_held(gate, 2, client)      # half the input (~0.5 s) went by without a checkpoint
    assert client.checkpoint_stats().counts.triggered == 0
    savepoint = client.trigger_savepoint(str(tmp_path / "sp"))
    assert os.path.exists(os.path.join(savepoint, "_metadata"))
    release(gate)
    result = client.wait(60)
    assert len(result.rows()) == 5000  # the final checkpoint still committed everything
    assert result.checkpoints.counts.completed == 2  # the savepoint and the final checkpoint
