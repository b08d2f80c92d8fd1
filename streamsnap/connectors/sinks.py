"""Built-in sinks: Collect and Print (rows to the driver) and FileSink (Parquet / JSON lines).

All three follow the two-phase-commit shape of `connectors.base`:

* `Collect` ships rows to its driver-side collector as they are written and marks, at each
  checkpoint's synchronous phase, "everything so far belongs to checkpoint n". The collector
  makes rows visible only when checkpoint n completes, and drops what no completed checkpoint
  covers when the job fails over — so collected results are exactly-once.
* `FileSink` writes hidden in-progress files, closes them at the snapshot (pre-commit) and
  renames them into place when the checkpoint completes (commit). After a restore it commits
  what the checkpoint had pre-committed and deletes in-progress files of earlier attempts.
* `Print` prints on the driver as rows arrive (at-least-once, like Flink's print sink).

Without checkpointing, output is committed when the input ends.
"""

from __future__ import annotations

import json
import logging
import posixpath
import sys
import threading
import uuid
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq

from streamsnap.checkpoint import filesystem
from streamsnap.connectors.base import Sink, SinkWriter
from streamsnap.errors import ConfigurationError
from streamsnap.network.frames import decode_batches, encode_batches
from streamsnap.runtime.batches import Batch, num_rows, to_record_batch, to_rows
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


# ===================================================================== files
FORMATS = ("parquet", "jsonl")
MODES = ("error_if_exists", "append", "overwrite")
INPROGRESS_PREFIX = ".inprogress-"


class FileSink(Sink):
    """Writes part files into a directory (fsspec URL); exactly-once with checkpoints.

    Finished files are `part-<subtask>-<n>-<id>.<ext>`; files in progress are hidden
    (`.inprogress-...`), so `spark.read.parquet(path)` only ever sees committed output.

    mode: what to do with output already in the directory when the job starts, as Spark's
      DataFrameWriter — "error_if_exists" (default, as in Spark: refuse, so two runs never mix
      silently), "append" (add to it) or "overwrite" (delete the directory's contents first).
      A job restored from a checkpoint or savepoint that has this sink's state (same uid) is
      continuing its own output: it is neither refused nor overwritten.
    """

    def __init__(self, path: str, format: str = "parquet", *, mode: str = "error_if_exists"):
        if not isinstance(path, str) or not path:
            raise ConfigurationError(f"FileSink.path must be a directory path or fsspec URL, got {path!r}")
        if format not in FORMATS:
            raise ConfigurationError(
                f"FileSink.format must be one of {', '.join(repr(f) for f in FORMATS)}, got {format!r}")
        if mode not in MODES:
            raise ConfigurationError(
                f"FileSink.mode must be one of {', '.join(repr(m) for m in MODES)}, got {mode!r}")
        self.path = filesystem.normalize(path)
        self.format = format
        self.mode = mode

    def check_output(self, sink_name: str, resuming: bool) -> None:
        """Apply `mode` to existing output; called by execute() before the job runs (api/preflight.py)."""
        if resuming or self.mode == "append":
            return
        fs, root = filesystem.filesystem(self.path)
        if not fs.exists(root):
            return
        if not fs.isdir(root):
            raise ConfigurationError(f"FileSink '{sink_name}': {filesystem.user_path(self.path)!r} is a file, "
                                     f"not a directory; choose a directory for the output")
        fs.invalidate_cache(root)
        entries = fs.ls(root, detail=False)
        if self.mode == "overwrite":
            for entry in entries:
                fs.rm(entry, recursive=True)
            if entries:
                log.info("FileSink '%s': mode='overwrite' deleted %d entries of %s", sink_name, len(entries),
                         filesystem.user_path(self.path))
            return
        existing = sorted(posixpath.basename(e.rstrip("/")) for e in entries
                          if not posixpath.basename(e.rstrip("/")).startswith((".", "_")))
        if existing:
            raise ConfigurationError(
                f"FileSink '{sink_name}': the output directory {filesystem.user_path(self.path)!r} already holds "
                f"{len(existing)} file(s) ({', '.join(existing[:3])}{', ...' if len(existing) > 3 else ''}); "
                f"mode='error_if_exists' (the default, as Spark's) refuses to mix two runs' output. Fix: "
                f"FileSink(..., mode='append') to add to it, mode='overwrite' to replace it, another path, or "
                f"execute(restore_from=...) to resume the job that wrote it")

    def create_writer(self, ctx: OperatorContext) -> SinkWriter:
        return FileSinkWriter(self, ctx)

    def to_dataframe(self, spark):
        """The committed output as a Spark DataFrame — while the job runs, or after it.

        In-progress files are hidden (`.inprogress-...`) and Spark skips hidden files, so this
        sees exactly the rows of completed checkpoints (exactly-once), never a half-written file.
        Parquet is read with `mergeSchema` (a `schema="widen"` stream may have widened it)."""
        if self.format == "parquet":
            return spark.read.option("mergeSchema", "true").parquet(self.path)
        return spark.read.json(self.path)


class FileSinkWriter(SinkWriter):
    def __init__(self, sink: FileSink, ctx: OperatorContext):
        self._sink = sink
        self._ctx = ctx
        # Identifies this writer's files, so recovery can tell them from older attempts'.
        self._token = f"{ctx.run_id or ctx.job_id[:12]}-a{ctx.attempt}-s{ctx.subtask_index}"
        self._counter = 0
        self._file: IO[bytes] | None = None
        self._writer: pq.ParquetWriter | None = None
        self._current: dict | None = None
        self._pending: list[dict] = []  # pre-committed, not yet committed

    def open(self) -> None:
        filesystem.makedirs(self._sink.path)

    def _start_file(self, schema: pa.Schema | None) -> None:
        name = f"part-{self._ctx.subtask_index}-{self._token}-{self._counter}-{uuid.uuid4().hex[:8]}.{self._sink.format}"
        self._counter += 1
        inprogress = filesystem.join(self._sink.path, INPROGRESS_PREFIX + name)
        self._current = {"inprogress": inprogress, "final": filesystem.join(self._sink.path, name)}
        self._file = filesystem.open_write(inprogress)
        if self._sink.format == "parquet":
            self._writer = pq.ParquetWriter(self._file, schema)

    def write(self, batch: Batch) -> None:
        if not num_rows(batch):
            return
        if self._sink.format == "parquet":
            # Batches arrive checked against the stream's schema (connectors.base); it changes only
            # when a widening stream grew, and then a new part file starts with the wider schema.
            record_batch = to_record_batch(batch)
            if self._writer is not None and not self._writer.schema.equals(record_batch.schema):
                self._close_file(roll=True)
            if self._writer is None:
                self._start_file(record_batch.schema)
            assert self._writer is not None      # _start_file opened one
            self._writer.write_batch(record_batch)
        else:
            if self._file is None:
                self._start_file(None)
            assert self._file is not None        # _start_file opened one
            lines = "".join(json.dumps(row, default=str) + "\n" for row in to_rows(batch))
            self._file.write(lines.encode())

    def _close_file(self, roll: bool = False) -> dict | None:
        """Close the in-progress file; returns its committable (None if there was none)."""
        if self._file is None:
            return None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._file.close()
        self._file = None
        committable = self._current
        assert committable is not None           # set with the file
        self._current = None
        if roll:
            self._pending.append(dict(committable, checkpoint_id=None))
        return committable

    def prepare_commit(self, checkpoint_id: int) -> list:
        committable = self._close_file()
        for pending in self._pending:
            if pending.get("checkpoint_id") is None:
                pending["checkpoint_id"] = checkpoint_id
        if committable is not None:
            self._pending.append(dict(committable, checkpoint_id=checkpoint_id))
        return [dict(p) for p in self._pending]

    def commit(self, checkpoint_id: int) -> None:
        keep = []
        for pending in self._pending:
            cid = pending.get("checkpoint_id")
            if cid is not None and cid <= checkpoint_id:
                _commit_file(pending)
            else:
                keep.append(pending)
        self._pending = keep

    def end_input(self) -> None:
        if self._ctx.extra.get("checkpointing"):
            return  # the final checkpoint pre-commits and commits what is left
        committable = self._close_file()
        for pending in self._pending + ([committable] if committable else []):
            _commit_file(pending)
        self._pending = []

    def recover(self, committables: list) -> None:
        """Commit the restored checkpoint's pre-committed files; drop older attempts' leftovers."""
        mine = committables[self._ctx.subtask_index::self._ctx.parallelism]
        for pending in mine:
            _commit_file(pending)
        if self._ctx.subtask_index == 0:
            keep = {posixpath.basename(p["inprogress"]) for p in committables}
            current = f"-{self._ctx.run_id or self._ctx.job_id[:12]}-a{self._ctx.attempt}-"
            fs, root = filesystem.filesystem(self._sink.path)
            for path in fs.ls(root, detail=False):
                name = posixpath.basename(path)
                if name.startswith(INPROGRESS_PREFIX) and name not in keep and current not in name:
                    log.info("file sink: deleting uncommitted %s of an earlier attempt", name)
                    fs.rm(path)

    def close(self) -> None:
        self._close_file()  # an unfinished file stays in progress; recovery deals with it


def _commit_file(committable: dict) -> None:
    """Rename an in-progress file into place; idempotent (a second commit finds it done)."""
    source, target = committable["inprogress"], committable["final"]
    fs, source_path = filesystem.filesystem(source)
    target_path = filesystem.filesystem(target)[1]
    if fs.exists(source_path):
        fs.mv(source_path, target_path)
    elif not fs.exists(target_path):
        raise FileNotFoundError(
            f"file sink cannot commit {target}: neither it nor its in-progress file {source} exists "
            f"(was the output directory modified outside the job?)")


# `ss.sinks`: what a job writes to. Custom sinks subclass streamsnap.connectors.base.Sink.
__all__ = ["Collect", "Print", "FileSink", "Discard", "Kafka", "Delta", "Iceberg"]

from streamsnap.connectors.kafka import KafkaSink as Kafka  # noqa: E402  (ss.sinks.Kafka)
from streamsnap.connectors.lakehouse import Delta, Iceberg  # noqa: E402  (table libraries imported on use)


def __dir__() -> list[str]:
    """`dir()` lists the public names (`__all__`), not the module's imports and submodules."""
    return sorted(__all__)
