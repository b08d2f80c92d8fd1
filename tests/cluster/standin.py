"""A SparkSession stand-in for tests of the JobMaster's own decisions (not of Spark).

Its barrier job blocks until released — or, with `ends_on_cancel`, until its job group is
cancelled, then fails the way a cancelled Spark job does. It counts the jobs it was given, so a
test can tell how many attempts the JobMaster deployed.
"""

from __future__ import annotations

import threading

import streamsnap as ss
from streamsnap.cluster.jobmaster import JobMaster, JobSettings
from streamsnap.graph.execution_graph import build_execution_graph
from streamsnap.graph.job_graph import build_job_graph


class StandInSpark:
    master = "local[8]"

    def __init__(self, ends_on_cancel: bool):
        self.ends_on_cancel = ends_on_cancel
        self.release = threading.Event()
        self.cancelled: list[str] = []
        self.jobs_started = 0
        self._groups: dict[str, threading.Event] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self.sparkContext = self

    def setJobGroup(self, group, description, interruptOnCancel=False):
        self._local.group = group

    def parallelize(self, data, slices):
        return self

    def barrier(self):
        return self

    def mapPartitions(self, fn):
        return self

    def collect(self):
        with self._lock:
            self.jobs_started += 1
            ended = self._groups.setdefault(self._local.group, threading.Event())
        while not self.release.is_set():
            if self.ends_on_cancel and ended.wait(0.01):
                raise RuntimeError(f"Job group {self._local.group} was cancelled")
            self.release.wait(0.01)
        return []

    def cancelJobGroup(self, group):
        with self._lock:
            self.cancelled.append(group)
            self._groups.setdefault(group, threading.Event()).set()

    def statusTracker(self):
        return self

    def getActiveJobsIds(self):
        return [7]


def master_for(spark, restart: ss.RestartStrategy, parallelism: int = 1) -> JobMaster:
    env = ss.StreamEnvironment(parallelism=parallelism)
    env.from_collection([{"a": 1}]).sink_to(ss.sinks.Collect())
    graph = build_execution_graph(build_job_graph(env._graph))
    return JobMaster(spark, graph, JobSettings("stand-in", None, restart, ss.NetworkConfig()))
