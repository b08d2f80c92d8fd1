"""A driver that dies: its Spark tasks go away, and running the job again resumes it.

The driver is a real process running a job on its own embedded Spark session; it is SIGKILLed
mid-run. Every process it had started (the Spark JVM, the Python workers running its tasks)
must be gone within seconds, and a second run of the same job on the same checkpoint directory
resumes from the latest completed checkpoint: the FileSink's committed output equals a
failure-free run's.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.integration.support import SCRIPT_EVENT_AND_SUM, run_driver_script_here
from tests.integration.test_failover import expected_rows, read_output

pytestmark = pytest.mark.spark

N = 12_000      # the first run's input takes 6 s at 2000 rows/s: it is killed well before its end

DRIVER = textwrap.dedent('''
    import json, os, sys
    import streamsnap as ss

    out, ckpt, info, n, rate = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]) or None
''') + SCRIPT_EVENT_AND_SUM + textwrap.dedent('''
    env = ss.StreamEnvironment(parallelism=2, checkpointing=ss.CheckpointConfig(interval=0.3, directory=ckpt),
                               restart=ss.RestartStrategy.none())
    (env.from_source(ss.sources.Generator(event, count=n, rate=rate), name="events", uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.FileSink(out, format="parquet"), name="files", uid="files"))
    client = env.execute_async("driver dies")
    while client.status() != "RUNNING":
        if client.status() in ("FAILED", "FINISHED", "CANCELED"):
            break
    with open(info + ".tmp", "w") as f:
        json.dump({"job_id": client.job_id, "tasks": [s.pid for s in client.subtasks()]}, f)
    os.replace(info + ".tmp", info)
    result = client.wait()
    print("RESULT", json.dumps({"restored": result.checkpoints.latest_restored.checkpoint_id
                                if result.checkpoints.latest_restored else None}))
''')


@pytest.fixture
def drivers():
    """The driver processes a test started; any still running at its end is killed (its Spark
    session goes with it, as the test shows), so a failed test leaves nothing behind."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def start_driver(tmp_path, run: int, rate: float | None, drivers: list) -> tuple[subprocess.Popen, str]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    info = str(tmp_path / f"run-{run}.json")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "out"), str(tmp_path / "ckpt"), info, str(N),
                             str(rate or 0)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    drivers.append(proc)
    return proc, info


def wait_for_file(path: str, proc: subprocess.Popen, timeout=240) -> dict:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, f"the driver exited early:\n{proc.stdout.read()}"
        assert time.monotonic() < deadline, f"the driver did not start its job within {timeout} s"
        time.sleep(0.05)
    with open(path) as f:
        return json.load(f)


def _running(pid: int) -> bool:
    """Whether a process runs (a zombie does not); it may end while it is being looked at."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def completed_checkpoints(job_dir) -> list[str]:
    if not job_dir.exists():
        return []
    return [p.name for p in job_dir.iterdir() if p.name.startswith("chk-") and (p / "_metadata").exists()]


@pytest.mark.parametrize("seed", [1, 2])
def test_a_killed_driver_leaves_nothing_running_and_the_rerun_resumes_exactly(spark, tmp_path, seed, drivers):
    rng = random.Random(seed)
    first, info = start_driver(tmp_path, 1, rate=2000, drivers=drivers)
    started = wait_for_file(info, first)
    job_dir = tmp_path / "ckpt" / started["job_id"]
    deadline = time.monotonic() + 30
    while len(completed_checkpoints(job_dir)) < 1:
        assert time.monotonic() < deadline, "no checkpoint completed"
        time.sleep(0.02)
    time.sleep(rng.uniform(0.1, 1.5))
    spawned = psutil.Process(first.pid).children(recursive=True)  # the Spark JVM and its Python workers
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    assert "RESULT" not in first.stdout.read(), "the job ended before its driver was killed: make it longer"
    orphans = set(started["tasks"]) | {p.pid for p in spawned}
    deadline = time.monotonic() + 20
    while alive := sorted(p for p in orphans if _running(p)):
        assert time.monotonic() < deadline, f"processes of the dead driver still run: {alive}"
        time.sleep(0.1)
    assert not (tmp_path / "out").exists() or read_output(tmp_path / "out") != sorted(expected_rows(N))

    # The rerun (the rest as fast as it goes) runs here, on the suite's session: what is tested
    # is that it resumes, not that it starts a Spark of its own.
    output = run_driver_script_here(DRIVER, [str(tmp_path / "out"), str(tmp_path / "ckpt"),
                                             str(tmp_path / "run-2.json"), str(N), "0"])
    assert "resumes from checkpoint" in output and "RESULT" in output, output
    assert json.loads(output.split("RESULT", 1)[1])["restored"] is not None
    rows = read_output(tmp_path / "out")
    assert len(rows) == len(set(rows)), "duplicates in the committed output"
    assert set(rows) == expected_rows(N)
    assert not [f for f in os.listdir(tmp_path / "out") if f.startswith(".inprogress")]
