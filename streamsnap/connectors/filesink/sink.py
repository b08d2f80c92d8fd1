"""FileSink: part files in a directory, exactly-once through two-phase commit, rolled by policy.

Exactly-once, per subtask:

* Rows go into the open part's current *segment*, a hidden file (`.inprogress-...`).
* At a checkpoint's pre-commit the segment is closed (durable). If the rolling policy says roll,
  the part's segments become the part file (one segment: itself; several: combined, see
  `compaction.py`), still hidden, and a *pending* committable {hidden path, final path} goes into
  the checkpoint. If not, the part stays open: its list of closed segments goes into the
  checkpoint, and the next rows go into a new segment of the same part.
* When the checkpoint completes, pending files are renamed into place (commit, idempotent) and
  the segments a combined file was made of are deleted.
* After a failover, the restored checkpoint's pending files are committed and its open part is
  resumed from its closed segments — exactly the rows written before the checkpoint's barrier.
  Any other hidden file (segments or combined files written after that barrier by the failed
  attempt) is deleted, so nothing is written twice and nothing not covered is lost.

Readers (Spark, DuckDB, `FileSource`) skip hidden names, so they never see a segment, a combined
file before its commit, or an in-progress leftover.

Latency vs file count: a row is visible at the first completed checkpoint after its part rolled.
The default (`RollingPolicy.on_checkpoint()`) makes rows visible at every checkpoint and leaves a
file per subtask per checkpoint; `RollingPolicy(rollover_interval=...)` leaves one per subtask per
interval (or per `max_part_size`) and shows rows that much later. Segments are written once and
(for parts of several checkpoints) copied once at the roll.

Partitioned output (`partition_by=[...]`, `partitions.py`): one open part per partition
directory, each rolled, pre-committed and committed as above; hidden files live beside the
part files in their directory. After a failover, every restored open part is resumed (one per
directory) or rolled and committed at the next checkpoint.
"""

from __future__ import annotations

import json
import logging
import posixpath
import time
import uuid
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq

from streamsnap.checkpoint import filesystem
from streamsnap.connectors.base import Sink, SinkWriter
from streamsnap.connectors.files import existing_directory, visible_names
from streamsnap.connectors.filesink import partitions
from streamsnap.connectors.filesink.compaction import (MANIFEST_PREFIX, combine, compact, compact_completed,
                                                      delete_quietly_missing, write_manifest)
from streamsnap.connectors.filesink.rolling import PartStats, RollingPolicy, check_policy
from streamsnap.errors import ConfigurationError, StreamsnapError
from streamsnap.runtime.batches import Batch, num_rows, to_record_batch, to_rows
from streamsnap.runtime.operators.base import OperatorContext

log = logging.getLogger(__name__)

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
    rolling: when a part file closes (`ss.sinks.RollingPolicy`). None (default): at every
      checkpoint, as before — rows visible one checkpoint later, one file per subtask per
      checkpoint. `RollingPolicy(rollover_interval=60)` and friends keep a part open across
      checkpoints: one file per subtask per interval, rows visible when their part rolls.
    compact: merge the parts all subtasks rolled for one checkpoint into one file (one per
      schema), as Flink's `enableCompact`: p times fewer files, at the price of subtask 0 copying
      them once when the checkpoint completes (`filesink/compaction.py` says why it is
      exactly-once). Needs checkpointing; without it, parts are committed as they are.
    partition_by: column names, e.g. ["dt", "hm"]: Hive-style directories
      `dt=<value>/hm=<value>/part-...` as Spark's `partitionBy` (the columns are left out of the
      files; Spark, `pyarrow.dataset(path, partitioning="hive")` and DuckDB's
      `hive_partitioning` read them back from the paths). Each directory has its own parts,
      rolled and committed exactly-once as above.
    """

    def __init__(self, path: str, format: str = "parquet", *, mode: str = "error_if_exists",
                 rolling: RollingPolicy | None = None, compact: bool = False, partition_by=None):
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
        self.rolling = check_policy(rolling)
        if not isinstance(compact, bool):
            raise ConfigurationError(f"FileSink.compact must be True or False, got {compact!r}")
        self.compact = compact
        self.partition_by = partitions.check_partition_by(partition_by)
        if compact and self.partition_by:
            raise ConfigurationError(
                "FileSink: compact=True merges the parts of a checkpoint into one file and cannot "
                "follow partition directories yet; use partition_by without compact (or a "
                "RollingPolicy for fewer, larger files)")

    def validate(self, schema: pa.Schema | None) -> None:
        if self.partition_by and schema is not None:
            partitions.check_columns(self.partition_by, schema.names, f"FileSink {filesystem.user_path(self.path)!r}")

    def check_output(self, sink_name: str, resuming: bool) -> None:
        """Apply `mode` to existing output; called by execute() before the job runs (api/preflight.py)."""
        if resuming or self.mode == "append":
            return
        directory = existing_directory(self.path, f"FileSink '{sink_name}'", "choose a directory for the output")
        if directory is None:
            return
        fs, root = directory
        entries = fs.ls(root, detail=False)
        if self.mode == "overwrite":
            for entry in entries:
                fs.rm(entry, recursive=True)
            if entries:
                log.info("FileSink '%s': mode='overwrite' deleted %d entries of %s", sink_name, len(entries),
                         filesystem.user_path(self.path))
            return
        existing = visible_names(entries)
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

    def __repr__(self) -> str:
        partitioned = f", partition_by={list(self.partition_by)}" if self.partition_by else ""
        return (f"FileSink({self.path!r}, format={self.format!r}, mode={self.mode!r}, rolling={self.rolling!r}, "
                f"compact={self.compact}{partitioned})")


class _Part:
    """The open part: its closed segments (URLs) and the segment being written."""

    def __init__(self, created_ms: int, segments: list[str] | None = None, size: int = 0,
                 last_write_ms: int | None = None, schema: pa.Schema | None = None, directory: str = ""):
        self.directory = directory        # relative partition directory ("" unpartitioned)
        self.created_ms = created_ms
        self.last_write_ms = created_ms if last_write_ms is None else last_write_ms
        self.segments = list(segments or [])
        self.closed_size = size           # bytes of the closed segments
        self.schema = schema              # Parquet: every segment of a part has one schema
        self.path: str | None = None      # the open segment
        self.file: IO[bytes] | None = None
        self.writer: pq.ParquetWriter | None = None

    def stats(self) -> PartStats:
        open_size = self.file.tell() if self.file is not None else 0
        return PartStats(self.closed_size + open_size, self.created_ms, self.last_write_ms)

    def close_segment(self) -> None:
        """Close the open segment (durable from here on) and add it to the part."""
        if self.file is None:
            return
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.closed_size += self.file.tell()
        self.file.close()
        self.file = None
        assert self.path is not None          # set with the file
        self.segments.append(self.path)
        self.path = None

    def state(self) -> dict:
        state = {"part": list(self.segments), "size": self.closed_size, "created": self.created_ms,
                 "last_write": self.last_write_ms}
        if self.directory:
            state["dir"] = self.directory
        return state


class FileSinkWriter(SinkWriter):
    def __init__(self, sink: FileSink, ctx: OperatorContext):
        self._sink = sink
        self._ctx = ctx
        self._policy = sink.rolling
        # Identifies this writer's files, so recovery can tell them from older attempts'.
        self._run = ctx.run_id or ctx.job_id[:12]
        self._token = f"{self._run}-a{ctx.attempt}-s{ctx.subtask_index}"
        self._counter = 0
        self._parts: dict[str, _Part] = {}   # the open part of each partition directory
        self._pending: list[dict] = []  # rolled, not yet committed
        self._compacting: list[dict] = []  # committed to subtask 0's compaction, source not yet merged
        self._compact = sink.compact and bool(ctx.extra.get("checkpointing"))
        self._ending = False            # input ended: the final checkpoint rolls everything
        self._stop_at: int | None = None  # a stop-with-savepoint's checkpoint: it rolls everything

    def open(self) -> None:
        filesystem.makedirs(self._sink.path)

    def _now_ms(self) -> int:
        clock = self._ctx.clock
        return int((clock.wall() if clock is not None else time.time()) * 1000)

    def _new_name(self, directory: str = "") -> tuple[str, str]:
        """(hidden URL, final URL) of a new file of this writer in `directory` (a partition's)."""
        name = (f"part-{self._ctx.subtask_index}-{self._token}-{self._counter}-{uuid.uuid4().hex[:8]}"
                f".{self._sink.format}")
        self._counter += 1
        base = filesystem.join(self._sink.path, directory) if directory else self._sink.path
        return filesystem.join(base, INPROGRESS_PREFIX + name), filesystem.join(base, name)

    # ------------------------------------------------------------ writing
    def write(self, batch: Batch) -> None:
        if not num_rows(batch):
            return
        now = self._now_ms()
        by = self._sink.partition_by
        if not by:
            self._write_part("", batch, now)
            return
        record_batch = to_record_batch(batch)
        partitions.check_columns(by, record_batch.schema.names,
                                 f"FileSink {filesystem.user_path(self._sink.path)!r}")
        for directory, rows in partitions.split(record_batch, by):
            self._write_part(directory, rows, now)

    def _write_part(self, directory: str, batch: Batch, now: int) -> None:
        part = self._parts.get(directory)
        if part is not None and self._policy.roll_before_write(part.stats(), now):
            self._roll(directory)
        record_batch = to_record_batch(batch) if self._sink.format == "parquet" else None
        part = self._parts.get(directory)
        if (record_batch is not None and part is not None and part.schema is not None
                and not part.schema.equals(record_batch.schema)):
            # A widening stream grew (connectors.base checks every batch): a new part starts
            # with the wider schema, as one Parquet file has one schema.
            self._roll(directory)
        part = self._parts.get(directory)
        if part is None:
            part = self._parts[directory] = _Part(now, directory=directory)
        if part.file is None:
            part.path = self._new_name(directory)[0]
            part.file = filesystem.open_write(part.path)
            if record_batch is not None:
                part.schema = record_batch.schema
                part.writer = pq.ParquetWriter(part.file, record_batch.schema)
        if part.writer is not None:
            assert record_batch is not None
            part.writer.write_batch(record_batch)
        else:
            lines = "".join(json.dumps(row, default=str) + "\n" for row in to_rows(batch))
            part.file.write(lines.encode())
        part.last_write_ms = now
        if self._policy.roll_after_write(part.stats()):
            self._roll(directory)

    def _roll(self, directory: str = "") -> None:
        """Close the open part of `directory` into a pending file (hidden), committed at the
        next checkpoint."""
        part = self._parts.pop(directory, None)
        if part is None:
            return
        part.close_segment()
        self._pending.append(dict(self._part_file(part.segments, directory), checkpoint_id=None))

    def _part_file(self, segments: list[str], directory: str = "") -> dict:
        """The committable of a part made of `segments`: the one segment itself, or a combined file."""
        if len(segments) == 1:
            (segment,) = segments
            name = posixpath.basename(segment)
            return {"inprogress": segment, "final": posixpath.join(posixpath.dirname(segment),
                                                                   name[len(INPROGRESS_PREFIX):])}
        hidden, final = self._new_name(directory)
        combine(segments, hidden, self._sink.format)
        return {"inprogress": hidden, "final": final, "segments": list(segments)}

    # ------------------------------------------------------------ two-phase commit
    def prepare_commit(self, checkpoint_id: int) -> list:
        now = self._now_ms()
        for directory, part in list(self._parts.items()):
            part.close_segment()
            if (self._ending or checkpoint_id == self._stop_at
                    or self._policy.roll_at_checkpoint(part.stats(), now)):
                self._roll(directory)
        new = [p for p in self._pending if p.get("checkpoint_id") is None]
        for pending in new:
            pending["checkpoint_id"] = checkpoint_id
            if self._compact:
                pending["target"] = f"part-compacted-{checkpoint_id:06d}-{self._run}"
        if self._compact and new:
            write_manifest(self._sink.path, checkpoint_id, self._token, new)
        # A compacted file stays in the state until subtask 0 merged it (its source is gone).
        self._compacting = [c for c in self._compacting if filesystem.exists(c["inprogress"])]
        state = [dict(p) for p in self._pending + self._compacting]
        state += [part.state() for part in self._parts.values() if part.segments]
        return state

    def commit(self, checkpoint_id: int) -> None:
        keep = []
        for pending in self._pending:
            cid = pending.get("checkpoint_id")
            if cid is not None and cid <= checkpoint_id:
                if "target" in pending:
                    self._compacting.append(pending)
                else:
                    _commit_file(pending)
            else:
                keep.append(pending)
        self._pending = keep
        if self._compact and self._ctx.subtask_index == 0:
            compact_completed(self._sink.path, checkpoint_id, self._sink.format)

    def prepare_stop(self, checkpoint_id: int) -> None:
        """A stop-with-savepoint rolls every open part (drained or not, unlike Flink without
        drain): what the job wrote is visible when it stops, and a resumed job starts new parts."""
        self._stop_at = checkpoint_id

    def end_input(self) -> None:
        self._ending = True
        if self._ctx.extra.get("checkpointing"):
            return  # the final checkpoint pre-commits and commits what is left
        for directory in list(self._parts):
            self._roll(directory)
        for pending in self._pending:
            _commit_file(pending)
        self._pending = []

    def recover(self, committables: list) -> None:
        """Commit the restored checkpoint's pending files, resume its open parts, and delete
        every other hidden file of earlier attempts."""
        pending = [c for c in committables if "part" not in c and "target" not in c]
        compacted = [c for c in committables if "target" in c]
        parts = [c for c in committables if "part" in c]
        for committable in pending[self._ctx.subtask_index::self._ctx.parallelism]:
            _commit_file(committable)
        if self._ctx.subtask_index == 0:
            by_target: dict[str, list[dict]] = {}
            for committable in compacted:
                by_target.setdefault(committable["target"], []).append(committable)
            for target in sorted(by_target):
                compact(self._sink.path, by_target[target], self._sink.format)
        keep = {posixpath.basename(url) for c in pending + compacted
                for url in [c["inprogress"], *c.get("segments", [])]}
        keep |= {posixpath.basename(url) for c in parts for url in c["part"]}
        mine = parts[self._ctx.subtask_index::self._ctx.parallelism]
        for state in mine:
            missing = [url for url in state["part"] if not filesystem.exists(url)]
            if missing:
                raise StreamsnapError(
                    f"FileSink {filesystem.user_path(self._sink.path)!r}: the restored checkpoint's open part "
                    f"lost {len(missing)} segment(s) ({posixpath.basename(missing[0])}): restoring a checkpoint "
                    f"or savepoint older than the output's latest commit (its parts were rolled and committed "
                    f"since) cannot continue that output exactly; restore the latest one, or write to a new "
                    f"directory")
        for state in mine:
            # Resume one part per directory (with the same parallelism: this subtask's own); more
            # than one after a scale-in: the others roll now and are committed at the next checkpoint.
            directory = state.get("dir", "")
            if directory in self._parts:
                self._pending.append(dict(self._part_file(list(state["part"]), directory), checkpoint_id=None))
                continue
            self._parts[directory] = _Part(int(state["created"]), list(state["part"]), int(state["size"]),
                                           int(state["last_write"]), schema=self._segment_schema(state["part"][0]),
                                           directory=directory)
        if self._ctx.subtask_index == 0:
            current = f"-{self._run}-a{self._ctx.attempt}-"
            fs, root = filesystem.filesystem(self._sink.path)
            # A restore into a new directory: nothing of an earlier attempt there (none yet).
            # Partitioned: hidden files are in the partition directories, below the root.
            listed = (fs.find(root) if self._sink.partition_by else fs.ls(root, detail=False)) \
                if fs.exists(root) else ()
            for path in listed:
                name = posixpath.basename(path)
                if name.startswith((INPROGRESS_PREFIX, MANIFEST_PREFIX)) and name not in keep and current not in name:
                    log.info("file sink: deleting uncommitted %s of an earlier attempt", name)
                    fs.rm(path)

    def _segment_schema(self, url: str) -> pa.Schema | None:
        if self._sink.format != "parquet":
            return None
        with filesystem.open_read(url) as f:
            return pq.read_schema(f)

    def close(self) -> None:
        for part in self._parts.values():
            part.close_segment()  # stays hidden; recovery resumes or deletes it


def _commit_file(committable: dict) -> None:
    """Rename a pending file into place and drop the segments it was combined from; idempotent
    (a second commit, after a restore, finds it done)."""
    source, target = committable["inprogress"], committable["final"]
    fs, source_path = filesystem.filesystem(source)
    target_path = filesystem.filesystem(target)[1]
    if fs.exists(source_path):
        fs.mv(source_path, target_path)
    elif not fs.exists(target_path):
        raise FileNotFoundError(
            f"file sink cannot commit {target}: neither it nor its in-progress file {source} exists "
            f"(was the output directory modified outside the job? Or did a newer attempt of the job "
            f"recover and discard this superseded attempt's uncommitted files: then it must not commit)")
    delete_quietly_missing(committable.get("segments", []))
