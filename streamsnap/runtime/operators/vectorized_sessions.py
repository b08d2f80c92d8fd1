"""Vectorized session windows: sum/count/min/max/mean per key and event-time session on Arrow
batches.

`keyed.window(EventTimeSessionWindows.with_gap(g)).aggregate_columns({...})` (or `.count()`,
`.sum(col)`, ...) runs here instead of the per-row window operator, which merges a session set
per element in Python. A batch is factorized by key (Arrow); its rows become the windows
``[t, t + gap)`` with single-row partial aggregates, the batch's keys' stored sessions join
them, and `merge_sessions` (numpy: sort by key and start, a running maximum of the ends) says
which of them form one session; each session's partials fold with ``ufunc.reduceat``.

State: per key one entry of the ValueState ``_window.session.columns`` (keyed state, so
checkpoints, restore and rescaling move it with its key group): the key's open sessions, each
a row ``[start, end, pending, rows, (valid, sum, min, max) per input column]`` — the same
partials as the aligned windows' (vectorized_windows.py), stored as `partial_rows` bytes. A
batch reads and writes one entry per distinct key, in bulk.

Time, as Flink's WindowOperator with the EventTimeTrigger: a session fires when the watermark
passes its ``max_timestamp = end - 1`` and is dropped at ``end - 1 + allowed lateness``; rows
that extend a session already fired make a new, longer session that fires again (at once when
the watermark already passed its end). The timers are implied by the sessions (an end and a
pending flag), so none is stored: `SessionTimers` (in memory, rebuilt from the state on
restore) knows each key's earliest due time.

A batch is merged as a set: rows whose own window ``[t, t + gap)`` is past its cleanup time
are kept when they join, through the batch's other rows, a session that is not (Flink keeps
them when they arrive after those rows); the rows of a session that is late as a whole go to
the late side output, or are counted as dropped. As with the aligned windows, late rows within
the allowed lateness re-fire a session once per batch, with all of that batch's rows.

count_distinct is not offered on sessions: merging two sessions would merge their distinct
sets; string min/max neither (numeric columns only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from streamsnap.runtime.batches import Batch
from streamsnap.runtime.operators import partial_rows
from streamsnap.runtime.operators.base import OperatorContext, user_error
from streamsnap.runtime.operators.process import ProcessOperator
from streamsnap.runtime.operators.timestamps_and_watermarks import batch_timestamps
from streamsnap.runtime.operators.vectorized_windows import (VectorizedWindowOperator,
                                                             VectorizedWindowOperatorFactory, _Keys, _reduce,
                                                             _row_values, _TimerView, _Unchecked)
from streamsnap.state.descriptors import ValueStateDescriptor
from streamsnap.time.lateness import late_windows
from streamsnap.time.session_merge import merge_sessions
from streamsnap.time.session_timers import SessionTimers
from streamsnap.time.watermarks import MAX_WATERMARK
from streamsnap.time.windows import WindowAssigner

SESSIONS = "_window.session.columns"


@dataclass
class _Sessions:
    """Sessions of several keys as columns: `key` indexes the keys they belong to; `parts` are
    ``[rows, (valid, sum, min, max) per column]``."""

    key: np.ndarray
    start: np.ndarray
    end: np.ndarray
    pending: np.ndarray
    parts: list

    def __len__(self) -> int:
        return len(self.key)


def single_row_parts(batch: pa.RecordBatch, columns: tuple) -> list[np.ndarray]:
    """Single-row partials ``[rows, (valid, sum, min, max) per column]`` of a batch's numeric
    `columns` (the session operator's input, and its local stage's: local_windows.py)."""
    parts = [np.ones(batch.num_rows, dtype=np.int64)]
    for c in columns:
        valid, values = _row_values(batch.column(batch.schema.get_field_index(c)))
        parts += [valid.astype(np.int64), np.where(valid, values, 0), values, values]
    return parts


def _summary(end: np.ndarray, pending: np.ndarray, allowed_lateness: int) -> np.ndarray:
    """Each session's next due time: its trigger's (end - 1) while pending, else its cleanup."""
    due = np.minimum(end - 1 + allowed_lateness, MAX_WATERMARK)
    return np.where(pending, end - 1, due)


class VectorizedSessionOperator(VectorizedWindowOperator):
    """Column aggregates per key and event-time session, computed batch at a time: a batch
    costs numpy over its rows plus one bulk read and write of its keys' sessions; advancing
    the watermark one of the due keys' (found by `SessionTimers`)."""

    def _fields(self) -> int:
        """Fields of a stored session: ``[start, end, pending, rows, (valid, sum, min, max) per
        column]``."""
        return 4 + 4 * len(self.columns)

    def _init_windows(self, assigner: WindowAssigner) -> None:
        self.gap = assigner.gap_ms
        self.size = None
        self.index = SessionTimers()

    # ------------------------------------------------------------------ state
    def initialize_state(self) -> None:
        ProcessOperator.initialize_state(self)
        backend = self.keyed_backend
        self.windows = backend.get_state(ValueStateDescriptor(SESSIONS, serializer=_Unchecked()))
        # The restored sessions imply their timers: index each key's earliest.
        for key_groups, keys, values in self._restored_chunks(SESSIONS):
            sessions = self._read_sessions(values)
            self._schedule(_Keys(keys, key_groups), sessions, np.bincount(sessions.key, minlength=len(keys)))
        self.timer_service = _TimerView(self)

    def _read_sessions(self, values: list) -> _Sessions:
        """The sessions read from the state (a key's sessions as `partial_rows`, or None, per
        key) as columns."""
        counts, columns = self._decode(values, nested=True)
        key = np.repeat(np.arange(len(values), dtype=np.int64), counts)
        if not len(key):
            empty = np.empty(0, dtype=np.int64)
            return _Sessions(key, empty, empty, np.empty(0, dtype=bool), [empty] * (self._fields() - 3))
        return _Sessions(key, np.asarray(columns[0], dtype=np.int64), np.asarray(columns[1], dtype=np.int64),
                         np.asarray(columns[2], dtype=bool), [np.asarray(c) for c in columns[3:]])

    def _row_parts(self, batch: pa.RecordBatch) -> list[np.ndarray]:
        return single_row_parts(batch, self.columns)

    # ------------------------------------------------------------------ elements
    def process(self, batch: Batch) -> None:
        keyed = self._keyed_batch(batch)
        if keyed is None:
            return
        record_batch, keys = keyed
        n = record_batch.num_rows
        times = batch_timestamps(record_batch, self.timestamps, self.ctx.name)
        try:
            late = self._fold(keys, times, times + self.gap, self._row_parts(record_batch))
        except Exception as exc:
            raise user_error(self, f"<RecordBatch of {n} rows, first row "
                                   f"{record_batch.slice(0, 1).to_pylist()}>", exc) from None
        if late.any():
            if self.late_tag is None:
                self.num_late_records_dropped += int(late.sum())
            else:
                self.output.emit_side(self.late_tag, record_batch.filter(pa.array(late)).to_pylist())
        self._flush([])

    def _fold(self, keys, starts: np.ndarray, ends: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
        """Merge the batch's intervals ``[starts, ends)`` (a row's window, or a session a local
        stage merged: local_windows.py) and their partials `rows` into their keys' sessions;
        fire the sessions the watermark already passed; return which intervals were late (in
        a session late as a whole)."""
        state_keys = _Keys(keys.unique, keys.key_groups)
        old = self._read_sessions(self.windows.get_many(state_keys, hot=True))
        if len(old):
            key = np.r_[old.key, keys.index]
            parts = [np.r_[o, r] for o, r in zip(old.parts, rows)]
        else:
            key, parts = keys.index, rows
        is_old = np.r_[np.ones(len(old), dtype=bool), np.zeros(len(starts), dtype=bool)]
        merged = merge_sessions(key, np.r_[old.start, starts], np.r_[old.end, ends])
        order, bounds = merged.order, merged.bounds
        old_in = np.add.reduceat(is_old[order].astype(np.int64), bounds)
        sizes = np.diff(np.r_[bounds, len(order)])
        touched = sizes > old_in
        was_pending = np.add.reduceat(np.r_[old.pending, np.zeros(len(starts), dtype=bool)][order]
                                      .astype(np.int64), bounds) > 0
        late = (old_in == 0) & late_windows(merged.end, self.allowed_lateness, self._watermark)
        late_rows = late[merged.session_of()[len(old):]]
        kept = ~late
        totals = [m[kept] for m in _reduce([p[order] for p in parts], bounds)]
        start, end, session_key = merged.start[kept], merged.end[kept], merged.key[kept]
        touched = touched[kept]
        fire = touched & (end - 1 <= self._watermark)    # late rows within the allowed lateness
        pending = np.where(touched, ~fire, was_pending[kept])
        if fire.any():
            self._output([keys.unique[k] for k in session_key[fire].tolist()], start[fire],
                         [t[fire] for t in totals], end[fire])
        self._store(state_keys, _Sessions(session_key, start, end, pending, totals))
        return late_rows

    def _store(self, state_keys: _Keys, sessions: _Sessions) -> None:
        """Write each key's sessions (sorted by key; a key without any is cleared) and
        schedule its earliest due time."""
        count = len(state_keys.unique)
        per_key = np.bincount(sessions.key, minlength=count)
        self.windows.put_many(state_keys, partial_rows.encode(
            [sessions.start, sessions.end, sessions.pending, *sessions.parts], per_key))
        self._schedule(state_keys, sessions, per_key)

    def _schedule(self, state_keys: _Keys, sessions: _Sessions, per_key: np.ndarray) -> None:
        """Index each key's earliest due time (`per_key`: its sessions; a key without any is
        forgotten)."""
        count = len(state_keys.unique)
        cut = np.r_[0, np.cumsum(per_key)]
        due = _summary(sessions.end, sessions.pending, self.allowed_lateness)
        earliest = np.zeros(count, dtype=np.int64)
        pending = np.zeros(count, dtype=np.int64)
        has = np.flatnonzero(per_key > 0)
        if len(has):
            first = cut[:-1][has]
            earliest[has] = np.minimum.reduceat(due, first)
            pending[has] = np.add.reduceat(sessions.pending.astype(np.int64), first)
        self.index.schedule_many(state_keys.unique, state_keys.key_groups, earliest, per_key.astype(np.int64),
                                 pending)

    # ------------------------------------------------------------------ time
    def _advance(self, time: int) -> None:
        """Fire the sessions whose end the watermark passed and drop those past cleanup."""
        due_keys, due_groups = self.index.pop_due(time)
        if not due_keys:
            return
        state_keys = _Keys(due_keys, due_groups)
        stored = self._read_sessions(self.windows.get_many(state_keys))
        fire = stored.pending & (stored.end - 1 <= time)
        clean = np.minimum(stored.end - 1 + self.allowed_lateness, MAX_WATERMARK) <= time
        if fire.any():      # in time order (of the ends), then in key order
            chosen = np.flatnonzero(fire)
            chosen = chosen[np.argsort(stored.end[chosen], kind="stable")]
            self._output([due_keys[k] for k in stored.key[chosen].tolist()], stored.start[chosen],
                         [p[chosen] for p in stored.parts], stored.end[chosen])
        keep = ~clean
        self._store(state_keys, _Sessions(stored.key[keep], stored.start[keep], stored.end[keep],
                                          stored.pending[keep] & ~fire[keep],
                                          [p[keep] for p in stored.parts]))
        self._flush([])


@dataclass(frozen=True)
class VectorizedSessionOperatorFactory(VectorizedWindowOperatorFactory):
    """The aligned windows' factory (same fields, same late side output) making the session operator."""

    def create(self, ctx: OperatorContext) -> VectorizedSessionOperator:
        return VectorizedSessionOperator(ctx, self.key, self.assigner, self.allowed_lateness,
                                         self.aggregates, self.late_tag, self.timestamps, self.declared)



__all__ = ["SESSIONS", "single_row_parts", "VectorizedSessionOperator", "VectorizedSessionOperatorFactory"]
