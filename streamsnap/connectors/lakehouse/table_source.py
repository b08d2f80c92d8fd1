"""What the Delta and Iceberg sources share: data files as splits, read bounded or continuously.

A split is one data file: `[version, path, rows already emitted, partition values]` (partition
values: the columns a Delta table keeps only in its log, {} for Iceberg, whose files hold
them). A restored split re-opens its file and skips exactly the rows already emitted (Parquet
skips whole row groups through the footer), as FileSource does.

Bounded: the table's snapshot at one version, fixed when the pipeline is built (on the driver),
its files dealt round robin to the subtasks. Continuous: the same snapshot, then every later
version as it is committed — each subtask reads the log from the snapshot's version on and takes
the files it owns (see `enumeration.py` for the global state that makes this exactly-once over
restores at any parallelism). Only appends are streamed: a version that removes or rewrites
data (delete, update, merge, overwrite) fails the job naming the version, unless
`skip_change_commits=True` (Databricks' option of that name) skips such versions whole — its
added files are not read either, so what an update rewrote is not streamed twice. Versions that
only reorganise files without changing data (compaction, `dataChange=false` / Iceberg
"replace") are skipped silently.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import pyarrow as pa

from streamsnap.clock import Clock
from streamsnap.connectors.base import Source, SourceReader
from streamsnap.connectors.files import FileCursor, FileSplitReader
from streamsnap.connectors.lakehouse.enumeration import Enumeration
from streamsnap.errors import ConfigurationError, FileReadError, StreamsnapError
from streamsnap.runtime.operators.base import OperatorContext
from streamsnap.time.durations import to_millis
from streamsnap.time.watermarks import WatermarkStrategy


@dataclass
class NewVersion:
    """One version of the table log: the data files it added, and whether it may be streamed."""
    version: int
    added: list                 # [[path, partition values]]
    change: str | None = None   # what the version does besides appending (None: append-only)


class TableSource(Source):
    """Base of DeltaSource and IcebergSource: arguments, event time, the build-time snapshot."""

    #: How errors name the source: as the user wrote it, ss.sources.<label>.
    label = "Table"

    def __init__(self, *, bounded: bool, event_time: str | None, max_out_of_orderness,
                 skip_change_commits: bool, poll_interval: float, batch_size: int):
        name = self.label
        if not isinstance(bounded, bool):
            raise ConfigurationError(f"{name}.bounded must be True or False, got {bounded!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigurationError(f"{name}.batch_size must be an integer >= 1, got {batch_size!r}")
        if (isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float))
                or not 0 < poll_interval < float("inf")):
            raise ConfigurationError(f"{name}.poll_interval must be a number of seconds > 0, got {poll_interval!r}")
        if not isinstance(skip_change_commits, bool):
            raise ConfigurationError(f"{name}.skip_change_commits must be True or False, got {skip_change_commits!r}")
        if event_time is not None and (not isinstance(event_time, str) or not event_time.strip()):
            raise ConfigurationError(f"{name}.event_time must be a column name or None, got {event_time!r}")
        self.bounded = bounded
        self.event_time = event_time
        self.out_of_orderness_ms = to_millis(max_out_of_orderness, f"{name}.max_out_of_orderness")
        self.skip_change_commits = skip_change_commits
        self.poll_interval = float(poll_interval)
        self.batch_size = batch_size
        self._schema: pa.Schema | None = None
        self._version: int | None = None     # the snapshot's version, fixed at build time
        self._files: list | None = None      # its splits

    # ------------------------------------------------------------ what a table format provides
    @abstractmethod
    def _load(self) -> tuple[pa.Schema, int, list]:
        """(schema, snapshot version, [[path, partition values]] of the snapshot's data files);
        raises ConfigurationError naming what is wrong with the table."""

    @abstractmethod
    def open_table(self) -> TableLog:
        """The reader's access to the table (on a worker)."""

    # ------------------------------------------------------------ build time (driver)
    def validate(self) -> None:
        if self._files is None:
            self._schema, self._version, self._files = self._load()
        if self.event_time is not None:
            if self.event_time not in self._schema.names:
                raise ConfigurationError(
                    f"{self.label}: the event_time column {self.event_time!r} is not in the "
                    f"table (columns {self._schema.names}); name one of them or drop event_time=")
            kind = self._schema.field(self.event_time).type
            if not (pa.types.is_integer(kind) or pa.types.is_timestamp(kind)):
                raise ConfigurationError(
                    f"{self.label}: the event_time column {self.event_time!r} has type {kind}; "
                    f"it must be a timestamp or hold int64 epoch milliseconds")

    @property
    def schema(self) -> pa.Schema:
        if self._schema is None:
            self.validate()
        return self._schema

    @property
    def schema_mode(self) -> str:
        return "declared"

    @property
    def version(self) -> int:
        """The version (Delta) or sequence number (Iceberg) of the snapshot read first."""
        if self._version is None:
            self.validate()
        return self._version

    def default_watermark_strategy(self) -> WatermarkStrategy | None:
        if self.event_time is None:
            return None
        return (WatermarkStrategy.for_bounded_out_of_orderness(self.out_of_orderness_ms / 1000)
                .with_timestamp_assigner(self.event_time))

    def splits(self, parallelism: int) -> list:
        if self._files is None:
            self.validate()
        return [[self._version, path, 0, partition] for path, partition in self._files]

    def create_reader(self, ctx: OperatorContext) -> SourceReader:
        return TableReader(self, ctx)


class TableLog(ABC):
    """A worker's view of one table: its versions after the snapshot, and its data files."""

    @abstractmethod
    def versions_from(self, version: int, limit: int) -> list[NewVersion]:
        """The committed versions >= `version` in order (at most `limit`), [] when none yet."""

    @abstractmethod
    def filesystem(self):
        """An object with `open(path, "rb")` reading the table's data files."""

    @abstractmethod
    def conform(self, batch: pa.RecordBatch, partition: dict) -> pa.RecordBatch:
        """A batch of a data file as a batch of the table's schema."""

    def file_schema(self) -> pa.Schema | None:
        """The columns to read from a data file (None: all)."""
        return None


# ===================================================================== reader
class TableReader(FileSplitReader):
    """Reads the data files (splits) of one subtask one after another."""

    VERSIONS_PER_POLL = 50

    def __init__(self, source: TableSource, ctx: OperatorContext, clock: Clock | None = None):
        super().__init__(clock, None if source.bounded else source.poll_interval)
        self._source = source
        self._name = repr(source)
        self._enumeration = None if source.bounded else Enumeration(
            ctx.subtask_index, ctx.parallelism, source.version + 1)
        self._subtask, self._parallelism = ctx.subtask_index, ctx.parallelism
        self._log: TableLog | None = None
        self._current: list | None = None
        self._current_start = 0

    def restore_global_state(self, elements: list) -> None:
        if self._enumeration is not None:
            self._enumeration = Enumeration.restore(elements, self._subtask, self._parallelism, self._name)

    def assign_splits(self, splits: list) -> None:
        for split in splits:
            try:
                version, path, position, partition = split
                split = [int(version), str(path), int(position), dict(partition)]
            except (TypeError, ValueError) as exc:
                raise StreamsnapError(f"{self._name}: cannot restore split {split!r}: expected "
                                      f"[version, path, rows read, partition values]") from exc
            self._queue.append(split)

    def _connect(self) -> TableLog:
        if self._log is None:
            self._log = self._source.open_table()
        return self._log

    def _emit(self, split: list, batch: pa.RecordBatch) -> pa.RecordBatch:
        self._current, self._current_start = split, split[2]
        split[2] += batch.num_rows
        return self._connect().conform(batch, split[3])

    def _open_cursor(self, split: list) -> FileCursor:
        version, path, position, _ = split
        log = self._connect()
        try:
            return FileCursor(log.filesystem(), path, position, format="parquet",
                              batch_size=self._source.batch_size, schema=log.file_schema())
        except FileReadError as exc:
            if not isinstance(exc.__cause__, FileNotFoundError):
                raise
            raise FileReadError(
                f"{self._name}: the data file {path!r} of version {version} is gone ({position} of its "
                f"rows were read): the table's files were cleaned up (Delta VACUUM, Iceberg "
                f"expire_snapshots / remove_orphan_files) before this job read them. Keep the table's "
                f"file retention longer than the job can lag behind (and be down), or restart the job "
                f"from a later version", path) from exc

    def discover(self) -> int:
        """Enumerate the versions committed since the last look; returns how many."""
        enumeration = self._enumeration
        versions = self._connect().versions_from(enumeration.next_version, self.VERSIONS_PER_POLL)
        for entry in versions:
            if entry.change is not None and not self._source.skip_change_commits:
                raise StreamsnapError(
                    f"{self._name}: version {entry.version} of the table {entry.change}; this source "
                    f"streams appends only. Pass skip_change_commits=True to skip such versions "
                    f"(their rows are then not streamed), or restart from a version after it with "
                    f"starting_version= in a new job")
            if entry.change is None:
                for path, partition in entry.added:
                    if enumeration.takes(path, entry.version):
                        self._queue.append([entry.version, path, 0, partition])
            enumeration.enumerated(entry.version)
        return len(versions)

    def active_splits(self) -> list:
        return [self._queue[0][1]] if self._queue else []

    def current_split(self) -> str | None:
        return self._current[1] if self._current else None

    def position_of(self, index: int) -> str | None:
        if self._current is None:
            return None
        return f"version {self._current[0]}, file {self._current[1]!r}, row {self._current_start + index}"

    def snapshot_global_state(self, checkpoint_id: int) -> list:
        return [] if self._enumeration is None else self._enumeration.elements()
