"""Key selectors: how `key_by` finds the key of a row, per row or for a whole batch.

A key is one column, several columns (a tuple key) or the result of a user function. Key
groups are computed vectorized for a whole batch (`key_groups`), both by the partitioner that
routes rows to subtasks and by the keyed operator that scopes state to the current key, so the
two always agree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.errors import ConfigurationError, NullKeyError
from streamsnap.runtime.batches import Batch
from streamsnap.runtime.schemas import describe_row
from streamsnap.state.key_groups import assign_key_groups, hash_keys_columns, hashable_type


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

    def subset(self, positions: list[int]) -> "BatchKeys":
        """The distinct keys at `positions` of `unique` (no rows): for `put_many` of only the
        keys a batch changed."""
        return BatchKeys([self.unique[p] for p in positions], self.index[:0],
                         [self.key_groups[p] for p in positions])


@dataclass(frozen=True)
class KeySelector:
    """columns or function: the key. allow_null: None is a key like any other (else a row with a
    null key raises NullKeyError, as Flink rejects null keys). operator: the keyed operator,
    named in that error."""

    columns: tuple[str, ...] = ()
    function: Callable | None = None
    allow_null: bool = False
    operator: str | None = None

    @classmethod
    def of(cls, key, allow_null: bool = False) -> "KeySelector":
        if isinstance(key, str):
            if not key:
                raise ConfigurationError("key_by: the key column name must not be empty")
            return cls(columns=(key,), allow_null=allow_null)
        if isinstance(key, (list, tuple)):
            if not key or not all(isinstance(c, str) and c for c in key):
                raise ConfigurationError(f"key_by: expected a non-empty list of column names, got {key!r}")
            return cls(columns=tuple(key), allow_null=allow_null)
        if callable(key):
            return cls(function=key, allow_null=allow_null)
        raise ConfigurationError(
            f"key_by takes a column name, a list of column names or a function of the row, got {key!r}")

    def describe(self) -> str:
        if self.function is not None:
            return getattr(self.function, "__name__", "key function")
        return ", ".join(self.columns)

    def for_operator(self, name: str) -> "KeySelector":
        return replace(self, operator=name)

    # -- null keys
    def _null_key(self, row, field: str | None) -> NullKeyError:
        where = f"key_by({self.describe()!r})" + (f" in front of operator '{self.operator}'" if self.operator else "")
        what = (f"field '{field}' is None" if field is not None
                else f"the key function {self.describe()!r} returned None" if self.function is not None
                else "a key field is None")
        return NullKeyError(
            f"{where}: row has a null key ({what})\n"
            f"  row: {describe_row(row)}\n"
            f"  Every row needs a key: it decides the subtask and the keyed state (Flink rejects null keys too).\n"
            f"  fix: filter such rows out before key_by, give them a key in a map before it, or opt in with "
            f"key_by(..., allow_null_keys=True) so that None is one more key",
            operator=self.operator, field=field, row=row)

    def _check_rows(self, rows: list, keys: list) -> None:
        if len(self.columns) > 1:
            bad = next((i for i, k in enumerate(keys) if None in k), None)
        else:
            bad = keys.index(None) if None in keys else None
        if bad is not None:
            row = rows[bad]
            field = next((c for c in self.columns if row.get(c) is None), None)
            raise self._null_key(row, field)

    def _check_batch(self, batch: pa.RecordBatch) -> None:
        """The key columns are in `batch` (KeyError naming the first missing one) and, unless
        None is a key, hold no null (NullKeyError naming the row)."""
        names = batch.schema.names
        missing = [c for c in self.columns if c not in names]
        if missing:
            raise KeyError(f"key_by: batch has no column {missing[0]!r} (columns: {', '.join(names)})")
        if not self.allow_null:
            self._check_columns(batch)

    def _check_columns(self, batch: pa.RecordBatch) -> None:
        for c in self.columns:
            column = batch.column(c)
            if column.null_count:
                i = int(column.is_null().to_numpy(zero_copy_only=False).nonzero()[0][0])
                raise self._null_key(batch.slice(i, 1).to_pylist()[0], c)

    def validate(self, schema: pa.Schema | None, where: str) -> None:
        """Fail at build time when the schema is known and a key column is missing."""
        if schema is None or self.function is not None:
            return
        missing = [c for c in self.columns if c not in schema.names]
        if missing:
            raise ConfigurationError(
                f"key_by on {where}: no column {', '.join(repr(m) for m in missing)}; "
                f"the stream's columns are {', '.join(schema.names)}")
        for column in self.columns:
            t = schema.field(column).type
            if not hashable_type(t):
                raise ConfigurationError(
                    f"key_by on {where}: the key column {column!r} is of type {t}, which keys cannot "
                    f"be (keys are integers, booleans, floats, strings, binaries or structs of "
                    f"those); cast it first, e.g. map_batches turning a date or timestamp into "
                    f"int64 (epoch days or milliseconds) or a string")

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
            keys = [fn(r) for r in rows]
        else:
            try:
                if len(self.columns) == 1:
                    c = self.columns[0]
                    keys = [r[c] for r in rows]
                else:
                    cols = self.columns
                    keys = [tuple(r[c] for c in cols) for r in rows]
            except KeyError as exc:
                raise KeyError(f"key_by: row has no column {exc.args[0]!r}") from None
        if not self.allow_null:
            self._check_rows(rows, keys)
        return keys

    def keys_of_batch(self, batch: pa.RecordBatch, rows: list) -> list:
        """Keys of an Arrow batch's rows, read column-wise (no per-row dict lookups)."""
        if self.function is not None:
            return self.keys_of_rows(rows)
        self._check_batch(batch)
        if len(self.columns) == 1:
            return batch.column(self.columns[0]).to_pylist()
        return list(zip(*(batch.column(c).to_pylist() for c in self.columns)))

    def batch_keys(self, batch: pa.RecordBatch, max_parallelism: int) -> BatchKeys:
        """Factorize a batch's keys; column keys are encoded by Arrow, without Python per row."""
        if self.function is None and len(self.columns) == 1:
            self._check_batch(batch)
            column = batch.column(self.columns[0])
            if pa.types.is_dictionary(column.type):
                column = column.dictionary_decode()
            encoded = pc.dictionary_encode(column, null_encoding="encode")  # None is a key too
            uniques = encoded.dictionary
            return BatchKeys(uniques.to_pylist(), encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64),
                             assign_key_groups(uniques, max_parallelism).tolist())
        if self.function is None:
            factorized = self._factorized(batch, max_parallelism)
            if factorized is not None:
                return factorized
        keys = self.keys_of_batch(batch, batch.to_pylist() if self.function is not None else [])
        positions: dict = {}
        index = np.fromiter((positions.setdefault(k, len(positions)) for k in keys), dtype=np.int64,
                            count=len(keys))
        unique = list(positions)
        return BatchKeys(unique, index, assign_key_groups(unique, max_parallelism).tolist())

    def _factorized(self, batch: pa.RecordBatch, max_parallelism: int) -> BatchKeys | None:
        """`batch_keys` of several integer, boolean, string or binary columns without a tuple
        per row: each column dictionary-encoded by Arrow, the codes combined into one integer
        per row and factorized by numpy; tuples are made for the distinct keys only, and their
        key groups hashed from the columns (as `key_groups` routes the rows). None for other
        column types (floats: 0.0 and -0.0 are one key in Python, two values to Arrow)."""
        self._check_batch(batch)
        columns = []
        for c in self.columns:
            column = batch.column(c)
            if pa.types.is_dictionary(column.type):
                column = column.dictionary_decode()
            t = column.type     # the types Arrow encodes and takes exactly (views not yet)
            if not (pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
                    or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)):
                return None
            columns.append(column)
        codes = np.zeros(batch.num_rows, dtype=np.int64)
        width = 1
        for column in columns:
            encoded = pc.dictionary_encode(column, null_encoding="encode")    # None is a key too
            size = max(len(encoded.dictionary), 1)
            width *= size
            if width >= 1 << 62:
                return None
            codes = codes * size + encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")            # distinct keys by first appearance
        position = np.empty(len(order), dtype=np.int64)
        position[order] = np.arange(len(order), dtype=np.int64)
        rows = pa.array(first[order])
        distinct = [column.take(rows) for column in columns]
        unique = list(zip(*(column.to_pylist() for column in distinct)))
        groups = (hash_keys_columns(distinct) % np.uint64(max_parallelism)).astype(np.int64)
        return BatchKeys(unique, position[inverse.reshape(-1)], groups.tolist())

    def key_groups(self, batch: Batch, max_parallelism: int, keys: list | None = None) -> np.ndarray:
        """Key group of every row of `batch` (vectorized for Arrow batches keyed by columns)."""
        if keys is None and isinstance(batch, pa.RecordBatch) and self.function is None:
            self._check_batch(batch)
            if len(self.columns) == 1:
                return assign_key_groups(batch.column(self.columns[0]), max_parallelism)
            hashes = hash_keys_columns([batch.column(c) for c in self.columns])
            return (hashes % np.uint64(max_parallelism)).astype(np.int64)
        if keys is None:
            keys = self.keys_of_rows(batch if isinstance(batch, list) else batch.to_pylist())
        return assign_key_groups(keys, max_parallelism)
