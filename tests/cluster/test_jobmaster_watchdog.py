"""The JobMaster does not wait forever for a Spark job that ignores cancellation.

Spark is replaced by a stand-in whose barrier job ignores cancellation: this tests the
JobMaster's own decision logic (what it does when cancellation is not honoured), not Spark.
"""

import logging
import threading
import time

import pytest

import streamsnap as ss
from streamsnap.cluster import jobmaster
from tests.cluster.standin import StandInSpark, master_for


@pytest.fixture
def short_grace(monkeypatch):
    monkeypatch.setattr(jobmaster, "SPARK_CANCEL_GRACE", 0.3)


def test_a_failover_goes_on_when_the_cancelled_spark_job_never_ends(short_grace, caplog):
    caplog.set_level(logging.WARNING, logger="streamsnap.cluster.jobmaster")
    spark = StandInSpark(ends_on_cancel=False)
    master = master_for(spark, ss.RestartStrategy.none())
    master.start()
    try:
        time.sleep(0.2)
        master._post(lambda: master._handle_failure("a task was lost", "TASK_LOST", 0))
        with pytest.raises(ss.JobExecutionError, match="a task was lost"):
            master.wait(10)
        assert len(spark.cancelled) == 2  # once on failure, once more when overdue
        assert any("did not end" in r.getMessage() and "active Spark jobs: [7]" in r.getMessage()
                   for r in caplog.records)
    finally:
        spark.release.set()


def test_cancel_finishes_when_the_spark_job_never_ends(short_grace):
    spark = StandInSpark(ends_on_cancel=False)
    master = master_for(spark, ss.RestartStrategy.none())
    master.start()
    try:
        time.sleep(0.2)
        master.cancel()
        assert master.wait_terminal(10)
        assert master.status.value == "CANCELED"
    finally:
        spark.release.set()


def test_a_user_error_reported_after_a_lost_upstream_is_the_jobs_cause_and_a_data_error_stops_restarts():
    # A task's user function raises and it closes its channels; the downstream task that notices
    # the lost connection may report first. The attempt is charged once, with the root cause.
    spark = StandInSpark(ends_on_cancel=True)
    master = master_for(spark, ss.RestartStrategy.fixed_delay(attempts=5, delay=0.0))
    master.start()
    master._post(lambda: master._handle_failure("UpstreamLostError: lost the connection from upstream",
                                                "TASK_FAILURE", 0))
    master._post(lambda: master._handle_failure("bad row {'x': 1}", "DATA_ERROR", 0))
    master._post(lambda: master._handle_failure("another knock-on", "TASK_FAILURE", 0))
    with pytest.raises(ss.JobExecutionError, match="a data error recurs") as info:
        master.wait(10)
    assert info.value.reason == "DATA_ERROR" and "bad row {'x': 1}" in str(info.value)
    assert spark.jobs_started == 1        # charged once, and a data error is not restarted


def _deployed_master():
    """A JobMaster (parallelism 2, 5 restarts) on the stand-in, once its first attempt's subtasks exist."""
    spark = StandInSpark(ends_on_cancel=False)
    master = master_for(spark, ss.RestartStrategy.fixed_delay(attempts=5, delay=0.0), parallelism=2)
    master.start()
    deadline = time.monotonic() + 10
    while len(master._subtasks) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return spark, master


def test_a_data_error_reported_by_a_task_after_a_knock_on_failure_is_the_jobs_cause():
    # The same race as above, but through the control messages the tasks send: the attempt has
    # ended with the first report, and the root cause that follows must still be heard.
    spark, master = _deployed_master()
    try:
        first, second = [s.attempt_id.to_wire() for s in master._subtasks.values()][:2]
        master._post(lambda: master._handle_message(None, {
            "type": "failed", "attempt": first, "error": "UpstreamLostError: lost the connection from upstream",
            "user_error": False, "data_error": False}))
        master._post(lambda: master._handle_message(None, {
            "type": "failed", "attempt": second, "error": "bad row {'x': 1}", "user_error": True,
            "data_error": True}))
        done = threading.Event()
        master._post(done.set)
        assert done.wait(10)
        spark.release.set()           # the cancelled Spark job ends only now
        with pytest.raises(ss.JobExecutionError, match="a data error recurs") as info:
            master.wait(10)
        assert info.value.reason == "DATA_ERROR" and "bad row {'x': 1}" in str(info.value)
        assert spark.jobs_started == 1
    finally:
        spark.release.set()


@pytest.mark.parametrize("close_after_grace", [False, True])
def test_a_killed_upstream_is_the_root_cause_even_when_its_downstream_reports_the_lost_channel_first(
        close_after_grace):
    # SIGKILL of an upstream task: its downstream notices the dropped data connection and may
    # report before the JobMaster sees the upstream's own control connection drop. The attempt
    # ends with the first report; the killed subtask is still named as the root cause.
    spark, master = _deployed_master()
    try:
        subtasks = list(master._subtasks.values())
        source = next(s for s in subtasks if "collection" in s.attempt_id.vertex_id)
        other = next(s for s in subtasks if s is not source)
        lost = [source.attempt_id.vertex_id, source.attempt_id.index]
        master._post(lambda: master._handle_message(None, {
            "type": "failed", "attempt": other.attempt_id.to_wire(), "follow_on": True, "lost": lost,
            "error": f"UpstreamLostError: lost the connection from upstream subtask {lost[0]}#0",
            "task": "downstream (2/2)", "user_error": False, "data_error": False}))
        if close_after_grace:     # the upstream's connection drops late: the cause is upgraded then
            time.sleep(jobmaster.FOLLOW_ON_GRACE + 0.2)
        master._post(lambda: master._handle_close(type("Conn", (), {"context": source})(), None))
        time.sleep(jobmaster.FOLLOW_ON_GRACE + 0.2)       # the follow-on report, held for that long, folds in
        done = threading.Event()
        master._post(done.set)
        assert done.wait(10)
        [entry] = master.exceptions.entries()
        assert entry.reason == "TASK_LOST" and f"lost subtask {lost[0]}#0" in entry.root_cause, entry
        assert entry.task == "Source: collection (1/1)" and [c.task for c in entry.concurrent] == ["downstream (2/2)"]
        assert master._attempts.failures == 1            # charged once
    finally:
        spark.release.set()
        master.cancel()
