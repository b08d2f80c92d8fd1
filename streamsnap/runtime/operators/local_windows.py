"""Local/global aggregation of keyed windows: `key_by(...).window(...).aggregate_columns(...)`
in two phases, as Flink's planner splits a window aggregate into a local and a global one
(and Spark a partial aggregate before its exchange).

* **local** (`LocalKeyedWindowAggregateOperator`, chained to the upstream, no state): each
  batch's rows are reduced to one partial per (key, window) with numpy, sent with the key
  columns as they were (so the key's partitioner routes them unchanged) plus the window start,
  the row count and ``(valid, sum, min, max)`` per input column — window_all's partial layout.
  The shuffle and the keyed stage then see one row per (key, window) and batch instead of one
  per event: Nexmark's bids hit a few hundred (auction, day) pairs per batch of 8,192.
* **global** (`KeyedGlobalWindowAggregateOperator`): the keyed vectorized window operator,
  folding partials into its windows. Its state is the one-phase operator's, under the same
  uid, so a savepoint of either restores into the other.

Session windows split the same way (`LocalSessionAggregateOperator`,
`KeyedGlobalSessionAggregateOperator`): the local stage merges each key's rows of a batch into
the sessions they form on their own and sends one partial per session with its start and end;
the global one merges those intervals with the stored sessions as it merges rows' windows.
Session merging is associative, so this is the merge of the batch's rows as a set, which is
what the one-phase operator computes (Spark merges sessions in each partition before its
shuffle, too).

Lateness stays the global operator's decision. Its watermark is the minimum over the local
subtasks, never ahead of the one a local subtask has seen, so a pair (row, window) on time there
is on time at the global stage (and a session, which only grows there). A batch with a pair (a
session) the local watermark already passed is forwarded as it is, and the global stage judges
it exactly as in one phase: which rows go to the late side output, and one refiring per batch
of a window within the allowed lateness (splitting the batch into raw rows and partials would
refire such a window twice). A batch whose keys barely repeat (fewer than four rows per group)
is forwarded as it is too, and so are the next few (`LocalKeyedStage`): pre-reducing it would
cost the local stage a sort and save the global one nothing (Spark gives up a partial
aggregate that does not reduce in the same way). Key functions, processing time and
count_distinct are not split (`splits`), nor sliding windows kept as slices (sliced_windows.py):
their operator runs in one phase.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.batches import Batch, to_record_batch
from streamsnap.runtime.operators.base import OperatorContext, OperatorFactory, user_error
from streamsnap.runtime.operators.vectorized_sessions import (VectorizedSessionOperator, VectorizedSessionOperatorFactory,
                                                              single_row_parts)
from streamsnap.runtime.operators.vectorized_windows import (ColumnAggregate, VectorizedWindowOperator,
                                                             VectorizedWindowOperatorFactory, _group_bounds,
                                                             _reduce, row_parts)
from streamsnap.runtime.operators.window_all import (FIELDS, ROWS, START, GlobalWindowAggregateOperator,
                                                     LocalWindowStage, _columns_of, partial_columns, partial_name)
from streamsnap.time.lateness import late_windows
from streamsnap.time.session_merge import merge_sessions
from streamsnap.time.windows import WindowAssigner

END = "__window_all.end"    # a local session's end (its start is START)

REDUCTION = 4     # rows per (key, window) group a batch needs for its partials to be sent
MAX_SKIP = 64     # batches sent on untried, at most, after one that did not reduce


def splits(key: KeySelector, assigner: WindowAssigner, aggregates) -> bool:
    """Whether this keyed window aggregate runs in two phases (module docstring)."""
    return (key.function is None and assigner.is_event_time
            and all(a.function != "count_distinct" for a in aggregates))


def key_codes(batch: pa.RecordBatch, columns: tuple) -> np.ndarray:
    """Each row's key as an int (equal keys, equal codes; null is a key), no Python per row."""
    codes = None
    for name in columns:
        column = batch.column(batch.schema.get_field_index(name))
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        encoded = pc.dictionary_encode(column, null_encoding="encode")
        index = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        if codes is None:
            codes = index
        else:     # (re-coded after each column, so codes stay below the batch's rows)
            codes = np.unique(codes * len(encoded.dictionary) + index, return_inverse=True)[1].reshape(-1)
    return codes


class LocalKeyedStage(LocalWindowStage):
    """What the keyed local stages share: a batch whose keys barely repeat is sent on as it
    is, and so are the next ones, a number that doubles (up to `MAX_SKIP`) while batches keep
    not repeating, so a stream whose keys never repeat costs the local stage next to nothing
    (the counting Spark does before it gives up a partial aggregate)."""

    def __init__(self, ctx: OperatorContext, key: KeySelector, assigner: WindowAssigner, allowed_lateness: int,
                 aggregates: tuple[ColumnAggregate, ...], timestamps):
        super().__init__(ctx, assigner, allowed_lateness, timestamps)
        self.key = key
        self.columns, self.extreme_only = _columns_of(aggregates)
        self.reduces = splits(key, assigner, aggregates)
        self._skip = 0        # batches still to send on without trying
        self._backoff = 1     # batches to skip after the next one that does not reduce

    def skips(self) -> bool:
        if self._skip:
            self._skip -= 1
            return True
        return False

    def _reduces(self, groups: int, rows: int) -> bool:
        """Whether `rows` in `groups` are worth pre-reducing; if not, skip the next batches."""
        if groups * REDUCTION <= rows:
            self._backoff = 1
            return True
        self._skip, self._backoff = self._backoff, min(2 * self._backoff, MAX_SKIP)
        return False


class LocalKeyedWindowAggregateOperator(LocalKeyedStage):
    """Phase one: a batch's rows reduced to one partial per (key, window)."""

    def reduce(self, batch: pa.RecordBatch, rows: np.ndarray, starts: np.ndarray, maybe_late: np.ndarray) -> None:
        if maybe_late.any():        # judged at the global stage as one batch (module docstring)
            self.output.emit(batch)
            return
        window_starts, window_index = np.unique(starts, return_inverse=True)
        codes = key_codes(batch, self.key.columns)[rows] * len(window_starts) + window_index.reshape(-1)
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        bounds = _group_bounds(sorted_codes)
        if not self._reduces(len(bounds), len(rows)):    # barely repeating keys: the rows as they are
            self.output.emit(batch)
            return
        merged = _reduce(row_parts(batch, self.columns, self.extreme_only, rows, order, bounds), bounds)
        first = pa.array(rows[order[bounds]])
        names, arrays = partial_columns(window_starts[sorted_codes[bounds] % len(window_starts)], merged,
                                        self.columns)
        keys = [batch.column(batch.schema.get_field_index(c)).take(first) for c in self.key.columns]
        self.output.emit(pa.RecordBatch.from_arrays(keys + arrays, names=list(self.key.columns) + names))


class LocalSessionAggregateOperator(LocalKeyedStage):
    """Phase one of session windows: each key's rows of a batch merged into the sessions they
    form on their own (`merge_sessions`), one partial per session with its start and end."""

    def reduce_times(self, batch: pa.RecordBatch, times: np.ndarray) -> None:
        merged = merge_sessions(key_codes(batch, self.key.columns), times, times + self.assigner.gap_ms)
        if late_windows(merged.end, self.allowed_lateness, self._watermark).any() or \
                not self._reduces(len(merged), len(times)):
            self.output.emit(batch)     # as it is (module docstring)
            return
        totals = _reduce([p[merged.order] for p in single_row_parts(batch, self.columns)], merged.bounds)
        first = pa.array(merged.order[merged.bounds])
        names, arrays = partial_columns(merged.start, totals, self.columns)
        keys = [batch.column(batch.schema.get_field_index(c)).take(first) for c in self.key.columns]
        self.output.emit(pa.RecordBatch.from_arrays(keys + arrays + [pa.array(merged.end, pa.int64())],
                                                    names=list(self.key.columns) + names + [END]))


class KeyedGlobalSessionAggregateOperator(VectorizedSessionOperator):
    """Phase two of session windows: the session operator merging the local stages' sessions
    (and the batches they sent on as they were) into its keys' sessions."""

    def process(self, batch: Batch) -> None:
        record_batch = to_record_batch(batch)
        if END not in record_batch.schema.names:
            super().process(record_batch)
            return
        if not record_batch.num_rows:
            return
        counts = record_batch.column(ROWS).to_numpy()
        self.records_in += int(counts.sum())
        parts = [counts]
        for c in self.columns:
            parts += [record_batch.column(partial_name(f, c)).to_numpy() for f in FIELDS]
        try:
            keys = self.key.batch_keys(record_batch, self.ctx.max_parallelism)
            late = self._fold(keys, record_batch.column(START).to_numpy(), record_batch.column(END).to_numpy(),
                              parts)
        except Exception as exc:
            raise user_error(self, f"<{record_batch.num_rows} local sessions, first "
                                   f"{record_batch.slice(0, 1).to_pylist()}>", exc) from None
        self.num_late_records_dropped += int(counts[late].sum())   # none expected (module docstring)
        self._flush([])


class KeyedGlobalWindowAggregateOperator(GlobalWindowAggregateOperator):
    """Phase two: the keyed vectorized window operator folding the local partials (and judging
    the raw rows); its rows keep their key columns."""

    def _output(self, keys: list, starts: np.ndarray, merged: list[np.ndarray],
                ends: np.ndarray | None = None) -> None:
        VectorizedWindowOperator._output(self, keys, starts, merged, ends)


@dataclass(frozen=True)
class LocalKeyedWindowAggregateOperatorFactory(OperatorFactory):
    key: KeySelector
    assigner: WindowAssigner
    allowed_lateness: int
    aggregates: tuple[ColumnAggregate, ...]
    timestamps: object = None
    input_format = "batch"

    def create(self, ctx: OperatorContext) -> LocalKeyedWindowAggregateOperator:
        return LocalKeyedWindowAggregateOperator(ctx, self.key, self.assigner, self.allowed_lateness,
                                                 self.aggregates, self.timestamps)

    def describe(self) -> str:
        return f"window({type(self.assigner).__name__}).aggregate_columns (local)"


@dataclass(frozen=True)
class LocalSessionAggregateOperatorFactory(LocalKeyedWindowAggregateOperatorFactory):
    def create(self, ctx: OperatorContext) -> LocalSessionAggregateOperator:
        return LocalSessionAggregateOperator(ctx, self.key, self.assigner, self.allowed_lateness,
                                             self.aggregates, self.timestamps)


@dataclass(frozen=True)
class KeyedGlobalSessionAggregateOperatorFactory(VectorizedWindowOperatorFactory):
    def create(self, ctx: OperatorContext) -> KeyedGlobalSessionAggregateOperator:
        return KeyedGlobalSessionAggregateOperator(ctx, self.key, self.assigner, self.allowed_lateness,
                                                   self.aggregates, self.late_tag, self.timestamps, self.declared)


@dataclass(frozen=True)
class KeyedGlobalWindowAggregateOperatorFactory(VectorizedWindowOperatorFactory):
    def create(self, ctx: OperatorContext) -> KeyedGlobalWindowAggregateOperator:
        return KeyedGlobalWindowAggregateOperator(ctx, self.key, self.assigner, self.allowed_lateness,
                                                  self.aggregates, self.late_tag, self.timestamps, self.declared)


# The one-phase factory -> (its local stage's, its global stage's).
TWO_PHASES = {VectorizedWindowOperatorFactory: (LocalKeyedWindowAggregateOperatorFactory,
                                                KeyedGlobalWindowAggregateOperatorFactory),
              VectorizedSessionOperatorFactory: (LocalSessionAggregateOperatorFactory,
                                                 KeyedGlobalSessionAggregateOperatorFactory)}

__all__ = ["TWO_PHASES", "LocalKeyedWindowAggregateOperator", "KeyedGlobalWindowAggregateOperator",
           "LocalKeyedWindowAggregateOperatorFactory", "KeyedGlobalWindowAggregateOperatorFactory",
           "LocalSessionAggregateOperator", "KeyedGlobalSessionAggregateOperator",
           "LocalSessionAggregateOperatorFactory", "KeyedGlobalSessionAggregateOperatorFactory",
           "key_codes", "splits"]
