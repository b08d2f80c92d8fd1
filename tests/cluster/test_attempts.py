"""A failure is charged once per attempt; stragglers of an ended attempt change nothing.

The tracker is tested message by message; the JobMaster is driven through its own event handlers
with a stand-in Spark whose barrier job ends when cancelled, in the order that made the chaos
tests count one kill twice (a second subtask of the failed attempt closing its connection while
the job is FAILING, RESTARTING, and after the new attempt was deployed).

A Spark job that ends cleanly before the subtasks' last reports were handled is driven message by
message instead: on the test's thread, on a manual clock, with no Spark job and no loop thread.
"""

from __future__ import annotations

import queue
import time

import pytest

import streamsnap as ss
from streamsnap.clock import ManualScheduler, TimerQueue
from streamsnap.cluster import failover
from streamsnap.cluster.attempts import AttemptTracker
from streamsnap.cluster.status import JobStatus
from tests.cluster.standin import StandInSpark, master_for


def test_a_failure_ends_the_attempt_once_and_stragglers_do_not_count():
    t = AttemptTracker()
    assert not t.is_live(0)
    assert t.request_deploy() and not t.request_deploy()  # at most one pending deploy
    assert t.begin_deploy() == 0 and t.is_live(0)
    assert t.charge_failure(0)
    assert not t.charge_failure(0) and not t.is_live(0)  # a second subtask of attempt 0
    assert t.request_deploy() and not t.request_deploy()
    assert not t.charge_failure(0)                       # during the restart delay
    assert t.begin_deploy() == 1
    assert not t.charge_failure(0) and t.is_live(1)      # racing with the redeploy
    assert t.charge_failure(1) and t.failures == 2


def test_a_cancelled_attempt_charges_no_failure_and_deploy_needs_a_request():
    t = AttemptTracker()
    t.request_deploy()
    t.begin_deploy()
    t.retire(0)
    assert not t.charge_failure(0) and t.failures == 0
    with pytest.raises(RuntimeError, match="without a pending deploy"):
        t.begin_deploy()
    t.request_deploy()
    t.cancel_deploy()
    assert t.request_deploy()


class Conn:
    """What `_handle_close` reads of a control connection: the subtask it belongs to."""

    def __init__(self, subtask):
        self.context = subtask


def wait_for(condition, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def stragglers(master, subtasks, attempt, checkpoint_limit=False):
    """Everything an ended attempt's subtasks and Spark job may still report (and, while it is
    still the newest attempt, the coordinator's checkpoint-failure limit)."""
    def deliver():
        for s in subtasks:
            master._handle_close(Conn(s), ConnectionResetError("peer gone"))
            master._handle_message(Conn(s), {"type": "failed", "attempt": s.attempt_id.to_wire(),
                                             "error": "cancelled by the driver"})
        master._on_spark_job_end(attempt, RuntimeError("Could not recover from a failed barrier ResultStage"))
        master._deploy_timed_out(attempt)
        if checkpoint_limit:
            master._on_checkpoint_failure_limit(RuntimeError("tolerable checkpoint failures exceeded"))
    master._post(deliver)


def test_a_second_subtask_lost_after_the_failure_is_not_a_second_restart():
    spark = StandInSpark(ends_on_cancel=True)
    master = master_for(spark, ss.RestartStrategy.fixed_delay(attempts=3, delay=0.3), parallelism=2)
    master.start()
    try:
        wait_for(lambda: spark.jobs_started == 1, "attempt 0's Spark job")
        first = list(master._subtasks.values())
        assert len(first) >= 2
        # The real failure, and at once (same loop turn, job FAILING) the other subtask's close.
        master._post(lambda: (master._handle_close(Conn(first[0]), None),
                              master._handle_close(Conn(first[1]), None)))
        wait_for(lambda: master.status is JobStatus.RESTARTING, "RESTARTING")
        stragglers(master, first, 0, checkpoint_limit=True)  # during the restart delay
        wait_for(lambda: spark.jobs_started >= 2, "attempt 1's Spark job")
        stragglers(master, first, 0)               # racing with the redeploy
        time.sleep(0.8)                            # longer than the restart delay: a second deploy would show
        assert spark.jobs_started == 2
        assert master._attempt == 1 and master._backoff.restarts == 1
        assert len(master.recovery_log) == 1
        assert master.status is not JobStatus.FAILED
        # The new attempt still fails over normally.
        second = list(master._subtasks.values())
        master._post(lambda: master._handle_close(Conn(second[1]), None))
        wait_for(lambda: spark.jobs_started >= 3, "attempt 2's Spark job")
        assert master._backoff.restarts == 2 and len(master.recovery_log) == 2
    finally:
        master.cancel()
        assert master.wait_terminal(10)
        spark.release.set()
    assert master.status is JobStatus.CANCELED


def test_cancel_during_the_restart_delay_deploys_nothing():
    spark = StandInSpark(ends_on_cancel=True)
    master = master_for(spark, ss.RestartStrategy.fixed_delay(attempts=3, delay=0.5))
    master.start()
    try:
        wait_for(lambda: spark.jobs_started == 1, "attempt 0's Spark job")
        (only,) = master._subtasks.values()
        master._post(lambda: master._handle_close(Conn(only), None))
        wait_for(lambda: master.status is JobStatus.RESTARTING, "RESTARTING")
        master.cancel()
        assert master.wait_terminal(5)
        time.sleep(0.7)
        assert master.status is JobStatus.CANCELED and spark.jobs_started == 1
    finally:
        spark.release.set()


def test_a_user_or_data_error_replaces_a_knock_on_cause_and_nothing_replaces_a_data_error():
    from streamsnap.cluster.attempts import replaces_cause

    assert replaces_cause("USER_FUNCTION", "TASK_FAILURE") and replaces_cause("DATA_ERROR", "TASK_LOST")
    assert replaces_cause("DATA_ERROR", "USER_FUNCTION")
    assert not replaces_cause("TASK_FAILURE", "USER_FUNCTION") and not replaces_cause("USER_FUNCTION", "DATA_ERROR")
    assert not replaces_cause("TASK_LOST", "TASK_FAILURE") and not replaces_cause("USER_FUNCTION", "USER_FUNCTION")


class TaskConn(Conn):
    """A subtask's control connection as the JobMaster's loop sees it: `closed` once its reader
    thread saw the end of the stream (the close itself is an event queued behind its messages)."""

    def __init__(self):
        super().__init__(None)
        self.closed = False
        self.sent: list[dict] = []

    def send(self, message: dict) -> bool:
        self.sent.append(message)
        return not self.closed

    def close(self) -> None:
        self.closed = True


def settle(master) -> None:
    """Turn the JobMaster's loop by hand until nothing is queued or due: an event, then the due timers."""
    while True:
        try:
            event = master._events.get_nowait()
        except queue.Empty:
            event = None
        if event is not None:
            event()
        if master._timers.run_due() == 0 and event is None:
            return


@pytest.fixture
def running():
    """A JobMaster (no restarts) on a manual clock whose first attempt is RUNNING, its Spark job
    not yet ended: (master, clock, the subtasks' connections by task index)."""
    master = master_for(StandInSpark(ends_on_cancel=False), ss.RestartStrategy.none(), parallelism=2)
    clock = ManualScheduler()
    master._clock, master._timers = clock, TimerQueue(clock)
    master._launch_attempt = lambda deployment: setattr(master, "_spark_running", True)
    master._attempts.request_deploy()
    master._deploy()
    conns = {index: TaskConn() for index in master._subtasks}
    for kind in ("register", "running"):
        for index, subtask in master._subtasks.items():
            master._on_control_message(conns[index], {"type": kind, "attempt": subtask.attempt_id.to_wire(),
                                                      "pid": 100 + index, "host": "h", "data_address": None})
    settle(master)
    assert master.status is JobStatus.RUNNING and len(conns) >= 2
    yield master, clock, conns
    if not master.wait_terminal(0):
        master._server.close()


def report(master, conn, kind: str) -> None:
    """What the subtask's connection thread posts: its report, or (kind "close") the end of its stream."""
    if kind == "close":
        conn.closed = True
        master._on_control_close(conn, None)
    else:
        master._on_control_message(conn, {"type": kind, "attempt": conn.context.attempt_id.to_wire()})


def end_before_reports(master, reports: list, read: bool) -> None:
    """The Spark job ends cleanly, then the subtasks' `reports` ((connection, kind), each ending
    its stream with "close") come: `read`, their connection threads had already read them, queued
    behind the end; else the loop takes the end while they are still being read."""
    if read:
        for conn, kind in reports:
            conn.closed = conn.closed or kind == "close"
    master._post(lambda: master._on_spark_job_end(master._attempt, None))   # the Spark job's thread
    if not read:
        settle(master)
        assert master.status is JobStatus.RUNNING   # the job waits for the reports
    for conn, kind in reports:
        report(master, conn, kind)
    settle(master)


@pytest.mark.parametrize("read", [False, True], ids=["still-reading", "read-not-handled"])
def test_a_clean_spark_end_before_the_finished_reports_are_handled_ends_the_job_finished(running, read):
    master, clock, conns = running
    end_before_reports(master, [(conn, kind) for conn in conns.values() for kind in ("finished", "close")], read)
    clock.advance(0.05)   # a connection still being read is looked at again every 20 ms
    settle(master)
    assert master.status is JobStatus.FINISHED
    assert master.wait(0).status == JobStatus.FINISHED.value


@pytest.mark.parametrize("read", [False, True], ids=["still-reading", "read-not-handled"])
def test_a_subtask_lost_after_a_clean_spark_end_fails_the_job_as_task_lost(running, read):
    master, clock, conns = running
    lost, *finishing = conns.values()
    end_before_reports(master, [(conn, kind) for conn in finishing for kind in ("finished", "close")]
                       + [(lost, "close")], read)   # no finished report: the task process died
    clock.advance(failover.LAST_REPORTS_GRACE + 1)
    settle(master)
    assert master.status is JobStatus.FAILED
    with pytest.raises(ss.JobExecutionError) as failed:
        master.wait(0)
    assert failed.value.reason == "TASK_LOST" and "lost subtask" in failed.value.cause


def test_a_subtask_silent_after_a_clean_spark_end_fails_the_job_after_the_grace(running, monkeypatch):
    monkeypatch.setattr(failover, "LAST_REPORTS_GRACE", 0.5)
    master, clock, conns = running
    *finishing, silent = conns.values()
    end_before_reports(master, [(conn, "finished") for conn in finishing], read=False)
    clock.advance(0.45)
    settle(master)
    assert master.status is JobStatus.RUNNING
    clock.advance(0.1)
    settle(master)
    assert master.status is JobStatus.FAILED
    with pytest.raises(ss.JobExecutionError) as failed:
        master.wait(0)
    assert failed.value.reason == "SPARK_JOB_FAILED"
    assert failed.value.cause == "the Spark job ended before all subtasks finished"
    assert silent.sent[-1] == {"type": "cancel"}   # the attempt is stopped, the silent task with it
