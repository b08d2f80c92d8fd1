"""Vectorized windowed aggregation: sum/count/min/max/mean per key and window on Arrow batches.

`keyed.window(TumblingEventTimeWindows.of(60)).aggregate_columns({...})` (or `.sum(col)`,
`.count()`, ...) runs here instead of the per-row window operator. A batch is factorized by
key (Arrow), assigned to windows (`assign_window_starts`, numpy), split into late and on-time
rows (`late_windows`), and reduced per (key, window) group with sort + `ufunc.reduceat` — no
Python per row. Python runs once per group, to fold the batch's partial aggregate into the
window's state and ask the trigger, and once per fired window.

Partial aggregates are what the state holds, so windows of any size cost the same: per
window ``[rows, (valid, sum, min, max) per input column]``. They live in the same
``_window.contents`` MapState, timers and cleanup as the per-row operator, which this one
extends: checkpoints, restore and rescaling work the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.batches import Batch, to_record_batch
from streamsnap.runtime.operators import OperatorContext, OperatorFactory, current_millis, user_error
from streamsnap.runtime.timestamps_operator import batch_timestamps
from streamsnap.runtime.window_operator import WindowOperator
from streamsnap.time.lateness import late_windows
from streamsnap.time.windows import TimeWindow, WindowAssigner

AGGREGATES = ("sum", "count", "min", "max", "mean")


@dataclass(frozen=True)
class ColumnAggregate:
    """`output` = `function` over `column` (None for count, which counts rows)."""

    output: str
    function: str
    column: str | None


def _merge_partials(a: list | None, b: list) -> list:
    """Fold two partial aggregates ``[rows, valid, sum, min, max, valid, sum, ...]``."""
    if a is None:
        return b
    out = [a[0] + b[0]]
    for i in range(1, len(a), 4):
        low = [v for v in (a[i + 2], b[i + 2]) if v is not None]
        high = [v for v in (a[i + 3], b[i + 3]) if v is not None]
        out += [a[i] + b[i], a[i + 1] + b[i + 1], min(low) if low else None,
                max(high) if high else None]
    return out


def _group_stats(column: pa.Array, rows: np.ndarray, order: np.ndarray, starts: np.ndarray
                 ) -> tuple[list, list, list, list]:
    """(valid count, sum, min, max) per group of `column`'s `rows`, groups given by `starts`
    into the `order`ed rows; min/max are None for groups without a valid value."""
    if pa.types.is_boolean(column.type):
        column = pc.cast(column, pa.int64())
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise TypeError(f"column of type {column.type} cannot be aggregated; sum/min/max/mean "
                        f"take integer, float or boolean columns")
    valid = column.is_valid().to_numpy(zero_copy_only=False)[rows][order]
    values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)[rows][order]
    if values.dtype.kind == "f":
        highest, lowest = np.inf, -np.inf
    else:
        values = values.astype(np.int64, copy=False)
        highest, lowest = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    counts = np.add.reduceat(valid.astype(np.int64), starts)
    sums = np.add.reduceat(values, starts)
    mins = np.minimum.reduceat(np.where(valid, values, highest), starts)
    maxs = np.maximum.reduceat(np.where(valid, values, lowest), starts)
    counts_list = counts.tolist()
    return (counts_list, sums.tolist(),
            [m if c else None for m, c in zip(mins.tolist(), counts_list)],
            [m if c else None for m, c in zip(maxs.tolist(), counts_list)])


class VectorizedWindowOperator(WindowOperator):
    """Column aggregates per key and tumbling/sliding window, computed batch at a time."""

    def __init__(self, ctx: OperatorContext, key: KeySelector, assigner: WindowAssigner,
                 allowed_lateness: int, aggregates: tuple[ColumnAggregate, ...],
                 late_tag: str | None = None, timestamps=None):
        super().__init__(ctx, key, assigner, assigner.default_trigger(), allowed_lateness,
                         contents=None, late_tag=late_tag, timestamps=timestamps)
        self.aggregates = aggregates
        self.columns = tuple(dict.fromkeys(a.column for a in aggregates if a.column is not None))
        self.size = assigner.size

    def process(self, batch: Batch) -> None:
        record_batch = to_record_batch(batch)
        n = record_batch.num_rows
        self.records_in += n
        if not n:
            return
        try:
            keys = self.key.batch_keys(record_batch, self.ctx.max_parallelism)
        except Exception as exc:
            raise user_error(self, record_batch.slice(0, 1).to_pylist()[0], exc) from None
        if self.event_time:
            times = batch_timestamps(record_batch, self.timestamps, self.ctx.name)
        else:
            times = np.full(n, current_millis(self.ctx.clock), dtype=np.int64)
        rows, starts = self.assigner.assign_window_starts(times)
        if self.event_time:
            self._split_late(record_batch, times, rows, starts)
            on_time = ~late_windows(starts + self.size, self.allowed_lateness,
                                    self.timer_service.current_watermark)
            rows, starts = rows[on_time], starts[on_time]
        if len(rows):
            try:
                self._fold(record_batch, keys, rows, starts)
            except Exception as exc:
                raise user_error(self, f"<RecordBatch of {n} rows, first row "
                                       f"{record_batch.slice(0, 1).to_pylist()}>", exc) from None
        self._flush([])

    def _split_late(self, batch: pa.RecordBatch, times: np.ndarray, rows: np.ndarray,
                    starts: np.ndarray) -> None:
        """Rows whose every window is past its cleanup time and that are themselves late go to
        the late side output, or are dropped and counted."""
        watermark = self.timer_service.current_watermark
        late = late_windows(starts + self.size, self.allowed_lateness, watermark)
        if not late.any():
            return
        has_window = np.zeros(len(times), dtype=bool)
        has_window[rows[~late]] = True
        skipped = ~has_window & (times + self.allowed_lateness <= watermark)
        if not skipped.any():
            return
        if self.late_tag is None:
            self.num_late_records_dropped += int(skipped.sum())
        else:
            self.output.emit_side(self.late_tag, batch.filter(pa.array(skipped)).to_pylist())

    def _fold(self, batch: pa.RecordBatch, keys, rows: np.ndarray, starts: np.ndarray) -> None:
        window_starts, window_index = np.unique(starts, return_inverse=True)
        groups = keys.index[rows] * len(window_starts) + window_index
        order = np.argsort(groups, kind="stable")
        ordered = groups[order]
        bounds = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        sizes = np.diff(np.r_[bounds, len(ordered)]).tolist()
        stats = [_group_stats(batch.column(batch.schema.get_field_index(c)), rows, order, bounds)
                 for c in self.columns]
        first = ordered[bounds]
        group_keys = (first // len(window_starts)).tolist()
        group_starts = window_starts[first % len(window_starts)].tolist()
        set_key = self.keyed_backend.set_current_key
        contents, trigger, context = self.contents, self.trigger, self.trigger_context
        for g, (k, start) in enumerate(zip(group_keys, group_starts)):
            partial = [sizes[g]]
            for valid, sums, mins, maxs in stats:
                partial += [valid[g], sums[g], mins[g], maxs[g]]
            key = keys.unique[k]
            set_key(key, keys.key_groups[k])
            window = TimeWindow(start, start + self.size)
            ns = (start, start + self.size)
            merged = _merge_partials(contents.get(ns), partial)
            contents.put(ns, merged)
            context.window = window
            self._act(trigger.on_element(None, None, window, context), key, window, ns, merged)
            self._register_cleanup_timer(window)

    def _emit(self, key, window: TimeWindow, contents: list) -> None:
        row = dict(zip(self.key.columns, key if len(self.key.columns) > 1 else (key,))) \
            if self.key.function is None else {"key": key}
        row["window_start"], row["window_end"] = window.start, window.end
        position = {c: 1 + 4 * i for i, c in enumerate(self.columns)}
        for aggregate in self.aggregates:
            if aggregate.function == "count":
                row[aggregate.output] = contents[0]
                continue
            i = position[aggregate.column]
            valid, total, low, high = contents[i:i + 4]
            row[aggregate.output] = {
                "sum": total if valid else None, "min": low, "max": high,
                "mean": total / valid if valid else None}[aggregate.function]
        self._out.append(row)


@dataclass(frozen=True)
class VectorizedWindowOperatorFactory(OperatorFactory):
    key: KeySelector
    assigner: WindowAssigner
    allowed_lateness: int
    aggregates: tuple[ColumnAggregate, ...]
    late_tag: str | None = None
    timestamps: object = None
    keyed = True
    input_format = "batch"

    def create(self, ctx: OperatorContext) -> VectorizedWindowOperator:
        return VectorizedWindowOperator(ctx, self.key, self.assigner, self.allowed_lateness,
                                        self.aggregates, self.late_tag, self.timestamps)

    def describe(self) -> str:
        return f"window({type(self.assigner).__name__}).aggregate_columns"


__all__ = ["AGGREGATES", "ColumnAggregate", "VectorizedWindowOperator",
           "VectorizedWindowOperatorFactory"]
