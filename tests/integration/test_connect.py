"""Jobs submitted through a Spark Connect session (issue 29): a thin gRPC client with no
`sparkContext`, against a Connect server from the pyspark wheel (scripts/spark-connect). The
barrier stage is a DataFrame `mapInArrow(..., barrier=True)`, cancelled by tag; results must be
those of a classic session, also across SIGKILLs of slot processes.

A classic and a Connect session cannot share one Python process (PySpark decides per process),
so each test's driver is a subprocess, as a user's program would be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.integration.support import SCRIPT_EVENT_AND_SUM
from tests.integration.test_failover import expected_rows, read_output

pytestmark = pytest.mark.spark

CHAOS = textwrap.dedent('''
    import json, os, signal, sys, time
    from pyspark.sql import SparkSession
    import streamsnap as ss

    url, out, ckpt, n, kills = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    spark = SparkSession.builder.remote(url).getOrCreate()
''') + SCRIPT_EVENT_AND_SUM + textwrap.dedent('''
    env = ss.StreamEnvironment(parallelism=2, spark=spark,
                               checkpointing=ss.CheckpointConfig(interval=0.3, directory=ckpt),
                               restart=ss.RestartStrategy.fixed_delay(attempts=kills, delay=0.0))
    (env.from_source(ss.sources.Generator(event, count=n, rate=2500), name="events", uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.FileSink(out, format="parquet"), name="files", uid="files"))
    client = env.execute_async("connect chaos")
    killed = []
    for k in range(kills):
        deadline = time.monotonic() + 120
        while client.status() != "RUNNING" or len(client.recoveries()) != k:
            assert time.monotonic() < deadline, f"not RUNNING again after kill {k}: {client.status()}"
            time.sleep(0.01)
        done = client.checkpoint_stats().counts.completed
        while client.checkpoint_stats().counts.completed == done:   # a checkpoint of this attempt
            assert time.monotonic() < deadline and client.status() == "RUNNING", "no checkpoint completed"
            time.sleep(0.01)
        victim = [s for s in client.subtasks() if s.state == "RUNNING" and s.pid][k % 2]
        os.kill(victim.pid, signal.SIGKILL)
        killed.append(victim.pid)
    result = client.wait(300)
    print("RESULT", json.dumps({"restarts": result.restarts, "status": result.status, "killed": killed}))
''')


def test_a_job_through_spark_connect_survives_sigkills_of_slot_processes_exactly_once(connect_server, tmp_path):
    n, kills = 24_000, 3
    script = tmp_path / "driver.py"
    script.write_text(CHAOS)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(script), connect_server, str(out), str(tmp_path / "ckpt"), str(n),
                           str(kills)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.split("RESULT", 1)[1])
    assert result["status"] == "FINISHED" and result["restarts"] == kills, result
    rows = read_output(out)
    assert len(rows) == len(set(rows)), "duplicates in the committed output"
    assert set(rows) == expected_rows(n)


SILENT = textwrap.dedent('''
    import os, socket, sys, time
    from pyspark.sql import SparkSession
    import streamsnap as ss

    with socket.socket() as s:          # a port nobody answers on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
    env = ss.StreamEnvironment(parallelism=1, spark=spark)
    env.from_collection([{"x": 1}]).sink_to(ss.sinks.Collect())
    started = time.monotonic()
    try:
        env.execute("silent server")
    except ss.ConfigurationError as exc:
        print("ERROR", round(time.monotonic() - started, 1), exc, flush=True)
    # PySpark's Connect client retries its own clean-up against the dead server at exit (minutes).
    os._exit(0)
''')


def test_a_connect_server_that_does_not_answer_fails_execute_naming_it(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(SILENT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert "ERROR" in done.stdout, done.stdout + done.stderr
    seconds, message = done.stdout.split("ERROR", 1)[1].strip().split(" ", 1)
    assert "the Spark Connect server at 127.0.0.1:" in message and "did not answer" in message, message
    assert float(seconds) < 60
