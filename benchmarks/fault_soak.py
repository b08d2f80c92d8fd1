"""The fault soak of issue 33: one long chaos job on the many-hosts cluster, a fault every few
minutes of rotating kinds, ending with the exact-output check and the memory over time.

The job is multi_host.DRIVER's (filter + two keyed stages at p=3 into an exactly-once Parquet
FileSink, its Generator paced at --rate rows/s for --minutes) on a Spark standalone cluster of
two Workers posing as hosts 127.0.0.2 and .3 (scripts/spark-standalone --hosts). Every --every
seconds the next fault of the rotation strikes:

* slot: a keyed subtask's process SIGKILLed;
* partition: the two hosts cut apart (scripts/partition) for 10 s;
* enospc: the checkpoint disk (a tmpfs of the soak's own) filled for 10 s — checkpoints fail,
  within tolerable_failures, so no restart is expected;
* host: the Worker host running most subtasks killed whole (scripts/spark-standalone
  kill-host), then started again (start-host) 10 s later.

Faults stop --quiet-tail seconds before the input ends. Every 5 s the RSS of the keyed
subtasks (mean per subtask), of the driver's Python process (where the JobMaster runs) and of
its JVM is sampled; the report compares the first and last quartile of each. Per fault: the
restarts it caused, the time the job took to notice it and to put out its first row after it.
Exits 1 unless the output is exact and restarts ≤ faults.

    python -m benchmarks.fault_soak [--minutes 30] [--every 120] [--rate 500]
                                    [--kinds slot,partition,enospc,host] [--keep DIR]

Needs root and nft for partition and enospc (else those kinds are left out, saying so). Every
process, rule and mount it makes is removed at the end, on an error and on Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil

from tests.integration import multi_host
from tests.integration.multi_host import CLUSTER_SCRIPT, PARTITION_SCRIPT
from tests.integration.test_storage_faults import fill

KINDS = ("slot", "partition", "enospc", "host")
FAULT_SECONDS = 10          # a partition's, a full disk's and a lost host's length
PEER_TIMEOUT = 3.0
SAMPLE_EVERY = 5.0


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def keyed(subtask: dict) -> bool:
    return subtask["pid"] is not None and subtask["vertex"].startswith(("sum", "count"))


def rss_mb(pid: int) -> float | None:
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.NoSuchProcess:
        return None


class Memory:
    """RSS samples over time, in a thread: keyed subtasks (mean), the driver's Python, its JVM."""

    def __init__(self, job: multi_host.Job, driver_pid: int):
        self.job, self.driver = job, psutil.Process(driver_pid)
        self.samples: dict[str, list[float]] = {"keyed subtask": [], "driver python": [], "driver JVM": []}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            if self.job.session.process.poll() is not None:
                return          # the driver ended
            subtasks = [rss_mb(s["pid"]) for s in self.job.info()["subtasks"] if keyed(s)]
            subtasks = [r for r in subtasks if r is not None]
            if subtasks:
                self.samples["keyed subtask"].append(statistics.mean(subtasks))
            try:
                self.samples["driver python"].append(self.driver.memory_info().rss / 2**20)
                jvms = [c for c in self.driver.children() if c.name() == "java"]
                if jvms:
                    self.samples["driver JVM"].append(jvms[0].memory_info().rss / 2**20)
            except psutil.NoSuchProcess:
                return          # the driver ended

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(SAMPLE_EVERY + 5)

    def report(self) -> list[str]:
        lines = []
        for name, values in self.samples.items():
            if len(values) < 4:
                lines.append(f"  {name}: {len(values)} samples, too few for quartiles")
                continue
            quarter = len(values) // 4
            first, last = statistics.mean(values[:quarter]), statistics.mean(values[-quarter:])
            lines.append(f"  {name}: first quartile {first:.0f} MB, last quartile {last:.0f} MB "
                         f"({(last - first) / first:+.0%}), max {max(values):.0f} MB, {len(values)} samples")
        return lines


class Faults:
    """Injects the rotation's faults, each undone before `inject` returns, also on an error or
    Ctrl-C (a lost host's Worker is then stopped with the cluster)."""

    def __init__(self, cluster: dict, job: multi_host.Job, disk: str | None):
        self.cluster, self.job, self.disk = cluster, job, disk
        self.random = random.Random(33)
        self.injected: list[dict] = []          # {"kind", "at", "detail"}

    def inject(self, kind: str) -> None:
        at = time.time()
        detail = getattr(self, kind)()
        self.injected.append({"kind": kind, "at": at, "detail": detail})
        print(f"{time.strftime('%H:%M:%S')} fault {len(self.injected)}: {kind} {detail}", flush=True)

    def slot(self) -> str:
        victims = [s for s in self.job.info()["subtasks"] if keyed(s)]
        if not victims:
            return "no keyed subtask running (mid-restart): nothing killed"
        victim = self.random.choice(victims)
        try:
            os.kill(victim["pid"], signal.SIGKILL)
        except ProcessLookupError:
            return f"{victim['vertex']}#{victim['index']} pid {victim['pid']} already gone"
        return f"SIGKILL {victim['vertex']}#{victim['index']} pid {victim['pid']} on {victim['host']}"

    def partition(self) -> str:
        a, b = sorted(h["address"] for h in self.cluster["hosts"].values())[:2]
        cut = subprocess.Popen([sys.executable, PARTITION_SCRIPT, "cut", a, b, "--for", str(FAULT_SECONDS)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with contextlib.ExitStack() as undo:
            undo.callback(heal, cut)
            output, _ = cut.communicate(timeout=FAULT_SECONDS + 60)
        if cut.returncode != 0:
            raise RuntimeError(f"scripts/partition failed: {output}")
        return f"{a} <-> {b} for {FAULT_SECONDS} s"

    def enospc(self) -> str:
        filler = fill(self.disk)
        try:
            time.sleep(FAULT_SECONDS)
        finally:
            os.remove(filler)
        return f"{self.disk} full for {FAULT_SECONDS} s"

    def host(self) -> str:
        info = self.job.info()
        busiest = max(self.cluster["hosts"], key=lambda name: sum(
            s["host"] == self.cluster["hosts"][name]["address"] for s in info["subtasks"]))
        directory = self.cluster["directory"]
        killed = subprocess.run([sys.executable, CLUSTER_SCRIPT, "kill-host", directory, busiest],
                                capture_output=True, text=True, timeout=60)
        if killed.returncode != 0:
            raise RuntimeError(f"kill-host {busiest} failed: {killed.stderr}")
        time.sleep(FAULT_SECONDS)
        started = subprocess.run([sys.executable, CLUSTER_SCRIPT, "start-host", directory, busiest],
                                 capture_output=True, text=True, timeout=150)
        if started.returncode != 0:
            raise RuntimeError(f"start-host {busiest} failed: {started.stderr}")
        return (f"{busiest} ({self.cluster['hosts'][busiest]['address']}) killed "
                f"({len(killed.stdout.split())} processes), back after {FAULT_SECONDS} s")

    def per_fault(self, recoveries: list[dict]) -> list[str]:
        """Each fault with the failovers noticed between it and the next fault."""
        lines = []
        for i, fault in enumerate(self.injected):
            until = self.injected[i + 1]["at"] if i + 1 < len(self.injected) else float("inf")
            mine = [r for r in recoveries if fault["at"] <= r["failed_at"] < until]
            figures = ""
            if mine:
                figures = f", noticed after {mine[0]['failed_at'] - fault['at']:.1f} s"
                if mine[0].get("first_output_at") is not None:
                    figures += f", first output {mine[0]['first_output_at'] - fault['at']:.1f} s after the fault"
            lines.append(f"  {i + 1}. {fault['kind']}: {len(mine)} restart(s){figures}")
        return lines


def heal(cut: subprocess.Popen) -> None:
    if cut.poll() is None:
        cut.terminate()         # the script heals on SIGTERM
        cut.wait(30)
    subprocess.run([sys.executable, PARTITION_SCRIPT, "heal"], check=True, timeout=30)


def usable_kinds(kinds: list[str]) -> list[str]:
    root_tools = os.geteuid() == 0 and shutil.which("nft") is not None
    left = []
    for kind in kinds:
        if kind in ("partition", "enospc") and not root_tools:
            print(f"leaving out {kind}: it needs root (nft, mount)", flush=True)
        else:
            left.append(kind)
    return left


def mount_disk(directory: str, stack: contextlib.ExitStack) -> str:
    """A tmpfs of the soak's own for the checkpoints (unmounted on the stack's close)."""
    disk = os.path.join(directory, "ckpt-disk")
    os.makedirs(disk)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", disk], check=True, timeout=30)
    stack.callback(subprocess.run, ["umount", "-l", disk], check=True, timeout=30)
    return disk


def soak(args, directory: str, stack: contextlib.ExitStack) -> bool:
    kinds = usable_kinds(args.kinds)
    disk = mount_disk(directory, stack) if "enospc" in kinds else None
    cluster_dir = os.path.join(directory, "cluster")
    cluster = multi_host.start_cluster(cluster_dir)
    stack.callback(multi_host.stop_cluster, cluster_dir)
    session = multi_host.Session(cluster, directory)
    stack.callback(close_session, session)
    n = int(args.rate * args.minutes * 60)
    faults_planned = max(1, int(args.minutes * 60 // args.every))
    job_dir = pathlib.Path(directory) / "job"
    job_dir.mkdir()
    job = session.run(job_dir, "fault soak", {
        "network": {"peer_timeout": PEER_TIMEOUT}, "rate": args.rate, "attempts": 2 * faults_planned + 4,
        "tolerable_failures": 4 * FAULT_SECONDS,    # checkpoints every 0.5 s: a full disk's are tolerated
        "timeout": args.minutes * 60 + 900}, n=n, ckpt=os.path.join(disk, "ckpt") if disk else None)
    info = job.info()
    started = time.monotonic()
    print(f"{time.strftime('%H:%M:%S')} running: {n} rows at {args.rate}/s, faults every {args.every:g} s "
          f"({', '.join(kinds)}), subtasks on {sorted({s['host'] for s in info['subtasks']})}", flush=True)
    memory = Memory(job, info["driver_pid"])
    faults = Faults(cluster, job, disk)
    quiet_from = args.minutes * 60 - args.quiet_tail
    while True:
        next_at = args.every * (len(faults.injected) + 1)
        if next_at > quiet_from:
            break
        time.sleep(max(0.0, next_at - (time.monotonic() - started)))
        faults.inject(kinds[len(faults.injected) % len(kinds)])
    result = job.session.await_line("RESULT", args.minutes * 60 + 900)
    memory.stop()
    result = json.loads(result)
    print(f"{time.strftime('%H:%M:%S')} job {result['status']} after {time.monotonic() - started:.0f} s: "
          f"{result.get('restarts')} restart(s) for {len(faults.injected)} fault(s); "
          f"checkpoints {result.get('checkpoints')}")
    if result["status"] != "FINISHED":
        print(f"the job did not finish: {result.get('error')}")
        return False
    print("\n".join(faults.per_fault(result["recoveries"])))
    print("memory (RSS):\n" + "\n".join(memory.report()))
    try:
        job.assert_exact()
    except AssertionError as exc:
        print(f"output NOT exact: {exc}")
        return False
    print(f"output exact: {len(multi_host.read_output(job.out))} rows")
    return result["restarts"] <= len(faults.injected)


def close_session(session: multi_host.Session) -> None:
    if session.process.poll() is None:
        session.process.kill()      # still running its job (an error, Ctrl-C): its JVM exits with it
    session.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--every", type=float, default=120, help="seconds between faults")
    parser.add_argument("--rate", type=int, default=500, help="input rows per second")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"the rotation, of {', '.join(KINDS)}")
    parser.add_argument("--quiet-tail", type=float, default=30, help="no fault in the input's last seconds")
    parser.add_argument("--keep", default=None, help="directory for the logs and output (kept)")
    args = parser.parse_args()
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown or not args.kinds:
        parser.error(f"--kinds takes some of {', '.join(KINDS)}; got {', '.join(unknown) or 'none'}")
    if args.every < 2 * FAULT_SECONDS + 10 or args.minutes * 60 - args.quiet_tail < args.every:
        parser.error(f"--every must be at least {2 * FAULT_SECONDS + 10} s and leave room for one fault "
                     f"before the last --quiet-tail seconds of --minutes")
    directory = args.keep or tempfile.mkdtemp(prefix="fault-soak-")
    os.makedirs(directory, exist_ok=True)
    print(f"fault soak in {directory}", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    with contextlib.ExitStack() as stack:
        ok = soak(args, directory, stack)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
