"""Built-in sinks: Collect and Print (rows to the driver) and FileSink (Parquet / JSON lines).

All three follow the two-phase-commit shape of `connectors.base`:

* `Collect` ships rows to its driver-side collector as they are written and marks, at each
  checkpoint's synchronous phase, "everything so far belongs to checkpoint n". The collector
  makes rows visible only when checkpoint n completes, and drops what no completed checkpoint
  covers when the job fails over — so collected results are exactly-once.
* `FileSink` (the `connectors/filesink` package) writes hidden in-progress files, closes them
  at the snapshot (pre-commit) and renames the parts its `RollingPolicy` rolled into place when
  the checkpoint completes (commit). After a restore it commits what the checkpoint had
  pre-committed, resumes its open parts and deletes in-progress files of earlier attempts.
* `Print` prints on the driver as rows arrive (at-least-once, like Flink's print sink).

Without checkpointing, output is committed when the input ends.
"""

from __future__ import annotations

import logging
import sys
import threading

import pyarrow as pa

from streamsnap.connectors.base import Sink, SinkWriter
from streamsnap.network.frames import decode_batches, encode_batches
from streamsnap.runtime.batches import Batch, num_rows, to_record_batch
from streamsnap.runtime.operators.base import OperatorContext

log = logging.getLogger(__name__)


# ===================================================================== rows to the driver
class _DriverWriter(SinkWriter):
    """Sends written batches to the sink's driver component over the control connection."""

    def __init__(self, ctx: OperatorContext, transactional: bool):
        self._ctx = ctx
        self._transactional = transactional
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0

    def _send(self, op: str, **fields) -> None:
        self._ctx.driver.send({"type": "sink", "uid": self._ctx.uid, "op": op,
                               "subtask": self._ctx.subtask_index, **fields})

    def write(self, batch: Batch) -> None:
        if not num_rows(batch):
            return
        self._pending.append(to_record_batch(batch))
        self._pending_rows += num_rows(batch)
        if self._pending_rows >= 4096 or not self._transactional:
            self._ship()

    def _ship(self) -> None:
        if not self._pending:
            return
        groups: dict[pa.Schema, list[pa.RecordBatch]] = {}
        for b in self._pending:
            groups.setdefault(b.schema, []).append(b)
        for batches in groups.values():
            self._send("data", ipc=encode_batches(batches).to_pybytes())
        self._pending, self._pending_rows = [], 0

    def end_input(self) -> None:
        self._ship()
        self._send("end")

    def prepare_commit(self, checkpoint_id: int) -> list:
        self._ship()
        self._send("precommit", checkpoint_id=checkpoint_id)
        return []

    def close(self) -> None:
        self._ship()


class Collector:
    """Driver side of `Collect`: holds rows per subtask until a checkpoint covers them."""

    def __init__(self, name: str):
        self.name = name
        self._lock = threading.Lock()
        self._committed: list[dict] = []
        self._open: dict[int, list[dict]] = {}            # subtask -> rows not yet pre-committed
        self._precommitted: dict[int, list[tuple[int, list[dict]]]] = {}  # subtask -> [(checkpoint id, rows)]

    def on_message(self, subtask: int, message: dict) -> None:
        op = message["op"]
        with self._lock:
            if op == "data":
                rows = [r for b in decode_batches(message["ipc"]) for r in b.to_pylist()]
                self._open.setdefault(subtask, []).extend(rows)
            elif op == "precommit":
                rows = self._open.pop(subtask, [])
                self._precommitted.setdefault(subtask, []).append((int(message["checkpoint_id"]), rows))
            elif op != "end":
                raise ValueError(f"unknown collect message {op!r}")

    def notify_checkpoint_complete(self, checkpoint) -> None:
        checkpoint_id = checkpoint.checkpoint_id
        with self._lock:
            for subtask in sorted(self._precommitted):
                keep = []
                for cid, rows in self._precommitted[subtask]:
                    if cid <= checkpoint_id:
                        self._committed.extend(rows)
                    else:
                        keep.append((cid, rows))
                self._precommitted[subtask] = keep

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Aborted pre-commits stay pending: the next completed checkpoint commits them."""

    def on_failover(self) -> None:
        """Rows no completed checkpoint covers will be produced again after the restore."""
        with self._lock:
            self._open.clear()
            self._precommitted.clear()

    def on_finished(self, checkpointing: bool) -> None:
        """Without checkpoints, the end of input is the commit point."""
        with self._lock:
            if not checkpointing:
                for subtask in sorted(self._precommitted):
                    for _, rows in self._precommitted[subtask]:
                        self._committed.extend(rows)
                for subtask in sorted(self._open):
                    self._committed.extend(self._open[subtask])
            else:
                dropped = sum(len(r) for r in self._open.values()) + sum(
                    len(rows) for txns in self._precommitted.values() for _, rows in txns)
                if dropped:
                    log.warning("collect sink %s: %d rows no checkpoint committed were dropped at job end",
                                self.name, dropped)
            self._open.clear()
            self._precommitted.clear()

    def rows(self) -> list[dict]:
        with self._lock:
            return list(self._committed)


class Collect(Sink):
    """Collects rows into the JobResult on the driver (exactly-once with checkpoints)."""

    def create_writer(self, ctx: OperatorContext) -> SinkWriter:
        return _DriverWriter(ctx, transactional=True)

    def create_driver_component(self):
        return Collector("collect")


class Printer:
    """Driver side of `Print`: prints rows as they arrive, prefixed with the subtask (`2> `)."""

    def __init__(self, stream=None, prefix: str = ""):
        self._stream = stream
        self._prefix = prefix

    def on_message(self, subtask: int, message: dict) -> None:
        if message["op"] != "data":
            return
        out = self._stream or sys.stdout
        for batch in decode_batches(message["ipc"]):
            for row in batch.to_pylist():
                out.write(f"{self._prefix}{subtask + 1}> {row}\n")
        out.flush()


class Print(Sink):
    """Prints rows on the driver's stdout (at-least-once)."""

    def __init__(self, prefix: str = ""):
        self.prefix = prefix

    def create_writer(self, ctx: OperatorContext) -> SinkWriter:
        return _DriverWriter(ctx, transactional=False)

    def create_driver_component(self):
        return Printer(prefix=self.prefix)


class _DiscardWriter(SinkWriter):
    def write(self, batch: Batch) -> None:
        """Dropped."""


class Discard(Sink):
    """Consumes and drops every row (Flink's DiscardingSink): for benchmarks and dry runs."""

    checks_schema = False  # it keeps no row, so it pays for no conversion

    def create_writer(self, ctx: OperatorContext) -> SinkWriter:
        return _DiscardWriter()


# `ss.sinks`: what a job writes to. Custom sinks subclass streamsnap.connectors.base.Sink.
__all__ = ["Collect", "Print", "FileSink", "RollingPolicy", "Discard", "Kafka", "Delta", "Iceberg"]

from streamsnap.connectors.filesink import FileSink, FileSinkWriter, RollingPolicy  # noqa: E402,F401

from streamsnap.connectors.kafka import KafkaSink as Kafka  # noqa: E402  (ss.sinks.Kafka)
from streamsnap.connectors.lakehouse.delta_sink import Delta  # noqa: E402  (table libraries imported on use)
from streamsnap.connectors.lakehouse.iceberg_sink import Iceberg  # noqa: E402


def __dir__() -> list[str]:
    """`dir()` lists the public names (`__all__`), not the module's imports and submodules."""
    return sorted(__all__)
