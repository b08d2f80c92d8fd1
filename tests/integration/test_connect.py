"""Jobs submitted through a Spark Connect session (issue 29): a thin gRPC client with no
`sparkContext`, against a Connect server from the pyspark wheel (scripts/spark-connect). The
barrier stage is a DataFrame `mapInArrow(..., barrier=True)`, cancelled by tag; results must be
those of a classic session, also across SIGKILLs of slot processes.

A classic and a Connect session cannot share one Python process (PySpark decides per process),
so each test's driver is a subprocess, as a user's program would be. Detached jobs (`streamsnap run
--detach`) are here too, at the end: every test of the shared Connect server is in this file, so
under `--dist loadfile` one xdist worker starts it, once per suite run."""

from __future__ import annotations

import inspect
import json
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
from tests.integration import test_windows
from tests.integration.support import SCRIPT_EVENT_AND_SUM
from tests.integration.test_failover import event, expected_rows, read_output

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
            assert time.monotonic() < deadline and client.status() == "RUNNING", \
                f"no checkpoint completed before kill {k}: {client.status()}, recoveries {client.recoveries()}"
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


# The window job's functions, as tests/integration/test_windows.py defines them (the script
# must hold them: the cluster's executors cannot import the test modules).
WINDOW_FUNCTIONS = "\n".join(textwrap.dedent(inspect.getsource(f)) for f in (
    test_windows.event, test_windows.CountSum, test_windows.WithWindow))

SCENARIOS = textwrap.dedent('''
    import json, os, sys, time
    from collections import defaultdict
    from pyspark.sql import SparkSession
    import streamsnap as ss

    url, work = sys.argv[1], sys.argv[2]
    spark = SparkSession.builder.remote(url).getOrCreate()
    out = {}

    # Bad input: more slots than the cluster behind the server has (spark.cores.max = 8).
    env = ss.StreamEnvironment(parallelism=9, spark=spark)
    env.from_collection([{"x": 1}]).sink_to(ss.sinks.Collect())
    started = time.monotonic()
    try:
        env.execute("too wide")
        out["too_few_slots"] = "no error"
    except ss.ConfigurationError as exc:
        out["too_few_slots"] = [round(time.monotonic() - started, 1), str(exc)]

    # Event-time tumbling windows over out-of-order input (tests/integration/test_windows.py's), against a reference.
    SIZE, KEYS, SPLITS = 10_000, 5, 4
''') + WINDOW_FUNCTIONS + textwrap.dedent('''
    n = 4000
    env = ss.StreamEnvironment(parallelism=2, spark=spark, auto_watermark_interval=0.05,
                               checkpointing=ss.CheckpointConfig(interval=0.5, directory=work + "/ckpt-windows"))
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(2.0).with_timestamp_assigner("ts")
    (env.from_source(ss.sources.Generator(event, count=n, rate=2500, splits=SPLITS, batch_size=40), name="events",
                     uid="events", watermark_strategy=strategy)
        .key_by("key").window(ss.windows.TumblingEventTimeWindows.of(SIZE / 1000))
        .aggregate(CountSum(), WithWindow(), name="windows", uid="windows")
        .sink_to(ss.sinks.Collect(), name="out", uid="out"))
    rows = env.execute("connect windows").rows("out")
    reference = defaultdict(lambda: [0, 0])
    for i in range(n):
        e = event(i)
        reference[(e["key"], e["ts"] // SIZE * SIZE)][0] += 1
        reference[(e["key"], e["ts"] // SIZE * SIZE)][1] += e["value"]
    fired = [(r["key"], r["start"]) for r in rows]
    out["windows"] = {"fired_once": len(fired) == len(set(fired)), "windows": len(rows),
                      "exact": {(r["key"], r["start"]): [r["count"], r["sum"]] for r in rows} == dict(reference)}

    # Savepoint -> rescale 2 -> 3 (onto RocksDB) -> resume: every row once, every key's state carried.
    N = 12_000

    def numbered(i):
        return {"key": i % 40, "value": i + 1, "i": i}

    class RunningSum(ss.KeyedProcessFunction):
        def open(self, ctx):
            self.total = ctx.get_state(ss.ValueStateDescriptor("total", default=0))

        def process_element(self, row, ctx):
            self.total.update(self.total.value() + row["value"])
            yield {"key": ctx.current_key, "total": self.total.value(), "i": row["i"]}

    def build(parallelism, rate, backend="hashmap"):
        env = ss.StreamEnvironment(parallelism=parallelism, spark=spark, state_backend=backend,
                                   checkpointing=ss.CheckpointConfig(interval=0.3, directory=work + "/ckpt-rescale"))
        (env.from_source(ss.sources.Generator(numbered, count=N, rate=rate, splits=4), name="events", uid="events")
            .key_by("key").process(RunningSum(), name="sum", uid="sum").sink_to(ss.sinks.Collect(), name="out"))
        return env

    first = build(2, 1000).execute_async("connect p2")
    deadline = time.monotonic() + 120
    while first.status() != "RUNNING" or first.checkpoint_stats().counts.completed < 1:
        assert time.monotonic() < deadline, "the p2 job never checkpointed"
        time.sleep(0.05)
    savepoint = first.stop_with_savepoint(work + "/savepoints")
    before = first.wait(60).rows()
    after = build(3, None, "rocksdb").execute("connect p3", restore_from=savepoint).rows()
    finals = defaultdict(int)
    for i in range(N):
        finals[i % 40] += i + 1
    last = {}
    for r in before + after:
        last[r["key"]] = max(last.get(r["key"], 0), r["total"])
    out["rescale"] = {"before": len(before), "every_row_once": sorted(r["i"] for r in before + after) == list(range(N)),
                      "finals": last == dict(finals)}
    print("RESULT", json.dumps(out), flush=True)
    os._exit(0)
''')


def test_event_time_windows_and_a_savepoint_rescale_resume_through_connect_on_a_standalone_cluster(
        connect_server, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(SCENARIOS)
    done = subprocess.run([sys.executable, str(script), connect_server, str(tmp_path)], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert "RESULT" in done.stdout, done.stdout[-5000:] + done.stderr[-5000:]
    out = json.loads(done.stdout.split("RESULT", 1)[1])
    seconds, message = out["too_few_slots"]
    # Refused before any barrier stage waits for slots (that wait would last minutes): a generous
    # bound, not a speed target (about 1 s on a quiet machine).
    assert seconds < 60 and "only 8 task slots" in message and "9 or more executor cores (spark.cores.max" in message, message
    assert out["windows"] == {"fired_once": True, "windows": out["windows"]["windows"], "exact": True}, out
    assert out["windows"]["windows"] >= 5 * 10
    assert 0 < out["rescale"]["before"] < 12_000 and out["rescale"]["every_row_once"] and out["rescale"]["finals"], out


KAFKA = textwrap.dedent('''
    import json, os, signal, sys, time
    from pyspark.sql import SparkSession
    import streamsnap as ss
    from streamsnap.cluster.registry import JobRegistry

    url, bootstrap, source, sink, ckpt = sys.argv[1:6]
    spark = SparkSession.builder.remote(url).getOrCreate()
''') + SCRIPT_EVENT_AND_SUM + textwrap.dedent('''
    class SlowSum(RunningSum):
        def process_element(self, row, ctx):    # ~4 s of work per subtask: the kill lands mid-run
            if row["i"] % 6 == 0:
                time.sleep(0.002)
            yield from super().process_element(row, ctx)

    env = ss.StreamEnvironment(parallelism=2, spark=spark,
                               checkpointing=ss.CheckpointConfig(interval=0.3, directory=ckpt),
                               restart=ss.RestartStrategy.fixed_delay(attempts=1, delay=0.0),
                               network=ss.NetworkConfig(batch_size=256, credits=2, output_queue_frames=2))
    (env.from_source(ss.sources.Kafka(bootstrap, [source], stop_at="latest", batch_size=256), name="events",
                     uid="events")
        .key_by("key").process(SlowSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.Kafka(bootstrap, sink, key="key", semantic="exactly_once"), name="kafka", uid="kafka"))
    client = env.execute_async("connect kafka")
    deadline = time.monotonic() + 120
    while client.status() != "RUNNING" or client.checkpoint_stats().counts.completed < 1:
        assert time.monotonic() < deadline, f"no checkpoint: {client.status()}"
        time.sleep(0.01)
    os.kill(JobRegistry(ckpt, client.job_id).read()["pid"], signal.SIGKILL)     # the JobMaster's own process
    result = client.wait(300)
    print("RESULT", json.dumps({"restarts": result.restarts, "status": result.status,
                                "causes": [r["cause"] for r in result.recoveries]}), flush=True)
    os._exit(0)
''')


def test_kafka_exactly_once_through_connect_survives_a_sigkill_of_the_job_master(connect_server, kafka_broker,
                                                                                  tmp_path):
    from tests.integration.test_kafka import N, output_rows, topics
    from tests.integration.test_failover import expected_rows

    source, sink = topics(kafka_broker)
    script = tmp_path / "driver.py"
    script.write_text(KAFKA)
    done = subprocess.run([sys.executable, str(script), connect_server, kafka_broker, source, sink,
                           str(tmp_path / "ckpt")], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert "RESULT" in done.stdout, done.stdout[-5000:] + done.stderr[-5000:]
    result = json.loads(done.stdout.split("RESULT", 1)[1])
    assert result["status"] == "FINISHED" and result["restarts"] == 1, result
    assert "JobMaster of epoch 0" in result["causes"][0], result
    rows = output_rows(kafka_broker, sink)
    assert len(rows) == len(set(rows)), f"{len(rows) - len(set(rows))} duplicates for read_committed"
    assert set(rows) == expected_rows(N)


BARE = textwrap.dedent('''
    import json, sys, time
    from pyspark.sql import SparkSession
    import streamsnap as ss

    spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    env.from_collection([{"x": 1}]).sink_to(ss.sinks.Collect())
    started = time.monotonic()
    try:
        env.execute("on executors without streamsnap")
        out = {"error": None}
    except ss.PreflightError as exc:
        out = {"error": str(exc)}
    out["seconds"] = time.monotonic() - started
    print("RESULT", json.dumps(out), flush=True)
''')


def test_executors_that_cannot_import_streamsnap_fail_execute_naming_it_and_the_fix(tmp_path):
    """A Connect server whose executors' Python has neither streamsnap nor msgpack (one of its
    dependencies; so shipping the package cannot help): `execute()` fails in its pre-flight
    check, before any barrier stage, naming streamsnap, the missing module and the setting to
    change. Its own small server (local[2]): the shared one's executors have streamsnap, and a
    Connect client cannot choose the executors' Python. scripts/spark-connect left the preloading
    worker daemon out (that Python cannot import it): a daemon module it could not import would
    have failed every Python task, the check's among them."""
    from tests.integration.test_user_session import _python_without_streamsnap

    scripts = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts")
    python = _python_without_streamsnap(tmp_path, shadow="msgpack")
    # No PYTHONPATH: this test run's would put the repository (streamsnap) on the executors' path.
    server_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    server_env["PYSPARK_PYTHON"] = python
    directory = str(tmp_path / "server")
    started = subprocess.run([sys.executable, os.path.join(scripts, "spark-connect"), "start", directory, "--master",
                              "local[2]"], capture_output=True, text=True, timeout=180, env=server_env)
    try:
        assert started.returncode == 0, started.stderr
        assert "cannot import streamsnap.cluster.worker_daemon" in started.stderr, started.stderr
        script = tmp_path / "driver.py"
        script.write_text(BARE)
        done = subprocess.run([sys.executable, str(script), started.stdout.strip().splitlines()[-1]],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
    finally:
        subprocess.run([sys.executable, os.path.join(scripts, "spark-connect"), "stop", directory], timeout=60)
    assert "RESULT" in done.stdout, done.stdout[-3000:] + done.stderr[-5000:]
    out = json.loads(done.stdout.split("RESULT", 1)[1])
    error = out["error"]
    assert error and "the Spark executors cannot import streamsnap, even after it was shipped" in error, out
    assert "addArtifacts" in error and "No module named 'msgpack'" in error and python in error, error
    assert "set spark.pyspark.python on the Spark Connect server" in error, error
    assert out["seconds"] < 120, out    # seconds, not a barrier stage's wait for slots


# ====================================================================== detached jobs (issue 29)
# `streamsnap run --detach` submits through Spark Connect (execute_async(detached=True)) and
# exits; another process — this one, with no Spark session of its kind — lists the job,
# attaches, takes a savepoint and stops it with a savepoint through its JobMaster in the
# cluster, and the committed output is exact. Here, not in test_detached.py, so the Connect
# server (a session fixture) starts once per suite run under `--dist loadfile`.
DETACHED_SUBMIT = textwrap.dedent('''
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
    script.write_text(DETACHED_SUBMIT)
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
    registry = JobRegistry(ckpt, job_id)
    leases = SubmitterLease(registry)
    # The Connect session is in the lease before the job's Spark job exists, so a replacement can
    # interrupt it even if the submitter dies before its first renewal.
    assert leases.current()["session_id"], leases.current()
    client = ss.jobs.attach(ckpt, job_id)
    _wait_for_checkpoints(client, 1)
    first = leases.current()
    assert first["generation"] == 0 and first["pid"] == registry.read()["submitter"]["pid"]
    os.kill(first["pid"], signal.SIGKILL)

    deadline = time.monotonic() + 180       # the lease expires after TIMEOUT s, then a resubmission
    while True:
        # None for a moment: the replacement took generation 1 and has not written its lease yet.
        lease, record = leases.current(), registry.read()
        if (lease is not None and lease["generation"] == 1 and record.get("status") == "RUNNING"
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
