"""The chaos job on a real Spark standalone cluster (scripts/spark-standalone): a Master and two
Workers, each its own JVM with its own executors and Python workers. A whole Worker JVM is
SIGKILLed mid-run; its executor goes with it, and the job recovers on the surviving Worker with
the failure-free output, every row once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.integration.support import SCRIPT_EVENT_AND_SUM
from tests.integration.test_failover import expected_rows, read_output

pytestmark = pytest.mark.spark

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "spark-standalone")
N = 12_000

DRIVER = textwrap.dedent('''
    import json, os, sys, time
    from pyspark.sql import SparkSession
    import streamsnap as ss

    url, out, ckpt, info, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    spark = (SparkSession.builder.master(url).appName("streamsnap worker loss")
             .config("spark.executor.cores", "2").config("spark.cores.max", "4")
             .config("spark.executor.memory", "1g")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    deadline = time.monotonic() + 60
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < 3:   # driver + 2 executors
        assert time.monotonic() < deadline, "the executors did not register"
        time.sleep(0.1)
''') + SCRIPT_EVENT_AND_SUM + textwrap.dedent('''
    env = ss.StreamEnvironment(parallelism=2, spark=spark,
                               checkpointing=ss.CheckpointConfig(interval=0.3, directory=ckpt),
                               restart=ss.RestartStrategy.fixed_delay(attempts=3, delay=0.5))
    (env.from_source(ss.sources.Generator(event, count=n, rate=2000), name="events", uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.FileSink(out, format="parquet"), name="files", uid="files"))
    client = env.execute_async("worker loss")
    while client.status() != "RUNNING" or client.checkpoint_stats().counts.completed < 1:
        assert client.status() not in ("FAILED", "FINISHED", "CANCELED"), client.status()
        time.sleep(0.05)
    with open(info + ".tmp", "w") as f:
        json.dump({"slots": client.slots, "tasks": [s.pid for s in client.subtasks()]}, f)
    os.replace(info + ".tmp", info)
    result = client.wait(240)
    print("RESULT", json.dumps({"restarts": result.restarts, "status": result.status}))
''')


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("spark-standalone"))
    started = subprocess.run([sys.executable, SCRIPT, "start", directory, "--workers", "2", "--cores", "2",
                              "--memory", "1g"], capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr
    with open(os.path.join(directory, "cluster.json")) as f:
        cluster = json.load(f)
    yield cluster
    stopped = subprocess.run([sys.executable, SCRIPT, "stop", directory], capture_output=True, text=True,
                             timeout=60)
    assert stopped.returncode == 0, stopped.stderr


def test_a_killed_worker_jvm_is_recovered_from_exactly_once(standalone_cluster, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    info = str(tmp_path / "info.json")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONUNBUFFERED="1", SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    driver = subprocess.Popen([sys.executable, str(script), standalone_cluster["master_url"], str(out),
                               str(tmp_path / "ckpt"), info, str(N)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 180
        while not os.path.exists(info):
            assert driver.poll() is None, driver.stdout.read()
            assert time.monotonic() < deadline, "the job did not start on the cluster"
            time.sleep(0.05)
        with open(info) as f:
            started = json.load(f)
        assert started["slots"] == 2
        workers = {pid for name, pid in standalone_cluster["pids"].items() if name.startswith("worker")}
        # The Worker JVM whose executor runs the first subtask: an ancestor of its Python worker.
        victim = next(p.pid for p in psutil.Process(started["tasks"][0]).parents() if p.pid in workers)
        os.kill(victim, signal.SIGKILL)
        output, _ = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, output
    result = json.loads(output.split("RESULT", 1)[1])
    assert result["status"] == "FINISHED" and result["restarts"] >= 1, output
    rows = read_output(out)
    assert len(rows) == len(set(rows)), "duplicates in the committed output"
    assert set(rows) == expected_rows(N)
