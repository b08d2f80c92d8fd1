"""The lookup join: every row of a stream joined with a bounded table, per batch, in Arrow.

Flink's lookup join (`JOIN dim FOR SYSTEM_TIME AS OF ...`) and Spark's stream-static join
enrich a stream from a table without shuffling the stream by key. Here the table is small
enough to live whole in every subtask: `LookupTable` indexes it once, on the driver when the
job is built, and travels with the job graph; each batch is then joined with a few vectorized
calls (`pc.index_in` of the batch's key codes, `take`), no Python per row and no keyBy. The
operator keeps no state: a restored or rescaled job joins with the table its graph carries.

Keys: each key column is coded by its position among the table's distinct values of that
column, and a composite key by those codes in mixed radix (one int64), so one `index_in` finds
a row's matches whatever the number of key columns. A null key matches nothing (as in SQL).
Matches follow SQL: a row whose key occurs k times in the table comes out k times (in the
table's order), `how="left"` keeps a row without match once, with nulls for the table's columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.errors import UsageError
from streamsnap.runtime.batches import Batch, to_record_batch
from streamsnap.runtime.operators.base import OperatorContext, OperatorFactory, StreamOperator, user_error
from streamsnap.runtime.schemas import RowSchema

HOWS = ("inner", "left")


def key_type(t: pa.DataType) -> pa.DataType:
    """The type a key column is compared in: integers as int64 and strings as string, whatever
    their width, so an int32 key meets an int64 one."""
    if pa.types.is_dictionary(t):
        return key_type(t.value_type)
    if pa.types.is_integer(t):
        return pa.int64()
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    return t


def _as_key(column, t: pa.DataType):
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return column if column.type == t else pc.cast(column, t)


class LookupTable:
    """A table indexed by its key columns for `join(batch)`.

    table: the bounded side; on: (stream column, table column) pairs; columns: table column →
    output column name, the table columns added to each joined row."""

    def __init__(self, table: pa.Table, on: tuple[tuple[str, str], ...], columns: dict[str, str]):
        self.on = on
        self.columns = dict(columns)
        self.types = tuple(key_type(table.schema.field(t).type) for _, t in on)
        keys = [_as_key(table.column(t).combine_chunks(), kt) for (_, t), kt in zip(on, self.types)]
        self.dictionaries = tuple(pc.unique(k).drop_null() for k in keys)
        sizes = [max(len(d), 1) for d in self.dictionaries]
        if float(np.prod(np.array(sizes, dtype=np.float64))) >= 2.0 ** 53:
            raise ValueError(f"lookup join: the table's key columns have {sizes} distinct values, too "
                             f"many combinations to code exactly (2**53); join on fewer columns")
        self.strides = tuple(int(np.prod(sizes[i + 1:], dtype=np.int64)) for i in range(len(sizes)))
        codes = self._codes(keys)
        valid = ~np.isnan(codes)
        rows = np.nonzero(valid)[0]
        row_codes = codes[valid].astype(np.int64)
        order = np.argsort(row_codes, kind="stable")          # matches kept in the table's order
        sorted_codes = row_codes[order]
        unique_codes, starts, counts = np.unique(sorted_codes, return_index=True, return_counts=True)
        self.codes = pa.array(unique_codes, type=pa.int64())
        self.starts = starts.astype(np.int64)
        self.counts = counts.astype(np.int64)
        self.unique = bool(counts.size == 0 or counts.max() == 1)
        values = table.select(list(self.columns)).take(pa.array(rows[order], type=pa.int64()))
        self.values = values.rename_columns(list(self.columns.values())).combine_chunks()

    @property
    def num_rows(self) -> int:
        return self.values.num_rows

    def _codes(self, keys: list) -> np.ndarray:
        """Per row, its composite key's code as float64 (NaN: null, or not among the table's keys)."""
        total = None
        for key, dictionary, stride in zip(keys, self.dictionaries, self.strides):
            position = pc.index_in(key, value_set=dictionary, skip_nulls=True)
            part = position.to_numpy(zero_copy_only=False).astype(np.float64) * stride  # null -> NaN
            total = part if total is None else total + part
        return total

    def join(self, batch: pa.RecordBatch, how: str) -> pa.RecordBatch:
        """`batch` with the table's columns of its matching rows (see the module docstring)."""
        keys = [_as_key(batch.column(s), t) for (s, _), t in zip(self.on, self.types)]
        codes = self._codes(keys)
        matched = ~np.isnan(codes)
        position = np.full(len(codes), -1, dtype=np.int64)
        if matched.any():
            found = pc.index_in(pa.array(codes[matched].astype(np.int64)), value_set=self.codes)
            hits = found.to_numpy(zero_copy_only=False)
            hit = ~np.isnan(hits) if hits.dtype.kind == "f" else np.ones(len(hits), dtype=bool)
            where = np.nonzero(matched)[0]
            position[where[hit]] = hits[hit].astype(np.int64)
        has = position >= 0
        if self.unique:
            rows = np.arange(len(position)) if how == "left" else np.nonzero(has)[0]
            right = position[rows]
        else:
            count = np.where(has, self.counts[np.maximum(position, 0)], 0)
            repeats = np.maximum(count, 1) if how == "left" else count
            rows = np.repeat(np.arange(len(position)), repeats)
            first = np.repeat(np.where(has, self.starts[np.maximum(position, 0)], -1), repeats)
            offsets = np.arange(len(rows)) - np.repeat(np.cumsum(repeats) - repeats, repeats)
            right = np.where(first >= 0, first + offsets, -1)
        left = batch if len(rows) == batch.num_rows and how == "left" and self.unique \
            else batch.take(pa.array(rows, type=pa.int64()))
        taken = pa.array(right, type=pa.int64(), mask=right < 0)    # -1: no match, a null row
        added = [self.values.column(i).take(taken).combine_chunks() for i in range(self.values.num_columns)]
        return pa.RecordBatch.from_arrays(left.columns + added,
                                          names=left.schema.names + self.values.schema.names)


class LookupJoinOperator(StreamOperator):
    """Joins each batch with the job graph's LookupTable; stateless."""

    input_rows = None   # schemas.RowSchema for rows a chained per-row operator hands over

    def __init__(self, ctx: OperatorContext, table: LookupTable, how: str):
        super().__init__(ctx)
        self.table = table
        self.how = how

    def process(self, batch: Batch) -> None:
        record_batch = to_record_batch(batch, self.input_rows)
        self.records_in += record_batch.num_rows
        if not record_batch.num_rows:
            return
        try:
            missing = [s for s, _ in self.table.on if s not in record_batch.schema.names]
            if missing:
                raise UsageError(f"the stream's rows have no join column {missing[0]!r} (columns: "
                                 f"{record_batch.schema.names}); fix on= of lookup_join")
            result = self.table.join(record_batch, self.how)
        except pa.ArrowInvalid as exc:
            raise user_error(self, f"<RecordBatch of {record_batch.num_rows} rows>", UsageError(
                f"lookup join: the stream's key column(s) {[s for s, _ in self.table.on]} cannot be compared "
                f"with the table's {[str(t) for t in self.table.types]} ({exc}); convert the column with "
                f"map_batches before lookup_join")) from None
        except Exception as exc:
            raise user_error(self, f"<RecordBatch of {record_batch.num_rows} rows>", exc) from None
        self.output.emit(result)


@dataclass(frozen=True)
class LookupJoinOperatorFactory(OperatorFactory):
    table: LookupTable
    how: str
    input_schema: object = None     # the input stream's schemas.StreamSchema
    input_format = "batch"

    def create(self, ctx: OperatorContext) -> StreamOperator:
        operator = LookupJoinOperator(ctx, self.table, self.how)
        operator.input_rows = RowSchema(self.input_schema, ctx.name, ctx.task_name, role="input")
        return operator

    def describe(self) -> str:
        return f"lookup_join({self.how}, {self.table.num_rows} rows)"


__all__ = ["HOWS", "LookupJoinOperatorFactory", "LookupTable", "key_type"]
