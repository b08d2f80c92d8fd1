"""What the many-hosts fault tests share (test_hosts.py): a Spark standalone cluster whose Workers
each pose as a host (scripts/spark-standalone --hosts), the chaos job they run from a driver
process of its own, and the output that job must commit whatever the fault."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict

from tests.integration.support import SCRIPT_EVENT_AND_SUM

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER_SCRIPT = os.path.join(ROOT, "scripts", "spark-standalone")
PARTITION_SCRIPT = os.path.join(ROOT, "scripts", "partition")
HOSTS = 2               # Workers, each a host with P cores: the p=3 job still fits after one is lost
P = 3
N = 9_000
RATE = 1_500            # 6 s of input
KEYS = 40


def event(i: int) -> dict:
    # Split i % P feeds its own keys: a key's rows come from one split, in order, so running
    # sums and counts are deterministic — any replay or loss error shows in them.
    return {"key": (i % P) * 100 + (i // P) % KEYS, "value": i + 1, "i": i}


def kept(row: dict) -> bool:
    return row["i"] % 7 != 3


def expected_rows(n: int = N) -> set[tuple]:
    """(key, running total, i, running count) of every kept row: the failure-free output."""
    totals, counts, rows = defaultdict(int), defaultdict(int), set()
    for i in range(n):
        e = event(i)
        if not kept(e):
            continue
        totals[e["key"]] += e["value"]
        counts[e["key"]] += 1
        rows.add((e["key"], totals[e["key"]], i, counts[e["key"]]))
    return rows


def read_output(path) -> list[tuple]:
    import glob

    import pyarrow.parquet as pq

    rows = []
    for f in sorted(glob.glob(os.path.join(str(path), "part-*.parquet"))):
        t = pq.read_table(f)
        rows.extend(zip(*(t.column(c).to_pylist() for c in ("key", "total", "i", "count"))))
    return rows


# The driver: one Spark application for every job of the module (its executors start once, the
# slowest part). It reads one job a line on stdin ({"name", "out", "ckpt", "info", "n",
# "options"}) and runs filter + two keyed stages at p=3; it writes `info` (the running attempt's
# subtasks and hosts) once a checkpoint completed, and prints RESULT {...} at the job's end. The
# functions are defined in the script so Spark pickles them by value.
DRIVER = textwrap.dedent('''
    import json, os, sys, time
    from pyspark.sql import SparkSession
    import streamsnap as ss

    spark = (SparkSession.builder.master(sys.argv[1]).appName("streamsnap many hosts")
             .config("spark.executor.cores", "%(P)d").config("spark.cores.max", "%(cores)d")
             # A barrier stage retried while its lost executor's slots still count waits this long
             # before Spark checks the slots again (15 s by default: most of a host loss's recovery).
             .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
             .config("spark.executor.memory", "768m")
             # As docs/how-to/cluster.md sets it up: Python workers forked with streamsnap imported.
             .config("spark.python.daemon.module", "streamsnap.cluster.worker_daemon")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    deadline = time.monotonic() + 120
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < %(hosts)d + 1:   # driver + one per host
        assert time.monotonic() < deadline, "the executors did not register"
        time.sleep(0.1)
    print("READY", flush=True)
''' % {"hosts": HOSTS, "cores": P * HOSTS, "P": P}) + SCRIPT_EVENT_AND_SUM + textwrap.dedent('''
    P, KEYS, RATE = %(P)d, %(KEYS)d, %(RATE)d

    def event(i):  # P splits, each with keys of its own
        return {"key": (i %% P) * 100 + (i // P) %% KEYS, "value": i + 1, "i": i}

    class RunningCount(ss.KeyedProcessFunction):
        def open(self, ctx):
            self.count = ctx.get_state(ss.ValueStateDescriptor("count", default=0))

        def process_element(self, row, ctx):
            count = self.count.value() + 1
            self.count.update(count)
            yield {"key": row["key"], "total": row["total"], "i": row["i"], "count": count}

    for line in sys.stdin:
        job = json.loads(line)
        options = job["options"]
        env = ss.StreamEnvironment(parallelism=P, spark=spark, web=False,
                                   local_recovery=options.get("local_recovery", False),
                                   network=ss.NetworkConfig(**options.get("network", {})),
                                   checkpointing=ss.CheckpointConfig(interval=0.5, directory=job["ckpt"],
                                                                     tolerable_failures=options.get("tolerable_failures", 0)),
                                   restart=ss.RestartStrategy.fixed_delay(attempts=options.get("attempts", 2),
                                                                          delay=0.5))
        (env.from_source(ss.sources.Generator(event, count=job["n"], rate=options.get("rate", RATE)), name="events", uid="events")
            .filter(lambda row: row["i"] %% 7 != 3, name="kept")
            .key_by("key").process(RunningSum(), name="sum", uid="sum")
            .key_by("key").process(RunningCount(), name="count", uid="count")
            .sink_to(ss.sinks.FileSink(job["out"], format="parquet"), name="files", uid="files"))
        client = env.execute_async(job["name"])
        while client.status() != "RUNNING" or client.checkpoint_stats().counts.completed < 1:
            assert client.status() not in ("FAILED", "FINISHED", "CANCELED"), client.status()
            time.sleep(0.05)
        def write_info():
            info = {"subtasks": [{"vertex": s.vertex, "index": s.index, "host": s.host, "pid": s.pid,
                                  "data_address": s.data_address} for s in client.subtasks()],
                    "recoveries": client.recoveries(), "driver_pid": os.getpid()}
            with open(job["info"] + ".tmp", "w") as f:
                json.dump(info, f, default=str)
            os.replace(job["info"] + ".tmp", job["info"])

        # Rewritten every second while the job runs: who watches it (a fault test, the soak)
        # follows the running attempt's subtasks and the failovers so far.
        write_info()
        deadline = time.monotonic() + options.get("timeout", 300)
        while client.status() not in ("FAILED", "FINISHED", "CANCELED") and time.monotonic() < deadline:
            time.sleep(1)
            write_info()
        try:
            result = client.wait(max(1.0, deadline - time.monotonic()))
            outcome = {"restarts": result.restarts, "status": result.status, "recoveries": result.recoveries,
                       "hosts": sorted({s.host for s in client.subtasks()}),
                       "checkpoints": {"completed": result.checkpoints.counts.completed,
                                       "failed": result.checkpoints.counts.failed}}
        except Exception as exc:
            outcome = {"status": "FAILED", "error": f"{type(exc).__name__}: {exc}",
                       "recoveries": client.recoveries()}
        print("RESULT", json.dumps(outcome, default=str), flush=True)
''' % {"P": P, "KEYS": KEYS, "RATE": RATE})


def start_cluster(directory: str) -> dict:
    started = subprocess.run([sys.executable, CLUSTER_SCRIPT, "start", directory, "--workers", str(HOSTS),
                              "--cores", str(P), "--memory", "1g", "--hosts"],
                             capture_output=True, text=True, timeout=240)
    if started.returncode != 0:
        raise RuntimeError(f"scripts/spark-standalone start --hosts failed: {started.stderr or started.stdout}")
    with open(os.path.join(directory, "cluster.json")) as f:
        return dict(json.load(f), directory=directory)


def stop_cluster(directory: str) -> None:
    subprocess.run([sys.executable, CLUSTER_SCRIPT, "stop", directory], check=True, timeout=60)




class Session:
    """The driver process serving this module's jobs, one at a time (`run`)."""

    def __init__(self, cluster: dict, directory: str):
        script = os.path.join(directory, "driver.py")
        with open(script, "w") as f:
            f.write(DRIVER)
        env = dict(os.environ, PYTHONUNBUFFERED="1", SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.log = open(os.path.join(directory, "driver.log"), "w+")
        self._output: queue.Queue = queue.Queue()
        self.process = subprocess.Popen([sys.executable, script, cluster["master_url"]], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        threading.Thread(target=self._read, daemon=True).start()
        self.await_line("READY", 180)

    def _read(self) -> None:
        for line in self.process.stdout:
            self._output.put(line)
        self._output.put(None)

    def await_line(self, marker: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._output.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {marker} from the driver within {timeout:.0f} s:\n{self.stderr()}")
            if line is None:
                raise AssertionError(f"the driver ended (exit code {self.process.wait()}):\n{self.stderr()}")
            if line.startswith(marker):
                return line[len(marker):].strip()

    def stderr(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-20_000:]

    def run(self, tmp_path, name: str, options: dict | None = None, n: int = N, ckpt: str | None = None) -> "Job":
        job = Job(self, tmp_path, n)
        self.process.stdin.write(json.dumps({"name": name, "out": str(job.out), "ckpt": ckpt or str(tmp_path / "ckpt"),
                                             "info": job.info_path, "n": n, "options": options or {}}) + "\n")
        self.process.stdin.flush()
        return job

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self.log.close()


class Job:
    """One job of the session: its info once running, its result once ended, its output."""

    def __init__(self, session: Session, tmp_path, n: int):
        self.session, self.out, self.n = session, tmp_path / "out", n
        self.info_path = str(tmp_path / "info.json")

    def info(self, timeout: float = 180) -> dict:
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.info_path):
            if self.session.process.poll() is not None:
                raise AssertionError(f"the driver ended before the job ran:\n{self.session.stderr()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the job did not start on the cluster:\n{self.session.stderr()}")
            time.sleep(0.05)
        with open(self.info_path) as f:
            return json.load(f)

    def result(self, timeout: float = 300) -> dict:
        result = json.loads(self.session.await_line("RESULT", timeout))
        assert result["status"] == "FINISHED", (result, self.session.stderr())
        return result

    def assert_exact(self) -> None:
        rows = read_output(self.out)
        assert len(rows) == len(set(rows)), "duplicates in the committed output"
        expected = expected_rows(self.n)
        assert set(rows) == expected, (f"{len(expected - set(rows))} rows missing, "
                                       f"{len(set(rows) - expected)} unexpected")
