"""Hive-style partitioned paths for the FileSink: `dt=2026-11-28/hm=14:05/part-...`.

As Spark's `DataFrameWriter.partitionBy` and Flink's bucket assigner: each row goes to the
directory named by its partition columns' values, and those columns are not written into the
file body (a reader restores them from the path: Spark's partition discovery,
`pyarrow.dataset(..., partitioning="hive")`, DuckDB's `hive_partitioning`). Values are escaped
as Hive escapes path names (`%XX` for `/`, `=`, `%`, ...), null and "" go to Hive's default
partition. Pure functions: the writer (`sink.py`) keeps one open part per directory.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.errors import ConfigurationError

DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
# The characters Hive's FileUtils.escapePathName escapes (besides control characters).
_ESCAPED = frozenset('"#%\'*/:=?\\\x7f{[]^')


def check_partition_by(partition_by) -> tuple[str, ...]:
    """`partition_by` as a tuple of column names; () for None. Fails on anything else."""
    if partition_by is None:
        return ()
    if isinstance(partition_by, str) or not isinstance(partition_by, Sequence):
        raise ConfigurationError(
            f"FileSink.partition_by must be a list of column names such as ['dt', 'hm'], got "
            f"{partition_by!r}")
    if not partition_by:
        raise ConfigurationError(
            "FileSink.partition_by is empty; give the columns to partition by (e.g. ['dt']) or "
            "leave it out (None) for unpartitioned output")
    for name in partition_by:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(
                f"FileSink.partition_by names columns: {name!r} is not a column name (a non-empty "
                f"str); give e.g. partition_by=['dt', 'hm']")
    duplicates = sorted({n for n in partition_by if list(partition_by).count(n) > 1})
    if duplicates:
        raise ConfigurationError(f"FileSink.partition_by names {duplicates} more than once; name each column once")
    return tuple(partition_by)


def check_columns(partition_by: tuple[str, ...], names: Sequence[str], where: str) -> None:
    """The partition columns must be among the rows' columns, and leave some for the body."""
    missing = [n for n in partition_by if n not in names]
    if missing:
        raise ConfigurationError(
            f"{where}: partition column {missing[0]!r} is not in the rows (columns {list(names)}); "
            f"add it to the stream (e.g. with map or map_batches) or fix partition_by")
    if len(partition_by) == len(names):
        raise ConfigurationError(
            f"{where}: partition_by {list(partition_by)} takes every column, leaving the files "
            f"empty (as Spark refuses); keep at least one column out of partition_by")


def escape(value) -> str:
    """A partition value as a path segment (Hive's escaping; null and "" -> default partition)."""
    if value is None:
        return DEFAULT_PARTITION
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    if not text:
        return DEFAULT_PARTITION
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED or ord(c) < 0x20 else c for c in text)


def directory(partition_by: tuple[str, ...], values: Sequence) -> str:
    """The relative directory `col=value/...` of one combination of partition values."""
    return "/".join(f"{escape(name)}={escape(value)}" for name, value in zip(partition_by, values))


def split(batch: pa.RecordBatch, partition_by: tuple[str, ...]) -> list[tuple[str, pa.RecordBatch]]:
    """The batch's rows by partition directory, in first-seen order, each without the
    partition columns (rows keep their order within a directory)."""
    n = batch.num_rows
    codes = np.zeros(n, dtype=np.int64)
    dictionaries = []
    for name in partition_by:
        encoded = pc.dictionary_encode(batch.column(batch.schema.get_field_index(name)))
        dictionary = encoded.dictionary.to_pylist() + [None]       # last: null
        indices = pc.fill_null(encoded.indices, len(dictionary) - 1).to_numpy(zero_copy_only=False)
        codes = codes * len(dictionary) + indices.astype(np.int64)
        dictionaries.append(dictionary)
    body = batch.select([f.name for f in batch.schema if f.name not in partition_by])
    unique, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    order = np.argsort(inverse.reshape(-1), kind="stable")       # rows by group, in row order
    counts = np.bincount(inverse.reshape(-1), minlength=len(unique))
    ends = np.cumsum(counts)
    out = []
    for group in np.argsort(first, kind="stable").tolist():
        rows = order[ends[group] - counts[group]:ends[group]]
        values, code = [], int(unique[group])
        for dictionary in reversed(dictionaries):
            code, index = divmod(code, len(dictionary))
            values.append(dictionary[index])
        part = body if len(unique) == 1 else body.take(pa.array(rows, pa.int64()))
        out.append((directory(partition_by, values[::-1]), part))
    return out


__all__ = ["DEFAULT_PARTITION", "check_columns", "check_partition_by", "directory", "escape", "split"]
