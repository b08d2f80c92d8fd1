"""W1 on Bytewax 0.21, the comparison issue 12 names: 2 processes x 1 worker, 1 s snapshots.

The dataflow is W1 as the per-row README way writes it for streamsnap (benchmarks/per_row.py):
a per-row source function (`{"key": i % K, "value": i}`, two partitions, 1024 rows a batch,
like `Generator`), `key_on` + `stateful_map` keeping the running sum, every sum emitted to a
discarding sink. Bytewax runs as its CLI runs it (`python -m bytewax.run`, one OS process per
cluster process, on loopback), with recovery on (`-r` with 2 initialised partitions, `-s 1`).
The figure is timed like streamsnap's: from the first poll of a source partition to the last
sink partition's close, so process start-up and cluster formation do not count.

Needs `pip install -e '.[bench]'` (bytewax); `benchmarks.per_row.bytewax_available()` says
whether it is installed.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from bytewax import operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition

BATCH = 1024
PARTITIONS = 2


class _Partition(StatefulSourcePartition):
    def __init__(self, index: int, n: int, k: int, stamps: str, resume):
        self.index, self.n, self.k, self.stamps = index, n, k, stamps
        self.position = resume or 0
        self.stamped = False

    def next_batch(self):
        if not self.stamped:
            self.stamped = True
            with open(os.path.join(self.stamps, f"start-{os.getpid()}-{self.index}"), "w") as f:
                f.write(repr(time.time()))
        first = self.index + PARTITIONS * self.position
        if first >= self.n:
            raise StopIteration()
        indices = range(first, min(self.n, first + PARTITIONS * BATCH), PARTITIONS)
        self.position += len(indices)
        k = self.k
        return [{"key": i % k, "value": i} for i in indices]

    def snapshot(self):
        return self.position


class _Source(FixedPartitionedSource):
    def __init__(self, n: int, k: int, stamps: str):
        self.n, self.k, self.stamps = n, k, stamps

    def list_parts(self):
        return [str(i) for i in range(PARTITIONS)]

    def build_part(self, step_id, for_part, resume_state):
        return _Partition(int(for_part), self.n, self.k, self.stamps, resume_state)


class _Discard(StatelessSinkPartition):
    def __init__(self, stamps: str):
        self.stamps, self.rows = stamps, 0

    def write_batch(self, items):
        self.rows += len(items)

    def close(self):
        with open(os.path.join(self.stamps, f"end-{os.getpid()}"), "w") as f:
            f.write(f"{time.time()!r} {self.rows}")


class _DiscardSink(DynamicSink):
    def __init__(self, stamps: str):
        self.stamps = stamps

    def build(self, step_id, worker_index, worker_count):
        return _Discard(self.stamps)


def _running_sum(total, row):
    total = (total or 0) + row["value"]
    return total, {"key": row["key"], "total": total}


def flow() -> Dataflow:
    """The dataflow, configured by W1_N, W1_K and W1_STAMPS (how `bytewax.run` builds it)."""
    stamps = os.environ["W1_STAMPS"]
    w1 = Dataflow("w1")
    rows = op.input("events", w1, _Source(int(os.environ["W1_N"]), int(os.environ["W1_K"]), stamps))
    keyed = op.key_on("key", rows, lambda row: str(row["key"]))
    op.output("out", op.stateful_map("sum", keyed, _running_sum), _DiscardSink(stamps))
    return w1


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def run(n: int, k: int = 1000, processes: int = 2, snapshot_interval: int = 1, timeout: float = 600.0) -> dict:
    """One Bytewax W1 run over n rows: events/s from first poll to last sink close."""
    work = tempfile.mkdtemp(prefix="ssbench-bytewax-")
    try:
        stamps, recovery = os.path.join(work, "stamps"), os.path.join(work, "recovery")
        os.makedirs(stamps)
        os.makedirs(recovery)
        subprocess.run([sys.executable, "-m", "bytewax.recovery", recovery, str(PARTITIONS)],
                       check=True, capture_output=True, timeout=60)
        env = dict(os.environ, W1_N=str(n), W1_K=str(k), W1_STAMPS=stamps,
                   PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(__file__)),
                                                            os.environ.get("PYTHONPATH")])))
        addresses = ";".join(f"127.0.0.1:{port}" for port in _free_ports(processes))
        command = [sys.executable, "-m", "bytewax.run", "benchmarks.bytewax_w1:flow()", "-w", "1",
                   "-a", addresses, "-r", recovery, "-s", str(snapshot_interval), "-b", "0"]
        procs = [subprocess.Popen(command + ["-i", str(i)], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE) for i in range(processes)]
        errors = []
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if proc.returncode != 0:
                errors.append(err.decode(errors="replace")[-2000:])
        if errors:
            raise RuntimeError(f"Bytewax W1 failed: {errors[0]}")
        starts = [float(open(p).read()) for p in glob.glob(os.path.join(stamps, "start-*"))]
        ends = [open(p).read().split() for p in glob.glob(os.path.join(stamps, "end-*"))]
        rows = sum(int(e[1]) for e in ends)
        if rows != n:
            raise RuntimeError(f"Bytewax W1: the sink got {rows} running sums, expected {n}")
        seconds = max(float(e[0]) for e in ends) - min(starts)
        return {"per_second": n / seconds, "seconds": seconds, "output_rows": rows}
    finally:
        shutil.rmtree(work, ignore_errors=True)
