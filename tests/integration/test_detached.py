"""Detached jobs (issue 29): `streamsnap run --detach` submits through Spark Connect
(execute_async(detached=True)) and exits; another process — this one, with no Spark session of its kind — lists the job, attaches,
takes a savepoint and stops it with a savepoint through its JobMaster in the cluster, and the
committed output is exact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict

import pytest
from typer.testing import CliRunner

import streamsnap as ss
from streamsnap.cli import app
from streamsnap.cluster.registry import JobRegistry
from streamsnap.cluster.submitter import RemoteJob
from streamsnap.cluster.submitter_lease import SubmitterLease
from streamsnap.errors import ConfigurationError
from tests.integration.support import SCRIPT_EVENT_AND_SUM
from tests.integration.test_failover import event, read_output

pytestmark = pytest.mark.spark

SUBMIT = textwrap.dedent('''
    import os, sys
    from pyspark.sql import SparkSession
    import streamsnap as ss

    url, out, ckpt = os.environ["CONNECT_URL"], os.environ["OUT"], os.environ["CKPT"]
    spark = SparkSession.builder.remote(url).getOrCreate()
''') + SCRIPT_EVENT_AND_SUM + textwrap.dedent('''
    env = ss.StreamEnvironment(parallelism=2, spark=spark,
                               checkpointing=ss.CheckpointConfig(interval=0.3, directory=ckpt))
    (env.from_source(ss.sources.Generator(event, count=10 ** 9, rate=1000), name="events", uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.FileSink(out, format="parquet"), name="files", uid="files"))
    env.execute("detached job")     # under `streamsnap run --detach`: submits, and the file stops here
    raise AssertionError("execute() returned under --detach")
''')


def _exact_prefix(rows: list[tuple]) -> int:
    """Rows (key, total, i) of a run stopped part-way: each split's rows must be exactly its
    first m events with the right running sums, once each. Returns how many rows."""
    assert len(rows) == len(set(rows)), "duplicates in the committed output"
    by_split = defaultdict(list)
    for key, total, i in rows:
        by_split[i % 2].append(i)
    totals: dict = defaultdict(int)
    expected = set()
    for split, seen in by_split.items():
        assert sorted(seen) == list(range(split, split + 2 * len(seen), 2)), f"split {split} has gaps"
        for i in sorted(seen):
            e = event(i)
            totals[e["key"]] += e["value"]
            expected.add((e["key"], totals[e["key"]], i))
    assert set(rows) == expected
    return len(rows)


def _submit_detached(connect_server: str, tmp_path) -> tuple[str, str, str]:
    """`streamsnap run --detach` of SUBMIT in a process that exits: (job id, checkpoint dir, output dir)."""
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    script = tmp_path / "submit.py"
    script.write_text(SUBMIT)
    started = time.monotonic()
    # `streamsnap run --detach`: the job file's execute() submits with execute_async(detached=True).
    done = subprocess.run([sys.executable, "-m", "streamsnap.cli", "run", "--detach", str(script)], capture_output=True,
                          text=True, timeout=300,
                          env=dict(os.environ, PYTHONUNBUFFERED="1", CONNECT_URL=connect_server, OUT=out, CKPT=ckpt))
    assert done.returncode == 0, done.stdout + done.stderr
    job_id, _, status = done.stdout.split("job ", 1)[1].split()[:3]
    assert status == "RUNNING,", done.stdout
    print(f"detached submit: {time.monotonic() - started:.1f} s including the client's start")
    return job_id, ckpt, out


def _wait_for_checkpoints(client, at_least: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while client.checkpoint_stats().counts.completed < at_least:
        assert time.monotonic() < deadline, f"fewer than {at_least} checkpoints of the detached job"
        time.sleep(0.1)


def test_a_detached_job_outlives_its_submitter_and_is_stopped_with_a_savepoint_from_another_process(
        connect_server, tmp_path):
    job_id, ckpt, out = _submit_detached(connect_server, tmp_path)
    [info] = ss.jobs.list(ckpt)
    assert (info.job_id, info.job_name, info.status, info.live) == (job_id, "detached job", "RUNNING", True)
    listing = CliRunner().invoke(app, ["list", ckpt])
    assert listing.exit_code == 0 and job_id in listing.output and "RUNNING" in listing.output, listing.output

    client = ss.jobs.attach(ckpt, job_id)
    _wait_for_checkpoints(client, 2)
    taken = CliRunner().invoke(app, ["savepoint", ckpt, job_id, str(tmp_path / "savepoints")])
    assert taken.exit_code == 0 and "savepoint of job" in taken.output, taken.output
    final = client.stop_with_savepoint(str(tmp_path / "savepoints"), timeout=120)
    assert os.path.exists(os.path.join(final, "_metadata"))
    assert client.status() == "FINISHED"
    assert ss.jobs.list(ckpt)[0].status == "FINISHED"
    assert _exact_prefix(read_output(out)) > 0


def test_a_detached_job_whose_submitter_is_killed_is_resubmitted_by_a_replacement(connect_server, tmp_path):
    """Nothing in Spark supervises the in-cluster submitter: its JobMaster watches its lease and
    starts a replacement, which interrupts the orphaned Spark job and submits the job again."""
    job_id, ckpt, out = _submit_detached(connect_server, tmp_path)
    client = ss.jobs.attach(ckpt, job_id)
    _wait_for_checkpoints(client, 1)
    registry = JobRegistry(ckpt, job_id)
    leases = SubmitterLease(registry)
    first = leases.current()
    assert first["generation"] == 0 and first["pid"] == registry.read()["submitter"]["pid"]
    os.kill(first["pid"], signal.SIGKILL)

    deadline = time.monotonic() + 180       # the lease expires after TIMEOUT s, then a resubmission
    while True:
        lease, record = leases.current(), registry.read()
        if (lease["generation"] == 1 and record.get("status") == "RUNNING"
                and (record.get("submitter_lost") or {}).get("charged")):
            break
        assert time.monotonic() < deadline, f"no replacement submitter runs the job: {lease} {record.get('status')}"
        time.sleep(0.2)
    assert lease["pid"] == record["submitter_lost"]["replacement"]["pid"] != first["pid"]
    history = RemoteJob(registry).exceptions.entries()
    assert any(e.reason == "SUBMITTER_LOST" and f"pid {first['pid']}" in e.root_cause for e in history), history
    completed = client.checkpoint_stats().counts.completed
    _wait_for_checkpoints(client, completed + 1)        # the resubmitted job checkpoints again
    client.stop_with_savepoint(str(tmp_path / "savepoints"), timeout=120)
    assert client.status() == "FINISHED" and registry.read()["restarts"] >= 1
    assert _exact_prefix(read_output(out)) > 0


def test_control_of_jobs_fails_cleanly_on_bad_input(spark, tmp_path):
    with pytest.raises(ConfigurationError, match="no job 'nope' is recorded under .*jobs there: none"):
        ss.jobs.attach(str(tmp_path), "nope")
    result = CliRunner().invoke(app, ["cancel", str(tmp_path), "nope"])
    assert result.exit_code == 1 and "no job 'nope'" in result.output
    result = CliRunner().invoke(app, ["savepoint", str(tmp_path)])
    assert result.exit_code == 2 and "usage: streamsnap savepoint DIR JOB PATH" in result.output
    env = ss.StreamEnvironment(parallelism=1, spark=spark,
                               checkpointing=ss.CheckpointConfig(interval=1, directory=str(tmp_path / "ckpt")))
    env.from_collection([{"a": 1}]).sink_to(ss.sinks.Collect())
    with pytest.raises(ConfigurationError, match="detached=True.* needs a Spark Connect session.*spark-submit"):
        env.execute_async("classic", detached=True)
