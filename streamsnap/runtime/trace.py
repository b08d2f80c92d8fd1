"""Per-batch timings of a running task: what a latency tail is made of.

Off unless the environment variable STREAMSNAP_TRACE_DIR names a directory (set it before the
Spark session starts, so the Python workers inherit it). Then every task records, stamped with
the wall clock, each unit of work of its mailbox loop — a source batch emitted, an input batch
processed (with the age of its oldest row when a column named by STREAMSNAP_TRACE_STAMP holds
creation times in epoch seconds), each wait in the network poll, each network frame flushed
(rows, age of its oldest row), each checkpoint's synchronous part and each garbage collection —
and, per unit, the CPU time and the time spent runnable but waiting for a CPU (Linux
/proc/self/schedstat): the part of a delay that is the machine's scheduling, not our code.
At teardown it writes one JSON line per record to `<dir>/<task>-<pid>.jsonl`;
`benchmarks/latency_trace.py` runs the per-row latency job traced and sums them up.

Tracing wraps the task's methods at set-up (instance attributes), so a task that is not traced
runs exactly the code it runs without this module.
"""

from __future__ import annotations

import gc
import json
import os
import re
import time

import pyarrow as pa
import pyarrow.compute as pc

DIR_ENV = "STREAMSNAP_TRACE_DIR"
STAMP_ENV = "STREAMSNAP_TRACE_STAMP"
_SCHEDSTAT = "/proc/self/schedstat"


def _cpu_and_wait() -> tuple[float, float]:
    """Seconds this process's main thread ran and waited runnable (0, 0 where unavailable)."""
    try:
        with open(_SCHEDSTAT) as f:
            ran, waited, _ = f.read().split()
    except OSError:
        return 0.0, 0.0
    return int(ran) / 1e9, int(waited) / 1e9


class TaskTrace:
    """The records of one task; `install` wraps the task's methods to fill it."""

    def __init__(self, directory: str, task_name: str, stamp: str | None):
        self.directory = directory
        self.task_name = task_name
        self.stamp = stamp
        self.records: list[tuple] = []
        self._gc_started = 0.0
        self._started = (time.process_time(), time.time())

    # ---------------------------------------------------------------- wrapping
    def install(self, task) -> None:
        head = task.head
        if task.is_source:
            head.emit_next = self._timed("emit", head.emit_next, lambda args: -1)
        else:
            head.process = self._timed("batch", head.process, lambda args: self._rows_and_oldest(args[0]))
            if hasattr(head, "process_input"):
                head.process_input = self._timed("batch", head.process_input,
                                                 lambda args: self._rows_and_oldest(args[1]))
        task.network.poll = self._timed("poll", task.network.poll, lambda args: args[0] if args else None)
        task.perform_checkpoint = self._timed("checkpoint", task.perform_checkpoint, lambda args: args[0])
        for writer in task.writers:
            writer._flush = self._flushes(writer)
        gc.callbacks.append(self._on_gc)

    def _timed(self, kind: str, fn, describe):
        records = self.records

        def timed(*args, **kwargs):
            detail = describe(args)
            start, (cpu, waited) = time.time(), _cpu_and_wait()
            try:
                return fn(*args, **kwargs)
            finally:
                cpu_end, waited_end = _cpu_and_wait()
                records.append((kind, start, time.time() - start, detail, cpu_end - cpu, waited_end - waited))
        return timed

    def _flushes(self, writer):
        flush, records = writer._flush, self.records

        def traced(channel: int) -> None:
            since = writer._since[channel]
            if writer._parts[channel] and since is not None:
                records.append(("flush", time.time(), channel, writer._rows[channel], time.monotonic() - since))
            flush(channel)
        return traced

    def _rows_and_oldest(self, batch) -> tuple[int, float | None]:
        if isinstance(batch, pa.RecordBatch):
            oldest = None
            if self.stamp is not None and batch.num_rows:
                position = batch.schema.get_field_index(self.stamp)
                if position >= 0:
                    oldest = pc.min(batch.column(position)).as_py()
            return batch.num_rows, oldest
        if not isinstance(batch, list):
            return -1, None
        stamps = [row.get(self.stamp) for row in batch] if self.stamp is not None else []
        stamps = [s for s in stamps if s is not None]
        return len(batch), (min(stamps) if stamps else None)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.records.append(("gc", time.time(), time.perf_counter() - self._gc_started,
                                 info.get("generation"), info.get("collected")))

    # ---------------------------------------------------------------- output
    def close(self) -> str:
        """Stop recording and write the records; returns the file's path."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        cpu, wall = self._started
        self.records.append(("total", time.process_time() - cpu, time.time() - wall))
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.task_name).strip("_")
        path = os.path.join(self.directory, f"{name}-{os.getpid()}.jsonl")
        with open(path, "w") as f:
            for record in self.records:
                f.write(json.dumps(record) + "\n")
        self.records = []
        return path


def install(task) -> TaskTrace | None:
    """Trace `task` (set up, not yet running) when STREAMSNAP_TRACE_DIR is set; else None."""
    directory = os.environ.get(DIR_ENV)
    if not directory:
        return None
    os.makedirs(directory, exist_ok=True)
    trace = TaskTrace(directory, task.name, os.environ.get(STAMP_ENV) or None)
    trace.install(task)
    return trace
