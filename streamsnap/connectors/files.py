"""A replayable file source: the rows of the Parquet / JSON-lines / CSV files in a directory.

Every regular file directly in the directory is one split (not recursive; names starting with
`.` or `_` are skipped, like Spark, so in-progress files of writers that follow that convention
— streamsnap's own FileSink among them — are never read). A split's state is
`[path, rows already emitted]`; a restored split re-opens its file and skips exactly that many
rows (Parquet skips whole row groups through the footer metadata first), so the rows replayed
after a restore are exactly those after the checkpointed position.

Bounded (no `monitor_interval`): the directory is listed once, when the pipeline is built
(on the driver; the list travels with the source, so every subtask sees the same one); the
files are dealt round robin to the subtasks, each subtask reads its files in name order and
finishes when they are all read. Files added later are not read.

Monitored (`monitor_interval` seconds): the source is unbounded. Each reader lists the
directory every `monitor_interval` seconds and takes the new files it owns:
`xxh64(path) % parallelism == subtask_index`, so every file is taken by exactly one subtask
without any coordination. Which files are *known* (taken by some subtask: finished, being read,
or queued) is union-distributed global state, so after a restore — with any parallelism — no
subtask takes a known file again; files being read or queued are split state and resume where
the checkpoint left them.

Contract for writers: a file must be complete when it appears in the directory and must not
change afterwards. Write it elsewhere (or under a hidden name such as `.name.tmp`) and rename
it into place — the same contract as Spark's file stream source. A file that shrank below the
checkpointed position is reported as an error rather than silently re-read.
"""

from __future__ import annotations

import logging
import posixpath
from collections import deque
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import xxhash

from streamsnap.checkpoint import filesystem
from streamsnap.clock import Clock, SystemClock
from streamsnap.connectors.base import Source, SourceReader
from streamsnap.errors import ConfigurationError, FileReadError, StreamsnapError
from streamsnap.runtime.operators.base import OperatorContext

log = logging.getLogger(__name__)

FORMATS = ("parquet", "jsonl", "csv")

# csv_options keys, by the pyarrow.csv options object they configure. A header row is always
# read (column names come from it), so the options that replace it are not offered.
CSV_READ_OPTIONS = ("encoding", "block_size", "skip_rows")
CSV_PARSE_OPTIONS = ("delimiter", "quote_char", "double_quote", "escape_char", "newlines_in_values",
                     "ignore_empty_lines")
CSV_CONVERT_OPTIONS = ("null_values", "true_values", "false_values", "strings_can_be_null",
                       "quoted_strings_can_be_null", "timestamp_parsers", "decimal_point")
CSV_OPTIONS = CSV_READ_OPTIONS + CSV_PARSE_OPTIONS + CSV_CONVERT_OPTIONS


def is_hidden(name: str) -> bool:
    """Files Spark and streamsnap treat as not (yet) data: `.name`, `_name`."""
    return name.startswith((".", "_"))


def owner_of(path: str, parallelism: int) -> int:
    """The subtask that takes a newly discovered file (monitoring mode); stable across runs."""
    return xxhash.xxh64(path.encode("utf-8")).intdigest() % parallelism


def list_data_files(fs, directory: str) -> list[str]:
    """Paths of the visible regular files directly in `directory`, sorted by name."""
    fs.invalidate_cache(directory)  # object stores cache listings; we need fresh ones
    entries = fs.ls(directory, detail=True)
    files = [e["name"] for e in entries
             if e.get("type") == "file" and not is_hidden(posixpath.basename(e["name"].rstrip("/")))]
    return sorted(files, key=posixpath.basename)


def existing_directory(path: str, where: str, fix: str):
    """(fs, root) of the output directory at `path` (listing cache dropped), None when nothing is
    there yet; a file there is refused, `where` naming the output and `fix` what to choose."""
    fs, root = filesystem.filesystem(path)
    if not fs.exists(root):
        return None
    if not fs.isdir(root):
        raise ConfigurationError(f"{where}: {filesystem.user_path(path)!r} is a file, not a directory; {fix}")
    fs.invalidate_cache(root)
    return fs, root


def visible_names(entries: list[str]) -> list[str]:
    """The base names of listed entries that are data (not hidden), sorted."""
    return sorted(name for name in (posixpath.basename(e.rstrip("/")) for e in entries) if not is_hidden(name))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# ===================================================================== source
class FileSource(Source):
    """Rows of the Parquet / JSON-lines / CSV files in a directory (fsspec URL or local path).

    path: the directory; every visible regular file directly in it is read.
    format: "parquet", "jsonl" (one JSON object per line) or "csv" (with a header row).
    schema: the output schema (a pyarrow.Schema); every file is read with it (columns selected
      by name, values converted). Inferred from the first file with rows when omitted (for CSV
      and JSON lines from its first block, ~1 MiB) — pass it when types could differ between
      files, or when a monitored directory may start empty (files are then read with their
      own inferred schema).
    monitor_interval: seconds between listings of the directory; makes the source unbounded.
      None (default): read the files present when the pipeline is built, then end.
    batch_size: maximum rows per emitted batch.
    csv_options: pyarrow.csv settings for format="csv", e.g. {"delimiter": ";",
      "null_values": ["", "NA"]}; allowed keys: see CSV_OPTIONS.

    The directory must exist when the pipeline is built (also when monitored: a missing
    directory is far more often a typo than a plan). Files must appear atomically (rename)
    and never change afterwards; see the module docstring.
    """

    def __init__(self, path: str, format: str = "parquet", *, schema: pa.Schema | None = None,
                 monitor_interval: float | None = None, batch_size: int = 4096,
                 csv_options: dict | None = None):
        if not isinstance(path, str) or not path.strip():
            raise ConfigurationError(
                f"FileSource.path must be a directory: a local path or fsspec URL such as "
                f"file:///data/in or s3://bucket/in, got {path!r}")
        if format not in FORMATS:
            raise ConfigurationError(
                f"FileSource.format must be one of {', '.join(repr(f) for f in FORMATS)}, got {format!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigurationError(f"FileSource.batch_size must be an integer >= 1, got {batch_size!r}")
        if monitor_interval is not None and (
                isinstance(monitor_interval, bool) or not isinstance(monitor_interval, (int, float))
                or not monitor_interval > 0 or monitor_interval == float("inf")):
            raise ConfigurationError(
                f"FileSource.monitor_interval must be a number of seconds > 0, or None to read the "
                f"files present when the pipeline is built and end (bounded), got {monitor_interval!r}")
        if schema is not None and not isinstance(schema, pa.Schema):
            raise ConfigurationError(f"FileSource.schema must be a pyarrow.Schema or None, got {type(schema).__name__}")
        if csv_options is not None:
            if format != "csv":
                raise ConfigurationError(
                    f"FileSource.csv_options only applies to format='csv', not format={format!r}")
            if not isinstance(csv_options, dict):
                raise ConfigurationError(
                    f"FileSource.csv_options must be a dict, got {type(csv_options).__name__}")
            unknown = sorted(str(k) for k in csv_options if k not in CSV_OPTIONS)
            if unknown:
                raise ConfigurationError(
                    f"FileSource.csv_options: unknown option(s) {', '.join(map(repr, unknown))}; "
                    f"allowed: {', '.join(CSV_OPTIONS)}")
            try:
                _csv_option_objects(dict(csv_options), None)
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(f"FileSource.csv_options are invalid: {exc}") from exc
        self.path = filesystem.normalize(path.strip())
        self.format = format
        self.batch_size = batch_size
        self.monitor_interval = float(monitor_interval) if monitor_interval is not None else None
        self.csv_options = dict(csv_options or {})
        self.bounded = monitor_interval is None
        self._given_schema = schema
        self._schema = schema
        self._schema_resolved = schema is not None
        # Bounded: the files to read, listed once at build time (on the driver) and shipped
        # with the source, so every subtask deals the same list however the directory changes.
        self._files: list[str] | None = None

    # ------------------------------------------------------------ build time (driver)
    def filesystem(self):
        """(fsspec filesystem, directory path in it)."""
        return filesystem.filesystem(self.path)

    def _list(self) -> list[str]:
        fs, directory = self.filesystem()
        try:
            if not fs.isdir(directory):
                what = "a file, not a directory" if fs.exists(directory) else "does not exist"
                raise ConfigurationError(
                    f"FileSource.path {self.path!r} {what}; it must be an existing directory "
                    f"(the source reads every file directly in it)")
            return list_data_files(fs, directory)
        except ConfigurationError:
            raise
        except Exception as exc:
            raise ConfigurationError(f"FileSource.path {self.path!r} cannot be listed: {_describe(exc)}") from exc

    @property
    def schema(self) -> pa.Schema | None:
        if not self._schema_resolved:
            self._schema = self._infer_schema(self._list())
            self._schema_resolved = True
        return self._schema

    @property
    def schema_mode(self) -> str:
        return "declared" if self._given_schema is not None else "inferred"

    def _infer_schema(self, files: list[str]) -> pa.Schema | None:
        fs, _ = self.filesystem()
        for path in files:
            try:
                schema = _probe_schema(fs, path, self.format, self.csv_options)
            except Exception as exc:
                raise ConfigurationError(
                    f"FileSource could not read {path!r} as {self.format} to infer the schema: "
                    f"{_describe(exc)}. Fix or remove the file, check format=, or pass schema=") from exc
            if schema is not None:
                return schema
        return None

    def validate(self) -> None:
        files = self._list()
        if self.bounded:
            self._files = files
        if self._given_schema is None:
            self._schema = self._infer_schema(files)
            self._schema_resolved = True
        elif files:
            fs, _ = self.filesystem()
            try:
                _probe_schema(fs, files[0], self.format, self.csv_options)
            except Exception as exc:
                raise ConfigurationError(
                    f"FileSource could not read the first file {files[0]!r} as {self.format}: "
                    f"{_describe(exc)}. Fix or remove the file, or check format=") from exc

    def splits(self, parallelism: int) -> list:
        if not self.bounded:
            return []  # readers discover files themselves, each taking the files it owns
        if self._files is None:
            self._files = self._list()
        return [[path, 0] for path in self._files]

    def create_reader(self, ctx: OperatorContext) -> SourceReader:
        return FileSourceReader(self, ctx)

    def __repr__(self) -> str:
        mode = f"monitor_interval={self.monitor_interval}" if self.monitor_interval else "bounded"
        return f"FileSource({self.path!r}, format={self.format!r}, {mode})"


# ===================================================================== readers
class FileSplitReader(SourceReader):
    """What readers of file splits share (FileSource's, and the lakehouse table sources'): the
    splits they own queued in reading order, read one file after another through a `FileCursor`
    opened when the file's turn comes (and closed with the reader), the file system or table
    opened lazily on the worker, and — unbounded — `discover()` every `discovery_interval`
    seconds in `poll`, so new files are found without a thread of their own.

    A subclass says how a split opens (`_open_cursor`), what a batch read from it becomes
    (`_emit`, which also advances the split's position), how to open its storage (`_connect`)
    and, unbounded, how to find new splits (`discover`)."""

    def __init__(self, clock: Clock | None, discovery_interval: float | None):
        self._clock = clock or SystemClock()
        self._discovery_interval = discovery_interval   # None: bounded, no discovery
        # Splits owned and not finished, in reading order; _queue[0] is the one being read.
        self._queue: deque[list] = deque()
        self._cursor: FileCursor | None = None
        self._next_discovery: float | None = None       # None: discover at the first poll

    # ------------------------------------------------------------ what a subclass provides
    def _connect(self) -> None:
        """Open the storage the splits are read from (at most once: later calls return)."""
        raise NotImplementedError

    def _open_cursor(self, split: list) -> FileCursor:
        raise NotImplementedError

    def _emit(self, split: list, batch: pa.RecordBatch) -> pa.RecordBatch:
        """`batch` was read from `split`: advance its position; the batch to emit."""
        raise NotImplementedError

    def discover(self):
        raise NotImplementedError(f"{type(self).__name__} is bounded: it discovers nothing")

    # ------------------------------------------------------------ lifecycle
    def open(self) -> None:
        self._connect()

    def close(self) -> None:
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None

    def poll(self) -> pa.RecordBatch | None:
        if self._discovery_interval is not None:
            now = self._clock.monotonic()
            if self._next_discovery is None or now >= self._next_discovery:
                self.discover()
                self._next_discovery = now + self._discovery_interval
        while self._queue:
            split = self._queue[0]
            if self._cursor is None:
                self._cursor = self._open_cursor(split)
            batch = self._cursor.next_batch()
            if batch is None:
                self.close()
                self._queue.popleft()
                continue
            return self._emit(split, batch)
        return None

    def is_finished(self) -> bool:
        return self._discovery_interval is None and not self._queue

    def next_available_in(self) -> float:
        if self._queue or self._discovery_interval is None or self._next_discovery is None:
            return 0.0
        return max(0.0, self._next_discovery - self._clock.monotonic())

    def snapshot_splits(self, checkpoint_id: int) -> list:
        return [list(split) for split in self._queue]


class FileSourceReader(FileSplitReader):
    """Reads the files (splits `[path, rows read]`) of one subtask in order, `batch_size` rows per poll at most."""

    def __init__(self, source: FileSource, ctx: OperatorContext, clock: Clock | None = None):
        super().__init__(clock, source.monitor_interval)
        self._source = source
        self._subtask = ctx.subtask_index
        self._parallelism = ctx.parallelism
        self._fs = None
        self._directory = None
        # Files known to every subtask through the restored global state, and files this reader
        # took itself (assigned or discovered) — together: never to be taken again.
        self._inherited: set[str] = set()
        self._taken: set[str] = set()
        self._current: str | None = None          # the file of the batch last returned
        self._current_start = 0                   # the row of that file the batch starts at

    # ------------------------------------------------------------ assignment and restore
    def restore_global_state(self, elements: list) -> None:
        self._inherited = {str(p) for p in elements}

    def assign_splits(self, splits: list) -> None:
        for split in splits:
            try:
                path, position = split
                path, position = str(path), int(position)
            except (TypeError, ValueError) as exc:
                raise StreamsnapError(
                    f"FileSource: cannot restore split {split!r}: expected [path, rows read]") from exc
            if position < 0:
                raise StreamsnapError(f"FileSource: split {split!r} has a negative position")
            if path in self._taken:
                continue  # a split handed out twice would be read twice
            self._queue.append([path, position])
            self._taken.add(path)

    # ------------------------------------------------------------ reading
    def _connect(self):
        if self._fs is None:
            self._fs, self._directory = self._source.filesystem()
        return self._fs

    def _open_cursor(self, split: list) -> FileCursor:
        source = self._source
        return FileCursor(self._connect(), split[0], split[1], format=source.format, batch_size=source.batch_size,
                          schema=source.schema, csv_options=source.csv_options)

    def _emit(self, split: list, batch: pa.RecordBatch) -> pa.RecordBatch:
        self._current, self._current_start = split[0], split[1]
        split[1] += batch.num_rows
        return batch

    def discover(self) -> list[str]:
        """List the directory and take the new files this subtask owns; returns them."""
        fs = self._connect()
        try:
            files = list_data_files(fs, self._directory)
        except FileNotFoundError:
            log.warning("FileSource: directory %s does not exist (any more); will look again in %.3gs",
                        self._source.path, self._source.monitor_interval or 0.0)
            return []
        except Exception as exc:
            raise FileReadError(f"FileSource could not list {self._source.path!r}: {_describe(exc)}",
                                self._source.path) from exc
        new = [p for p in files if p not in self._taken and p not in self._inherited
               and owner_of(p, self._parallelism) == self._subtask]
        for path in new:
            self._queue.append([path, 0])
            self._taken.add(path)
        return new

    def active_splits(self) -> list:
        """Only the file being read: files are read one after another, so a queued file has
        not started and must not hold the watermark back (it joins when its turn comes)."""
        return [self._queue[0][0]] if self._queue else []

    def current_split(self) -> str | None:
        return self._current

    def position_of(self, index: int) -> str | None:
        if self._current is None:
            return None
        return f"file {self._current!r}, row {self._current_start + index}"

    # ------------------------------------------------------------ checkpoints
    def snapshot_global_state(self, checkpoint_id: int) -> list:
        # Every known file is reported by exactly one subtask, so the union stays one entry
        # per file: inherited files by their owner (all subtasks hold the same inherited set),
        # files this reader took since the restore by this reader (nobody else knows them).
        mine = [p for p in self._inherited if owner_of(p, self._parallelism) == self._subtask]
        mine.extend(self._taken - self._inherited)
        return sorted(mine)


# ===================================================================== one file
class FileCursor:
    """Batches of one file (`format`: one of FORMATS) from row `start` on, at most `batch_size`
    rows each, conformed to `schema` (None: the file's own)."""

    def __init__(self, fs, path: str, start: int, *, format: str, batch_size: int,
                 schema: pa.Schema | None, csv_options: dict | None = None):
        self.path = path
        self._format = format
        self._batch_size = batch_size
        self._schema = schema
        self._start = start
        self._stream = None
        self._pending: pa.RecordBatch | None = None
        self._skip = 0        # rows still to drop before the first emitted one
        self._seen = 0        # rows of the file decoded so far (skipped or kept)
        self._batches: Iterator[pa.RecordBatch] = iter(())
        try:
            self._open(fs, csv_options or {})
        except FileReadError:
            self.close()
            raise
        except FileNotFoundError as exc:
            self.close()
            raise FileReadError(
                f"FileSource: file {path!r} vanished ({'not yet read' if start == 0 else f'{start} rows were read'}); "
                f"files must stay in the directory until fully read", path) from exc
        except Exception as exc:
            self.close()
            raise self._error("cannot be opened", exc) from exc

    def _error(self, what: str, exc: BaseException) -> FileReadError:
        return FileReadError(
            f"FileSource: file {self.path!r} {what} as {self._format}: {_describe(exc)}. "
            f"Fix or remove the file (or check format=/schema=); corrupt files cannot be skipped "
            f"without losing rows", self.path)

    def _open(self, fs, csv_options: dict) -> None:
        if self._format == "parquet":
            self._stream = fs.open(self.path, "rb")
            parquet = pq.ParquetFile(self._stream)
            meta = parquet.metadata
            self._check_position(meta.num_rows)
            # Skip whole row groups through the footer, then the rest row by row (sliced).
            first, before = 0, 0
            while first < meta.num_row_groups and before + meta.row_group(first).num_rows <= self._start:
                before += meta.row_group(first).num_rows
                first += 1
            self._seen = before
            self._skip = self._start - before
            if first < meta.num_row_groups:
                columns = self._schema.names if self._schema is not None else None
                self._batches = parquet.iter_batches(batch_size=self._batch_size,
                                                     row_groups=list(range(first, meta.num_row_groups)),
                                                     columns=columns)
            return
        self._skip = self._start
        self._stream = fs.open(self.path, "rb", compression="infer")
        try:
            if self._format == "csv":
                read, parse, convert = _csv_option_objects(csv_options, self._schema)
                self._batches = iter(pa_csv.open_csv(self._stream, read_options=read, parse_options=parse,
                                                     convert_options=convert))
            else:
                parse = (pa_json.ParseOptions(explicit_schema=self._schema, unexpected_field_behavior="ignore")
                         if self._schema is not None else pa_json.ParseOptions())
                self._batches = iter(pa_json.open_json(self._stream, parse_options=parse))
        except pa.ArrowInvalid:
            # pyarrow refuses files without any content; those simply hold no rows.
            if not _only_whitespace(fs, self.path):
                raise
            self._batches = iter(())

    def _check_position(self, total: int) -> None:
        if self._start > total:
            raise FileReadError(
                f"FileSource: file {self.path!r} has {total} rows, but the checkpoint recorded "
                f"{self._start} rows as already read: the file changed after it appeared in the "
                f"directory (files must be complete when they appear — rename them into place — "
                f"and never change afterwards)", self.path)

    def _conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        schema = self._schema
        if schema is None or batch.schema.equals(schema):
            return batch
        try:
            if batch.schema.names != schema.names:
                batch = batch.select(schema.names)
            return batch.cast(schema)
        except Exception as exc:
            raise FileReadError(
                f"FileSource: rows of file {self.path!r} do not fit the source schema "
                f"({_describe(exc)}); file schema: {batch.schema}; source schema: {schema}. Pass "
                f"schema= with types every file can be converted to", self.path) from exc

    def next_batch(self) -> pa.RecordBatch | None:
        """The next batch of at most batch_size rows, or None when the file is done."""
        while True:
            pending = self._pending
            if pending is not None and pending.num_rows:
                out = pending.slice(0, self._batch_size)
                self._pending = pending.slice(self._batch_size) if pending.num_rows > self._batch_size else None
                return out
            try:
                batch = next(self._batches)
            except StopIteration:
                if self._skip:
                    self._check_position(self._seen)
                return None
            except Exception as exc:
                raise self._error(f"cannot be read (after row {self._seen})", exc) from exc
            self._seen += batch.num_rows
            if self._skip:
                if batch.num_rows <= self._skip:
                    self._skip -= batch.num_rows
                    continue
                batch = batch.slice(self._skip)
                self._skip = 0
            self._pending = self._conform(batch)

    def close(self) -> None:
        self._batches = iter(())
        self._pending = None
        if self._stream is not None:
            stream, self._stream = self._stream, None
            try:
                stream.close()
            except OSError as exc:  # pragma: no cover - nothing was written, nothing is lost
                log.debug("FileSource: closing %s failed: %s", self.path, exc)


# ===================================================================== helpers
def _csv_option_objects(options: dict, schema: pa.Schema | None):
    read = pa_csv.ReadOptions(**{k: v for k, v in options.items() if k in CSV_READ_OPTIONS})
    parse = pa_csv.ParseOptions(**{k: v for k, v in options.items() if k in CSV_PARSE_OPTIONS})
    convert_kwargs = {k: v for k, v in options.items() if k in CSV_CONVERT_OPTIONS}
    if schema is not None:
        convert_kwargs.update(column_types=schema, include_columns=schema.names,
                              include_missing_columns=False)
    convert = pa_csv.ConvertOptions(**convert_kwargs)
    return read, parse, convert


def _only_whitespace(fs, path: str) -> bool:
    with fs.open(path, "rb", compression="infer") as f:
        while True:
            chunk = f.read(1 << 16)
            if not chunk:
                return True
            if chunk.strip():
                return False


def _probe_schema(fs, path: str, format: str, csv_options: dict) -> pa.Schema | None:
    """The schema of one file, from its footer (Parquet) or its first block (CSV, JSON lines).

    None for a CSV / JSON-lines file without rows: a header alone types every column as null,
    which would make every later file unreadable, so inference moves on to the next file.
    """
    if format == "parquet":
        with fs.open(path, "rb") as f:
            return pq.ParquetFile(f).schema_arrow
    with fs.open(path, "rb", compression="infer") as f:
        try:
            if format == "csv":
                read, parse, convert = _csv_option_objects(csv_options, None)
                reader = pa_csv.open_csv(f, read_options=read, parse_options=parse, convert_options=convert)
            else:
                reader = pa_json.open_json(f)
        except pa.ArrowInvalid:
            if _only_whitespace(fs, path):
                return None
            raise
        for batch in reader:
            if batch.num_rows:
                return reader.schema
        return None
