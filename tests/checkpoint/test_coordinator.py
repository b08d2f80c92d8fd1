"""The checkpoint coordinator, driven message by message on a fake clock."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st
from tests.properties import examples

from streamsnap.api.config import CheckpointConfig
from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.coordinator import CheckpointCoordinator, CheckpointListenerError
from streamsnap.checkpoint.failure_manager import CheckpointFailureThresholdExceeded
from streamsnap.checkpoint.handles import FileHandle, KeyGroupsStateHandle, OperatorSubtaskState
from streamsnap.checkpoint.messages import AcknowledgeCheckpoint, CheckpointMetrics
from streamsnap.checkpoint.metadata import read_metadata
from streamsnap.checkpoint.restore_point import read_restore_point
from streamsnap.checkpoint.reasons import AcknowledgeResult, CheckpointException, CheckpointFailureReason as R
from streamsnap.checkpoint.stats import CheckpointStatus
from streamsnap.checkpoint.storage import CheckpointStorage, resolve_restore_path, subdirectories
from streamsnap.clock import ManualScheduler
from streamsnap.cluster.status import ExecutionState, JobStatus
from streamsnap.errors import RestoreError
from streamsnap.graph.ids import ExecutionAttemptId
from streamsnap.runtime.events import CheckpointType

from .conftest import JOB_ID, OPERATORS, Harness, RecordingGateway, RecordingListener, file_exists, write_file


def monotonic_of(h, wall_timestamp: float) -> float:
    return wall_timestamp - (h.scheduler.wall() - h.scheduler.monotonic())


def reason_of(future) -> R:
    exc = future.exception(timeout=0)
    assert isinstance(exc, CheckpointException), exc
    return exc.reason


def complete(h, checkpoint_id=None):
    """Trigger (unless given) and fully acknowledge a checkpoint; returns the CompletedCheckpoint."""
    future = None
    if checkpoint_id is None:
        future = h.coordinator.trigger_checkpoint()
        checkpoint_id = h.coordinator.pending_checkpoint_ids[-1]
    h.ack_all(checkpoint_id)
    if future is not None:
        return future.result(timeout=0)
    return h.coordinator.completed_store.latest()


# ---------------------------------------------------------------- periodic trigger

@pytest.mark.parametrize("seed", range(20))
def test_first_periodic_trigger_after_random_initial_delay_within_bounds(make_harness, seed):
    h = make_harness(seed=seed, interval=10.0, min_pause=2.0)
    h.start()
    h.scheduler.advance(2.0 - 1e-6)
    assert h.gateway.triggered == []
    h.scheduler.advance(8.0)  # now just before min_pause + (interval - min_pause) = interval
    assert h.gateway.triggered_ids() == [1]
    first = monotonic_of(h, h.gateway.triggered[0][2]) - 1000.0
    assert 2.0 <= first < 10.0


def test_initial_delays_differ_between_seeds(make_harness):
    delays = set()
    for seed in range(5):
        h = make_harness(seed=seed, interval=10.0)
        h.start()
        h.scheduler.advance(10.0)
        delays.add(round(h.gateway.triggered[0][2], 6))
    assert len(delays) > 1


def test_periodic_trigger_fires_at_fixed_interval(make_harness):
    h = make_harness(interval=5.0, max_concurrent=10)
    h.start()
    h.scheduler.advance(5.0)
    assert h.gateway.triggered_ids() == [1]
    t1 = h.gateway.triggered[0][2]
    h.scheduler.advance(15.0)
    assert h.gateway.triggered_ids() == [1, 2, 3, 4]
    times = sorted({t for _, _, t, _ in h.gateway.triggered})
    assert [round(b - a, 6) for a, b in zip(times, times[1:])] == [5.0, 5.0, 5.0]
    assert times[0] == t1


def test_job_status_other_than_running_stops_trigger_and_aborts_pending(make_harness):
    h = make_harness(interval=5.0)
    h.start()
    h.scheduler.advance(5.0)
    assert h.coordinator.pending_checkpoint_ids == [1]
    h.coordinator.job_status_changed(JobStatus.RESTARTING)
    assert not h.coordinator.is_periodic_scheduling
    assert h.coordinator.pending_checkpoint_ids == []
    assert h.coordinator.stats.snapshot().latest_failed.failure_reason is R.CHECKPOINT_COORDINATOR_SUSPEND
    h.scheduler.advance(60.0)
    assert h.gateway.triggered_ids() == [1]
    assert h.failures == []  # suspension is not a checkpoint failure
    h.coordinator.job_status_changed(JobStatus.RUNNING)
    h.scheduler.advance(5.0)
    assert h.gateway.triggered_ids() == [1, 2]


def test_no_periodic_trigger_without_interval(make_harness):
    h = make_harness(interval=None)
    h.start()
    h.scheduler.advance(3600.0)
    assert h.gateway.triggered == []
    assert h.scheduler.pending_timers() == 0


def test_base_interval_is_at_least_min_pause(make_harness):
    h = make_harness(interval=1.0, min_pause=4.0, max_concurrent=5)
    h.start()
    h.scheduler.advance(4.0)
    assert h.gateway.triggered_ids() == [1]
    h.scheduler.advance(3.9)
    assert h.gateway.triggered_ids() == [1]


# ---------------------------------------------------------------- pre-checks

def test_pre_check_fails_when_a_task_is_not_running(make_harness):
    h = make_harness()
    h.deploy(running=False)
    for attempt in h.tasks[:-1]:
        h.coordinator.execution_state_changed(attempt, ExecutionState.RUNNING)
    future = h.coordinator.trigger_checkpoint()
    assert reason_of(future) is R.NOT_ALL_REQUIRED_TASKS_RUNNING
    assert "sum#1(attempt 0) (CREATED)" in str(future.exception())
    assert h.gateway.triggered == []
    assert h.storage.existing_checkpoint_ids() == []
    assert h.failures == []  # pre-flight refusals never count
    h.coordinator.execution_state_changed(h.tasks[-1], ExecutionState.RUNNING)
    assert h.coordinator.trigger_checkpoint().done() is False
    assert h.gateway.triggered_ids() == [1]


def test_pre_check_fails_without_deployment(make_harness):
    h = make_harness()
    assert reason_of(h.coordinator.trigger_checkpoint()) is R.NOT_ALL_REQUIRED_TASKS_RUNNING


def test_set_execution_attempts_requires_an_acknowledging_task_per_vertex(make_harness):
    h = make_harness()
    sources = [ExecutionAttemptId("src", 0, 0)]
    with pytest.raises(ValueError, match="sum"):
        h.coordinator.set_execution_attempts(sources, sources, sources, OPERATORS)


# ---------------------------------------------------------------- the happy path

def test_checkpoint_completes_and_everyone_is_notified(make_harness):
    h = make_harness()
    h.start()
    listener = RecordingListener()
    h.coordinator.add_listener(listener)
    future = h.coordinator.trigger_checkpoint()
    assert [(a, cid) for a, cid, _, _ in h.gateway.triggered] == [(a, 1) for a in h.sources]
    options = h.gateway.triggered[0][3]
    assert options.checkpoint_type is CheckpointType.CHECKPOINT
    assert options.target_location == h.storage.checkpoint_directory(1)
    assert options.exactly_once is True

    results = h.ack_all(1)
    assert results == [AcknowledgeResult.SUCCESS] * 4
    completed = future.result(timeout=0)
    assert completed.checkpoint_id == 1
    assert h.coordinator.pending_checkpoint_ids == []
    assert sorted(a for a, cid, _ in h.gateway.completed if cid == 1) == sorted(h.tasks)
    assert listener.completed == [1]
    assert h.coordinator.completed_store.latest() is completed

    metadata = read_metadata(filesystem.join(h.storage.checkpoint_directory(1), "_metadata"))
    assert set(metadata.operators) == {"source", "sum", "out"}
    assert metadata.operators["out"].subtask_states == {0: OperatorSubtaskState(), 1: OperatorSubtaskState()}
    assert metadata.operators["sum"].parallelism == 2 and metadata.operators["sum"].max_parallelism == 128
    path = metadata.operators["source"].subtask_states[1].keyed[0].file.path
    assert not path.startswith(("/", "file:"))  # relative: relocatable
    assert file_exists(completed.external_pointer, path)

    snap = h.coordinator.stats.snapshot()
    assert snap.counts.completed == 1 and snap.counts.in_progress == 0
    assert snap.latest_completed.status is CheckpointStatus.COMPLETED
    assert len(snap.latest_completed.subtasks) == 4


def test_synchronous_acks_from_inside_the_trigger_call(make_harness):
    h = make_harness()
    h.start()
    acked = []

    def on_trigger(attempt, checkpoint_id, options):
        if attempt == h.sources[-1]:  # once the last source got it, every task answers at once
            for task in h.tasks:
                acked.append(h.coordinator.receive_acknowledge(
                    h.ack_message(checkpoint_id, task, base_url=options.target_location)))

    h.gateway.on_trigger = on_trigger
    future = h.coordinator.trigger_checkpoint()
    assert acked == [AcknowledgeResult.SUCCESS] * 4
    assert future.result(timeout=0).checkpoint_id == 1


def test_stats_record_subtask_metrics(make_harness):
    h = make_harness()
    h.start()
    h.coordinator.trigger_checkpoint()
    h.scheduler.advance(1.5)
    metrics = CheckpointMetrics(0.1, 0.2, 0.3, 0.4, 500, 0)
    h.ack(1, h.tasks[0], metrics=metrics)
    snap = h.coordinator.stats.snapshot()
    stats = snap.history[0]
    assert stats.status is CheckpointStatus.IN_PROGRESS and stats.num_acknowledged == 1
    sub = stats.subtasks[0]
    assert (sub.sync_duration, sub.async_duration, sub.alignment_duration, sub.start_delay,
            sub.bytes_processed_during_alignment) == (0.1, 0.2, 0.3, 0.4, 500)
    assert sub.end_to_end_duration == pytest.approx(1.5)
    assert sub.state_size == len(b"state-bytes")


# ---------------------------------------------------------------- acknowledgement results

def test_duplicate_ack_is_reported_and_keeps_state(make_harness):
    h = make_harness()
    h.start()
    h.coordinator.trigger_checkpoint()
    first = h.ack_message(1, h.tasks[0])
    assert h.coordinator.receive_acknowledge(first) is AcknowledgeResult.SUCCESS
    assert h.coordinator.receive_acknowledge(first) is AcknowledgeResult.DUPLICATE
    assert file_exists(h.location(1), first.subtask_state["source"].keyed[0].file.path)


def test_ack_from_an_old_attempt_is_unknown_and_its_files_deleted(make_harness):
    h = make_harness()
    h.start()
    h.coordinator.trigger_checkpoint()
    old = ExecutionAttemptId("src", 0, 99)
    message = h.ack_message(1, old)
    path = message.subtask_state["source"].keyed[0].file.path
    assert file_exists(h.location(1), path)
    assert h.coordinator.receive_acknowledge(message) is AcknowledgeResult.UNKNOWN
    assert not file_exists(h.location(1), path)
    assert h.coordinator.pending_checkpoint(1).acknowledged == frozenset()


def test_late_ack_after_abort_is_discarded_and_its_files_deleted(make_harness):
    h = make_harness(tolerable_failures=5)
    h.start()
    h.coordinator.trigger_checkpoint()
    location = h.location(1)
    h.ack(1, h.tasks[0])
    h.decline(1, h.tasks[1], R.CHECKPOINT_DECLINED)
    assert not filesystem.exists(location)  # aborted: the directory is gone
    late = h.ack_message(1, h.tasks[2], base_url=location)  # the task was still uploading
    assert filesystem.exists(location)
    assert h.coordinator.receive_acknowledge(late) is AcknowledgeResult.DISCARDED
    assert not file_exists(location, late.subtask_state["sum"].keyed[0].file.path)
    assert not filesystem.exists(location)


def test_ack_for_unknown_checkpoint_id_deletes_its_files(make_harness):
    h = make_harness()
    h.start()
    base = h.storage.checkpoint_directory(42)
    message = h.ack_message(42, h.tasks[0], base_url=base)
    assert h.coordinator.receive_acknowledge(message) is None
    assert not file_exists(base, message.subtask_state["source"].keyed[0].file.path)


def test_stray_ack_never_deletes_files_of_a_retained_checkpoint(make_harness):
    h = make_harness()
    h.start()
    h.coordinator.trigger_checkpoint()
    message = h.ack_message(1, h.tasks[0])
    h.coordinator.receive_acknowledge(message)
    for attempt in h.tasks[1:]:
        h.ack(1, attempt)
    completed = h.coordinator.completed_store.latest()
    # The same ack arrives again after completion (e.g. a retried RPC).
    assert h.coordinator.receive_acknowledge(message) is AcknowledgeResult.DISCARDED
    path = message.subtask_state["source"].keyed[0].file.path
    assert file_exists(completed.external_pointer, path)
    assert h.coordinator.restore_latest_checkpoint().checkpoint_id == 1


def test_stray_ack_never_deletes_files_outside_the_job_directory(make_harness, tmp_path):
    h = make_harness()
    h.start()
    outside = filesystem.normalize(str(tmp_path / "elsewhere"))
    write_file(outside, "precious")
    handle = KeyGroupsStateHandle(FileHandle(filesystem.join(outside, "precious"), 11), 0, 63)
    task_owned = write_file(h.storage.task_owned_directory, "mine")
    owned = KeyGroupsStateHandle(FileHandle("../taskowned/mine", task_owned.size), 0, 63)
    sneaky = AcknowledgeCheckpoint(h.tasks[0], 77, {"source": OperatorSubtaskState(keyed=(handle, owned))})
    assert h.coordinator.receive_acknowledge(sneaky) is None
    assert file_exists(outside, "precious")
    assert file_exists(h.storage.task_owned_directory, "mine")


# ---------------------------------------------------------------- decline, expiry, failure counting

class _FailingListener(RecordingListener):
    """A driver-side listener whose completion (or abort) handling raises, as a committer might."""

    def notify_checkpoint_complete(self, checkpoint):
        raise RuntimeError("table is read-only")

    def notify_checkpoint_aborted(self, checkpoint_id):
        raise RuntimeError("cleanup refused")


def test_a_listener_that_raises_fails_the_job_with_its_traceback_logged_and_the_others_are_still_told(
        make_harness, caplog):
    h = make_harness(tolerable_failures=5)
    h.start()
    failing, recording = _FailingListener(), RecordingListener()
    h.coordinator.add_listener(failing)
    h.coordinator.add_listener(recording)
    with caplog.at_level(logging.ERROR, logger="streamsnap.checkpoint.coordinator"):
        completed = complete(h)
    assert completed.checkpoint_id == 1 and recording.completed == [1]       # the checkpoint itself completed
    assert sorted(a for a, cid, _ in h.gateway.completed if cid == 1) == sorted(h.tasks)
    assert len(h.failures) == 1 and isinstance(h.failures[0], CheckpointListenerError)
    assert "notify_checkpoint_complete of checkpoint 1 failed" in str(h.failures[0])
    assert "table is read-only" in str(h.failures[0]) and h.failures[0].reason == "CHECKPOINT_LISTENER_FAILURE"
    [record] = [r for r in caplog.records if "failing the job" in r.getMessage()]
    assert record.exc_info is not None and "table is read-only" in caplog.text    # the traceback is logged
    # An abort's listener error fails the job the same way (not counted as a checkpoint failure).
    future = h.coordinator.trigger_checkpoint()
    h.decline(2, h.tasks[1], R.CHECKPOINT_ASYNC_EXCEPTION)
    assert reason_of(future) is R.CHECKPOINT_ASYNC_EXCEPTION and recording.aborted == [2]
    assert len(h.failures) == 2 and "notify_checkpoint_aborted of checkpoint 2" in str(h.failures[1])



def test_decline_aborts_with_the_task_reason(make_harness):
    h = make_harness(tolerable_failures=1)
    h.start()
    listener = RecordingListener()
    h.coordinator.add_listener(listener)
    future = h.coordinator.trigger_checkpoint()
    location = h.location(1)
    h.ack(1, h.tasks[0])
    h.decline(1, h.tasks[1], R.CHECKPOINT_ASYNC_EXCEPTION)
    assert reason_of(future) is R.CHECKPOINT_ASYNC_EXCEPTION
    assert "declined by src#1(attempt 0): test" in str(future.exception())
    assert h.coordinator.pending_checkpoint_ids == []
    assert not filesystem.exists(location)
    assert sorted(a for a, cid in h.gateway.aborted if cid == 1) == sorted(h.tasks)
    assert listener.aborted == [1]
    assert h.coordinator.failure_manager.continuous_failures == 1
    assert h.failures == []


def test_decline_from_a_task_outside_the_checkpoint_is_ignored(make_harness):
    h = make_harness()
    h.start()
    h.coordinator.trigger_checkpoint()
    h.decline(1, ExecutionAttemptId("src", 0, 5), R.CHECKPOINT_DECLINED)
    assert h.coordinator.pending_checkpoint_ids == [1]


def test_subsumption_decline_does_not_fail_the_job(make_harness):
    h = make_harness(tolerable_failures=0)
    h.start()
    future = h.coordinator.trigger_checkpoint()
    h.decline(1, h.tasks[2], R.CHECKPOINT_DECLINED_SUBSUMED)
    assert reason_of(future) is R.CHECKPOINT_DECLINED_SUBSUMED
    assert h.failures == []


def test_expired_checkpoint_fails_the_job_when_nothing_is_tolerated(make_harness):
    h = make_harness(timeout=30.0, tolerable_failures=0)
    h.start()
    future = h.coordinator.trigger_checkpoint()
    location = h.location(1)
    h.ack(1, h.tasks[0])
    h.scheduler.advance(29.9)
    assert not future.done()
    h.scheduler.advance(0.2)
    assert reason_of(future) is R.CHECKPOINT_EXPIRED
    assert "still waiting for src#1(attempt 0)" in str(future.exception())
    assert not filesystem.exists(location)
    assert len(h.failures) == 1
    assert isinstance(h.failures[0], CheckpointFailureThresholdExceeded)
    assert h.failures[0].reason is R.CHECKPOINT_EXPIRED
    assert "CHECKPOINT_EXPIRED" in str(h.failures[0])
    assert h.coordinator.stats.snapshot().latest_failed.failure_reason is R.CHECKPOINT_EXPIRED


def test_two_tolerated_failures_do_not_fail_the_job_and_a_success_resets(make_harness):
    h = make_harness(timeout=10.0, tolerable_failures=2)
    h.start()
    for _ in range(2):
        h.coordinator.trigger_checkpoint()
        h.scheduler.advance(10.0)
    assert h.failures == []
    assert h.coordinator.failure_manager.continuous_failures == 2
    complete(h)
    assert h.coordinator.failure_manager.continuous_failures == 0
    for _ in range(2):
        h.coordinator.trigger_checkpoint()
        h.scheduler.advance(10.0)
    assert h.failures == []
    h.coordinator.trigger_checkpoint()
    h.scheduler.advance(10.0)
    assert len(h.failures) == 1 and h.failures[0].reason is R.CHECKPOINT_EXPIRED


def test_completion_cancels_the_timeout(make_harness):
    h = make_harness(timeout=10.0)
    h.start()
    complete(h)
    h.scheduler.advance(100.0)
    assert h.failures == []
    assert h.coordinator.stats.snapshot().counts.failed == 0


def test_finalize_failure_aborts_and_counts(make_harness, monkeypatch):
    h = make_harness(tolerable_failures=0)
    h.start()
    future = h.coordinator.trigger_checkpoint()
    location = h.location(1)

    def broken_write(url, data):
        raise OSError("disk full")

    messages = [h.ack_message(1, a) for a in h.tasks]  # the tasks' files are written
    monkeypatch.setattr(filesystem, "write_atomic", broken_write)  # ... then _metadata cannot be
    for message in messages:
        h.coordinator.receive_acknowledge(message)
    assert reason_of(future) is R.FINALIZE_CHECKPOINT_FAILURE
    assert "disk full" in str(future.exception())
    assert not filesystem.exists(location)
    assert h.coordinator.completed_store.latest() is None
    assert [f.reason for f in h.failures] == [R.FINALIZE_CHECKPOINT_FAILURE]
    assert h.gateway.completed == []


def test_trigger_rpc_failure_aborts_the_checkpoint(make_harness):
    h = make_harness(tolerable_failures=5)
    h.start()
    h.gateway.fail_trigger = ConnectionError("task unreachable")
    future = h.coordinator.trigger_checkpoint()
    assert reason_of(future) is R.TRIGGER_CHECKPOINT_FAILURE
    assert h.coordinator.pending_checkpoint_ids == []
    assert not filesystem.exists(h.storage.checkpoint_directory(1))


def test_failed_task_aborts_the_checkpoints_waiting_for_it(make_harness):
    h = make_harness(tolerable_failures=0)
    h.start()
    future = h.coordinator.trigger_checkpoint()
    h.coordinator.execution_state_changed(h.tasks[3], ExecutionState.FAILED)
    assert reason_of(future) is R.TASK_FAILURE
    assert h.failures == []  # the job fails over for the task failure itself
    assert reason_of(h.coordinator.trigger_checkpoint()) is R.NOT_ALL_REQUIRED_TASKS_RUNNING


def test_abort_pending_checkpoints_on_failover(make_harness):
    h = make_harness(max_concurrent=3, tolerable_failures=0)
    h.start()
    futures = [h.coordinator.trigger_checkpoint() for _ in range(3)]
    h.coordinator.abort_pending_checkpoints(R.JOB_FAILOVER)
    assert [reason_of(f) for f in futures] == [R.JOB_FAILOVER] * 3
    assert h.coordinator.pending_checkpoint_ids == []
    assert h.storage.existing_checkpoint_ids() == []
    assert h.failures == []


def test_redeployment_aborts_checkpoints_of_the_old_attempts(make_harness):
    h = make_harness()
    h.start()
    future = h.coordinator.trigger_checkpoint()
    h.deploy(number=1)
    assert reason_of(future) is R.JOB_FAILOVER
    stale = h.ack_message(1, ExecutionAttemptId("sum", 0, 0), base_url=h.storage.checkpoint_directory(1))
    assert h.coordinator.receive_acknowledge(stale) is AcknowledgeResult.DISCARDED
    assert complete(h).checkpoint_id == 2


# ---------------------------------------------------------------- concurrency, queueing, min pause

def test_max_concurrent_queues_and_runs_after_completion(make_harness):
    h = make_harness(max_concurrent=1)
    h.start()
    first = h.coordinator.trigger_checkpoint()
    second = h.coordinator.trigger_checkpoint()
    assert h.coordinator.pending_checkpoint_ids == [1]
    assert h.coordinator.num_queued_requests == 1
    h.ack_all(1)
    assert first.result(timeout=0).checkpoint_id == 1
    assert h.coordinator.pending_checkpoint_ids == [2]
    h.ack_all(2)
    assert second.result(timeout=0).checkpoint_id == 2


def test_periodic_requests_do_not_pile_up_behind_a_slow_checkpoint(make_harness):
    h = make_harness(interval=1.0, max_concurrent=1, timeout=100.0)
    h.start()
    h.scheduler.advance(1.0)
    assert h.coordinator.pending_checkpoint_ids == [1]
    h.scheduler.advance(10.0)  # ten more beats while checkpoint 1 is slow
    assert h.coordinator.num_queued_requests == 1
    counts = h.coordinator.failure_manager.failure_counts()
    assert counts[R.TOO_MANY_CHECKPOINT_REQUESTS] >= 8
    assert h.failures == []
    h.ack_all(1)
    assert h.coordinator.pending_checkpoint_ids == [2]
    assert h.coordinator.num_queued_requests == 0


def test_min_pause_postpones_the_next_periodic_checkpoint(make_harness):
    h = make_harness(interval=2.0, min_pause=1.5, max_concurrent=1, seed=3)
    h.start()
    h.scheduler.advance(2.0)
    assert h.coordinator.pending_checkpoint_ids == [1]
    h.scheduler.advance(1.9)
    done_at = h.scheduler.monotonic()
    h.ack_all(1)
    # The queued periodic request is too early now: dropped, trigger rescheduled.
    assert h.coordinator.pending_checkpoint_ids == []
    assert h.coordinator.failure_manager.failure_counts()[R.MINIMUM_TIME_BETWEEN_CHECKPOINTS] == 1
    h.scheduler.advance(1.5 - 1e-6)
    assert h.coordinator.pending_checkpoint_ids == []
    h.scheduler.advance(2e-6)
    assert h.coordinator.pending_checkpoint_ids == [2]
    assert monotonic_of(h, h.gateway.triggered[-1][2]) >= done_at + 1.5
    assert h.failures == []


def test_manual_checkpoint_ignores_min_pause(make_harness):
    h = make_harness(min_pause=60.0)
    h.start()
    complete(h)
    future = h.coordinator.trigger_checkpoint()
    assert h.coordinator.pending_checkpoint_ids == [2]
    h.ack_all(2)
    assert future.result(timeout=0).checkpoint_id == 2


# ---------------------------------------------------------------- subsumption and retention

def test_completion_subsumes_older_pending_checkpoints_but_not_savepoints(make_harness, tmp_path):
    h = make_harness(max_concurrent=3, tolerable_failures=0)
    h.start()
    older = h.coordinator.trigger_checkpoint()
    savepoint = h.coordinator.trigger_savepoint(str(tmp_path / "sp"))
    newer = h.coordinator.trigger_checkpoint()
    assert h.coordinator.pending_checkpoint_ids == [1, 2, 3]
    older_location = h.location(1)
    h.ack(1, h.tasks[0])
    h.ack_all(3)
    assert newer.result(timeout=0).checkpoint_id == 3
    assert reason_of(older) is R.CHECKPOINT_SUBSUMED
    assert not filesystem.exists(older_location)
    assert not savepoint.done()
    assert h.coordinator.pending_checkpoint_ids == [2]
    assert h.failures == []
    h.ack_all(2)
    assert savepoint.result(timeout=0).checkpoint_type is CheckpointType.SAVEPOINT


def test_retention_keeps_newest_and_deletes_subsumed_from_disk(make_harness):
    h = make_harness(num_retained=2)
    h.start()
    completed = [complete(h) for _ in range(4)]
    assert [c.checkpoint_id for c in h.coordinator.completed_store.all()] == [3, 4]
    assert h.storage.existing_checkpoint_ids() == [3, 4]
    for old in completed[:2]:
        assert not filesystem.exists(old.external_pointer)
        assert not any(filesystem.exists(url) for url in old.exclusive_files())
    for kept in completed[2:]:
        assert all(filesystem.exists(url) for url in kept.exclusive_files())


# ---------------------------------------------------------------- savepoints

def test_savepoint_location_options_and_no_commit(make_harness, tmp_path):
    h = make_harness()
    h.start()
    listener = RecordingListener()
    h.coordinator.add_listener(listener)
    target = str(tmp_path / "savepoints")
    future = h.coordinator.trigger_savepoint(target)
    options = h.gateway.triggered[0][3]
    assert options.checkpoint_type is CheckpointType.SAVEPOINT
    name = options.target_location.rsplit("/", 1)[-1]
    assert options.target_location.startswith(filesystem.normalize(target) + "/")
    assert name.startswith("savepoint-job0123456789-1-")     # the whole job id, not a prefix
    h.ack_all(1)
    savepoint = future.result(timeout=0)
    assert savepoint.external_pointer == options.target_location
    assert read_metadata(filesystem.join(savepoint.external_pointer, "_metadata")).checkpoint_type is CheckpointType.SAVEPOINT
    assert h.gateway.completed == [] and listener.completed == []  # plain savepoints commit nothing
    assert h.coordinator.completed_store.all() == []  # not a failover point
    assert h.coordinator.stats.snapshot().latest_savepoint.checkpoint_id == 1
    complete(h)
    complete(h)
    assert filesystem.exists(savepoint.external_pointer)  # never deleted by retention


def test_terminating_savepoint_notifies_commit(make_harness, tmp_path):
    h = make_harness()
    h.start()
    listener = RecordingListener()
    h.coordinator.add_listener(listener)
    future = h.coordinator.trigger_savepoint(str(tmp_path / "sp"), terminate=True)
    assert h.gateway.triggered[0][3].checkpoint_type is CheckpointType.TERMINATING_SAVEPOINT
    h.ack_all(1)
    assert future.result(timeout=0).checkpoint_type is CheckpointType.TERMINATING_SAVEPOINT
    assert sorted(a for a, _, _ in h.gateway.completed) == sorted(h.tasks)
    assert listener.completed == [1]


def test_a_completed_stop_with_savepoint_is_the_failover_point_and_is_never_deleted(make_harness, tmp_path):
    """The sinks committed on the terminating savepoint: a failure before the job finished must
    restore from it, not from checkpoint 1 (which would replay committed output)."""
    h = make_harness(num_retained=1)
    h.start()
    complete(h)                                                    # checkpoint 1
    future = h.coordinator.trigger_savepoint(str(tmp_path / "sp"), terminate=True)
    h.ack_all(2)
    path = future.result(timeout=0).external_pointer
    assert h.coordinator.restore_latest_checkpoint().checkpoint_id == 2
    # The job runs on from it and completes a checkpoint of its own; the savepoint stays.
    h.deploy(1)
    complete(h)
    assert h.coordinator.restore_latest_checkpoint().checkpoint_id == 3
    h.coordinator.shutdown(JobStatus.FINISHED)
    assert filesystem.exists(filesystem.join(path, "_metadata"))


def _stop_with_savepoint_subsuming_checkpoint_1(h, tmp_path, drain: bool):
    h.start()
    complete(h)                                                    # checkpoint 1
    future = h.coordinator.trigger_savepoint(str(tmp_path / "sp"), terminate=True, drain=drain)
    h.ack_all(2)
    return future.result(timeout=0)


@pytest.mark.parametrize("drain", [False, True])
def test_a_new_run_resumes_from_the_recorded_stop_with_savepoint(make_harness, tmp_path, drain):
    """Issue 28 (2): the savepoint subsumed chk-1 (num_retained=1) and lives outside the job
    directory; the driver dies before the job finished. A new run must resume from it."""
    h = make_harness(num_retained=1)
    savepoint = _stop_with_savepoint_subsuming_checkpoint_1(h, tmp_path, drain)
    assert h.storage.completed_ids() == []                         # chk-1 is gone
    point = read_restore_point(h.storage.job_directory)
    assert (point.checkpoint_id, point.path, point.drained) == (2, savepoint.external_pointer, drain)
    # The driver dies here: no shutdown. A new run of the job (same directory):
    h2 = make_harness(num_retained=1)
    assert h2.coordinator.recover_completed_checkpoints() == [2]
    restored = h2.coordinator.restore_latest_checkpoint()
    assert (restored.checkpoint_id, restored.external_pointer) == (2, savepoint.external_pointer)
    assert restored.properties.drain is drain and not restored.properties.owned
    assert h2.coordinator.id_counter.current == 3
    # ... and it never deletes the user's savepoint, even when it later finishes.
    h2.deploy(1)
    complete(h2)                                                   # checkpoint 3 supersedes the record
    assert h2.coordinator.recover_completed_checkpoints() == [3]
    h2.coordinator.shutdown(JobStatus.FINISHED)
    assert filesystem.exists(filesystem.join(savepoint.external_pointer, "_metadata"))
    assert read_restore_point(h2.storage.job_directory) is None      # finished: nothing to resume


def test_the_record_is_superseded_by_a_newer_checkpoint_and_kept_when_the_job_fails(make_harness, tmp_path):
    h = make_harness(num_retained=2)
    _stop_with_savepoint_subsuming_checkpoint_1(h, tmp_path, drain=False)
    h.coordinator.shutdown(JobStatus.FAILED)                       # a failed job keeps its restore point
    assert read_restore_point(h.storage.job_directory).checkpoint_id == 2
    h2 = make_harness(num_retained=2)
    assert h2.coordinator.recover_completed_checkpoints() == [1, 2]
    h2.deploy(1)
    h2.start()
    complete(h2)                                                   # checkpoint 3, in the job directory
    h3 = make_harness(num_retained=2)
    assert h3.coordinator.recover_completed_checkpoints() == [3]   # 1 subsumed; the record (2) is older: ignored
    assert h3.coordinator.restore_latest_checkpoint().checkpoint_id == 3


def test_a_recorded_savepoint_that_cannot_be_read_is_refused_under_exactly_once(make_harness, tmp_path):
    h = make_harness(num_retained=1)
    savepoint = _stop_with_savepoint_subsuming_checkpoint_1(h, tmp_path, drain=False)
    filesystem.delete(savepoint.external_pointer, recursive=True)  # the user deleted it
    with pytest.raises(RestoreError) as info:
        make_harness(num_retained=1).coordinator.recover_completed_checkpoints()
    message = str(info.value)
    assert "last committed its output on terminating_savepoint 2" in message
    assert "_restore_point" in message and "resume='never'" in message
    # At-least-once accepts repeats: it starts from what is left (nothing) with a warning.
    assert make_harness(num_retained=1, mode="at_least_once").coordinator.recover_completed_checkpoints() == []


def test_a_damaged_record_is_named(make_harness, tmp_path):
    h = make_harness(num_retained=1)
    _stop_with_savepoint_subsuming_checkpoint_1(h, tmp_path, drain=False)
    filesystem.write_atomic(filesystem.join(h.storage.job_directory, "_restore_point"), b"{not json")
    with pytest.raises(RestoreError, match="restore-point record .*_restore_point is damaged"):
        make_harness(num_retained=1).coordinator.recover_completed_checkpoints()


def test_a_stop_with_savepoint_whose_record_cannot_be_written_fails(make_harness, tmp_path, monkeypatch):
    """The record is written before the savepoint counts as completed (and before what it
    subsumes is deleted): failing to write it fails the savepoint, chk-1 stays."""
    from streamsnap.checkpoint import coordinator as coordinator_module

    def refuse(*_):
        raise OSError("disk full")
    monkeypatch.setattr(coordinator_module, "write_restore_point", refuse)
    h = make_harness(num_retained=1)
    h.start()
    complete(h)
    future = h.coordinator.trigger_savepoint(str(tmp_path / "sp"), terminate=True)
    h.ack_all(2)
    assert reason_of(future) is R.FINALIZE_CHECKPOINT_FAILURE
    assert h.storage.completed_ids() == [1]
    assert h.coordinator.restore_latest_checkpoint().checkpoint_id == 1


def test_only_a_stop_with_savepoint_drains(make_harness, tmp_path):
    h = make_harness()
    h.start()
    with pytest.raises(ValueError, match="only a stop-with-savepoint"):
        h.coordinator.trigger_savepoint(str(tmp_path / "sp"), drain=True)


def test_savepoint_takes_priority_over_queued_checkpoints_and_max_concurrent(make_harness, tmp_path):
    h = make_harness(max_concurrent=1)
    h.start()
    h.coordinator.trigger_checkpoint()
    queued = h.coordinator.trigger_checkpoint()
    savepoint = h.coordinator.trigger_savepoint(str(tmp_path / "sp"))
    assert h.coordinator.pending_checkpoint_ids == [1, 2]  # the savepoint went ahead
    assert h.coordinator.pending_checkpoint(2).properties.is_savepoint
    h.ack_all(2)
    assert savepoint.result(timeout=0).checkpoint_id == 2
    h.ack_all(1)
    assert h.coordinator.pending_checkpoint_ids == [3]
    h.ack_all(3)
    assert queued.result(timeout=0).checkpoint_id == 3


def test_savepoint_failure_does_not_count(make_harness, tmp_path):
    h = make_harness(timeout=5.0, tolerable_failures=0)
    h.start()
    future = h.coordinator.trigger_savepoint(str(tmp_path / "sp"))
    location = h.location(1)
    h.scheduler.advance(5.0)
    assert reason_of(future) is R.CHECKPOINT_EXPIRED
    assert not filesystem.exists(location)
    assert h.failures == []


def test_savepoint_needs_a_target_directory(make_harness):
    h = make_harness()
    with pytest.raises(ValueError, match="target directory"):
        h.coordinator.trigger_savepoint("")


# ---------------------------------------------------------------- restore and ids

def test_restore_latest_checkpoint(make_harness):
    h = make_harness(num_retained=2)
    h.start()
    assert h.coordinator.restore_latest_checkpoint() is None
    complete(h)
    latest = complete(h)
    restored = h.coordinator.restore_latest_checkpoint()
    assert restored.checkpoint_id == latest.checkpoint_id
    assert restored.metadata == latest.metadata
    assert h.coordinator.stats.snapshot().latest_restored.checkpoint_id == 2


def corrupt_metadata(checkpoint) -> None:
    url = filesystem.join(checkpoint.external_pointer, "_metadata")
    data = bytearray(filesystem.read_bytes(url))
    data[-5] ^= 0x01
    filesystem.write_atomic(url, bytes(data))


def test_at_least_once_restore_falls_back_when_latest_metadata_is_corrupt(make_harness, caplog):
    h = make_harness(num_retained=2, mode="at_least_once")
    h.start()
    complete(h)
    corrupt_metadata(complete(h))
    with caplog.at_level(logging.WARNING, logger="streamsnap.checkpoint.coordinator"):
        restored = h.coordinator.restore_latest_checkpoint()
    assert restored.checkpoint_id == 1
    assert "cannot restore checkpoint 2" in caplog.text and "checksum mismatch" in caplog.text
    assert "output committed since then repeats" in caplog.text
    assert h.coordinator.id_counter.current == 3


def test_exactly_once_refuses_to_fall_back_past_committed_output(make_harness):
    """Checkpoint 2's output was committed: restoring checkpoint 1 would commit it again."""
    h = make_harness(num_retained=2)
    h.start()
    older = complete(h)
    corrupt_metadata(complete(h))
    with pytest.raises(RestoreError) as info:
        h.coordinator.restore_latest_checkpoint()
    text = str(info.value)
    assert "checkpoint 2" in text and "checksum mismatch" in text and "a second time" in text
    assert f"restore_from={filesystem.user_path(older.external_pointer)!r}" in text
    assert h.coordinator.stats.snapshot().latest_restored is None  # nothing was restored


def test_restore_raises_when_no_retained_checkpoint_is_readable(make_harness):
    h = make_harness(num_retained=1)
    h.start()
    latest = complete(h)
    filesystem.delete(filesystem.join(latest.external_pointer, "_metadata"))
    with pytest.raises(RestoreError, match="none of the 1 retained checkpoint"):
        h.coordinator.restore_latest_checkpoint()


def test_ids_continue_across_a_coordinator_restart(make_harness):
    h = make_harness()
    h.start()
    complete(h)
    complete(h)
    h.coordinator.trigger_checkpoint()  # 3 is in flight when the driver dies
    again = make_harness()  # new coordinator, same storage
    again.start()
    future = again.coordinator.trigger_checkpoint()
    assert again.coordinator.pending_checkpoint_ids == [4]
    again.ack_all(4)
    assert future.result(timeout=0).checkpoint_id == 4


def test_ids_continue_after_chk_directories_even_without_counter_file(make_harness, checkpoint_dir):
    h = make_harness()
    h.start()
    complete(h)
    filesystem.delete(h.storage.id_counter_url)
    again = make_harness()
    again.start()
    again.coordinator.trigger_checkpoint()
    assert again.coordinator.pending_checkpoint_ids == [2]


def test_restore_from_savepoint_moves_counter_and_is_never_deleted(make_harness, tmp_path, checkpoint_dir):
    h = make_harness()
    h.start()
    for _ in range(5):
        complete(h)
    savepoint = h.coordinator.trigger_savepoint(str(tmp_path / "sp"))
    h.ack_all(6)
    path = savepoint.result(timeout=0).external_pointer

    other = CheckpointStorage(checkpoint_dir, "otherjob")
    fresh = CheckpointCoordinator("otherjob", CheckpointConfig(interval=None, num_retained=1), other,
                                  ManualScheduler(), RecordingGateway(), lambda exc: None)
    restored = fresh.restore_from(path)
    assert restored.checkpoint_id == 6 and restored.checkpoint_type is CheckpointType.SAVEPOINT
    assert fresh.id_counter.current == 7
    assert fresh.restore_latest_checkpoint().checkpoint_id == 6  # failover point until a checkpoint completes
    fresh.shutdown(JobStatus.FINISHED)
    assert filesystem.exists(filesystem.join(path, "_metadata"))


# ---------------------------------------------------------------- shutdown

def test_shutdown_aborts_pending_and_refuses_new_requests(make_harness):
    h = make_harness(interval=5.0)
    h.start()
    h.scheduler.advance(5.0)
    queued_behind = h.coordinator.trigger_checkpoint()
    h.coordinator.shutdown(JobStatus.CANCELED)
    assert reason_of(queued_behind) is R.CHECKPOINT_COORDINATOR_SHUTDOWN
    assert h.coordinator.pending_checkpoint_ids == []
    assert reason_of(h.coordinator.trigger_checkpoint()) is R.CHECKPOINT_COORDINATOR_SHUTDOWN
    assert h.scheduler.pending_timers() == 0
    assert h.failures == []


@pytest.mark.parametrize("retention,status,kept", [
    ("delete_on_cancellation", JobStatus.CANCELED, False),
    ("retain_on_cancellation", JobStatus.CANCELED, True),
    ("retain_on_cancellation", JobStatus.FINISHED, False),
    ("delete_on_cancellation", JobStatus.FAILED, True),
])
def test_shutdown_applies_retention(make_harness, retention, status, kept):
    h = make_harness(retention=retention)
    h.start()
    completed = complete(h)
    h.coordinator.shutdown(status)
    assert filesystem.exists(filesystem.join(completed.external_pointer, "_metadata")) is kept


def test_a_finished_job_keeps_its_final_checkpoint_when_asked_and_a_new_run_starts_fresh(make_harness):
    from streamsnap.checkpoint.job_end import read_job_end

    h = make_harness(retention="retain_on_finish", num_retained=2)
    h.start()
    first, final = complete(h), complete(h)
    h.coordinator.shutdown(JobStatus.FINISHED)
    assert not filesystem.exists(first.external_pointer)                       # only the final one stays
    assert filesystem.exists(filesystem.join(final.external_pointer, "_metadata"))
    end = read_job_end(h.storage.job_directory)
    assert (end.status, end.kept_checkpoint, end.retention) == ("FINISHED", final.checkpoint_id, "retain_on_finish")
    # A new run of the finished job: its final checkpoint is state to read, not a failover point.
    h2 = make_harness(retention="retain_on_finish")
    assert h2.coordinator.recover_completed_checkpoints() == []
    assert h2.coordinator.restore_latest_checkpoint() is None
    assert resolve_restore_path(h.storage.job_directory)[1] == final.external_pointer   # readable by choice


@pytest.mark.parametrize("status,retention,reason", [
    (JobStatus.FINISHED, "delete_on_cancellation", "the job finished and deleted its checkpoints: set "
                                                   "CheckpointConfig(retention='retain_on_finish')"),
    (JobStatus.FINISHED, "retain_on_cancellation", "the job finished and deleted"),
    (JobStatus.CANCELED, "delete_on_cancellation", "the job was cancelled and deleted its checkpoints: set "
                                                   "CheckpointConfig(retention='retain_on_cancellation')"),
])
def test_reading_a_job_whose_checkpoints_were_deleted_names_why_and_the_setting(make_harness, status, retention,
                                                                                reason):
    h = make_harness(retention=retention)
    h.start()
    completed = complete(h)
    h.coordinator.shutdown(status)
    for path in (h.storage.job_directory, completed.external_pointer):   # the job's directory, or its chk-<n>
        with pytest.raises(RestoreError) as info:
            resolve_restore_path(path)
        assert reason in str(info.value)


def test_terminating_savepoint_pauses_periodic_checkpoints_and_resumes_on_failure(make_harness, tmp_path):
    h = make_harness(interval=5.0, timeout=20.0, max_concurrent=3)
    h.start()
    h.scheduler.advance(5.0)
    assert h.gateway.triggered_ids() == [1]
    h.ack_all(1)
    stop = h.coordinator.trigger_savepoint(str(tmp_path / "sp"), terminate=True)
    assert not h.coordinator.is_periodic_scheduling
    h.scheduler.advance(19.0)
    assert h.gateway.triggered_ids() == [1, 2]  # no periodic checkpoint while stopping
    h.scheduler.advance(1.0)  # the savepoint expires: stopping failed
    assert reason_of(stop) is R.CHECKPOINT_EXPIRED
    assert h.coordinator.is_periodic_scheduling
    h.scheduler.advance(5.0)
    assert h.gateway.triggered_ids() == [1, 2, 3]


# ---------------------------------------------------------------- random schedules

OPS = st.sampled_from(["trigger", "trigger", "savepoint", "ack", "ack", "ack_rest", "ack_rest", "ack_old_attempt",
                       "late_ack", "decline", "advance", "task_failure_and_redeploy"])


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(OPS, st.integers(0, 1000)), min_size=10, max_size=60),
       max_concurrent=st.integers(1, 3), num_retained=st.integers(1, 3))
def test_random_schedules_keep_the_invariants(tmp_path_factory, ops, max_concurrent, num_retained):
    base = tmp_path_factory.mktemp("random")
    storage = CheckpointStorage(str(base / "ckpt"), "job")
    gateway = RecordingGateway()
    scheduler = ManualScheduler()
    failures = []
    config = CheckpointConfig(interval=None, timeout=10.0, max_concurrent=max_concurrent,
                              num_retained=num_retained, tolerable_failures=1000)
    coordinator = CheckpointCoordinator("job", config, storage, scheduler, gateway, failures.append,
                                        rng=random.Random(0))
    h = Harness(coordinator, scheduler, gateway, storage, failures)
    h.start()
    futures = []
    finished = []  # checkpoint ids that completed or were aborted, in order
    savepoint_dir = str(base / "sp")

    track = futures.append

    locations = {}  # where each checkpoint's tasks write (chk-<n> or a savepoint directory)

    def record_finished(before):
        for cid in sorted(before - set(coordinator.pending_checkpoint_ids)):
            finished.append(cid)
        for cid in coordinator.pending_checkpoint_ids:
            locations[cid] = coordinator.pending_checkpoint(cid).location.url

    for op, pick in ops:
        record_finished(set())
        before = set(coordinator.pending_checkpoint_ids)
        pending = coordinator.pending_checkpoint_ids
        if op == "trigger":
            track(coordinator.trigger_checkpoint())
        elif op == "savepoint":
            track(coordinator.trigger_savepoint(savepoint_dir))
        elif op == "ack" and pending:
            cid = pending[pick % len(pending)]
            waiting = sorted(coordinator.pending_checkpoint(cid).not_yet_acknowledged)
            assert h.ack(cid, waiting[pick % len(waiting)]) is AcknowledgeResult.SUCCESS
        elif op == "ack_rest" and pending:
            cid = pending[pick % len(pending)]
            for attempt in sorted(coordinator.pending_checkpoint(cid).not_yet_acknowledged):
                if cid in coordinator.pending_checkpoint_ids:  # may be subsumed or completed meanwhile
                    assert h.ack(cid, attempt) is AcknowledgeResult.SUCCESS
        elif op == "ack_old_attempt" and pending:
            cid = pending[pick % len(pending)]
            old = ExecutionAttemptId("sum", pick % 2, h.attempt_number + 100)
            assert h.ack(cid, old) is AcknowledgeResult.UNKNOWN
        elif op == "late_ack" and finished:
            cid = finished[-1]
            result = coordinator.receive_acknowledge(h.ack_message(cid, h.tasks[pick % 4],
                                                                   base_url=locations[cid]))
            assert result is AcknowledgeResult.DISCARDED
        elif op == "decline" and pending:
            cid = pending[pick % len(pending)]
            h.decline(cid, h.tasks[pick % 4], R.CHECKPOINT_DECLINED)
        elif op == "advance":
            scheduler.advance(pick % 12)
        elif op == "task_failure_and_redeploy":
            coordinator.execution_state_changed(h.tasks[pick % 4], ExecutionState.FAILED)
            h.deploy(number=h.attempt_number + 1)
        record_finished(before)

        # Invariants after every step.
        regular = [c for c in coordinator.pending_checkpoint_ids
                   if not coordinator.pending_checkpoint(c).properties.is_savepoint]
        assert len(regular) <= max_concurrent
        retained = [c.checkpoint_id for c in coordinator.completed_store.all()]
        assert retained == sorted(retained) and len(retained) <= num_retained
        on_disk = set(storage.existing_checkpoint_ids())
        assert on_disk <= set(coordinator.pending_checkpoint_ids) | set(retained), "lingering chk directory"
        for future in futures:
            if not future.done():
                assert coordinator.num_queued_requests or coordinator.pending_checkpoint_ids

    # Let everything in flight expire, then nothing but retained checkpoints and completed savepoints remain.
    # Queued requests start one after another as earlier ones expire (each after its 10 s timeout),
    # so advance until idle: at most one timeout per request made, plus one.
    for _ in range(len(futures) + 1):
        if not coordinator.pending_checkpoint_ids and not coordinator.num_queued_requests:
            break
        scheduler.advance(config.timeout)
    assert coordinator.pending_checkpoint_ids == []
    assert coordinator.num_queued_requests == 0
    assert all(f.done() for f in futures)
    retained = coordinator.completed_store.all()
    assert set(storage.existing_checkpoint_ids()) == {c.checkpoint_id for c in retained}
    expected_files = {u for c in retained for u in c.exclusive_files()} | {c.location.metadata_url for c in retained}
    fs, root = filesystem.filesystem(storage.job_directory)
    actual_files = {filesystem.normalize(p) for p in fs.find(root) if "/chk-" in p}
    assert actual_files == expected_files
    savepoints = [f.result() for f in futures if f.exception() is None and f.result().properties.is_savepoint]
    if filesystem.exists(savepoint_dir):
        assert {name for name, _ in subdirectories(filesystem.normalize(savepoint_dir))} == \
            {s.external_pointer.rsplit("/", 1)[-1] for s in savepoints}
    for checkpoint in retained:
        assert read_metadata(checkpoint.location.metadata_url).checkpoint_id == checkpoint.checkpoint_id
    committed = {c for _, c, _ in gateway.completed}
    completed_checkpoints = {f.result().checkpoint_id for f in futures
                             if f.exception() is None and not f.result().properties.is_savepoint}
    assert committed == completed_checkpoints
    assert failures == []
    event(f"completed checkpoints: {min(len(completed_checkpoints), 3)}+, savepoints: {min(len(savepoints), 1)}+")


def test_restored_from_a_snapshot_loaded_by_the_caller(make_harness):
    h = make_harness()
    h.coordinator.restored_from(41, "file:///sp/savepoint-x", CheckpointType.SAVEPOINT)
    assert h.coordinator.id_counter.current == 42
    restored = h.coordinator.stats.snapshot().latest_restored
    assert (restored.checkpoint_id, restored.external_path) == (41, "file:///sp/savepoint-x")
    h.coordinator.restored_from(3)  # never backwards
    h.start()
    h.coordinator.trigger_checkpoint()
    assert h.coordinator.pending_checkpoint_ids == [42]


def test_stopping_the_periodic_scheduler_keeps_in_flight_checkpoints(tmp_path):
    from streamsnap.checkpoint.coordinator import CheckpointCoordinator, CheckpointListenerError
    from streamsnap.checkpoint.storage import CheckpointStorage
    from streamsnap.clock import ManualScheduler
    from streamsnap.cluster.status import ExecutionState, JobStatus
    from streamsnap.api.config import CheckpointConfig
    from streamsnap.graph.ids import ExecutionAttemptId
    from streamsnap.checkpoint.pending import OperatorInfo
    from streamsnap.checkpoint.messages import AcknowledgeCheckpoint

    triggered = []

    class Gateway:
        def trigger_checkpoint(self, attempt, checkpoint_id, timestamp, options):
            triggered.append(checkpoint_id)

        def notify_checkpoint_complete(self, attempt, checkpoint_id, timestamp):
            pass

        def notify_checkpoint_aborted(self, attempt, checkpoint_id):
            pass

    scheduler = ManualScheduler()
    config = CheckpointConfig(interval=1.0, directory=str(tmp_path))
    coordinator = CheckpointCoordinator("job", config, CheckpointStorage(str(tmp_path), "job"), scheduler,
                                        Gateway(), lambda exc: None)
    task = ExecutionAttemptId("v", 0, 0)
    coordinator.set_execution_attempts([task], [task], [task], {"op": OperatorInfo("v", 1, 8)})
    coordinator.execution_state_changed(task, ExecutionState.RUNNING)
    coordinator.job_status_changed(JobStatus.RUNNING)
    scheduler.advance(1.0)
    assert triggered == [1]
    coordinator.stop_periodic_scheduler()
    scheduler.advance(5.0)
    assert triggered == [1]  # no new periodic trigger ...
    assert coordinator.pending_checkpoint_ids == [1]  # ... and the one in flight goes on
    coordinator.receive_acknowledge(AcknowledgeCheckpoint(task, 1))
    assert coordinator.completed_store.latest().checkpoint_id == 1
    final = coordinator.trigger_checkpoint()  # an explicit (final) checkpoint still works
    assert triggered == [1, 2] and not final.done()


# ---------------------------------------------------------------- abandoned state

def test_a_very_late_savepoint_ack_deletes_its_state_and_the_recreated_directory(make_harness, tmp_path):
    """More than NUM_RECENT_CHECKPOINTS later the coordinator has forgotten the savepoint; the
    ack's own location still leads to its files (not to chk-<id> of the job directory)."""
    h = make_harness()
    h.start()
    h.coordinator.trigger_savepoint(str(tmp_path / "sp"))
    location = h.location(1)
    h.decline(1, h.tasks[0], R.CHECKPOINT_DECLINED)             # aborted: its directory is deleted
    assert not filesystem.exists(location)
    for _ in range(20):
        complete(h)
    late = h.ack_message(1, h.tasks[1], base_url=location)      # a straggler writes, then acks
    late = AcknowledgeCheckpoint(late.attempt, 1, late.subtask_state, late.metrics, location)
    assert filesystem.exists(location)
    assert h.coordinator.receive_acknowledge(late) is None
    assert not filesystem.exists(location)


def test_a_late_ack_cannot_make_the_coordinator_delete_elsewhere(make_harness, tmp_path):
    h = make_harness()
    h.start()
    elsewhere = str(tmp_path / "precious")
    keep = write_file(elsewhere, "data")
    ack = AcknowledgeCheckpoint(h.tasks[0], 99, {}, CheckpointMetrics(), filesystem.normalize(elsewhere))
    h.coordinator.receive_acknowledge(ack)
    assert file_exists(elsewhere, keep.path)


def test_abandoned_checkpoint_directories_are_swept_but_not_pending_or_completed_ones(make_harness):
    h = make_harness(num_retained=2)
    h.start()
    completed = complete(h)                                      # 1
    h.coordinator.trigger_checkpoint()                           # 2 stays pending
    stray = h.storage.checkpoint_directory(7)                    # a cancelled task re-created it
    write_file(stray, "partial")
    h.coordinator.discard_abandoned_locations()
    assert not filesystem.exists(stray)
    assert filesystem.exists(h.location(2))
    assert filesystem.exists(filesystem.join(completed.external_pointer, "_metadata"))


# ---------------------------------------------------------------- file I/O off the event loop

class ManualIO:
    """An I/O executor the test steps: work waits until `run_next`, in submission order."""

    def __init__(self):
        self.queue = []

    def run(self, work, then):
        self.queue.append((work, then))

    def delete(self, url, recursive=False):
        self.queue.append((lambda: filesystem.delete(url, recursive=recursive), lambda r, e: None))

    def run_next(self):
        work, then = self.queue.pop(0)
        try:
            result, error = work(), None
        except Exception as exc:
            result, error = None, exc
        then(result, error)

    def run_all(self):
        while self.queue:
            self.run_next()


def harness_with_io(checkpoint_dir) -> tuple[Harness, ManualIO]:
    io = ManualIO()
    storage = CheckpointStorage(checkpoint_dir, JOB_ID)
    gateway = RecordingGateway()
    coordinator = CheckpointCoordinator(JOB_ID, CheckpointConfig(interval=None, directory=checkpoint_dir),
                                        storage, ManualScheduler(), gateway, lambda exc: None, io=io)
    h = Harness(coordinator, ManualScheduler(), gateway, storage)
    h.start()
    return h, io


def test_metadata_is_written_off_the_loop_and_completion_waits_for_it(checkpoint_dir):
    h, io = harness_with_io(checkpoint_dir)
    coordinator, gateway = h.coordinator, h.gateway
    future = coordinator.trigger_checkpoint()
    h.ack_all(1)
    # All acknowledged, but _metadata is queued on the I/O side: not complete, nothing committed.
    assert not future.done() and gateway.completed == []
    assert not filesystem.exists(filesystem.join(h.location(1), "_metadata"))
    io.run_next()
    assert future.result(timeout=0).checkpoint_id == 1 and len(gateway.completed) == len(h.tasks)


def test_an_abort_while_metadata_is_written_deletes_the_directory_after_the_write(checkpoint_dir):
    h, io = harness_with_io(checkpoint_dir)
    coordinator, gateway = h.coordinator, h.gateway
    future = coordinator.trigger_checkpoint()
    location = h.location(1)
    h.ack_all(1)
    coordinator.abort_pending_checkpoints(R.JOB_FAILOVER)      # the job fails over meanwhile
    assert reason_of(future) is R.JOB_FAILOVER
    io.run_all()                                                # the write, then the deletes
    assert not filesystem.exists(location)
    assert gateway.completed == [] and coordinator.completed_store.all() == []


# ---------------------------------------------------------------- a new driver for the same job

def test_a_new_coordinator_recovers_the_earlier_runs_checkpoints(make_harness):
    earlier = make_harness(num_retained=2)
    earlier.start()
    for _ in range(3):
        complete(earlier)                       # 2 and 3 retained; then the driver dies
    again = make_harness(num_retained=2)        # same storage, new process
    assert again.coordinator.recover_completed_checkpoints() == [2, 3]
    assert again.coordinator.restore_latest_checkpoint().checkpoint_id == 3
    again.start()
    complete(again)                             # 4 subsumes 2: the recovered ones are the job's own
    assert [c.checkpoint_id for c in again.coordinator.completed_store.all()] == [3, 4]
    assert not filesystem.exists(again.storage.checkpoint_directory(2))


def test_recovery_refuses_an_unreadable_newest_checkpoint_under_exactly_once(make_harness):
    earlier = make_harness(num_retained=2)
    earlier.start()
    complete(earlier)
    corrupt_metadata(complete(earlier))
    with pytest.raises(RestoreError, match="checkpoint 2 .*cannot be read.*resume='never'"):
        make_harness(num_retained=2).coordinator.recover_completed_checkpoints()
    lenient = make_harness(num_retained=2, mode="at_least_once")
    assert lenient.coordinator.recover_completed_checkpoints() == [1]


def test_unaligned_checkpoints_carry_their_options_and_savepoints_stay_aligned(make_harness, tmp_path):
    h = make_harness(unaligned=True, aligned_timeout=0.2)
    h.start()
    h.coordinator.trigger_checkpoint()
    h.coordinator.trigger_savepoint(str(tmp_path / "sp"))
    options = [t[3] for t in h.gateway.triggered]
    checkpoint = next(o for o in options if o.checkpoint_type is CheckpointType.CHECKPOINT)
    savepoint = next(o for o in options if o.checkpoint_type is CheckpointType.SAVEPOINT)
    assert (checkpoint.unaligned, checkpoint.aligned_timeout) == (True, 0.2)
    assert (savepoint.unaligned, savepoint.aligned_timeout) == (False, None)


def test_an_unaligned_checkpoints_metadata_keeps_each_subtasks_in_flight_figures(make_harness):
    from streamsnap.checkpoint.messages import CheckpointMetrics

    h = make_harness(unaligned=True)
    h.start()
    future = h.coordinator.trigger_checkpoint()
    for i, attempt in enumerate(h.tasks):
        h.ack(1, attempt, metrics=CheckpointMetrics(bytes_persisted_of_in_flight_data=100 * i,
                                                    bytes_processed_during_alignment=7, unaligned=i > 0))
    metadata = future.result(timeout=0).metadata
    assert metadata.in_flight == {f"{a.vertex_id}#{a.index}": (i > 0, 100 * i, 7) for i, a in enumerate(h.tasks)}
    assert read_metadata(filesystem.join(future.result(timeout=0).external_pointer or
                                         h.storage.checkpoint_directory(1), "_metadata")).in_flight == metadata.in_flight


def test_an_aligned_checkpoints_metadata_has_no_in_flight_entry(make_harness):
    h = make_harness()
    h.start()
    future = h.coordinator.trigger_checkpoint()
    h.ack_all(1)
    metadata = future.result(timeout=0).metadata
    assert metadata.in_flight == {} and "in_flight" not in metadata.to_wire()


def test_a_fenced_coordinator_completes_nothing_and_tells_no_sink_to_commit(make_harness, tmp_path):
    """A JobMaster superseded by a newer epoch (cluster/registry.py) must not finalize."""
    from streamsnap.cluster.registry import JobRegistry

    registry = JobRegistry(str(tmp_path / "registry"), "job")
    epoch = registry.take_epoch({})
    h = make_harness(tolerable_failures=0)
    h.coordinator._fence = lambda: registry.fence(epoch)
    h.start()
    assert complete(h).checkpoint_id == 1              # still the newest leader
    registry.take_epoch({})                            # a newer JobMaster took over
    future = h.coordinator.trigger_checkpoint()
    h.ack_all(2)
    assert reason_of(future) is R.FINALIZE_CHECKPOINT_FAILURE
    assert "superseded by epoch 1" in str(future.exception())
    assert not filesystem.exists(filesystem.join(h.storage.checkpoint_directory(2), "_metadata"))
    assert h.coordinator.completed_store.latest().checkpoint_id == 1
    assert [cid for _, cid, _ in h.gateway.completed] == [1] * len(h.tasks)
