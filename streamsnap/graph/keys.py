"""Key selectors: how `key_by` finds the key of a row, per row or for a whole batch.

A key is one column, several columns (a tuple key) or the result of a user function. Key
groups are computed vectorized for a whole batch (`key_groups`), both by the partitioner that
routes rows to subtasks and by the keyed operator that scopes state to the current key, so the
two always agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.errors import ConfigurationError
from streamsnap.runtime.batches import Batch
from streamsnap.state.key_groups import assign_key_groups, hash_keys_columns


@dataclass(frozen=True)
class BatchKeys:
    """The keys of one batch, factorized: what a KeyedBatchFunction works with.

    unique: the distinct keys, in order of first appearance.
    index: for every row, the position of its key in `unique` (numpy int array).
    key_groups: the key group of every distinct key (state lives per key group).
    """

    unique: list
    index: np.ndarray
    key_groups: list

    def __len__(self) -> int:
        return len(self.unique)


@dataclass(frozen=True)
class KeySelector:
    columns: tuple[str, ...] = ()
    function: Callable | None = None

    @classmethod
    def of(cls, key) -> "KeySelector":
        if isinstance(key, str):
            if not key:
                raise ConfigurationError("key_by: the key column name must not be empty")
            return cls(columns=(key,))
        if isinstance(key, (list, tuple)):
            if not key or not all(isinstance(c, str) and c for c in key):
                raise ConfigurationError(f"key_by: expected a non-empty list of column names, got {key!r}")
            return cls(columns=tuple(key))
        if callable(key):
            return cls(function=key)
        raise ConfigurationError(
            f"key_by takes a column name, a list of column names or a function of the row, got {key!r}")

    def describe(self) -> str:
        if self.function is not None:
            return getattr(self.function, "__name__", "key function")
        return ", ".join(self.columns)

    def validate(self, schema: pa.Schema | None, where: str) -> None:
        """Fail at build time when the schema is known and a key column is missing."""
        if schema is None or self.function is not None:
            return
        missing = [c for c in self.columns if c not in schema.names]
        if missing:
            raise ConfigurationError(
                f"key_by on {where}: no column {', '.join(repr(m) for m in missing)}; "
                f"the stream's columns are {', '.join(schema.names)}")

    # -- runtime
    def key_of_row(self, row: dict):
        if self.function is not None:
            return self.function(row)
        if len(self.columns) == 1:
            return row[self.columns[0]]
        return tuple(row[c] for c in self.columns)

    def keys_of_rows(self, rows: list) -> list:
        if self.function is not None:
            fn = self.function
            return [fn(r) for r in rows]
        try:
            if len(self.columns) == 1:
                c = self.columns[0]
                return [r[c] for r in rows]
            cols = self.columns
            return [tuple(r[c] for c in cols) for r in rows]
        except KeyError as exc:
            raise KeyError(f"key_by: row has no column {exc.args[0]!r}") from None

    def keys_of_batch(self, batch: pa.RecordBatch, rows: list) -> list:
        """Keys of an Arrow batch's rows, read column-wise (no per-row dict lookups)."""
        if self.function is not None:
            return self.keys_of_rows(rows)
        names = batch.schema.names
        for c in self.columns:
            if c not in names:
                raise KeyError(f"key_by: batch has no column {c!r} (columns: {', '.join(names)})")
        if len(self.columns) == 1:
            return batch.column(self.columns[0]).to_pylist()
        return list(zip(*(batch.column(c).to_pylist() for c in self.columns)))

    def batch_keys(self, batch: pa.RecordBatch, max_parallelism: int) -> BatchKeys:
        """Factorize a batch's keys; column keys are encoded by Arrow, without Python per row."""
        if self.function is None and len(self.columns) == 1:
            names = batch.schema.names
            if self.columns[0] not in names:
                raise KeyError(f"key_by: batch has no column {self.columns[0]!r} (columns: {', '.join(names)})")
            column = batch.column(self.columns[0])
            if pa.types.is_dictionary(column.type):
                column = column.dictionary_decode()
            encoded = pc.dictionary_encode(column, null_encoding="encode")  # None is a key too
            uniques = encoded.dictionary
            return BatchKeys(uniques.to_pylist(), encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64),
                             assign_key_groups(uniques, max_parallelism).tolist())
        keys = self.keys_of_batch(batch, batch.to_pylist() if self.function is not None else [])
        positions: dict = {}
        index = np.fromiter((positions.setdefault(k, len(positions)) for k in keys), dtype=np.int64,
                            count=len(keys))
        unique = list(positions)
        return BatchKeys(unique, index, assign_key_groups(unique, max_parallelism).tolist())

    def key_groups(self, batch: Batch, max_parallelism: int, keys: list | None = None) -> np.ndarray:
        """Key group of every row of `batch` (vectorized for Arrow batches keyed by columns)."""
        if keys is None and isinstance(batch, pa.RecordBatch) and self.function is None:
            names = batch.schema.names
            missing = [c for c in self.columns if c not in names]
            if missing:
                raise KeyError(f"key_by: batch has no column {missing[0]!r} (columns: {', '.join(names)})")
            if len(self.columns) == 1:
                return assign_key_groups(batch.column(self.columns[0]), max_parallelism)
            hashes = hash_keys_columns([batch.column(c) for c in self.columns])
            return (hashes % np.uint64(max_parallelism)).astype(np.int64)
        if keys is None:
            keys = self.keys_of_rows(batch if isinstance(batch, list) else batch.to_pylist())
        return assign_key_groups(keys, max_parallelism)
