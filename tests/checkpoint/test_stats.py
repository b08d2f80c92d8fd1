"""Checkpoint statistics: lifecycle, counts, bounded history, immutable snapshots."""

from __future__ import annotations

import dataclasses

import pytest

from streamsnap.checkpoint.messages import CheckpointMetrics
from streamsnap.checkpoint.reasons import CheckpointFailureReason as R
from streamsnap.checkpoint.stats import CheckpointStatsTracker, CheckpointStatus
from streamsnap.graph.ids import ExecutionAttemptId
from streamsnap.runtime.events import CheckpointType

A0, A1 = ExecutionAttemptId("v", 0, 0), ExecutionAttemptId("v", 1, 0)


def test_completed_checkpoint_with_subtasks():
    tracker = CheckpointStatsTracker()
    tracker.report_pending(1, 100.0, CheckpointType.CHECKPOINT, 2)
    snap = tracker.snapshot()
    assert snap.counts.triggered == 1 and snap.counts.in_progress == 1
    assert snap.history[0].status is CheckpointStatus.IN_PROGRESS and snap.history[0].end_to_end_duration is None
    tracker.report_subtask(1, A0, 101.0, 10, CheckpointMetrics(0.1, 0.5, 0.2, 0.05, 1000, 0))
    tracker.report_subtask(1, A1, 102.5, 30, CheckpointMetrics())
    tracker.report_completed(1, 103.0, 40, "file:///ckpt/job/chk-1")
    snap = tracker.snapshot()
    assert snap.counts.completed == 1 and snap.counts.in_progress == 0
    stats = snap.latest_completed
    assert stats.status is CheckpointStatus.COMPLETED
    assert stats.end_to_end_duration == 3.0 and stats.state_size == 40
    assert stats.external_path == "file:///ckpt/job/chk-1"
    assert stats.num_acknowledged == 2 and stats.latest_ack_timestamp == 102.5
    first = stats.subtasks[0]
    assert (first.index, first.end_to_end_duration, first.async_duration, first.bytes_processed_during_alignment) \
        == (0, 1.0, 0.5, 1000)
    assert snap.summary.end_to_end_duration.maximum == 3.0
    assert snap.summary.state_size.average == 40.0


def test_failed_and_savepoint_and_restored():
    tracker = CheckpointStatsTracker()
    tracker.report_pending(1, 0.0, CheckpointType.CHECKPOINT, 1)
    tracker.report_failed(1, 5.0, R.CHECKPOINT_EXPIRED, "too slow")
    tracker.report_pending(2, 6.0, CheckpointType.SAVEPOINT, 1)
    tracker.report_completed(2, 7.0, 5, "file:///sp/savepoint-x")
    tracker.report_restored(2, 8.0, "file:///sp/savepoint-x", CheckpointType.SAVEPOINT)
    snap = tracker.snapshot()
    assert snap.counts == dataclasses.replace(snap.counts, triggered=2, completed=1, failed=1, restored=1)
    assert snap.latest_failed.failure_reason is R.CHECKPOINT_EXPIRED and snap.latest_failed.end_to_end_duration == 5.0
    assert snap.latest_savepoint.checkpoint_id == 2 and snap.latest_completed is None
    assert snap.latest_restored.checkpoint_id == 2
    assert snap.failures_by_reason == {R.CHECKPOINT_EXPIRED: 1}
    text = snap.describe()
    assert "1 failed" in text and "CHECKPOINT_EXPIRED (too slow)" in text and "restored from: savepoint 2" in text


def test_late_reports_are_ignored():
    tracker = CheckpointStatsTracker()
    tracker.report_pending(1, 0.0, CheckpointType.CHECKPOINT, 1)
    tracker.report_failed(1, 1.0, R.CHECKPOINT_DECLINED)
    tracker.report_completed(1, 2.0, 1)
    tracker.report_subtask(1, A0, 3.0, 1, CheckpointMetrics())
    tracker.report_subtask(99, A0, 3.0, 1, CheckpointMetrics())
    snap = tracker.snapshot()
    assert snap.counts.completed == 0 and snap.history[0].num_acknowledged == 0


def test_history_is_bounded_but_keeps_checkpoints_in_progress():
    tracker = CheckpointStatsTracker(history_size=3)
    tracker.report_pending(1, 0.0, CheckpointType.CHECKPOINT, 1)  # stays in progress
    for checkpoint_id in range(2, 10):
        tracker.report_pending(checkpoint_id, float(checkpoint_id), CheckpointType.CHECKPOINT, 1)
        tracker.report_completed(checkpoint_id, checkpoint_id + 0.5, 1)
    snap = tracker.snapshot()
    assert [s.checkpoint_id for s in snap.history] == [9, 8, 1]
    assert snap.counts.completed == 8 and snap.counts.in_progress == 1


def test_snapshot_is_immutable():
    tracker = CheckpointStatsTracker()
    tracker.report_pending(1, 0.0, CheckpointType.CHECKPOINT, 1)
    snap = tracker.snapshot()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.counts = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.history[0].status = CheckpointStatus.COMPLETED
    with pytest.raises(TypeError):
        snap.failures_by_reason[R.CHECKPOINT_EXPIRED] = 3
    tracker.report_completed(1, 1.0, 1)
    assert snap.history[0].status is CheckpointStatus.IN_PROGRESS  # taken before: unchanged


def test_history_size_must_be_positive():
    with pytest.raises(ValueError):
        CheckpointStatsTracker(history_size=0)
