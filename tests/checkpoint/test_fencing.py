"""Fencing: an attempt cut off from the job (a partition, a host that comes back) can never commit
after a newer attempt started. What stops it, layer by layer:

* the JobMaster tells a sink to commit only when a checkpoint completed, and only the current
  attempt's acknowledgements complete one (ExecutionAttemptId: a superseded attempt's are
  discarded, its subtasks get no notification);
* a JobMaster in the cluster completes a checkpoint only while it holds the newest epoch of the
  job registry (cluster/registry.py): a superseded leader's `_metadata` is never written;
* the new attempt's sink recovery discards every uncommitted file of earlier attempts, so a
  cut-off sink that commits anyway finds nothing to commit and fails, its rows absent.

Driven message by message: the coordinator on a fake clock, real files, the real FileSink writer."""

from __future__ import annotations

import pytest

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.reasons import AcknowledgeResult, CheckpointException, CheckpointFailureReason as R
from streamsnap.cluster.registry import FencedError, JobRegistry
from streamsnap.graph.ids import ExecutionAttemptId
from tests.connectors.test_sinks import read_all, visible, writer

pytestmark = pytest.mark.faults

SINK = ExecutionAttemptId("sum", 1, 0)      # the old attempt's sink subtask (chained with "sum")


def test_a_cut_off_attempts_sink_cannot_commit_after_the_new_attempt_started(make_harness, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    h = make_harness()
    h.start()
    old_sink = writer(out, attempt=0)
    old_sink.write([{"v": 1}])
    committed = old_sink.prepare_commit(1)
    h.coordinator.trigger_checkpoint()
    h.ack_all(1)
    assert (SINK, 1) in [(a, cid) for a, cid, _ in h.gateway.completed]
    old_sink.commit(1)                      # checkpoint 1 completed: its rows are visible

    # Checkpoint 2: the sink pre-commits rows 2, 3; every other subtask acknowledges; then the
    # network cuts the sink's host off before its acknowledgement gets through.
    h.coordinator.trigger_checkpoint()
    old_sink.write([{"v": 2}, {"v": 3}])
    old_sink.prepare_commit(2)
    for attempt in h.tasks:
        if attempt != SINK:
            assert h.ack(2, attempt) is AcknowledgeResult.SUCCESS
    late_ack = h.ack_message(2, SINK)

    # The JobMaster notices, fails over and deploys attempt 1, which restores checkpoint 1.
    h.deploy(number=1)
    new_sink = writer(out, attempt=1)
    new_sink.recover(committed)

    # The partition heals: the old sink's acknowledgement arrives, too late to complete anything.
    assert h.coordinator.receive_acknowledge(late_ack) is AcknowledgeResult.DISCARDED
    assert not filesystem.exists(filesystem.join(h.storage.checkpoint_directory(2), "_metadata"))
    assert [cid for _, cid, _ in h.gateway.completed] == [1] * len(h.tasks)    # nobody told to commit 2
    # A cut-off sink that commits on its own is refused: its pre-committed file was discarded.
    with pytest.raises(FileNotFoundError, match="newer attempt of the job recover"):
        old_sink.commit(2)
    assert read_all(out) == [1]
    assert visible(out) == sorted(f.name for f in out.iterdir())     # nothing half-committed left


def test_a_superseded_job_master_cannot_complete_a_checkpoint_so_no_sink_commits(make_harness, tmp_path):
    registry = JobRegistry(str(tmp_path / "registry"), "job-1")
    epoch = registry.take_epoch({"pid": 1})
    h = make_harness(fence=lambda: registry.fence(epoch), tolerable_failures=5)
    h.start()
    future = h.coordinator.trigger_checkpoint()
    for attempt in h.tasks[:-1]:
        h.ack(1, attempt)
    # Cut off from the job's storage-side view: a new JobMaster took over (the next epoch) and
    # started a new attempt, while this one still collects the old attempt's acknowledgements.
    newer = registry.take_epoch({"pid": 2})
    h.ack(1, h.tasks[-1])                   # fully acknowledged — completing it is refused
    exc = future.exception(timeout=0)
    assert isinstance(exc, CheckpointException) and exc.reason is R.FINALIZE_CHECKPOINT_FAILURE
    assert f"superseded by epoch {newer}" in str(exc)
    assert not filesystem.exists(filesystem.join(h.storage.checkpoint_directory(1), "_metadata"))
    assert h.coordinator.completed_store.latest() is None
    assert h.gateway.completed == []        # no sink is told to commit
    with pytest.raises(FencedError):
        registry.fence(epoch)
