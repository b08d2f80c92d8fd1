"""Non-keyed windows (`stream.window_all(assigner)`): one logical window over the whole stream.

As Flink's `windowAll`, every window_all operator holding the windows runs at parallelism 1,
keyed by one constant key (`WindowAllKey`, Flink's NullByteKeySelector), so it is the keyed
window operator (windows.py, vectorized_windows.py) unchanged: triggers, lateness, late side
output, timers, checkpoints and restore all come with it.

The vectorized `aggregate_columns` runs in two phases, as Flink's planner splits an aggregate
into a local and a global one:

* **local** (`LocalWindowAggregateOperator`, at the upstream's parallelism, no state): each
  batch is assigned to windows and reduced to one partial aggregate per window with numpy —
  ``[rows, (valid, sum, min, max) per column]``, the layout the keyed operator stores — sent as
  one small Arrow batch (columns named ``__window_all.*``).
* **global** (`GlobalWindowAggregateOperator`, parallelism 1): the keyed vectorized operator
  folding those partials into its windows and firing them on its watermark.

Lateness is the global operator's decision, as with one operator: a row is late when the
global watermark has passed its windows' cleanup time when it arrives. The global watermark is
the minimum over its inputs, so it is never ahead of the local subtask's own (the watermarks a
local subtask forwarded before a batch are all it has seen): a row none of whose windows is
late by the local watermark cannot be late at the global stage, and is pre-aggregated. A batch
with any other row (rare: only rows behind their subtask's watermark) goes on whole, as raw
rows, and the global stage judges it as a single operator would — dropping late rows, sending
them to the late side output, or re-firing a window within the allowed lateness once for the
batch (split into raw rows and partials, the batch would re-fire such a window twice).
Processing-time windows and count_distinct (whose sets must see every value) are not
pre-aggregated: the local stage forwards the batches as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from streamsnap.graph.keys import BatchKeys, KeySelector
from streamsnap.runtime.batches import Batch, num_rows, to_record_batch
from streamsnap.runtime.operators.base import OperatorContext, OperatorFactory, StreamOperator, user_error
from streamsnap.runtime.operators.timestamps_and_watermarks import batch_timestamps
from streamsnap.runtime.operators.vectorized_windows import (ColumnAggregate, VectorizedWindowOperator,
                                                             VectorizedWindowOperatorFactory,
                                                             _group_bounds, _reduce, _text_groups, is_text,
                                                             row_parts)
from streamsnap.state.key_groups import assign_key_groups
from streamsnap.time.lateness import late_windows
from streamsnap.time.watermarks import MIN_WATERMARK
from streamsnap.time.windows import WindowAssigner

PREFIX = "__window_all."
START = PREFIX + "start"
ROWS = PREFIX + "rows"
FIELDS = ("valid", "sum", "min", "max")


def all_key(row) -> int:
    """The one key of every row of a non-keyed window."""
    return 0


class WindowAllKey(KeySelector):
    """The constant key of window_all: every row has key 0, computed without Python per row."""

    def describe(self) -> str:
        return "window_all"

    def _group(self, max_parallelism: int) -> int:
        return int(assign_key_groups([0], max_parallelism)[0])

    def keys_of_rows(self, rows: list) -> list:
        return [0] * len(rows)

    def keys_of_batch(self, batch: pa.RecordBatch, rows: list) -> list:
        return [0] * batch.num_rows

    def batch_keys(self, batch: pa.RecordBatch, max_parallelism: int) -> BatchKeys:
        return BatchKeys([0], np.zeros(batch.num_rows, dtype=np.int64), [self._group(max_parallelism)])

    def key_groups(self, batch: Batch, max_parallelism: int, keys: list | None = None) -> np.ndarray:
        return np.full(num_rows(batch), self._group(max_parallelism), dtype=np.int64)


WINDOW_ALL_KEY = WindowAllKey(function=all_key)


def partial_name(field: str, column: str) -> str:
    return f"{PREFIX}{field}.{column}"


def partial_batch(batch: pa.RecordBatch, rows: np.ndarray, starts: np.ndarray, columns: tuple,
                  extreme_only: frozenset) -> pa.RecordBatch:
    """The (row, window) pairs `rows`/`starts` of `batch` reduced to one partial per window."""
    window_starts, index = np.unique(starts, return_inverse=True)
    index = index.reshape(-1)
    order = np.argsort(index, kind="stable")
    bounds = _group_bounds(index[order])
    merged = _reduce(row_parts(batch, columns, extreme_only, rows, order, bounds), bounds)
    names, arrays = partial_columns(window_starts, merged, columns)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def partial_columns(starts: np.ndarray, merged: list[np.ndarray], columns: tuple) -> tuple[list, list]:
    """The names and Arrow arrays of partials `merged` (``[rows, (valid, sum, min, max) per
    column]``, one per group) of windows `starts`: what a global stage reads (`_row_parts`)."""
    names, arrays = [START, ROWS], [pa.array(starts, pa.int64()), pa.array(merged[0], pa.int64())]
    for i, column in enumerate(columns):
        for field, values in zip(FIELDS, merged[1 + 4 * i:5 + 4 * i]):
            names.append(partial_name(field, column))
            arrays.append(pa.array(values.tolist(), pa.string()) if values.dtype == object
                          else pa.array(values))
    return names, arrays


class LocalWindowStage(StreamOperator):
    """What the local stages of window_all share (no state): the input watermark, which decides
    which rows may be late at the global stage (module docstring), and the batch loop; a stage
    that cannot pre-reduce (`reduces` False) forwards its batches as they are."""

    reduces = True

    def __init__(self, ctx: OperatorContext, assigner: WindowAssigner, allowed_lateness: int, timestamps):
        super().__init__(ctx)
        self.assigner = assigner
        self.size = getattr(assigner, "size_ms", None)     # (sessions have no size)
        self.allowed_lateness = allowed_lateness
        self.timestamps = timestamps
        self._watermark = MIN_WATERMARK

    def process(self, batch: Batch) -> None:
        record_batch = to_record_batch(batch)
        n = record_batch.num_rows
        self.records_in += n
        if not n:
            return
        if not self.reduces or self.skips():
            self.output.emit(record_batch)
            return
        try:
            self.reduce_times(record_batch, batch_timestamps(record_batch, self.timestamps, self.ctx.name))
        except Exception as exc:
            raise user_error(self, f"<RecordBatch of {n} rows, first row "
                                   f"{record_batch.slice(0, 1).to_pylist()}>", exc) from None

    def skips(self) -> bool:
        """Whether to send this batch on as it is without trying to reduce it."""
        return False

    def reduce_times(self, batch: pa.RecordBatch, times: np.ndarray) -> None:
        """Emit what the global stage needs of `batch`, whose rows' event times are `times`:
        assigned to their windows for `reduce` (session stages merge them instead)."""
        rows, starts = self.assigner.assign_window_starts(times)
        self.reduce(batch, rows, starts, late_windows(starts + self.size, self.allowed_lateness, self._watermark))

    def reduce(self, batch: pa.RecordBatch, rows: np.ndarray, starts: np.ndarray, maybe_late: np.ndarray) -> None:
        """Emit what the global stage needs of `batch`, whose (row, window) pairs are `rows`,
        `starts`; `maybe_late`: the pairs whose window is late by this subtask's watermark."""
        raise NotImplementedError

    def process_watermark(self, timestamp: int) -> None:
        self._watermark = max(self._watermark, timestamp)
        self.output.emit_watermark(timestamp)


class LocalWindowAggregateOperator(LocalWindowStage):
    """Phase one: each batch's rows reduced to one partial aggregate per window (numpy), the
    rows that may be late at the global stage forwarded as they are (module docstring)."""

    def __init__(self, ctx: OperatorContext, assigner: WindowAssigner, allowed_lateness: int,
                 aggregates: tuple[ColumnAggregate, ...], timestamps):
        super().__init__(ctx, assigner, allowed_lateness, timestamps)
        self.columns, self.extreme_only = _columns_of(aggregates)
        self.reduces = assigner.is_event_time and not any(a.function == "count_distinct" for a in aggregates)

    def reduce(self, batch: pa.RecordBatch, rows: np.ndarray, starts: np.ndarray, maybe_late: np.ndarray) -> None:
        if maybe_late.any():     # judged at the global stage as one batch (module docstring)
            self.output.emit(batch)
        elif len(rows):
            self.output.emit(partial_batch(batch, rows, starts, self.columns, self.extreme_only))


def _columns_of(aggregates: tuple[ColumnAggregate, ...]) -> tuple[tuple, frozenset]:
    """The columns the partials carry and those only min/max take (may be strings), in the
    order `VectorizedWindowOperator` keeps them."""
    columns = tuple(dict.fromkeys(a.column for a in aggregates
                                  if a.column is not None and a.function != "count_distinct"))
    return columns, frozenset(c for c in columns if all(
        a.function in ("min", "max") for a in aggregates if a.column == c))


class GlobalWindowAggregateOperator(VectorizedWindowOperator):
    """Phase two (parallelism 1): the vectorized window operator under the constant key,
    folding the local partials (and judging the raw rows) into its windows; its output rows
    have no key column."""

    def process(self, batch: Batch) -> None:
        record_batch = to_record_batch(batch)
        if START not in record_batch.schema.names:
            super().process(record_batch)      # raw rows: judged and folded one by one
            return
        n = record_batch.num_rows
        if not n:
            return
        starts = record_batch.column(START).to_numpy()
        counts = record_batch.column(ROWS).to_numpy()
        self.records_in += int(counts.sum())
        rows = np.arange(n, dtype=np.int64)
        late = late_windows(starts + self.size, self.allowed_lateness, self._watermark)
        if late.any():    # not expected (module docstring); dropped as late pairs would be
            self.num_late_records_dropped += int(counts[late].sum())
            rows = rows[~late]
        if len(rows):
            self._fold(record_batch, self.key.batch_keys(record_batch, self.ctx.max_parallelism),
                       rows, starts[rows])
        self._flush([])

    def _row_parts(self, batch: pa.RecordBatch, rows: np.ndarray, order: np.ndarray,
                   bounds: np.ndarray) -> list[np.ndarray]:
        if START not in batch.schema.names:
            return super()._row_parts(batch, rows, order, bounds)
        take = rows[order]
        parts = [batch.column(ROWS).to_numpy()[take]]
        for c in self.columns:
            valid, sums, low, high = (batch.column(partial_name(f, c)) for f in FIELDS)
            valid = valid.to_numpy()[take]
            if is_text(low.type):     # per group already, as _reduce takes string columns
                parts += [np.add.reduceat(valid, bounds), np.zeros(len(bounds), dtype=np.int64),
                          _text_groups(low, take, bounds)[2], _text_groups(high, take, bounds)[3]]
                continue
            parts += [valid, sums.to_numpy()[take], low.to_numpy()[take], high.to_numpy()[take]]
        return parts

    def _output(self, keys: list, starts: np.ndarray, merged: list[np.ndarray]) -> None:
        first = len(self._out)
        super()._output(keys, starts, merged)
        self._out[first:] = [part.drop_columns(["key"]) for part in self._out[first:]]   # (the constant key)


@dataclass(frozen=True)
class LocalWindowAggregateOperatorFactory(OperatorFactory):
    assigner: WindowAssigner
    allowed_lateness: int
    aggregates: tuple[ColumnAggregate, ...]
    timestamps: object = None
    input_format = "batch"

    def create(self, ctx: OperatorContext) -> LocalWindowAggregateOperator:
        return LocalWindowAggregateOperator(ctx, self.assigner, self.allowed_lateness, self.aggregates,
                                            self.timestamps)

    def describe(self) -> str:
        return f"window_all({type(self.assigner).__name__}).aggregate_columns (local)"


@dataclass(frozen=True)
class GlobalWindowAggregateOperatorFactory(VectorizedWindowOperatorFactory):
    def create(self, ctx: OperatorContext) -> GlobalWindowAggregateOperator:
        return GlobalWindowAggregateOperator(ctx, self.key, self.assigner, self.allowed_lateness,
                                             self.aggregates, self.late_tag, self.timestamps, self.declared)

    def describe(self) -> str:
        return f"window_all({type(self.assigner).__name__}).aggregate_columns (global)"


__all__ = ["WINDOW_ALL_KEY", "WindowAllKey", "LocalWindowStage", "LocalWindowAggregateOperator", "GlobalWindowAggregateOperator",
           "LocalWindowAggregateOperatorFactory", "GlobalWindowAggregateOperatorFactory", "partial_batch",
           "partial_columns"]
