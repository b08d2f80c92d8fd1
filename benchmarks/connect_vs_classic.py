"""Issue 29's targets, one run: the same jobs through a Spark Connect session and a classic one.

    python -m benchmarks.connect_vs_classic [--rounds 2] [--n 1000000]
    python -m benchmarks.connect_vs_classic --only recovery [--reps 3] [--kinds classic,connect]
                                            [--daemons streamsnap,pyspark]

Starts a Connect server (scripts/spark-connect, `local[4]`) and runs, alternately, a classic
driver (`local[4]` in its own process) and a Connect driver (one process per session kind:
PySpark cannot hold both), each measuring:

* **per-row W1**: W1 written the README way — per-row `Generator(lambda i: {...})` source,
  `key_by`, a `KeyedProcessFunction` emitting every running sum, a discarding sink — p=2,
  checkpoints every 1 s; rows / s from the first source poll to the last sink subtask's end of
  input (both stamped by the tasks into files), so neither deployment nor the final checkpoint
  counts.
* **vectorized W1**: the same with a vectorized Generator and `process_batches`
  (benchmarks/workloads.py, form "batch"), timed the same way.
* **recovery**: a rate-limited W1 job (2000 rows/s, checkpoints every 0.3 s) whose slot process
  is SIGKILLed once a checkpoint completed: seconds from the kill to every subtask RUNNING again
  (the JobMaster's recovery record); classic with the JobMaster in the client (the default) and
  in the cluster, Connect with it in the cluster (the default), each also with the JobMaster's
  own process SIGKILLed (cluster placement).
* **detached submit** (Connect): seconds from the job being RUNNING (the registry's
  `running_since`) to `execute_async(detached=True)` returning, and the call's whole duration.

Prints one table of medians and the ratios the issue's targets are about. `--daemons
streamsnap,pyspark` runs each classic driver twice, alternately: its Python workers forked from
streamsnap's preloading daemon (cluster/worker_daemon.py, the embedded session's default) and
from PySpark's own (`pyspark.daemon`), one column each.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------ inside one driver process
def _file_end_sink(directory: str):
    """workloads.EndSink reporting through files: with the JobMaster in the cluster a sink's
    driver-side component lives in the JobMaster's process, not in this one."""
    from benchmarks.workloads import EndSink, _EndWriter

    class _FileEndWriter(_EndWriter):
        def end_input(self) -> None:
            with open(os.path.join(directory, f"end-{self._ctx.subtask_index}-{os.getpid()}"), "w") as f:
                json.dump({"end": time.time(), "rows": self.rows}, f)

    class FileEndSink(EndSink):
        def create_writer(self, ctx):
            return _FileEndWriter(ctx)

        def create_driver_component(self):
            return None
    return FileEndSink()


def _span(directory: str) -> tuple[float, int]:
    from benchmarks import workloads

    ends = []
    for name in os.listdir(directory):
        if name.startswith("end-"):
            with open(os.path.join(directory, name)) as f:
                ends.append(json.load(f))
    return max(e["end"] for e in ends) - min(workloads.read_starts(directory)), sum(e["rows"] for e in ends)


def _w1(spark, n: int, form: str) -> float:
    import streamsnap as ss
    from benchmarks import per_row, workloads

    stamps = tempfile.mkdtemp(prefix="ssbench-connect-")
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=ss.CheckpointConfig(
        interval=1.0, directory=workloads._checkpoint_dir("connect-")),
        network=None if form == "row" else ss.NetworkConfig(batch_size=65536))
    sink = _file_end_sink(stamps)
    if form == "row":
        source = per_row.StampedGenerator(lambda i: {"key": i % 1000, "value": i}, stamps, count=n)
        stream = env.from_source(source, name="events").key_by("key").process(per_row.RunningSum(), name="sum",
                                                                              uid="sum")
    else:   # the vectorized W1 of benchmarks/workloads.py, its source stamped the same way
        source = per_row.StampedGenerator(workloads._w1_rows(1000, False), stamps, count=n, vectorized=True,
                                          batch_size=65536)
        stream = env.from_source(source, name="events").key_by("key").process_batches(
            workloads.BatchRunningSum(), name="sum", uid="sum")
    stream.sink_to(sink, name="out")
    env.execute(f"W1 {form}")
    seconds, rows = _span(stamps)
    if rows != n:
        raise RuntimeError(f"W1 {form}: {rows} rows reached the sink, expected {n}")
    return n / seconds


# A recovery's steps, in order (cluster/in_cluster.py records them in the recovery log).
STEPS = ("failed_at", "attempt_ended_at", "worker_started_at", "closure_loaded_at", "task_started_at", "leader_at", "deployed_at",
         "running_at", "first_output_at")


def _recovery(spark, job_master: str, victim: str, timeline: dict | None = None) -> float:
    import streamsnap as ss
    from benchmarks import per_row, workloads
    from streamsnap.cluster.registry import JobRegistry

    directory = workloads._checkpoint_dir("recovery-")
    env = ss.StreamEnvironment(parallelism=2, spark=spark, job_master=job_master,
                               checkpointing=ss.CheckpointConfig(interval=0.3, directory=directory),
                               restart=ss.RestartStrategy.fixed_delay(attempts=1, delay=0.0))
    (env.from_source(ss.sources.Generator(lambda i: {"key": i % 100, "value": i}, count=10 ** 9, rate=2000),
                     name="events", uid="events")
        .key_by("key").process(per_row.RunningSum(), name="sum", uid="sum").sink_to(ss.sinks.Discard(), name="out"))
    client = env.execute_async(f"recovery {job_master} {victim}")
    try:
        _until(lambda: client.status() == "RUNNING" and client.checkpoint_stats().counts.completed >= 1)
        if victim == "jobmaster":
            pid = JobRegistry(directory, client.job_id).read()["pid"]
        else:
            pid = [s.pid for s in client.subtasks() if s.pid][0]
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        _until(lambda: client.recoveries() and "running_at" in client.recoveries()[-1]
               and client.status() == "RUNNING")
        record = client.recoveries()[-1]
        if timeline is not None:     # seconds after the kill of each step recorded
            timeline.update({step: record[step] - killed for step in STEPS if record.get(step) is not None})
            if record.get("closure_loaded_cpu") is not None:   # CPU seconds, not a time after the kill
                timeline["worker_cpu_until_closure"] = record["closure_loaded_cpu"]
        return record["running_at"] - killed
    finally:
        client.cancel()


def _detached(spark) -> dict:
    import streamsnap as ss
    from benchmarks import per_row, workloads
    from streamsnap.cluster.registry import JobRegistry

    directory = workloads._checkpoint_dir("detached-")
    env = ss.StreamEnvironment(parallelism=2, spark=spark,
                               checkpointing=ss.CheckpointConfig(interval=1.0, directory=directory))
    (env.from_source(ss.sources.Generator(lambda i: {"key": i % 100, "value": i}, count=10 ** 9, rate=500),
                     name="events", uid="events")
        .key_by("key").process(per_row.RunningSum(), name="sum", uid="sum").sink_to(ss.sinks.Discard(), name="out"))
    started = time.time()
    client = env.execute_async("detached submit", detached=True)
    returned = time.time()
    running_since = JobRegistry(directory, client.job_id).read()["running_since"]
    client.cancel()
    return {"after_running": returned - running_since, "call": returned - started}


def _until(predicate, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the job did not get there in time")
        time.sleep(0.01)


def _recoveries(spark, kind: str, reps: int) -> dict:
    """`--only recovery`: each recovery figure `reps` times, with its timeline (step -> seconds)."""
    out: dict = {}
    cases = [("cluster", "slot"), ("cluster", "jobmaster")] + ([("client", "slot")] if kind == "classic" else [])
    for job_master, victim in cases:
        for _ in range(reps):
            timeline: dict = {}
            out.setdefault(f"recovery_{job_master}_{victim}", []).append(_recovery(spark, job_master, victim, timeline))
            for step, seconds in timeline.items():
                out.setdefault(f"  {job_master}_{victim}.{step}", []).append(seconds)
    return {key: statistics.median(values) for key, values in out.items()}


DAEMONS = {"streamsnap": "streamsnap.cluster.worker_daemon", "pyspark": "pyspark.daemon"}


def driver(kind: str, url: str | None, n: int, only: str | None = None, reps: int = 1,
           daemon: str = "streamsnap") -> dict:
    from pyspark.sql import SparkSession

    from streamsnap.cluster.spark_session import embedded_session

    spark = (SparkSession.builder.remote(url).getOrCreate() if kind == "connect"
             else embedded_session(4, worker_daemon=DAEMONS[daemon]))
    if only == "recovery":
        return _recoveries(spark, kind, reps)
    _w1(spark, max(1, n // 10), "row")        # warm the workers and imports
    out = {"w1_row": _w1(spark, n, "row"), "w1_batch": _w1(spark, n * 20, "batch")}
    if kind == "classic":
        out["recovery_client_slot"] = _recovery(spark, "client", "slot")
    out["recovery_cluster_slot"] = _recovery(spark, "cluster", "slot")
    out["recovery_cluster_jobmaster"] = _recovery(spark, "cluster", "jobmaster")
    if kind == "connect":
        out.update({f"detached_{k}": v for k, v in _detached(spark).items()})
    return out


# ------------------------------------------------------------------------ the run
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--n", type=int, default=1_000_000, help="per-row W1 rows (vectorized: 20x)")
    parser.add_argument("--only", choices=("recovery",), help="only the recovery figures, with their timelines")
    parser.add_argument("--reps", type=int, default=3, help="with --only recovery: kills per figure and driver")
    parser.add_argument("--kinds", default="classic,connect", help="session kinds to run (comma-separated)")
    parser.add_argument("--daemons", default="streamsnap",
                        help="classic drivers: Python worker daemons to compare (streamsnap,pyspark)")
    parser.add_argument("--daemon", choices=tuple(DAEMONS), default="streamsnap", help=argparse.SUPPRESS)
    parser.add_argument("--driver", choices=("classic", "connect"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        print("RESULT " + json.dumps(driver(args.driver, args.url, args.n, args.only, args.reps, args.daemon)),
              flush=True)
        os._exit(0)    # a Connect client's clean-up must not hold the process
    daemons = args.daemons.split(",")
    if not set(daemons) <= set(DAEMONS):
        parser.error(f"--daemons {args.daemons!r}: choose among {', '.join(DAEMONS)}")
    # A column per session kind, and per worker daemon for classic drivers when compared.
    columns = [(kind, daemon) for kind in args.kinds.split(",")
               for daemon in (daemons if kind == "classic" else ["streamsnap"])]
    kinds = [kind if len(daemons) == 1 or kind != "classic" else f"{kind}/{daemon}" for kind, daemon in columns]
    server_dir = tempfile.mkdtemp(prefix="ssbench-connect-server-")
    script = os.path.join(ROOT, "scripts", "spark-connect")
    # The executors import this module's jobs (benchmarks/ is not a package they have installed).
    server_env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    url = "" if "connect" not in args.kinds.split(",") else subprocess.run(
        [sys.executable, script, "start", server_dir, "--master", "local[4]"], check=True, capture_output=True,
        text=True, env=server_env).stdout.strip().splitlines()[-1]
    results: dict[str, list[dict]] = {kind: [] for kind in kinds}
    extra = ["--only", args.only, "--reps", str(args.reps)] if args.only else []
    try:
        for _ in range(args.rounds):
            for kind, (session, daemon) in zip(kinds, columns):
                done = subprocess.run([sys.executable, "-m", "benchmarks.connect_vs_classic", "--driver", session,
                                       "--daemon", daemon, "--url", url, "--n", str(args.n), *extra],
                                      capture_output=True, text=True, cwd=ROOT)
                if "RESULT " not in done.stdout:
                    raise RuntimeError(f"{kind} driver failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
                results[kind].append(json.loads(done.stdout.split("RESULT ", 1)[1]))
                print(kind, results[kind][-1], flush=True)
    finally:
        if url:
            subprocess.run([sys.executable, script, "stop", server_dir], check=False)
    med = {kind: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for kind, runs in results.items()}
    width = max(14, *(len(kind) + 2 for kind in kinds))
    print(f"\n{'figure':<40}" + "".join(f"{kind:>{width}}" for kind in kinds))
    keys = sorted(set().union(*med.values()), key=lambda k: (k.strip().split(".")[0].replace("recovery_", ""),
                                                            k.startswith(" "), STEPS.index(k.split(".")[1]) if k.split(".")[-1] in STEPS else len(STEPS)))
    for key in keys:
        row = [med[k].get(key) for k in kinds]
        print(f"{key:<40}" + "".join(f"{v:>{width},.2f}" if v is not None else f"{'-':>{width}}" for v in row))
    if len(daemons) == 2 and "classic" in args.kinds.split(","):
        for key in sorted(k for k in med["classic/streamsnap"] if not k.startswith(" ")):
            print(f"{key}: streamsnap daemon / pyspark daemon = "
                  f"{med['classic/streamsnap'][key] / med['classic/pyspark'][key]:.3f}")
    for key in ("w1_row", "w1_batch") if not args.only and kinds == ["classic", "connect"] else ():
        print(f"{key}: Connect / classic = {med['connect'][key] / med['classic'][key]:.3f} (target >= 0.90)")


if __name__ == "__main__":
    main()
