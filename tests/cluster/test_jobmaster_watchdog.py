"""The JobMaster does not wait forever for a Spark job that ignores cancellation.

Spark is replaced by a stand-in whose barrier job never ends: this tests the JobMaster's own
decision logic (what it does when cancellation is not honoured), not Spark.
"""

import logging
import threading
import time

import pytest

import streamsnap as ss
from streamsnap.cluster import jobmaster
from streamsnap.cluster.jobmaster import JobMaster, JobSettings
from streamsnap.graph.execution_graph import build_execution_graph
from streamsnap.graph.job_graph import build_job_graph


class HungSpark:
    """A SparkSession stand-in whose jobs run until released and ignore cancellation."""

    def __init__(self):
        self.release = threading.Event()
        self.cancelled: list[str] = []
        self.sparkContext = self

    master = "local[8]"

    def setJobGroup(self, group, description, interruptOnCancel=False):
        pass

    def parallelize(self, data, slices):
        return self

    def barrier(self):
        return self

    def mapPartitions(self, fn):
        return self

    def collect(self):
        self.release.wait(30)
        return []

    def cancelJobGroup(self, group):
        self.cancelled.append(group)

    def statusTracker(self):
        return self

    def getActiveJobsIds(self):
        return [7]


def master_for(spark):
    env = ss.StreamEnvironment(parallelism=1)
    env.from_collection([{"a": 1}]).sink_to(ss.sinks.Collect())
    graph = build_execution_graph(build_job_graph(env._graph))
    return JobMaster(spark, graph, JobSettings("hung", None, ss.RestartStrategy.none(), ss.NetworkConfig()))


@pytest.fixture
def short_grace(monkeypatch):
    monkeypatch.setattr(jobmaster, "SPARK_CANCEL_GRACE", 0.3)


def test_a_failover_goes_on_when_the_cancelled_spark_job_never_ends(short_grace, caplog):
    caplog.set_level(logging.WARNING, logger="streamsnap.cluster.jobmaster")
    spark = HungSpark()
    master = master_for(spark)
    master.start()
    try:
        time.sleep(0.2)
        master._post(lambda: master._handle_failure("a task was lost", "TASK_LOST"))
        with pytest.raises(ss.JobExecutionError, match="a task was lost"):
            master.wait(10)
        assert len(spark.cancelled) == 2  # once on failure, once more when overdue
        assert any("did not end" in r.getMessage() and "active Spark jobs: [7]" in r.getMessage()
                   for r in caplog.records)
    finally:
        spark.release.set()


def test_cancel_finishes_when_the_spark_job_never_ends(short_grace):
    spark = HungSpark()
    master = master_for(spark)
    master.start()
    try:
        time.sleep(0.2)
        master.cancel()
        assert master.wait_terminal(10)
        assert master.status.value == "CANCELED"
    finally:
        spark.release.set()
