"""The JobMaster does not wait forever for a Spark job that ignores cancellation.

Spark is replaced by a stand-in whose barrier job ignores cancellation: this tests the
JobMaster's own decision logic (what it does when cancellation is not honoured), not Spark.
"""

import logging
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
