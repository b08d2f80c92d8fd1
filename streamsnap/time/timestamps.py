"""Reading event timestamps (int64 epoch milliseconds) out of Arrow record batches.

A column name is the vectorized path: the column is validated and converted with Arrow/numpy
kernels, no Python per row. Arrow timestamp columns of any unit are converted to milliseconds
(flooring, so an instant just before a millisecond boundary stays in the earlier one). A
function of the row is the flexible path and runs per row. Bad data fails with the field, the
first offending row and what to do, because a missing timestamp silently becoming 0 or
"now" would put events into wrong windows without anyone noticing.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from numbers import Integral

import numpy as np
import pyarrow as pa

from streamsnap.errors import DataError, describe_row

_UNIT_DIVISOR = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}   # None: multiply by 1000
_INT64_MAX = 2 ** 63 - 1
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)

Batch = pa.RecordBatch | pa.Table


class TimestampError(DataError, ValueError):
    """A record's event timestamp is missing or not an integer number of milliseconds.

    A DataError: the replay after a restart meets the same record again. The message names
    the record itself, not its index in a batch (batches are cut anew on every run); the source
    operator adds the record's source position (split, offset)."""


_WINDOW_END_FIX = ("keep window_end in what follows the window aggregate, or assign timestamps anew with "
                   "assign_timestamps_and_watermarks")


class WindowEndTimestamps:
    """The event time of a window's result rows: the window's last millisecond, `window_end - 1`
    (Flink's `window.maxTimestamp()`). The vectorized window aggregates give their output this
    assigner, so an event-time operator after them (a second window over the results, a
    `window_top_n`, timers) reads each result's time from its `window_end` column.

    `size_ms`: the length of every window of the results (tumbling and sliding windows), None
    when it varies (sessions); with it, `window_top_n` knows each result's window from its time.
    """

    column = "window_end"

    def __init__(self, size_ms: int | None = None):
        self.size_ms = size_ms

    def __call__(self, row: dict) -> int:
        if self.column not in row:
            raise _error(None, self.column, row, None,
                         "the row has no 'window_end' column, which a window result's timestamp is read from",
                         _WINDOW_END_FIX)
        return int(row[self.column]) - 1

    def __eq__(self, other) -> bool:
        return isinstance(other, WindowEndTimestamps) and other.size_ms == self.size_ms

    def __hash__(self) -> int:
        return hash((WindowEndTimestamps, self.size_ms))

    def __repr__(self) -> str:
        return "window_end - 1"


def _where(operator: str | None) -> str:
    return f"operator '{operator}': " if operator else ""


def _error(operator: str | None, field: str | None, record, index: int | None, problem: str,
           fix: str) -> TimestampError:
    row = "" if record is None else f"\n  row: {describe_row(record)}"
    error = TimestampError(f"{_where(operator)}{problem}{row}\n  fix: {fix}", operator=operator,
                           field=field, row=record)
    error.batch_index = index
    return error


def _row(batch: Batch, index: int) -> dict:
    return batch.slice(index, 1).to_pylist()[0]


def extract_timestamps(batch: Batch, assigner: str | Callable[[dict], int],
                       operator: str | None = None) -> np.ndarray:
    """The event timestamps of `batch` as an int64 numpy array (epoch milliseconds).

    `assigner` is a column name (an integer column of milliseconds or an Arrow timestamp
    column) or a function of the row (a dict) returning an int. `operator` names the operator
    in error messages.
    """
    if isinstance(assigner, str):
        return _from_column(batch, assigner, operator)
    if isinstance(assigner, WindowEndTimestamps):
        if assigner.column not in batch.schema.names:
            raise _error(operator, assigner.column, _row(batch, 0) if batch.num_rows else None, 0,
                         f"the window result's timestamp column 'window_end' is missing; the records have "
                         f"columns {batch.schema.names}",
                         _WINDOW_END_FIX)
        return _from_column(batch, assigner.column, operator) - 1
    if callable(assigner):
        return _from_function(batch, assigner, operator)
    raise TimestampError(f"{_where(operator)}timestamp assigner must be a column name or a function "
                         f"of the row, got {assigner!r}: fix the argument of with_timestamp_assigner",
                         operator=operator)


def _from_column(batch: Batch, field: str, operator: str | None) -> np.ndarray:
    names = batch.schema.names
    if field not in names:
        raise _error(operator, field, _row(batch, 0) if batch.num_rows else None, 0,
                     f"the timestamp column '{field}' is missing; the records have columns {names}",
                     "fix the name given to with_timestamp_assigner or add the column")
    column = batch.column(names.index(field))
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise _error(operator, field, _row(batch, row), row,
                     f"timestamp column '{field}' is null; every record needs an event timestamp",
                     "fill the nulls or drop those rows (e.g. with filter) before assigning timestamps")
    kind = column.type
    if pa.types.is_timestamp(kind):
        raw = column.cast(pa.int64()).to_numpy()
        divisor = _UNIT_DIVISOR[kind.unit]
        return raw * 1000 if divisor is None else raw // divisor
    if pa.types.is_integer(kind):
        values = column.to_numpy()
        if values.dtype == np.uint64 and len(values) and values.max() > _INT64_MAX:
            row = int(np.flatnonzero(values > _INT64_MAX)[0])
            raise _error(operator, field, _row(batch, row), row,
                         f"timestamp column '{field}' holds {int(values[row])}, beyond int64 milliseconds",
                         "give timestamps as int64 epoch milliseconds")
        return values.astype(np.int64, copy=False)
    row, value = _first_non_integer(column)
    raise _error(operator, field, _row(batch, row) if len(column) else None, row,
                 f"timestamp column '{field}' has type {kind}, not integer milliseconds (first "
                 f"offending value: {value!r})",
                 "cast it to int64 epoch milliseconds or to an Arrow timestamp, e.g. pc.cast(column, pa.int64())")


def _first_non_integer(column: pa.Array) -> tuple[int, object]:
    if pa.types.is_floating(column.type) and len(column):
        values = column.to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(~np.isfinite(values) | (np.floor(values) != values))
        row = int(bad[0]) if len(bad) else 0
        return row, values[row].item()
    return 0, (column[0].as_py() if len(column) else None)


def epoch_millis(value: object) -> int | None:
    """`value` as an int64 of epoch milliseconds, or None when it is not one. A `datetime` counts
    (naive ones as UTC, as Arrow's zone-less timestamps are): a timestamp column reaches per-row
    functions as datetimes, and the per-row path must accept what the columnar one does."""
    if isinstance(value, Integral) and not isinstance(value, bool):   # the per-row hot path first
        value = int(value)
        return value if -(2 ** 63) <= value <= _INT64_MAX else None
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return (value - _EPOCH) // datetime.timedelta(milliseconds=1)
    return None


def _from_function(batch: Batch, assigner: Callable[[dict], int],
                   operator: str | None) -> np.ndarray:
    out = np.empty(batch.num_rows, dtype=np.int64)
    for row, record in enumerate(batch.to_pylist()):
        out[row] = assign_timestamp(assigner, record, operator, row)
    return out


def assign_timestamp(assigner: str | Callable[[dict], int], record: dict,
                     operator: str | None = None, row: int | None = None) -> int:
    """The timestamp of one record (the per-row path), validated like `extract_timestamps`.
    `row`: the record's index in its batch, for the source operator to locate it."""
    if isinstance(assigner, str):
        if assigner not in record:
            raise _error(operator, assigner, record, row, f"the timestamp field '{assigner}' is missing",
                         "fix the name given to with_timestamp_assigner, or give every row the field")
        value = record[assigner]
        ts = epoch_millis(value)
        if ts is None:
            what = "None" if value is None else f"{value!r} ({type(value).__name__})"
            raise _error(operator, assigner, record, row,
                         f"timestamp field '{assigner}' is {what}, not an int of epoch milliseconds",
                         "give every row an int timestamp (e.g. int(dt.timestamp() * 1000)), or drop rows "
                         "without one (filter) before assigning timestamps")
        return ts
    value = assigner(record)
    ts = epoch_millis(value)
    if ts is None:
        raise _error(operator, None, record, row,
                     f"the timestamp assigner {assigner!r} returned {value!r} ({type(value).__name__})",
                     "make it return an int of epoch milliseconds (e.g. int(dt.timestamp() * 1000))")
    return ts
