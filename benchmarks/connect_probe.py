"""Probes behind docs/architecture/deployment-decision.md: Spark Connect vs classic sessions for streamsnap's
barrier-stage deployment, and where the JobMaster can live. Not product code.

Each subcommand prints one JSON object per measurement (and a summary line):

    python -m benchmarks.connect_probe startup  --connect URL [--n 4] [--reps 5] [--rounds 2]
        a trivial n-task barrier stage: classic RDD barrier (today), classic and Connect
        DataFrame mapInArrow(barrier=True); start-to-result seconds, medians (classic local[n]
        in alternating processes with the Connect client)
    python -m benchmarks.connect_probe cancel   --connect URL [--n 4] [--reps 3]
        a running barrier stage interrupted from the client (addTag + interruptTag)
    python -m benchmarks.connect_probe artifacts --connect URL
        streamsnap (zip) and a package installed nowhere, shipped with addArtifacts(pyfile=True);
        a function of the latter, pickled by reference, closing over a streamsnap object
    python -m benchmarks.connect_probe detach   --connect URL --place client|daemon [--watch 60]
        does a barrier stage outlive the process that submitted it (SIGKILLed)?
    python -m benchmarks.connect_probe takeover --connect URL [--n 2]
        a second process joins the (killed) submitter's session by id and interrupts its stage
    python -m benchmarks.connect_probe failover --connect URL|--classic [--master M] --place client|task
        deploy and redeploy times of a barrier stage whose tasks register with a JobMaster over
        TCP: JobMaster in the submitting process (it redeploys), or hosted by task 0 with Spark's
        own barrier-stage retry redeploying; [--rounds R] Spark jobs of --reps failovers each,
        [--rdd] (classic, task) the RDD barrier stage + a shuffle, [--clean-exit] cancelled
        tasks return instead of failing (shows Spark then re-runs only the missing partitions)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

SCHEMA = "p long, pid long, attempt long"


# ============================================================== sessions
def connect_session(url: str):
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote(url).create()


def classic_session(n: int, master: str | None = None):
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # the workers import this module (and the worktree's streamsnap) as this process does
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    spark = (SparkSession.builder.master(master or f"local[{n}]").appName("connect-probe")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
             .config("spark.python.task.killTimeout", "1s").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


# ============================================================== task functions
def trivial_rows(iterator):
    """RDD barrier task: one row naming the task."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    for _ in iterator:
        pass
    yield (ctx.partitionId(), os.getpid(), ctx.attemptNumber())


def trivial_batches(batches):
    """mapInArrow barrier task: one row naming the task."""
    import pyarrow as pa
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"p": [ctx.partitionId()], "pid": [os.getpid()],
                                      "attempt": [ctx.attemptNumber()]})


def sleeper(directory: str, seconds: float):
    """A barrier task that records its pid, heartbeats into a file, and runs for `seconds`."""

    def run(batches):
        import pyarrow as pa
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        for _ in batches:
            pass
        beat = os.path.join(directory, f"beat-{ctx.partitionId()}-{ctx.attemptNumber()}")
        with open(os.path.join(directory, f"pid-{ctx.partitionId()}-{ctx.attemptNumber()}"), "w") as f:
            f.write(str(os.getpid()))
        end = time.time() + seconds
        while time.time() < end:
            with open(beat, "w") as f:
                f.write(repr(time.time()))
            time.sleep(0.5)
        yield pa.RecordBatch.from_pydict({"p": [ctx.partitionId()], "pid": [os.getpid()],
                                          "attempt": [ctx.attemptNumber()]})
    return run


def barrier_df(spark, n: int, fn, repartition: bool = False):
    df = spark.range(n).repartition(n) if repartition else spark.range(0, n, 1, n)
    return df.mapInArrow(fn, SCHEMA, barrier=True)


def collect_tagged(spark, tag: str, make_df, outcome: dict) -> None:
    """Collect `make_df()` with the session tag `tag` (interruptTag stops it); `outcome` gets
    the error line (None if it finished) and when it ended."""
    spark.addTag(tag)
    try:
        make_df().collect()
        outcome["error"] = None
    except Exception as exc:
        outcome["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    finally:
        outcome["at"] = time.perf_counter()
        spark.removeTag(tag)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_files(directory: str, prefix: str, count: int, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = sorted(n for n in os.listdir(directory) if n.startswith(prefix))
        if len(names) >= count:
            return names
        time.sleep(0.02)
    raise TimeoutError(f"{count} files {prefix}* did not appear in {directory} within {timeout} s")


# ============================================================== startup
def _startup_worker(mode: str, url: str, n: int, reps: int) -> None:
    """One session kind per process: PySpark dispatches mapInArrow's UDF on the process's mode,
    so a classic and a Connect session do not mix in one process."""
    if mode == "classic":
        spark = classic_session(n)
        sc = spark.sparkContext
        variants = {
            "classic_rdd_barrier": lambda: sc.parallelize(range(n), n).barrier().mapPartitions(trivial_rows).collect(),
            "classic_df_barrier": lambda: barrier_df(spark, n, trivial_batches).collect(),
        }
    else:
        spark = connect_session(url)
        variants = {
            "connect_df_barrier": lambda: barrier_df(spark, n, trivial_batches).collect(),
            "connect_df_barrier_repartition": lambda: barrier_df(spark, n, trivial_batches, True).collect(),
        }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for run in variants.values():    # warm-up: Python workers, plan caches
        rows = run()
        assert sorted(r[0] for r in rows) == list(range(n)), rows
    for _ in range(reps):
        for name, run in variants.items():
            t = time.perf_counter()
            rows = run()
            times[name].append(time.perf_counter() - t)
            assert len(rows) == n
    print(json.dumps(times), flush=True)


def cmd_startup(args) -> None:
    """Classic and Connect in alternating child processes (rounds), `reps` runs each per round."""
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for mode in ("classic", "connect"):
            out = subprocess.run([sys.executable, "-m", "benchmarks.connect_probe", "_startup", mode,
                                  args.connect, str(args.n), str(args.reps)],
                                 capture_output=True, text=True, check=True).stdout
            for name, values in json.loads(out.strip().splitlines()[-1]).items():
                times.setdefault(name, []).extend(values)
    for name, values in times.items():
        emit({"probe": "startup", "variant": name, "n": args.n, "runs": len(values),
              "median_s": round(statistics.median(values), 3), "all_s": [round(v, 3) for v in values]})


# ============================================================== cancel
def cmd_cancel(args) -> None:
    spark = connect_session(args.connect)
    for rep in range(args.reps):
        directory = tempfile.mkdtemp(prefix="probe-cancel-")
        tag = f"probe-{uuid.uuid4().hex[:8]}"
        ended: dict = {}
        t_submit = time.perf_counter()
        thread = threading.Thread(target=collect_tagged, args=(
            spark, tag, lambda d=directory: barrier_df(spark, args.n, sleeper(d, 600)), ended))
        thread.start()
        names = _wait_files(directory, "pid-", args.n, 120)
        running = time.perf_counter()
        pids = [int(open(os.path.join(directory, name)).read()) for name in names]
        t0 = time.perf_counter()
        interrupted = spark.interruptTag(tag)
        t_call = time.perf_counter()
        thread.join(60)
        while any(_alive(p) for p in pids) and time.perf_counter() - t0 < 60:
            time.sleep(0.01)
        t_dead = time.perf_counter()
        emit({"probe": "cancel", "rep": rep, "n": args.n, "start_to_running_s": round(running - t_submit, 3),
              "interrupt_call_s": round(t_call - t0, 3), "client_sees_end_s": round(ended["at"] - t0, 3),
              "client_error": (ended["error"] or "").split(":")[0], "tasks_gone_s": round(t_dead - t0, 3),
              "operations_interrupted": len(interrupted)})


# ============================================================== artifacts
PROBE_PACKAGE = '''
import os


def report(setting, batches):
    """Runs on the executor: where streamsnap and this package were imported from."""
    import pyarrow as pa
    import streamsnap
    from pyspark import BarrierTaskContext

    import ssprobe_pkg

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({
        "p": [BarrierTaskContext.get().partitionId()], "streamsnap": [streamsnap.__file__],
        "pkg": [ssprobe_pkg.__file__], "setting": [type(setting).__module__ + "." + repr(setting)[:60]]})
'''


def cmd_artifacts(args) -> None:
    import functools
    import zipfile

    from streamsnap.api.config import NetworkConfig
    from streamsnap.api.preflight import package_zip

    work = tempfile.mkdtemp(prefix="probe-artifacts-")
    pkg_zip = os.path.join(work, "ssprobe_pkg.zip")
    with zipfile.ZipFile(pkg_zip, "w") as z:
        z.writestr("ssprobe_pkg/__init__.py", "")
        z.writestr("ssprobe_pkg/tasks.py", PROBE_PACKAGE)
    sys.path.insert(0, pkg_zip)     # importable here, so cloudpickle pickles report by reference
    from ssprobe_pkg.tasks import report

    spark = connect_session(args.connect)
    fn = functools.partial(report, NetworkConfig())
    schema = "p long, streamsnap string, pkg string, setting string"
    try:
        barrier_df(spark, 2, fn).mapInArrow(lambda b: b, schema).collect()
        before = "ok"
    except Exception as exc:
        cause = next((line.strip() for line in str(exc).splitlines() if "ModuleNotFoundError" in line), "")
        before = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]} {cause[:200]}"
    emit({"probe": "artifacts", "step": "before addArtifacts", "result": before})
    t = time.perf_counter()
    ship = package_zip(work)
    t_zip = time.perf_counter() - t
    t = time.perf_counter()
    spark.addArtifacts(ship, pkg_zip, pyfile=True)
    t_add = time.perf_counter() - t
    df = spark.range(0, 2, 1, 2).mapInArrow(fn, schema, barrier=True)
    rows = df.collect()
    emit({"probe": "artifacts", "step": "after addArtifacts", "zip_bytes": os.path.getsize(ship),
          "zip_s": round(t_zip, 3), "add_artifacts_s": round(t_add, 3),
          "rows": [r.asDict() for r in rows]})


# ============================================================== detach
def _daemon_main(url: str, directory: str, n: int, seconds: float) -> None:
    """The in-cluster submitter: its own Connect session back to the server; submits the barrier
    stage and stays attached to it (runs in a process an executor task started)."""
    spark = connect_session(url)
    with open(os.path.join(directory, "daemon-session"), "w") as f:
        f.write(json.dumps({"pid": os.getpid(), "session_id": spark.client._session_id,
                            "at": time.time()}))
    barrier_df(spark, n, sleeper(directory, seconds)).collect()


def launcher(url: str, directory: str, n: int, seconds: float, probe_root: str):
    """A one-task query whose task starts the in-cluster submitter in a new session (setsid) and
    returns at once: nothing of the client's stays running on the server."""

    def run(batches):
        import pyarrow as pa

        for _ in batches:
            pass
        env = dict(os.environ)
        env.pop("SPARK_REMOTE", None)
        log = open(os.path.join(directory, "daemon.log"), "ab")
        child = subprocess.Popen([sys.executable, "-m", "benchmarks.connect_probe", "_daemon", url, directory,
                                  str(n), str(seconds)], cwd=probe_root, env=env, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        yield pa.RecordBatch.from_pydict({"p": [0], "pid": [child.pid], "attempt": [0]})
    return run


def _submitter_main(url: str, directory: str, n: int, seconds: float, place: str) -> None:
    """The client process of `detach`: submits, reports when the tasks run, waits to be killed."""
    spark = connect_session(url)
    t = time.time()
    if place == "client":
        threading.Thread(target=lambda: barrier_df(spark, n, sleeper(directory, seconds)).collect(),
                         daemon=True).start()
    else:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        spark.range(0, 1, 1, 1).mapInArrow(launcher(url, directory, n, seconds, root), SCHEMA).collect()
    _wait_files(directory, "pid-", n, 180)
    with open(os.path.join(directory, "submitted"), "w") as f:
        f.write(json.dumps({"submit_at": t, "running_at": time.time()}))
    time.sleep(3600)


def cmd_detach(args) -> None:
    directory = tempfile.mkdtemp(prefix=f"probe-detach-{args.place}-")
    client = subprocess.Popen([sys.executable, "-m", "benchmarks.connect_probe", "_submitter", args.connect,
                               directory, str(args.n), str(args.watch + 120), args.place])
    _wait_files(directory, "submitted", 1, 240)
    submitted = json.load(open(os.path.join(directory, "submitted")))
    client.send_signal(signal.SIGKILL)
    client.wait()
    killed_at = time.time()
    beats = [os.path.join(directory, f"beat-{p}-0") for p in range(args.n)]
    last_alive = killed_at
    while time.time() - killed_at < args.watch:
        newest = max(os.path.getmtime(b) for b in beats)
        if newest > time.time() - 2:
            last_alive = newest
        time.sleep(1)
    pids = [int(open(os.path.join(directory, f"pid-{p}-0")).read()) for p in range(args.n)]
    record = {"probe": "detach", "place": args.place, "n": args.n,
              "submit_to_running_s": round(submitted["running_at"] - submitted["submit_at"], 3),
              "watched_s": args.watch, "tasks_ran_after_client_kill_s": round(last_alive - killed_at, 1),
              "tasks_alive_at_end": sum(_alive(p) for p in pids)}
    daemon = os.path.join(directory, "daemon-session")
    if os.path.exists(daemon):
        info = json.load(open(daemon))
        record["daemon_pid"] = info["pid"]
        record["daemon_alive"] = _alive(info["pid"])
        if info["pid"] and _alive(info["pid"]):
            os.killpg(info["pid"], signal.SIGKILL)     # the probe's own daemon; its stage ends with it
    emit(record)
    if args.place == "client":
        # the client is gone: interrupt what it left from a new session (the stage holds slots)
        pass


def _tagged_submitter_main(url: str, directory: str, n: int, tag: str) -> None:
    spark = connect_session(url)
    with open(os.path.join(directory, "session.tmp"), "w") as f:
        f.write(spark.client._session_id)
    os.replace(os.path.join(directory, "session.tmp"), os.path.join(directory, "session"))
    spark.addTag(tag)
    barrier_df(spark, n, sleeper(directory, 600)).collect()


def cmd_takeover(args) -> None:
    """Another process (a new submitter) joins the session of the one that submitted the job
    (sc://...;session_id=ID) and interrupts the job's stage by its tag: how the next JobMaster
    host gets rid of a dead host's Spark job on Connect."""
    directory = tempfile.mkdtemp(prefix="probe-takeover-")
    tag = f"streamsnap-job-{uuid.uuid4().hex[:8]}"
    first = subprocess.Popen([sys.executable, "-m", "benchmarks.connect_probe", "_tagged", args.connect,
                              directory, str(args.n), tag])
    _wait_files(directory, "pid-", args.n, 180)
    pids = [int(open(os.path.join(directory, f"pid-{p}-0")).read()) for p in range(args.n)]
    session_id = open(os.path.join(directory, "session")).read()
    first.send_signal(signal.SIGKILL)       # the submitter is gone; its stage runs on
    first.wait()
    time.sleep(2)
    alive_before = sum(_alive(p) for p in pids)
    t = time.perf_counter()
    spark = connect_session(f"{args.connect.rstrip('/')}/;session_id={session_id}")
    t_join = time.perf_counter() - t
    interrupted = spark.interruptTag(tag)
    while any(_alive(p) for p in pids) and time.perf_counter() - t < 60:
        time.sleep(0.01)
    emit({"probe": "takeover", "n": args.n, "tasks_alive_after_submitter_kill": alive_before,
          "join_session_s": round(t_join, 3), "operations_interrupted": len(interrupted),
          "join_to_tasks_gone_s": round(time.perf_counter() - t, 3)})


# ============================================================== failover
class MiniJobMaster:
    """The part of a JobMaster the deployment needs: tasks register over TCP (attempt, slot,
    pid); a dropped connection of the current attempt is a failure."""

    def __init__(self):
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = self._server.getsockname()
        self._lock = threading.Lock()
        self.registered: dict[int, dict[int, int]] = {}     # attempt -> slot -> pid
        self._connections: dict[int, list[socket.socket]] = {}
        self.all_registered: dict[int, threading.Event] = {}
        self.failed = threading.Event()
        self.failed_at: float | None = None
        self.expected = 0
        self.attempt = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def expect(self, attempt: int, n: int) -> threading.Event:
        with self._lock:
            self.attempt, self.expected = attempt, n
            self.failed.clear()
            return self.all_registered.setdefault(attempt, threading.Event())

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(256)
                if not chunk:
                    return
                data += chunk
            attempt, slot, pid = (int(x) for x in data.split())
            with self._lock:
                self._connections.setdefault(attempt, []).append(conn)
                slots = self.registered.setdefault(attempt, {})
                slots[slot] = pid
                if attempt == self.attempt and len(slots) == self.expected:
                    self.all_registered.setdefault(attempt, threading.Event()).set()
            try:
                conn.recv(1)    # blocks until the task's process dies or is cancelled
            except OSError:
                pass            # closed here: the attempt is being cancelled
            with self._lock:
                if attempt == self.attempt and not self.failed.is_set():
                    self.failed_at = time.perf_counter()
                    self.failed.set()
                    # cancel the attempt's other tasks (streamsnap sends "cancel"): they end
                    # and free their slots without waiting for Spark's task kill
                    for other in self._connections.get(attempt, []):
                        if other is not conn:
                            try:
                                other.shutdown(socket.SHUT_RDWR)
                            except OSError:
                                pass

    def close(self) -> None:
        self._server.close()


def registering_task(address, attempt: int, clean_exit: bool = False):
    """A barrier task that registers with the JobMaster and runs until cancelled; cancelled, it
    fails, or with `clean_exit` returns normally (a task that returns leaves its Python worker
    to be reused by the next attempt; one that raises does not)."""

    def run(batches):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        for _ in batches:
            pass
        sock = socket.create_connection(tuple(address))
        sock.sendall(f"{attempt} {ctx.partitionId()} {os.getpid()}\n".encode())
        sock.recv(1)            # the JobMaster closes it to cancel the task (or dies)
        if not clean_exit:
            raise RuntimeError("cancelled by the JobMaster (or it is gone)")
        yield from ()
    return run


def failover_client(spark, classic: bool, n: int, reps: int, clean_exit: bool = False) -> list[dict]:
    """JobMaster in the submitting process: it cancels the failed stage and submits the next."""
    master = MiniJobMaster()
    records = []
    state = {"running": None}

    def deploy(attempt: int) -> threading.Thread:
        group = f"probe-{uuid.uuid4().hex[:8]}-{attempt}"
        fn = registering_task(master.address, attempt, clean_exit)

        def submit():
            try:
                if classic:
                    spark.sparkContext.setJobGroup(group, "probe", interruptOnCancel=True)
                    spark.sparkContext.parallelize(range(n), n).barrier().mapPartitions(
                        lambda it, fn=fn: fn(it)).collect()
                else:
                    spark.addTag(group)
                    barrier_df(spark, n, fn).collect()
            except Exception:
                pass        # cancelled: expected
            finally:
                if not classic:
                    spark.removeTag(group)
        thread = threading.Thread(target=submit, daemon=True)
        thread.start()
        state["running"] = (group, thread)
        return thread

    def cancel():
        group, thread = state["running"]
        if classic:
            spark.sparkContext.cancelJobGroup(group)
        else:
            spark.interruptTag(group)
        thread.join(60)

    event = master.expect(0, n)
    t = time.perf_counter()
    deploy(0)
    event.wait(180)
    records.append({"what": "deploy", "s": round(time.perf_counter() - t, 3)})
    for attempt in range(1, reps + 1):
        victim = master.registered[attempt - 1][attempt % n]
        t_kill = time.perf_counter()
        os.kill(victim, signal.SIGKILL)
        master.failed.wait(60)
        detected = master.failed_at - t_kill
        cancel()
        t_cancelled = time.perf_counter()
        event = master.expect(attempt, n)
        deploy(attempt)
        event.wait(180)
        t_running = time.perf_counter()
        records.append({"what": "redeploy", "killed_slot": attempt % n, "detect_s": round(detected, 3),
                        "cancel_s": round(t_cancelled - master.failed_at, 3),
                        "resubmit_to_running_s": round(t_running - t_cancelled, 3),
                        "kill_to_running_s": round(t_running - t_kill, 3)})
    cancel()
    master.close()
    return records


def task_hosted(directory: str, n: int, clean_exit: bool = False):
    """Barrier task; task 0 hosts the (mini) JobMaster of its stage attempt and publishes its
    address in `directory`; the others find it there and register.

    Python's BarrierTaskContext has no stage attempt number; a barrier stage attempt's n tasks
    are launched together with consecutive task ids, so the JobMaster of a task's attempt is
    the one published by a task 0 whose id is within n of its own."""

    def run(batches):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        for _ in batches:
            pass
        slot, tid = ctx.partitionId(), ctx.taskAttemptId()
        started = time.time()
        if slot == 0:
            master = MiniJobMaster()
            master.expect(tid, n)
            path = os.path.join(directory, f"jm-{tid}")
            with open(path + ".tmp", "w") as f:
                f.write(json.dumps(list(master.address)))
            os.replace(path + ".tmp", path)

            def record():
                master.all_registered[tid].wait()
                attempt = sum(1 for name in os.listdir(directory) if name.startswith("running-"))
                with open(os.path.join(directory, f"running-{attempt}"), "w") as f:
                    f.write(json.dumps({"at": time.time(), "task0_started": started,
                                        "pids": master.registered[tid]}))
            threading.Thread(target=record, daemon=True).start()
        while True:
            mine = [int(name[3:]) for name in os.listdir(directory)
                    if name.startswith("jm-") and not name.endswith(".tmp") and abs(int(name[3:]) - tid) < n]
            if mine:
                break
            time.sleep(0.01)
        address = json.load(open(os.path.join(directory, f"jm-{mine[0]}")))
        yield from registering_task(address, mine[0], clean_exit)(iter(()))
        if slot == 0:
            master.close()      # a task that returns leaves its worker (and threads) to the next task
    return run


def failover_task(spark, n: int, reps: int, clean_exit: bool = False, rdd: bool = False) -> list[dict]:
    """JobMaster hosted by task 0; Spark's retry of the failed barrier ShuffleMapStage redeploys."""
    directory = tempfile.mkdtemp(prefix="probe-failover-task-")
    tag = f"probe-{uuid.uuid4().hex[:8]}"
    error: dict = {}
    t = time.time()
    # the shuffle after the barrier stage makes it a ShuffleMapStage, which Spark retries
    if rdd:     # classic only: the RDD barrier stage, a shuffle after it; cancelled by job group below
        fn = task_hosted(directory, n, clean_exit)

        def make():
            spark.sparkContext.setJobGroup(tag, "probe", interruptOnCancel=True)
            return spark.sparkContext.parallelize(range(n), n).barrier().mapPartitions(
                lambda it: (b.num_rows for b in fn(it))).repartition(1)
    else:
        def make():
            return barrier_df(spark, n, task_hosted(directory, n, clean_exit)).repartition(1)
    threading.Thread(target=collect_tagged, args=(spark, tag, make, error), daemon=True).start()
    _wait_files(directory, "running-0", 1, 180)
    records = [{"what": "deploy", "s": round(json.load(open(os.path.join(directory, "running-0")))["at"] - t, 3)}]
    for attempt in range(1, reps + 1):
        info = json.load(open(os.path.join(directory, f"running-{attempt - 1}")))
        slot = 0 if attempt % 2 else n - 1          # alternately the JobMaster's host, another task
        victim = info["pids"][str(slot)]
        t_kill = time.time()
        os.kill(victim, signal.SIGKILL)
        try:
            _wait_files(directory, f"running-{attempt}", 1, 120)
        except TimeoutError:
            records.append({"what": "redeploy", "killed_slot": slot, "error": error.get("error") or "timeout"})
            break
        new = json.load(open(os.path.join(directory, f"running-{attempt}")))
        records.append({"what": "redeploy", "killed_slot": slot, "killed": "jobmaster host" if slot == 0 else "task",
                        "kill_to_new_jobmaster_s": round(new["task0_started"] - t_kill, 3),
                        "kill_to_running_s": round(new["at"] - t_kill, 3)})
    if rdd:
        spark.sparkContext.cancelJobGroup(tag)
    else:
        spark.interruptTag(tag)
    return records


def cmd_failover(args) -> None:
    if args.classic:
        spark, kind = classic_session(args.n, args.master), "classic"
    else:
        spark, kind = connect_session(args.connect), "connect"
    records = []
    for round_ in range(args.rounds):     # a round is one Spark job: Spark retries a stage 3 times by default
        if args.place == "client":
            found = failover_client(spark, args.classic, args.n, args.reps, args.clean_exit)
        else:
            found = failover_task(spark, args.n, args.reps, args.clean_exit, args.rdd)
        for r in found:
            emit({"probe": "failover", "session": kind, "place": args.place, "n": args.n, "round": round_,
                  "clean_exit": args.clean_exit, **r})
        records += found
    redeploys = [r["kill_to_running_s"] for r in records if "kill_to_running_s" in r]
    if redeploys:
        emit({"probe": "failover", "session": kind, "place": args.place, "clean_exit": args.clean_exit, "rdd": args.rdd,
              "summary": True, "redeploys": len(redeploys),
              "median_kill_to_running_s": round(statistics.median(redeploys), 3),
              "median_deploy_s": round(statistics.median(r["s"] for r in records if r["what"] == "deploy"), 3)})


# ============================================================== main
def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_startup":
        _startup_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_tagged":
        _tagged_submitter_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_daemon":
        _daemon_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_submitter":
        _submitter_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), sys.argv[6])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("startup", "cancel", "artifacts", "detach", "takeover", "failover"):
        p = commands.add_parser(name)
        p.add_argument("--connect", help="sc:// URL of a Connect server (scripts/spark-connect)")
        p.add_argument("--n", type=int, default=4, help="barrier tasks")
        p.add_argument("--reps", type=int, default=5 if name == "startup" else 3)
        if name == "startup":
            p.add_argument("--rounds", type=int, default=2, help="alternating classic/Connect processes")
        if name in ("detach", "failover"):
            p.add_argument("--place", choices=("client", "daemon") if name == "detach" else ("client", "task"),
                           default="client")
        if name == "detach":
            p.add_argument("--watch", type=float, default=60, help="seconds to watch after the client's kill")
        if name == "failover":
            p.add_argument("--classic", action="store_true", help="a classic session in this process")
            p.add_argument("--master", help="the classic session's master (default local[n])")
            p.add_argument("--rounds", type=int, default=1, help="Spark jobs, each deployed and failed over --reps times")
            p.add_argument("--rdd", action="store_true",
                           help="with --classic --place task: the RDD barrier stage (today's call) + a shuffle")
            p.add_argument("--clean-exit", action="store_true",
                           help="cancelled tasks return normally instead of failing (their Python workers are reused)")
    args = parser.parse_args()
    globals()[f"cmd_{args.command}"](args)


if __name__ == "__main__":
    main()
