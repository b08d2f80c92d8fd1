"""A Delta Lake table as a source (delta-rs, the `deltalake` package): bounded or continuous.

The snapshot at `starting_version` (default: the latest version when the pipeline is built) is
read first; bounded, the source then ends, continuous, it goes on with every version committed
after it, read from the table's log (`_delta_log/<version>.json`) as it appears. Each data file
is a split checkpointed with its row position (see `table_source.py`): after a failover every
row is emitted exactly once, whatever the parallelism of the restored job.

Partition columns, which Delta keeps only in the log, are added to the rows of each file.
Tables whose readers must apply deletion vectors or column mapping are refused at build time
(their data files alone do not hold the table's rows).
"""

from __future__ import annotations

import json
import posixpath
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs

from streamsnap.checkpoint import filesystem
from streamsnap.connectors.lakehouse.table_source import NewVersion, TableLog, TableSource
from streamsnap.errors import ConfigurationError, StreamsnapError

#: Reader features whose tables cannot be read file by file.
UNSUPPORTED_READER_FEATURES = ("deletionVectors", "columnMapping")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class DeltaSource(TableSource):
    """Rows of a Delta Lake table: one snapshot (bounded) or it and every later append.

    path: the table's root (local path or URI, e.g. s3://bucket/table).
    starting_version: the version whose snapshot is read first; None: the latest version when
      the pipeline is built. Continuous, the versions after it follow.
    storage_options: delta-rs storage options (credentials, endpoints) for the log and the files.
    bounded: True (default) reads one snapshot and ends; False goes on with new versions.
    event_time: a timestamp or int64-milliseconds column giving each row's event time; the source
      then brings a bounded-out-of-orderness watermark strategy (`max_out_of_orderness` seconds)
      unless `from_source` is given another; each data file has its own watermark generator.
    skip_change_commits: continuous only: a version that deletes, updates or rewrites rows fails
      the job naming the version (False, default) or is skipped whole (True, as Databricks'
      option of that name).
    poll_interval: seconds between looks at the log for new versions (continuous).
    batch_size: maximum rows per emitted batch.
    """

    label = "Delta"

    def __init__(self, path: str, starting_version: int | None = None, storage_options: dict | None = None, *,
                 bounded: bool = True, event_time: str | None = None, max_out_of_orderness=0,
                 skip_change_commits: bool = False, poll_interval: float = 1.0, batch_size: int = 4096):
        if not isinstance(path, str) or not path.strip():
            raise ConfigurationError(f"Delta.path must be the table's directory (a local path or URI), got {path!r}")
        if starting_version is not None and (isinstance(starting_version, bool) or not isinstance(starting_version, int)
                                             or starting_version < 0):
            raise ConfigurationError(
                f"Delta.starting_version must be a table version (an integer >= 0) or None for the "
                f"latest, got {starting_version!r}")
        if storage_options is not None and not (isinstance(storage_options, dict)
                                                and all(isinstance(k, str) and isinstance(v, str)
                                                        for k, v in storage_options.items())):
            raise ConfigurationError(f"Delta.storage_options must be a dict of strings, got {storage_options!r}")
        super().__init__(bounded=bounded, event_time=event_time, max_out_of_orderness=max_out_of_orderness,
                         skip_change_commits=skip_change_commits, poll_interval=poll_interval,
                         batch_size=batch_size)
        self.path = path.strip() if "://" in path else filesystem.user_path(filesystem.normalize(path.strip()))
        self.starting_version = starting_version
        self.storage_options = dict(storage_options or {})
        self.partition_columns: list[str] = []

    def _not_a_table(self) -> ConfigurationError:
        hint = "check the path"
        try:
            fs, root = filesystem.filesystem(self.path)
            if not fs.exists(root):
                hint = "the path does not exist"
            elif fs.isdir(root):
                names = [posixpath.basename(p.rstrip("/")) for p in fs.ls(root)]
                if "metadata" in names:
                    hint = "it looks like an Apache Iceberg table: read it with ss.sources.Iceberg"
                elif any(n.endswith(".parquet") for n in names):
                    hint = "it holds loose Parquet files: read them with ss.sources.FileSource"
                else:
                    hint = "it has no _delta_log directory"
            else:
                hint = "it is a file, not a table directory"
        except Exception as exc:  # the hint is best effort; the error stands without it
            hint = f"it cannot be listed ({_describe(exc)})"
        return ConfigurationError(f"Delta: {self.path!r} is not a Delta table: {hint}")

    def _load(self):
        from deltalake import DeltaTable

        try:
            is_table = DeltaTable.is_deltatable(self.path, self.storage_options or None)
        except Exception as exc:
            raise ConfigurationError(f"Delta: cannot open {self.path!r}: {_describe(exc)}") from exc
        if not is_table:
            raise self._not_a_table()
        table = DeltaTable(self.path, storage_options=self.storage_options or None)
        latest = table.version()
        if self.starting_version is not None:
            if self.starting_version > latest:
                raise ConfigurationError(
                    f"Delta: starting_version={self.starting_version} does not exist in {self.path!r}; "
                    f"its latest version is {latest}")
            try:
                table.load_as_version(self.starting_version)
            except Exception as exc:
                raise ConfigurationError(
                    f"Delta: starting_version={self.starting_version} of {self.path!r} cannot be loaded "
                    f"({_describe(exc)}); its log may have been cleaned up — pick a later version "
                    f"(latest: {latest})") from exc
        features = set(table.protocol().reader_features or ()) & set(UNSUPPORTED_READER_FEATURES)
        if features:
            raise ConfigurationError(
                f"Delta: {self.path!r} uses the reader feature(s) {sorted(features)}, which this source "
                f"does not support (its data files alone do not hold the table's rows)")
        schema = pa.schema(table.schema())
        partition_columns = self.partition_columns = list(table.metadata().partition_columns)
        actions = pa.table(table.get_add_actions(flatten=True))
        files = []
        for row in actions.to_pylist():
            files.append([row["path"], {c: _partition_string(row.get(f"partition.{c}")) for c in partition_columns}])
        files.sort(key=lambda f: f[0])
        return schema, table.version(), files

    def open_table(self) -> TableLog:
        return DeltaLog(self)

    def __repr__(self) -> str:
        mode = "bounded" if self.bounded else "continuous"
        return f"Delta({self.path!r}, starting_version={self.starting_version}, {mode})"


def _partition_string(value) -> str | None:
    """A partition value as the log writes it (a string), from get_add_actions' typed value."""
    if value is None or isinstance(value, str):
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat(sep=" ")
    return str(value)


class DeltaLog(TableLog):
    """A worker's access to a Delta table: its log's commits and its data files."""

    def __init__(self, source: DeltaSource):
        from deltalake.fs import DeltaStorageHandler

        self._source = source
        self._fs = pafs.PyFileSystem(DeltaStorageHandler(source.path, source.storage_options or None))
        self._schema = source.schema
        self._file_schema = pa.schema([f for f in self._schema if f.name not in source.partition_columns])

    def filesystem(self):
        return _ArrowFiles(self._fs)

    def file_schema(self) -> pa.Schema:
        return self._file_schema

    def conform(self, batch: pa.RecordBatch, partition: dict) -> pa.RecordBatch:
        if not partition:
            return batch
        columns = {name: batch.column(name) for name in batch.schema.names}
        for name, value in partition.items():
            kind = self._schema.field(name).type
            columns[name] = pa.array([value] * batch.num_rows, pa.string()).cast(kind)
        return pa.RecordBatch.from_arrays([columns[f.name] for f in self._schema], schema=self._schema)

    def _commit(self, version: int) -> list[dict] | None:
        try:
            with self._fs.open_input_stream(f"_delta_log/{version:020d}.json") as f:
                text = f.read().decode("utf-8")
        except FileNotFoundError:
            return None
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def _check_not_cleaned_up(self, version: int) -> None:
        """A missing commit is either not written yet or removed by log cleanup: the latter when
        the next one exists (the log has a gap) — the job could only wait forever."""
        if self._fs.get_file_info(f"_delta_log/{version + 1:020d}.json").type == pafs.FileType.NotFound:
            return
        raise StreamsnapError(
            f"Delta: the log entry of version {version} of {self._source.path!r} is gone while later "
            f"versions exist: the log was cleaned up (delta.logRetentionDuration) before this job "
            f"read it. Its rows cannot be streamed; start a new job from the current snapshot, and "
            f"keep the log retention longer than the job can lag behind")

    def versions_from(self, version: int, limit: int) -> list[NewVersion]:
        out = []
        while len(out) < limit:
            actions = self._commit(version)
            if actions is None:
                if not out:
                    self._check_not_cleaned_up(version)
                break
            out.append(classify_commit(version, actions, self._schema.names, self._source.path))
            version += 1
        return out


def classify_commit(version: int, actions: list[dict], columns: list[str], path: str) -> NewVersion:
    """What one Delta commit means to a stream of appends (pure: a list of log actions in)."""
    operation = next((a["commitInfo"].get("operation") for a in actions if "commitInfo" in a), None) or "unknown"
    added, removes, vectors = [], 0, 0
    for action in actions:
        if "metaData" in action:
            schema = json.loads(action["metaData"].get("schemaString") or "{}")
            names = [f["name"] for f in schema.get("fields", [])]
            if names != list(columns):
                raise StreamsnapError(
                    f"Delta: version {version} of {path!r} changed the table's columns to {names} "
                    f"(the stream has {list(columns)}); start a new job on the new schema "
                    f"(starting_version={version})")
        elif "add" in action and action["add"].get("dataChange", True):
            add = action["add"]
            if add.get("deletionVector"):
                vectors += 1
            added.append([unquote(add["path"]), dict(add.get("partitionValues") or {})])
        elif "remove" in action and action["remove"].get("dataChange", True):
            removes += 1
    change = None
    if removes or vectors:
        change = (f"removes or rewrites data (operation {operation}: {removes} file(s) removed"
                  f"{f', {vectors} deletion vector(s)' if vectors else ''})")
    return NewVersion(version, sorted(added), change)


class _ArrowFiles:
    """`open(path, "rb")` over a pyarrow filesystem, as files.FileCursor reads files."""

    def __init__(self, fs: pafs.FileSystem):
        self._fs = fs

    def open(self, path: str, mode: str = "rb", **_):
        return self._fs.open_input_file(path)
