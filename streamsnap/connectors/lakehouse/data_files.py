"""Rolling, partitioned Parquet data files: what a lakehouse sink's writer puts under its table.

A writer keeps one open file per partition and buffers rows into row groups of a useful size
(not one per stream batch). A file rolls when it reaches the target size; at a checkpoint's
barrier every open file closes, since a Parquet file cannot be resumed and everything before the
barrier must be committable. So a file holds at most one checkpoint interval of one subtask's
rows of one partition: short intervals make small files, which the table's compaction (Delta's
OPTIMIZE, Iceberg's rewrite_data_files) merges — docs/how-to/lakehouse.md.

Files are written straight to their final place: a table format only reads the files its log
or manifests reference, so an uncommitted file is invisible until the committer adds it, and
one a failed attempt left is deleted at the restore (`committer.py`). Their names carry the
sink's tag (which sink wrote them) and the attempt's token (which attempt), for that cleanup.
"""

from __future__ import annotations

import datetime
import hashlib
import decimal
import posixpath
import urllib.parse
import uuid
from collections.abc import Callable
from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from streamsnap.checkpoint import filesystem

TARGET_FILE_SIZE = 128 * 1024 * 1024     # bytes; Delta's and Iceberg's usual target
ROW_GROUP_ROWS = 128 * 1024               # rows buffered per partition before a row group is written
ROW_GROUP_BYTES = 64 * 1024 * 1024
COMPRESSION = "zstd"
DICTIONARY_SAMPLE_ROWS = 16384            # rows of a file's first row group that decide its dictionary columns
DICTIONARY_MAX_DISTINCT = 0.1             # dictionary-encode a column whose sample is at most this share distinct


def file_prefix(uid: str) -> str:
    """How the names of a sink's data files start: `part-<tag of the sink's uid>-`."""
    return f"part-{hashlib.sha1(uid.encode()).hexdigest()[:8]}-"


def partition_directory(partition_by: list[str], values: tuple) -> str:
    """Hive-style `a=1/b=x` (Delta and Spark's layout); nulls as Hive's default partition."""
    return "/".join(f"{urllib.parse.quote(name, safe='')}="
                    f"{'__HIVE_DEFAULT_PARTITION__' if v is None else urllib.parse.quote(partition_string(v), safe='')}"
                    for name, v in zip(partition_by, values))


def partition_string(value: Any) -> str | None:
    """A partition value as the table formats serialize it (Delta's partitionValues)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return value.isoformat(sep=" ", timespec="microseconds")
    if isinstance(value, (datetime.date, decimal.Decimal)):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return str(value)


class _OpenFile:
    def __init__(self, url: str, relative: str, schema: pa.Schema, partition: tuple, table_schema: pa.Schema):
        self.url, self.relative, self.partition = url, relative, partition
        self.table_schema = table_schema
        self.schema = schema
        self.stream: IO[bytes] = filesystem.open_write(url)
        self.writer: pq.ParquetWriter | None = None   # at the first row group, which picks the dictionary columns
        self.buffered: list[pa.RecordBatch] = []
        self.buffered_rows = self.buffered_bytes = 0
        self.stats = ColumnStats(schema)

    def add(self, batch: pa.RecordBatch) -> None:
        self.buffered.append(batch)
        self.buffered_rows += batch.num_rows
        self.buffered_bytes += batch.nbytes
        self.stats.add(batch)
        if self.buffered_rows >= ROW_GROUP_ROWS or self.buffered_bytes >= ROW_GROUP_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.buffered:
            table = pa.Table.from_batches(self.buffered)
            if self.writer is None:
                self.writer = pq.ParquetWriter(self.stream, self.schema, compression=COMPRESSION,
                                               use_dictionary=dictionary_columns(table))
            self.writer.write_table(table, row_group_size=max(self.buffered_rows, 1))
            self.buffered, self.buffered_rows, self.buffered_bytes = [], 0, 0

    def size(self) -> int:
        return self.stream.tell()

    def close(self) -> dict:
        self.flush()
        self.writer.close()
        self.stream.close()
        fs, path = filesystem.filesystem(self.url)
        return {"path": self.relative, "size": int(fs.size(path)), "partition": [partition_string(v) for v in self.partition],
                "stats": self.stats.to_dict(), "schema": self.table_schema.serialize().to_pybytes()}


class DataFileWriter:
    """One subtask's data files under `root`; `close_all` returns the closed files' descriptions.

    convert: the table format's view of a batch (types it stores), applied before anything else;
    it must give every batch of one stream schema the same output schema.
    partition_columns_in_files: Iceberg keeps partition source columns in the data files; Delta
    does not (their values are in the log's partitionValues and the path).
    """

    def __init__(self, root: str, partition_by: list[str], name_prefix: str,
                 convert: Callable[[pa.RecordBatch], pa.RecordBatch],
                 target_file_size: int = TARGET_FILE_SIZE, partition_columns_in_files: bool = False):
        self._root = root
        self._partition_by = list(partition_by)
        self._keep_partition_columns = partition_columns_in_files
        self._prefix = name_prefix
        self._convert = convert
        self._target = target_file_size
        self._open: dict[tuple, _OpenFile] = {}
        self._closed: list[dict] = []
        self._counter = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        batch = self._convert(batch)
        for partition, part in self._split(batch):
            current = self._open.get(partition)
            if current is not None and not current.table_schema.equals(batch.schema):
                self._closed.append(self._open.pop(partition).close())   # a widened stream: new file
                current = None
            if current is None:
                current = self._open[partition] = self._new_file(partition, part.schema, batch.schema)
            current.add(part)
            if current.size() >= self._target:
                self._closed.append(self._open.pop(partition).close())

    def _split(self, batch: pa.RecordBatch):
        if not self._partition_by:
            yield (), batch
            return
        keys = list(zip(*(batch.column(name).to_pylist() for name in self._partition_by)))
        groups: dict[tuple, list[int]] = {}
        for index, key in enumerate(keys):
            groups.setdefault(key, []).append(index)
        data = batch if self._keep_partition_columns else batch.select(
            [n for n in batch.schema.names if n not in self._partition_by])
        for key, indices in groups.items():
            yield key, data if len(groups) == 1 else data.take(pa.array(indices, pa.int32()))

    def _new_file(self, partition: tuple, schema: pa.Schema, table_schema: pa.Schema) -> _OpenFile:
        name = f"{self._prefix}{self._counter}-{uuid.uuid4().hex[:8]}.parquet"
        self._counter += 1
        directory = partition_directory(self._partition_by, partition)
        relative = posixpath.join(directory, name) if directory else name
        return _OpenFile(filesystem.join(self._root, relative), relative, schema, partition, table_schema)

    def close_all(self) -> list[dict]:
        """Close every open file: the files written since the last call (a checkpoint's)."""
        closed = self._closed + [f.close() for f in self._open.values()]
        self._open, self._closed = {}, []
        return closed

    def abandon(self) -> None:
        """Close without describing (the subtask ends uncommitted; the restore deletes them)."""
        for f in self._open.values():
            if f.writer is not None:
                f.writer.close()
            f.stream.close()
        self._open = {}


def dictionary_columns(table: pa.Table) -> list[str]:
    """The top-level primitive columns worth dictionary encoding: few distinct values in a sample
    of the first row group (a key, a category, a constant). Parquet writers encode every column so
    by default; for a column of mostly distinct values (a running total, an id, a timestamp) the
    dictionary is as large as the data and building it costs more than the rest of the write
    (W1's sum column: 3x the time, and a larger file, measured with pyarrow 26)."""
    sample = table.slice(0, DICTIONARY_SAMPLE_ROWS)
    return [f.name for f in sample.schema if not pa.types.is_nested(f.type) and _few_distinct(sample.column(f.name))]


def _few_distinct(column: pa.ChunkedArray) -> bool:
    if pa.types.is_dictionary(column.type) or pa.types.is_null(column.type) or not len(column):
        return True
    try:
        distinct = pc.count_distinct(column, mode="all").as_py()
    except pa.ArrowNotImplementedError:   # no hash kernel for the type: the Parquet default (a dictionary)
        return True
    return distinct <= DICTIONARY_MAX_DISTINCT * len(column)


_STATS_TYPES = (pa.types.is_integer, pa.types.is_date, pa.types.is_string, pa.types.is_large_string)
_MAX_STAT_STRING = 32


class ColumnStats:
    """Row count, and per top-level primitive column nulls and min/max (data skipping)."""

    def __init__(self, schema: pa.Schema):
        self.rows = 0
        self._nulls: dict[str, int] = {f.name: 0 for f in schema if not pa.types.is_nested(f.type)}
        self._bounds: dict[str, list] = {f.name: [None, None] for f in schema
                                         if any(check(f.type) for check in _STATS_TYPES)}

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        for name in self._nulls:
            self._nulls[name] += batch.column(name).null_count
        for name, bounds in self._bounds.items():
            result = pc.min_max(batch.column(name)).as_py()
            low, high = result["min"], result["max"]
            if low is None:
                continue
            bounds[0] = low if bounds[0] is None else min(bounds[0], low)
            bounds[1] = high if bounds[1] is None else max(bounds[1], high)

    def to_dict(self) -> dict:
        """msgpack-able: {"rows", "nulls": {col: n}, "min": {col: v}, "max": {col: v}}; strings
        longer than a stat may hold are left out (a truncated max would skip matching files)."""
        low, high = {}, {}
        for name, (lo, hi) in self._bounds.items():
            if lo is None or (isinstance(lo, str) and max(len(lo), len(hi)) > _MAX_STAT_STRING):
                continue
            low[name], high[name] = _plain(lo), _plain(hi)
        return {"rows": self.rows, "nulls": dict(self._nulls), "min": low, "max": high}


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, datetime.date) else value


def widest_schema(files) -> pa.Schema:
    """The table schema of a commit's file descriptions: the union of theirs (a widening stream grows)."""
    decoded = [pa.ipc.read_schema(pa.py_buffer(s)) for s in {f["schema"] for f in files}]
    return pa.unify_schemas(decoded) if len(decoded) > 1 else decoded[0]


def delete_unreferenced(root: str, prefix: str, referenced: set[str], current_token: str) -> list[str]:
    """Delete the data files under `root` named `prefix...` (one sink's) that no commit references
    (`referenced`: file names) and the current attempt did not write (`current_token` in their
    name): files of checkpoints that never completed. Returns their paths."""
    fs, path = filesystem.filesystem(root)
    if not fs.exists(path):
        return []
    deleted = []
    for found in fs.find(path):
        name = posixpath.basename(found)
        if name.startswith(prefix) and current_token not in name and name not in referenced:
            fs.rm(found)
            deleted.append(found)
    return deleted
