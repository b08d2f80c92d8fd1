"""Sliding-window column aggregates kept as slices: one state entry per (key, slice), not per
(key, window).

A row of a sliding window of `size` every `slide` is in ``size / slide`` windows; the
per-window operator (vectorized_windows.py) reads and writes each of them per batch. Here the
windows are cut into slices of `slide` (Flink's slice sharing, `SliceSharedAssigner`): a batch
adds its rows to one entry per (key, slice) — ``[rows, (valid, sum, min, max) per column]``,
the per-window layout without the pending flag — and a window's result is merged from its
slices, in bulk, when time passes its end. Each slice is read once by each window it is in
and deleted after the last; the index of slices (`SliceIndex`, in memory, rebuilt from the
state on restore) says which keys and slices a due window merges.

Used for sliding windows whose size is a multiple of the slide, with no allowed lateness and
no count_distinct (`api/windowing.py` picks it): a window with allowed lateness re-fires for
late rows, and a distinct count is not the sum of its slices', so those keep per-window state.

Which windows have fired is not implied by the slices (a slice outlives the first windows it
is in), so it is checkpointed: each subtask stores its progress — the time up to which its
windows are done — for its key groups in union list state. On restore every key group takes
the progress of the subtask that owned it, and a window ending at or before that never fires
again; after a rescale that merged subtasks at different progress, the key groups that were
ahead skip the windows they already fired.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from streamsnap.errors import ConfigurationError
from streamsnap.runtime.operators.process import ProcessOperator
from streamsnap.runtime.operators.seen_filter import FiltersByStart, name_hashes
from streamsnap.runtime.operators.vectorized_windows import (SLICES, WINDOWS, VectorizedWindowOperator,
                                                             VectorizedWindowOperatorFactory, _fold_stored,
                                                             _group_bounds, _Keys, _reduce, _TimerView,
                                                             _Unchecked)
from streamsnap.state.descriptors import ValueStateDescriptor
from streamsnap.time.slice_index import DueSlices, SliceIndex
from streamsnap.time.watermarks import MIN_WATERMARK
from streamsnap.time.windows import WindowAssigner, window_starts

PROGRESS = "_window.progress"


def sliceable(assigner: WindowAssigner, allowed_lateness: int, aggregates) -> bool:
    """Whether `SlicedWindowOperator` computes these aggregates (see the module docstring)."""
    slide = getattr(assigner, "slide_ms", None)
    return (slide is not None and assigner.size_ms % slide == 0 and assigner.size_ms > slide
            and allowed_lateness == 0 and all(a.function != "count_distinct" for a in aggregates))


def _text_extremes(valid: np.ndarray, values: np.ndarray, bounds: np.ndarray, pick) -> np.ndarray:
    """Per group `pick` (min or max) of the str partials whose `valid` count is positive
    (None where a group has none)."""
    out = np.full(len(bounds), None, dtype=object)
    for g, (a, b) in enumerate(zip(bounds.tolist(), np.r_[bounds[1:], len(values)].tolist())):
        kept = [v for v, n in zip(values[a:b].tolist(), valid[a:b].tolist()) if n > 0]
        if kept:
            out[g] = pick(kept)
    return out


class SlicedWindowOperator(VectorizedWindowOperator):
    """Column aggregates per key and sliding window, stored per (key, slice)."""

    def _init_windows(self, assigner: WindowAssigner) -> None:
        self.size = assigner.size_ms
        self.index = SliceIndex(assigner.size_ms, assigner.slide_ms, assigner.offset_ms)
        self._ahead: dict[int, int] = {}       # key group -> progress beyond the index's (rescaled)
        # The stored min/max fields of string columns (`object_fields` counts them from rows,
        # the first field of a slice).
        self._text_fields = self.object_fields

    def _fields(self) -> int:
        """Fields of a stored slice: ``[rows, (valid, sum, min, max) per column]``."""
        return 1 + 4 * len(self.columns)

    # ------------------------------------------------------------------ state
    def initialize_state(self) -> None:
        ProcessOperator.initialize_state(self)
        backend = self.keyed_backend
        self._refuse_restored(WINDOWS, "one entry per window (written with allowed lateness, or "
                                       "by a streamsnap before window slicing)", "slices")
        self.windows = backend.get_state(ValueStateDescriptor(SLICES, serializer=_Unchecked()))
        self._progress = self.operator_backend.get_union_list_state(PROGRESS)
        mine = backend.key_group_range
        restored: dict[int, int] = {}
        for first, last, progress in self._progress.get():
            for kg in range(max(first, mine.start), min(last, mine.end) + 1):
                restored[kg] = max(restored.get(kg, MIN_WATERMARK), progress)
        floor = min(restored.values()) if len(restored) == len(mine) else MIN_WATERMARK
        self.index.progress = floor
        self._ahead = {kg: p for kg, p in restored.items() if p > floor}
        self._index_restored(SLICES)          # (slices have no pending flag: the result is moot)
        self.timer_service = _TimerView(self)
        if not self.event_time:
            self._schedule_wakeup(self.index.next_time())

    def snapshot_state(self, checkpoint_id: int, timestamp: float, location: str):
        mine = self.keyed_backend.key_group_range
        progress = self.index.progress
        self._progress.update([[mine.start, mine.end, progress]]
                              + [[kg, kg, p] for kg, p in sorted(self._ahead.items()) if p > progress])
        return super().snapshot_state(checkpoint_id, timestamp, location)

    # ------------------------------------------------------------------ elements
    def _times(self, batch: pa.RecordBatch) -> np.ndarray:
        times = super()._times(batch)
        if not self.event_time:   # the operator's processing time never runs back behind its windows
            np.maximum(times, self.index.progress + 1, out=times)
        return times

    def _assign(self, batch: pa.RecordBatch, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, slice starts) of the rows not late; a row is late when all its windows are
        done (the last window of its slice)."""
        index = self.index
        rows = np.arange(len(times), dtype=np.int64)
        slices = window_starts(times, index.offset, index.slice)
        if self.event_time:
            last_ends = window_starts(times, index.offset, index.slide) + self.size
            late = last_ends - 1 <= max(self._watermark, index.progress)
            if late.any():
                if self.late_tag is None:
                    self.num_late_records_dropped += int(late.sum())
                else:
                    self.output.emit_side(self.late_tag, batch.filter(pa.array(late)).to_pylist())
                rows, slices = rows[~late], slices[~late]
        return rows, slices

    def _fold(self, batch: pa.RecordBatch, keys, rows: np.ndarray, starts: np.ndarray) -> None:
        """Add the rows to their (key, slice) entries: one bulk read and write per batch."""
        g = self._batch_groups(batch, keys, rows, starts)
        merged = g.merged if g.old is None else _fold_stored(g.merged, g.existed, g.old)
        self.windows.put_many(g.state_keys, self._encode(merged))
        self._register_fresh(g.state_keys, g.starts, g.existed, g.hashes)

    # ------------------------------------------------------------------ time
    def _advance(self, time: int) -> None:
        """Fire the windows that end by `time`, merged from their slices, and delete the slices
        no later window needs."""
        due = self.index.due(time)
        if due.ends:
            self._fire(due)
        if due.clean:
            names: list = []
            groups: list = []
            for start in due.clean:
                for chunk_names, chunk_groups in due.chunks[start]:
                    names += chunk_names
                    groups += chunk_groups
            self.windows.put_many(_Keys(names, groups), [None] * len(names))
            if self._known is not None:
                for start in due.clean:
                    self._known.drop(start)
        self.index.retire(due)
        if self._ahead and all(p <= time for p in self._ahead.values()):
            self._ahead = {}
        self._flush([])

    def _fire(self, due: DueSlices) -> None:
        """Read every slice the due windows merge (once, in bulk), then per window merge its
        slices per key and emit a row per key, windows in end order."""
        starts = sorted({s for window in due.windows for s in window})
        at: dict[int, tuple[int, int]] = {}
        names: list = []
        groups: list = []
        for start in starts:
            first = len(names)
            for chunk_names, chunk_groups in due.chunks[start]:
                names += chunk_names
                groups += chunk_groups
            at[start] = (first, len(names))
        values = self.windows.get_many(_Keys(names, groups))
        # Every entry's key as a code, once (a slice is read by up to size/slide windows).
        ids: dict = {}
        all_codes = np.fromiter((ids.setdefault(name[0], len(ids)) for name in names), dtype=np.int64,
                                count=len(names))
        all_keys = list(ids)
        fields = self._decode(values)[1]
        columns = [np.array(f, dtype=object) if j in self._text_fields else np.asarray(f)
                   for j, f in enumerate(fields)]
        for end, window in zip(due.ends, due.windows):
            take = np.concatenate([np.arange(*at[s], dtype=np.int64) for s in window])
            if self._ahead:
                take = np.array([i for i in take.tolist()
                                 if end - 1 > self._ahead.get(groups[i], MIN_WATERMARK)], dtype=np.int64)
                if not len(take):
                    continue
            # This window's keys numbered in their order of first appearance in it.
            present, first, codes = np.unique(all_codes[take], return_index=True, return_inverse=True)
            rank = np.empty(len(present), dtype=np.int64)
            rank[np.argsort(first, kind="stable")] = np.arange(len(present))
            codes = rank[codes.reshape(-1)]
            order = np.argsort(codes, kind="stable")
            rows = take[order]
            bounds = _group_bounds(codes[order])
            parts = [c[rows] for c in columns]
            for j in range(1, len(parts), 4):
                if j + 2 in self._text_fields:   # strings: per group here, as _reduce takes them
                    valid = parts[j]
                    parts[j:j + 4] = [np.add.reduceat(valid, bounds), np.zeros(len(bounds), dtype=np.int64),
                                      _text_extremes(valid, parts[j + 2], bounds, min),
                                      _text_extremes(valid, parts[j + 3], bounds, max)]
            keys = [all_keys[k] for k in present[np.argsort(first, kind="stable")].tolist()]
            self._output(keys, np.full(len(keys), end - self.size, dtype=np.int64), _reduce(parts, bounds))


@dataclass(frozen=True)
class SlicedWindowOperatorFactory(VectorizedWindowOperatorFactory):
    def create(self, ctx) -> SlicedWindowOperator:
        return SlicedWindowOperator(ctx, self.key, self.assigner, self.allowed_lateness,
                                    self.aggregates, self.late_tag, self.timestamps, self.declared)

    def describe(self) -> str:
        return f"window({type(self.assigner).__name__}).aggregate_columns (sliced)"


__all__ = ["PROGRESS", "SLICES", "SlicedWindowOperator", "SlicedWindowOperatorFactory", "sliceable"]
