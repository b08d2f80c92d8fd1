"""Which checkpoint failures count, and when they fail the job."""

from __future__ import annotations

import pytest

from streamsnap.checkpoint.failure_manager import (COUNTED_REASONS, CheckpointFailureManager,
                                                   CheckpointFailureThresholdExceeded)
from streamsnap.checkpoint.reasons import CheckpointException, CheckpointFailureReason as R


def manager(tolerable):
    failures = []
    return CheckpointFailureManager(tolerable, failures.append), failures


def fail(m, reason, checkpoint_id, **kwargs):
    m.handle_checkpoint_failure(CheckpointException(reason, None, checkpoint_id), checkpoint_id, **kwargs)


def test_zero_tolerance_fails_on_first_counted_failure():
    m, failures = manager(0)
    fail(m, R.CHECKPOINT_EXPIRED, 1)
    assert len(failures) == 1
    error = failures[0]
    assert isinstance(error, CheckpointFailureThresholdExceeded) and isinstance(error, CheckpointException)
    assert error.reason is R.CHECKPOINT_EXPIRED and error.checkpoint_id == 1
    assert "CHECKPOINT_EXPIRED" in str(error) and "tolerable_failures=0" in str(error)
    assert isinstance(error.__cause__, CheckpointException)
    assert m.continuous_failures == 0  # cleared after failing the job


def test_tolerated_failures_and_reset_by_success():
    m, failures = manager(2)
    fail(m, R.CHECKPOINT_DECLINED, 1)
    fail(m, R.CHECKPOINT_EXPIRED, 2)
    assert failures == [] and m.continuous_failures == 2
    m.handle_checkpoint_success(3)
    assert m.continuous_failures == 0
    fail(m, R.CHECKPOINT_EXPIRED, 4)
    fail(m, R.CHECKPOINT_EXPIRED, 5)
    assert failures == []
    fail(m, R.IO_EXCEPTION, 6)
    assert [f.reason for f in failures] == [R.IO_EXCEPTION]


def test_each_checkpoint_counted_once():
    m, failures = manager(1)
    fail(m, R.CHECKPOINT_DECLINED, 1)
    fail(m, R.CHECKPOINT_EXPIRED, 1)
    assert failures == [] and m.continuous_failures == 1


def test_failures_without_a_checkpoint_id_count_each_time():
    m, failures = manager(1)
    fail(m, R.TRIGGER_CHECKPOINT_FAILURE, None)
    fail(m, R.TRIGGER_CHECKPOINT_FAILURE, None)
    assert len(failures) == 1


@pytest.mark.parametrize("reason", sorted(COUNTED_REASONS, key=lambda r: r.name))
def test_counted_reasons(reason):
    m, failures = manager(0)
    fail(m, reason, 1)
    assert [f.reason for f in failures] == [reason]


@pytest.mark.parametrize("reason", [
    R.TOO_MANY_CHECKPOINT_REQUESTS, R.MINIMUM_TIME_BETWEEN_CHECKPOINTS, R.NOT_ALL_REQUIRED_TASKS_RUNNING,
    R.PERIODIC_SCHEDULER_SHUTDOWN, R.CHECKPOINT_COORDINATOR_SHUTDOWN, R.CHECKPOINT_COORDINATOR_SUSPEND,
    R.JOB_FAILOVER, R.CHECKPOINT_SUBSUMED, R.CHECKPOINT_DECLINED_SUBSUMED, R.CHECKPOINT_DECLINED_TASK_CLOSING,
    R.CHECKPOINT_DECLINED_TASK_NOT_READY, R.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM,
    R.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER, R.TASK_FAILURE,
])
def test_ignored_reasons(reason):
    m, failures = manager(0)
    fail(m, reason, 1)
    assert failures == [] and m.continuous_failures == 0
    assert m.failure_counts() == {reason: 1}


def test_every_pre_flight_reason_is_ignored():
    assert not any(r.pre_flight for r in COUNTED_REASONS)


def test_savepoint_failures_are_not_counted():
    m, failures = manager(0)
    fail(m, R.CHECKPOINT_EXPIRED, 1, is_savepoint=True)
    assert failures == []
    assert m.failure_counts() == {R.CHECKPOINT_EXPIRED: 1}


def test_failure_of_a_checkpoint_older_than_the_last_success_is_not_counted():
    m, failures = manager(0)
    m.handle_checkpoint_success(5)
    fail(m, R.CHECKPOINT_EXPIRED, 4)
    assert failures == []
    fail(m, R.CHECKPOINT_EXPIRED, 6)
    assert len(failures) == 1


def test_per_reason_counts():
    m, _ = manager(10)
    fail(m, R.CHECKPOINT_EXPIRED, 1)
    fail(m, R.CHECKPOINT_EXPIRED, 2)
    fail(m, R.MINIMUM_TIME_BETWEEN_CHECKPOINTS, None)
    assert m.failure_counts() == {R.CHECKPOINT_EXPIRED: 2, R.MINIMUM_TIME_BETWEEN_CHECKPOINTS: 1}


def test_negative_tolerance_refused():
    with pytest.raises(ValueError):
        CheckpointFailureManager(-1, lambda e: None)
