"""The JobMaster inside the job's barrier stage (issue 29, docs/architecture/deployment-decision.md): task 0
hosts it, Spark's stage retry restarts the stage — also when the JobMaster's own process is
SIGKILLed — and the committed output stays exact. Classic session here; the Connect path is
tests/integration/test_connect.py."""

from __future__ import annotations

import os
import signal
import time
import urllib.request

import pytest

import streamsnap as ss
from streamsnap.cluster.registry import JobRegistry
from streamsnap.errors import ConfigurationError
from tests.integration.test_failover import RunningSum, event, expected_rows, read_output

pytestmark = pytest.mark.spark


def _job(spark, tmp_path, n: int, rate: int, attempts: int, out=None, web=None):
    env = ss.StreamEnvironment(parallelism=2, spark=spark, job_master="cluster", web=web,
                               checkpointing=ss.CheckpointConfig(interval=0.3, directory=str(tmp_path / "ckpt")),
                               restart=ss.RestartStrategy.fixed_delay(attempts=attempts, delay=0.0))
    (env.from_source(ss.sources.Generator(event, count=n, rate=rate), name="events", uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.FileSink(str(out or tmp_path / "out"), format="parquet"), name="files", uid="files"))
    return env


def _parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


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
        # The slot: task 0's Python worker, which runs slot 0's first subtask and is the JobMaster's parent.
        pid = record["pid"] if victim == "jobmaster" else _parent_pid(record["pid"])
        assert pid != os.getpid() and (victim == "jobmaster" or pid in {s.pid for s in client.subtasks()})
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
    result = client.wait(300)
    assert result.status == "FINISHED" and result.restarts == 2, result
    causes = [r["cause"] for r in result.recoveries]
    assert "JobMaster of epoch 0" in causes[0] and "was lost" in causes[0], causes
    # The JobMaster outlives its host task long enough to record that loss itself (or the lost
    # subtask it ran, whichever it notices first): the failure's own time and cause, and the end
    # of the attempt — not a "lost JobMaster" the next leader finds seconds later.
    second = result.recoveries[1]
    assert f"(pid {pid} on " in causes[1] and "was lost" not in causes[1], causes
    assert killed <= second["failed_at"] <= second["attempt_ended_at"] <= second["leader_at"], second
    # The exception history spans the JobMasters that led the job: one entry per failed attempt.
    assert [(e.attempt, e.reason) for e in result.exceptions][0] == (0, "JOBMASTER_LOST")
    assert len(result.exceptions) == 2 and result.exceptions[1].attempt == 1, result.exceptions
    assert registry.read()["status"] == "FINISHED" and registry.latest_epoch() == 2
    rows = read_output(tmp_path / "out")
    assert len(rows) == len(set(rows)), "duplicates in the committed output"
    assert set(rows) == expected_rows(n)


def test_a_second_submission_is_refused_its_web_ui_runs_with_its_job_master_and_its_directory_controls_it(
        spark, tmp_path):
    from typer.testing import CliRunner

    from streamsnap.cli import app

    ckpt = str(tmp_path / "ckpt")
    client = _job(spark, tmp_path, 10 ** 9, rate=500, attempts=0, web=ss.WebConfig(port=0)).execute_async("only once")
    try:
        _await(lambda: client.status() == "RUNNING", "RUNNING")
        url = client.web_url
        assert url is not None and [j.web_url for j in ss.jobs.list(ckpt)] == [url]
        with urllib.request.urlopen(f"{url}/jobs", timeout=10) as response:
            assert client.job_id in response.read().decode()
        with pytest.raises(ConfigurationError, match="already running .*cancel it first"):
            _job(spark, tmp_path, 10, rate=500, attempts=0, out=tmp_path / "out2").execute_async("only once")
        # A client that cannot reach the cluster: every request through files in the job's directory.
        remote = ss.jobs.attach(ckpt, client.job_id, via="storage")
        _await(lambda: remote.checkpoint_stats().counts.completed >= 1, "a checkpoint, asked through request files")
        taken = CliRunner().invoke(app, ["savepoint", ckpt, client.job_id, str(tmp_path / "sp"), "--via", "storage"])
        assert taken.exit_code == 0 and "savepoint of job" in taken.output, taken.output
        assert os.path.exists(os.path.join(taken.output.split(" at ", 1)[1].strip(), "_metadata"))
        with pytest.raises(ConfigurationError, match="via=...\\) must be 'control' or 'storage', got 'pigeon'"):
            ss.jobs.attach(ckpt, client.job_id, via="pigeon")
        remote.cancel()
    finally:
        if client.status() not in ("CANCELED", "CANCELLING"):
            client.cancel()
    with pytest.raises(ss.JobExecutionError, match="cancel"):
        client.wait(60)
    assert os.listdir(os.path.join(ckpt, client.job_id, "control", "requests")) == []


def test_job_master_cluster_without_checkpointing_is_refused():
    with pytest.raises(ConfigurationError, match="job_master='cluster'.*checkpointing"):
        ss.StreamEnvironment(parallelism=1, job_master="cluster")
    with pytest.raises(ConfigurationError, match="job_master must be"):
        ss.StreamEnvironment(parallelism=1, job_master="driver")


JOB_FILE = """
import streamsnap as ss
env = ss.StreamEnvironment(parallelism=2, job_master="cluster",
                           checkpointing=ss.CheckpointConfig(interval=0.3, directory={directory!r}))
(env.from_source(ss.sources.Generator(lambda i: {{"k": i % 10, "v": i}}, count=3000, rate=1500), name="events")
    .key_by("k").map(lambda r: r, name="m").sink_to(ss.sinks.Collect(), name="out"))
env.execute("status line")
"""


def test_streamsnap_run_shows_the_live_status_of_a_job_whose_job_master_is_in_the_cluster(spark, tmp_path):
    from typer.testing import CliRunner

    from streamsnap.cli import app

    job = tmp_path / "job.py"
    job.write_text(JOB_FILE.format(directory=str(tmp_path / "ckpt")))
    result = CliRunner().invoke(app, ["run", str(job), "--status-every", "0.5"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("status line: RUNNING |") for line in lines), result.output
    assert "status line: FINISHED after" in result.output and "3,000 source records" in result.output
