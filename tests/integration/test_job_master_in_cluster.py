"""The JobMaster inside the job's barrier stage (issue 29, docs/architecture/deployment-decision.md): task 0
hosts it, Spark's stage retry restarts the stage — also when the JobMaster's own process is
SIGKILLed — and the committed output stays exact. Classic session here; the Connect path is
tests/integration/test_connect.py."""

from __future__ import annotations

import os
import signal
import time

import pytest

import streamsnap as ss
from streamsnap.cluster.registry import JobRegistry
from streamsnap.errors import ConfigurationError
from tests.integration.test_failover import RunningSum, event, expected_rows, read_output

pytestmark = pytest.mark.spark


def _job(spark, tmp_path, n: int, rate: int, attempts: int, out=None):
    env = ss.StreamEnvironment(parallelism=2, spark=spark, job_master="cluster",
                               checkpointing=ss.CheckpointConfig(interval=0.3, directory=str(tmp_path / "ckpt")),
                               restart=ss.RestartStrategy.fixed_delay(attempts=attempts, delay=0.0))
    (env.from_source(ss.sources.Generator(event, count=n, rate=rate), name="events", uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.FileSink(str(out or tmp_path / "out"), format="parquet"), name="files", uid="files"))
    return env


def _await(predicate, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_job_with_its_job_master_in_task_0_survives_sigkills_of_the_job_master_and_a_slot(spark, tmp_path):
    n = 16_000
    client = _job(spark, tmp_path, n, rate=2_000, attempts=3).execute_async("in-cluster chaos")
    registry = JobRegistry(str(tmp_path / "ckpt"), client.job_id)
    for k, victim in enumerate(("jobmaster", "slot")):
        _await(lambda: client.status() == "RUNNING" and len(client.recoveries()) == k, f"RUNNING after {k} kills")
        done = client.checkpoint_stats().counts.completed
        _await(lambda: client.checkpoint_stats().counts.completed > done, "a checkpoint of this attempt")
        record = registry.read()
        pid = record["pid"] if victim == "jobmaster" else [s for s in client.subtasks() if s.pid][0].pid
        assert pid != os.getpid()
        os.kill(pid, signal.SIGKILL)
    result = client.wait(300)
    assert result.status == "FINISHED" and result.restarts == 2, result
    causes = [r["cause"] for r in result.recoveries]
    assert "JobMaster of epoch 0" in causes[0] and "was lost" in causes[0], causes
    assert registry.read()["status"] == "FINISHED" and registry.latest_epoch() == 2
    rows = read_output(tmp_path / "out")
    assert len(rows) == len(set(rows)), "duplicates in the committed output"
    assert set(rows) == expected_rows(n)


def test_a_second_submission_of_a_running_job_is_refused(spark, tmp_path):
    client = _job(spark, tmp_path, 10 ** 9, rate=500, attempts=0).execute_async("only once")
    try:
        _await(lambda: client.status() == "RUNNING", "RUNNING")
        with pytest.raises(ConfigurationError, match="already running .*cancel it first"):
            _job(spark, tmp_path, 10, rate=500, attempts=0, out=tmp_path / "out2").execute_async("only once")
    finally:
        client.cancel()
    with pytest.raises(ss.JobExecutionError, match="cancel"):
        client.wait(60)


def test_job_master_cluster_without_checkpointing_is_refused():
    with pytest.raises(ConfigurationError, match="job_master='cluster'.*checkpointing"):
        ss.StreamEnvironment(parallelism=1, job_master="cluster")
    with pytest.raises(ConfigurationError, match="job_master must be"):
        ss.StreamEnvironment(parallelism=1, job_master="driver")
