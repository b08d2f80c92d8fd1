"""Vectorized windowed aggregation: sum/count/min/max/mean/count_distinct per key and window on
Arrow batches.

min and max also take string columns (lexicographic, as Python compares str): per group with
Arrow's hash aggregation, stored as the window's str (or None) in the same partial layout.

`keyed.window(TumblingEventTimeWindows.of(60)).aggregate_columns({...})` (or `.sum(col)`,
`.count()`, ...) runs here instead of the per-row window operator, with the assigner's default
trigger (event time or processing time). A batch is factorized by key (Arrow), assigned to
windows (`assign_window_starts`, numpy), split into late and on-time rows (`late_windows`),
and reduced per (key, window) group with sort + `ufunc.reduceat`: no Python per row.

State: per (key, window) one entry of the ValueState ``_window.columns``, whose state key is
``(key, window start)`` in the *key's* key group (Flink's keyed state with a window namespace),
so checkpoints, restore and rescaling move it with its key group. Its value is the window's
partial aggregate ``[pending, rows, (valid, sum, min, max) per input column]`` as one
`partial_rows` row of bytes (a list when a min/max column holds strings), so windows of any
size cost the same. A batch reads and writes these entries once per (key, window) group in
bulk (`get_many` / `put_many`), with numpy folding the batch's partials into the stored ones.
Sliding windows without allowed lateness or count_distinct keep one entry per (key, slice)
instead (sliced_windows.py, a subclass sharing the batch reduction).

Timers: with the default trigger every window's timers are implied by its state: the cleanup
timer (end - 1 + allowed lateness) exists while the window has state, and the trigger's (end -
1) while `pending` is set (an element arrived before the watermark passed the end, and the
window has not fired since). So no timer is stored per window; `AlignedWindowIndex` (in
memory, rebuilt from the state on restore) lists, per window start, the windows registered,
and advancing time reads, fires and drops just the due windows, in bulk. As in Flink, a
window fires when time passes its end, late rows within the allowed lateness re-fire it (once
per batch, with all of that batch's rows), and it is dropped at its cleanup time; rows for
dropped windows go to the late side output or are counted as dropped.

count_distinct (optionally over the rows where a filter column holds, as SQL's ``COUNT(DISTINCT
x) FILTER (WHERE p)``) adds one count per distinct aggregate at the end of the partial, and the
values seen to a MapState per window (`window_distinct.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.errors import ConfigurationError
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.batches import Batch, to_record_batch
from streamsnap.runtime.operators import partial_rows
from streamsnap.runtime.operators.base import OperatorContext, OperatorFactory, user_error
from streamsnap.runtime.operators.keyed import current_millis
from streamsnap.runtime.operators.process import ProcessOperator
from streamsnap.runtime.operators.timestamps_and_watermarks import batch_timestamps
from streamsnap.runtime.operators.seen_filter import FiltersByStart, name_hashes
from streamsnap.runtime.operators.window_distinct import DistinctSets, DistinctSpec
from streamsnap.runtime.operators.windows import WindowOperator
from streamsnap.runtime.schemas import RowSchema, StreamSchema
from streamsnap.state.descriptors import ValueStateDescriptor
from streamsnap.state.serialization import Serializer, pack_value, unpack_value
from streamsnap.time.lateness import late_windows
from streamsnap.time.watermarks import MAX_WATERMARK, MIN_WATERMARK
from streamsnap.time.window_index import AlignedWindowIndex
from streamsnap.time.windows import WindowAssigner

AGGREGATES = ("sum", "count", "min", "max", "mean", "count_distinct")
WINDOWS = "_window.columns"
RESTORE_CHUNK = 65_536          # restored entries decoded at once (`partial_rows`), bounding memory
SLICES = "_window.slices"       # sliced_windows.py


@dataclass(frozen=True)
class ColumnAggregate:
    """`output` = `function` over `column` (None for count, which counts rows); count_distinct
    only counts the rows where `where` (a boolean or 0/1 column) holds, when given."""

    output: str
    function: str
    column: str | None
    where: str | None = None


class _Keys:
    """The `keys` argument of `ValueState.get_many/put_many`: distinct keys and their groups."""

    __slots__ = ("unique", "key_groups")

    def __init__(self, unique: list, key_groups: list):
        self.unique, self.key_groups = unique, key_groups


class _Unchecked(Serializer):
    """msgpack (the same encoding and tag as the default serializer), without the per-write
    encodability check: the operator only stores `partial_rows` bytes, or lists of the Python
    ints, floats, bools, str and None that numpy's / Arrow's `tolist()` made, which always
    encode."""

    native = True

    @property
    def tag(self) -> str:
        return "msgpack"

    def dumps(self, value):
        return pack_value(value)

    def loads(self, data: bytes):
        return unpack_value(data)


def _row_values(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(valid, values with nulls as 0) of a column that sum/min/max/mean can take."""
    if pa.types.is_boolean(column.type):
        column = pc.cast(column, pa.int64())
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise TypeError(f"column of type {column.type} cannot be aggregated; sum/min/max/mean "
                        f"take integer, float or boolean columns")
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
    if values.dtype.kind != "f":
        values = values.astype(np.int64, copy=False)
    return valid, values


def is_text(kind: pa.DataType) -> bool:
    """A string column: the only non-numeric type min and max take."""
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _text_groups(column: pa.Array, take: np.ndarray, bounds: np.ndarray) -> list[np.ndarray]:
    """The partials ``[valid, sum (0), min, max]`` per group of a string column: `take` lists
    the rows in group order (groups starting at `bounds`); min/max are object arrays (str, or
    None where a group has no valid value)."""
    groups = len(bounds)
    sizes = np.diff(np.r_[bounds, len(take)])
    table = pa.table({"g": np.repeat(np.arange(groups, dtype=np.int64), sizes),
                      "v": column.take(pa.array(take, pa.int64()))})
    reduced = table.group_by("g", use_threads=False).aggregate(
        [("v", "min"), ("v", "max"), ("v", "count")])
    where = reduced.column("g").to_numpy()
    valid = np.zeros(groups, dtype=np.int64)
    valid[where] = reduced.column("v_count").to_numpy()
    low = np.full(groups, None, dtype=object)
    high = np.full(groups, None, dtype=object)
    low[where] = reduced.column("v_min").to_pylist()
    high[where] = reduced.column("v_max").to_pylist()
    return [valid, np.zeros(groups, dtype=np.int64), low, high]


def _text_fold(ours: np.ndarray, theirs, pick) -> np.ndarray:
    """Per group `pick` (min or max) of two str-or-None sequences, None only where both are."""
    out = np.empty(len(ours), dtype=object)
    out[:] = [b if a is None else a if b is None else pick(a, b) for a, b in zip(ours.tolist(), theirs)]
    return out


def _extremes(values: np.ndarray) -> tuple:
    if values.dtype.kind == "f":
        return np.inf, -np.inf
    return np.iinfo(np.int64).max, np.iinfo(np.int64).min


def _reduce(parts: list[np.ndarray], bounds: np.ndarray) -> list[np.ndarray]:
    """Partials ``[rows, (valid, sum, min, max) per column]`` of single rows (ordered so that
    each group's rows are contiguous, groups starting at `bounds`) folded per group; min/max
    are 0 where a group has no valid value."""
    out = [np.add.reduceat(parts[0], bounds)]
    for i in range(1, len(parts), 4):
        valid, sums, mins, maxs = parts[i:i + 4]
        if mins.dtype == object:       # a string column: already per group (_text_groups)
            out += parts[i:i + 4]
            continue
        has = valid > 0
        highest, lowest = _extremes(mins)
        counts = np.add.reduceat(valid, bounds)
        some = counts > 0
        out += [counts, np.add.reduceat(sums, bounds),
                np.where(some, np.minimum.reduceat(np.where(has, mins, highest), bounds), 0),
                np.where(some, np.maximum.reduceat(np.where(has, maxs, lowest), bounds), 0)]
    return out


def _fold_stored(new: list[np.ndarray], existed: np.ndarray, old: list) -> list[np.ndarray]:
    """The batch's per-group partials `new` (``[rows, (valid, sum, min, max)...]``) folded with
    the stored ones `old` (the same fields, one sequence each) of the groups that `existed`."""
    def put(target: np.ndarray, values: np.ndarray) -> np.ndarray:
        out = target.astype(np.result_type(target, values), copy=True)
        out[existed] = values
        return out

    out = [put(new[0], new[0][existed] + np.asarray(old[0]))]
    for i in range(1, len(new), 4):
        ours = [f[existed] for f in new[i:i + 4]]
        if ours[2].dtype == object:    # a string column's min and max
            out += [put(new[i], ours[0] + np.asarray(old[i])), put(new[i + 1], ours[1] + np.asarray(old[i + 1])),
                    put(new[i + 2], _text_fold(ours[2], old[i + 2], min)),
                    put(new[i + 3], _text_fold(ours[3], old[i + 3], max))]
            continue
        theirs = [np.asarray(f) for f in old[i:i + 4]]
        valid = ours[0] + theirs[0]
        has_ours, has_theirs = ours[0] > 0, theirs[0] > 0
        low = np.where(has_ours, np.where(has_theirs, np.minimum(ours[2], theirs[2]), ours[2]),
                       theirs[2])
        high = np.where(has_ours, np.where(has_theirs, np.maximum(ours[3], theirs[3]), ours[3]),
                        theirs[3])
        out += [put(new[i], valid), put(new[i + 1], ours[1] + theirs[1]), put(new[i + 2], low),
                put(new[i + 3], high)]
    return out


def row_parts(batch: pa.RecordBatch, columns: tuple, extreme_only: frozenset, rows: np.ndarray,
              order: np.ndarray, bounds: np.ndarray) -> list[np.ndarray]:
    """The partials ``[rows, (valid, sum, min, max) per column]`` of single rows `rows[order]`
    (groups starting at `bounds`), for `_reduce`; string min/max columns already per group."""
    parts = [np.ones(len(rows), dtype=np.int64)]
    for c in columns:
        column = batch.column(batch.schema.get_field_index(c))
        if c in extreme_only and is_text(column.type):
            parts += _text_groups(column, rows[order], bounds)
            continue
        valid, values = _row_values(column)
        valid, values = valid[rows][order], values[rows][order]
        parts += [valid.astype(np.int64), np.where(valid, values, 0), values, values]
    return parts


def _group_bounds(sorted_codes: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])


@dataclass
class _Groups:
    """A batch reduced per (key, start) group: their state keys, starts and partials, whether
    each existed in the state (and the stored values `old`, field by field, of those that did),
    the names' filter hashes, and the rows' sort order and group bounds."""

    state_keys: _Keys
    starts: np.ndarray
    merged: list
    existed: np.ndarray
    old: list | None
    hashes: np.ndarray | None
    order: np.ndarray
    bounds: np.ndarray


class VectorizedWindowOperator(WindowOperator):
    """Column aggregates per key and tumbling/sliding window, computed batch at a time.

    A batch costs numpy over its rows plus one bulk read and write of its (key, window)
    groups' state entries; advancing time costs one bulk read and write of the due windows'
    entries (found by `AlignedWindowIndex`). See the module docstring for the state layout.
    """

    row_input = False

    def __init__(self, ctx: OperatorContext, key: KeySelector, assigner: WindowAssigner,
                 allowed_lateness: int, aggregates: tuple[ColumnAggregate, ...],
                 late_tag: str | None = None, timestamps=None, declared: pa.Schema | None = None):
        super().__init__(ctx, key, assigner, assigner.default_trigger(), allowed_lateness,
                         contents=None, late_tag=late_tag, timestamps=timestamps)
        # A schema the user declared for the results: each batch is checked (and losslessly
        # cast) against it, as rows would be; the results' own types need no check.
        self._conform = None if declared is None else \
            RowSchema(StreamSchema(declared, "declared"), ctx.name, ctx.task_name).conform
        self.aggregates = aggregates
        self.columns = tuple(dict.fromkeys(a.column for a in aggregates
                                           if a.column is not None and a.function != "count_distinct"))
        # The distinct sets kept: one per (column, filter), counted at the partial's end.
        self.distinct_specs = tuple(dict.fromkeys(DistinctSpec(a.column, a.where) for a in aggregates
                                                  if a.function == "count_distinct"))
        self.distinct = None
        # Columns only taken by min/max, which may be strings (the others must be numeric).
        self.extreme_only = frozenset(c for c in self.columns if all(
            a.function in ("min", "max") for a in aggregates if a.column == c))
        # Their stored min/max (positions in the merged partials): read back as object arrays,
        # as numpy would make fixed-width unicode of str (dropping trailing NULs).
        self.object_fields = frozenset(j for i, c in enumerate(self.columns) if c in self.extreme_only
                                       for j in (1 + 4 * i + 2, 1 + 4 * i + 3))
        self.windows = None
        self._known: FiltersByStart | None = None     # the windows with state, per start (RocksDB)
        self._init_windows(assigner)
        self._watermark = MIN_WATERMARK
        self._processing_time = MIN_WATERMARK

    def _fields(self) -> int:
        """Fields of a stored row: ``[pending, rows, (valid, sum, min, max) per column,
        distinct counts]`` (`partial_rows`)."""
        return 2 + 4 * len(self.columns) + len(self.distinct_specs)

    def _decode(self, values: list, nested: bool = False) -> tuple[np.ndarray, list]:
        """`partial_rows.decode` of stored values of this operator's fields."""
        return partial_rows.decode(values, self._fields(), nested, owner=self.ctx.name)

    def _encode(self, columns: list[np.ndarray]) -> list:
        """The stored values of rows given as columns: `partial_rows` bytes, or lists when a
        column holds strings."""
        values = partial_rows.encode(columns)
        return values if values is not None else list(map(list, zip(*(c.tolist() for c in columns))))

    def _init_windows(self, assigner: WindowAssigner) -> None:
        """The windows' size and the index of their timers (aligned windows share theirs)."""
        self.size = assigner.size_ms
        self.index = AlignedWindowIndex(self.size, self.allowed_lateness)

    # ------------------------------------------------------------------ state
    def initialize_state(self) -> None:
        ProcessOperator.initialize_state(self)
        backend = self.keyed_backend
        self._refuse_restored(SLICES, "as slices (a sliding window without allowed lateness or "
                                      "count_distinct)", "one entry per window")
        self.windows = backend.get_state(ValueStateDescriptor(WINDOWS, serializer=_Unchecked()))
        if self.distinct_specs:
            self.distinct = DistinctSets(backend, self.distinct_specs)
        # The restored windows imply their timers: index them (by start, then by key).
        pending = self._index_restored(WINDOWS)
        self.index.mark_pending(pending)
        self.timer_service = _TimerView(self)
        if not self.event_time:
            self._schedule_wakeup(self.index.next_time())

    def _refuse_restored(self, state: str, layout: str, ours: str) -> None:
        """Restored entries of the other state layout (`state`) fail the restore: this operator
        would never read them, and their windows would be lost."""
        backend = self.keyed_backend
        if state in backend.state_names():
            backend.get_state(ValueStateDescriptor(state, serializer=_Unchecked()))
            if next(backend.iter_entries(state), None) is not None:
                raise ConfigurationError(
                    f"{self.ctx.name}: the restored state holds this window's contents {layout}, "
                    f"but the operator now keeps {ours}; restore it into the job it was taken "
                    f"from, or start this job without that state")

    def _index_restored(self, state: str) -> set[int]:
        """Register the restored entries of `state` (names ``(key, start)``) by start, and
        return the starts whose first field (a window's pending flag) is set."""
        backend = self.keyed_backend
        by_start: dict[int, tuple[list, list]] = {}
        pending: set[int] = set()
        for key_groups, names, values in self._restored_chunks(state):
            for key_group, name in zip(key_groups, names):
                chunk = by_start.setdefault(name[1], ([], []))
                chunk[0].append(name)
                chunk[1].append(key_group)
            flags = np.asarray(self._decode(values)[1][0], dtype=bool).tolist()
            pending.update(name[1] for name, flag in zip(names, flags) if flag)
        # On RocksDB a lookup of a window that does not exist still probes the database: the
        # windows the index holds (all that have state) go into a filter per start, and a
        # window it has certainly not seen is new without a lookup (`_stored`).
        self._known = None if backend.LOOKUPS_ARE_CHEAP else FiltersByStart()
        for start in sorted(by_start):
            names, groups = by_start[start]
            self._register(start, names, groups, None if self._known is None else name_hashes(names))
        return pending

    def _restored_chunks(self, state: str):
        """The restored entries of `state` as (key groups, names, values) lists of at most
        RESTORE_CHUNK entries: decoded a chunk at a time, so memory stays bounded."""
        chunk: tuple[list, list, list] = ([], [], [])
        for entry in self.keyed_backend.iter_entries(state):
            for part, item in zip(chunk, entry):
                part.append(item)
            if len(chunk[0]) == RESTORE_CHUNK:
                yield chunk
                chunk = ([], [], [])
        if chunk[0]:
            yield chunk

    # ------------------------------------------------------------------ elements
    def _keyed_batch(self, batch: Batch):
        """The batch as Arrow and its factorized keys (None for an empty batch), counted in."""
        record_batch = to_record_batch(batch)
        self.records_in += record_batch.num_rows
        if not record_batch.num_rows:
            return None
        try:
            return record_batch, self.key.batch_keys(record_batch, self.ctx.max_parallelism)
        except Exception as exc:
            raise user_error(self, record_batch.slice(0, 1).to_pylist()[0], exc) from None

    def process(self, batch: Batch) -> None:
        keyed = self._keyed_batch(batch)
        if keyed is None:
            return
        record_batch, keys = keyed
        rows, starts = self._assign(record_batch, self._times(record_batch))
        if len(rows):
            try:
                self._fold(record_batch, keys, rows, starts)
            except Exception as exc:
                raise user_error(self, f"<RecordBatch of {record_batch.num_rows} rows, first row "
                                       f"{record_batch.slice(0, 1).to_pylist()}>", exc) from None
        self._flush([])
        if not self.event_time:
            self._schedule_wakeup(self.index.next_time())

    def _times(self, batch: pa.RecordBatch) -> np.ndarray:
        """The rows' times: their event timestamps, or the operator's processing time."""
        if self.event_time:
            return batch_timestamps(batch, self.timestamps, self.ctx.name)
        return np.full(batch.num_rows, current_millis(self.ctx.clock), dtype=np.int64)

    def _assign(self, batch: pa.RecordBatch, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The on-time (row, window start) pairs to fold; late rows go to the side output."""
        rows, starts = self.assigner.assign_window_starts(times)
        if self.event_time:
            self._split_late(batch, times, rows, starts)
            on_time = ~late_windows(starts + self.size, self.allowed_lateness, self._watermark)
            rows, starts = rows[on_time], starts[on_time]
        return rows, starts

    def _split_late(self, batch: pa.RecordBatch, times: np.ndarray, rows: np.ndarray,
                    starts: np.ndarray) -> None:
        """Rows whose every window is past its cleanup time and that are themselves late go to
        the late side output, or are dropped and counted."""
        watermark = self._watermark
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
        """Add the (row, window) pairs to their windows: numpy per row, then one state read
        and one write per (key, window) of the batch."""
        g = self._batch_groups(batch, keys, rows, starts)
        state_keys, group_starts, merged, existed, old, hashes = \
            g.state_keys, g.starts, g.merged, g.existed, g.old, g.hashes
        numeric = len(merged)
        ends = group_starts + (self.size - 1)
        pending = ends > self._watermark if self.event_time else np.ones(len(ends), dtype=bool)
        if old is not None:
            pending[existed] |= np.asarray(old[0], dtype=bool)
            merged = _fold_stored(merged, existed, old[1:1 + numeric])
        order, bounds = g.order, g.bounds
        if self.distinct is not None:
            row_groups = np.empty(len(rows), dtype=np.int64)
            row_groups[order] = np.repeat(np.arange(len(bounds)), np.diff(np.r_[bounds, len(rows)]))
            for d, new in enumerate(self.distinct.add(batch, rows, row_groups, state_keys.unique,
                                                      state_keys.key_groups, group_starts.tolist(), ~existed,
                                                      hashes)):
                if old is not None:
                    new[existed] += np.asarray(old[1 + numeric + d], dtype=np.int64)
                merged.append(new)
        if self.event_time:
            fire_now = ends <= self._watermark
            if fire_now.any():   # late elements within the allowed lateness re-fire
                self._output([state_keys.unique[g][0] for g in np.flatnonzero(fire_now).tolist()],
                             group_starts[fire_now], [m[fire_now] for m in merged])
        self.windows.put_many(state_keys, self._encode([pending, *merged]))
        # Index the new windows (their cleanup timer) and the pending ones (trigger timer).
        self._register_fresh(state_keys, group_starts, existed, hashes)
        if pending.any():
            self.index.mark_pending(np.unique(group_starts[pending]).tolist())

    def _batch_groups(self, batch: pa.RecordBatch, keys, rows: np.ndarray, starts: np.ndarray) -> "_Groups":
        """The batch's (row, start) pairs reduced per (key, start) group (sort + reduceat), and
        what the state held for those groups (read in bulk)."""
        key_index = keys.index[rows]
        window_starts, window_index = np.unique(starts, return_inverse=True)
        codes = key_index * len(window_starts) + window_index.reshape(-1)
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        bounds = _group_bounds(sorted_codes)
        merged = _reduce(self._row_parts(batch, rows, order, bounds), bounds)
        first = sorted_codes[bounds]
        group_keys = (first // len(window_starts)).tolist()
        group_starts = window_starts[first % len(window_starts)]
        unique, groups = keys.unique, keys.key_groups
        state_keys = _Keys(list(zip([unique[k] for k in group_keys], group_starts.tolist())),
                           [groups[k] for k in group_keys])
        # Each group's name hashed once per batch, for the filters (RocksDB only).
        hashes = None if self._known is None else name_hashes(state_keys.unique)
        stored = self._stored(state_keys, group_starts, hashes)
        existed = np.fromiter((v is not None for v in stored), dtype=bool, count=len(stored))
        old = self._decode(stored)[1] if existed.any() else None     # (the windows that existed)
        return _Groups(state_keys, group_starts, merged, existed, old, hashes, order, bounds)

    def _register_fresh(self, state_keys: _Keys, starts: np.ndarray, existed: np.ndarray,
                        hashes: np.ndarray | None) -> None:
        """Register the groups that did not exist before, a chunk per start."""
        fresh = np.flatnonzero(~existed)
        if not len(fresh):
            return
        by_start = fresh[np.argsort(starts[fresh], kind="stable")]
        fresh_starts = starts[by_start]
        cut = _group_bounds(fresh_starts).tolist() + [len(by_start)]
        positions = by_start.tolist()
        names, key_groups = state_keys.unique, state_keys.key_groups
        for a, b in zip(cut[:-1], cut[1:]):
            chunk = positions[a:b]
            self._register(int(fresh_starts[a]), [names[g] for g in chunk],
                           [key_groups[g] for g in chunk], None if hashes is None else hashes[chunk])

    def _register(self, start: int, names: list, key_groups: list, hashes: np.ndarray | None) -> None:
        """Windows `names` (key, start) now have state: into the index (their timers) and, with
        their `hashes` (`name_hashes`), the filter of known windows."""
        self.index.add(start, names, key_groups)
        if self._known is not None and names:
            self._known.add(np.full(len(names), start, dtype=np.int64), hashes)

    def _stored(self, state_keys: _Keys, starts: np.ndarray, hashes: np.ndarray | None) -> list:
        """The windows' stored values (None: no window), looking up only the windows the filter
        of known windows may hold (`hashes`: their names' hashes); the index holds every window
        with state (restored ones included), so the others are certainly new."""
        if self._known is None:
            return self.windows.get_many(state_keys)
        names = state_keys.unique
        look = np.flatnonzero(self._known.might_contain(starts, hashes, unknown=False)).tolist()
        if len(look) == len(names):
            return self.windows.get_many(state_keys)
        out: list = [None] * len(names)
        if look:
            groups = state_keys.key_groups
            for i, value in zip(look, self.windows.get_many(_Keys([names[i] for i in look],
                                                                  [groups[i] for i in look]))):
                out[i] = value
        return out

    def _row_parts(self, batch: pa.RecordBatch, rows: np.ndarray, order: np.ndarray,
                   bounds: np.ndarray) -> list[np.ndarray]:
        """What `_fold` reduces per group (window_all's global stage reads partials instead)."""
        return row_parts(batch, self.columns, self.extreme_only, rows, order, bounds)

    # ------------------------------------------------------------------ time
    def _advance(self, time: int) -> None:
        """Fire the windows whose trigger timer is due at `time` and drop those past cleanup."""
        due = self.index.due(time)
        if not due:
            return
        state_keys = _Keys(due.keys, due.key_groups)
        # The end of the input: every window fires and goes, so the state is read and dropped
        # whole (`take_all`: on RocksDB a scan and a range deletion per key group).
        whole = time == MAX_WATERMARK and self.event_time
        stored = self.windows.take_all(state_keys) if whole else self.windows.get_many(state_keys)
        present = [i for i, v in enumerate(stored) if v is not None] if None in stored \
            else range(len(stored))            # (windows and index agree: all are there)
        if present:
            names = state_keys.unique
            starts = np.asarray(due.starts, dtype=np.int64)
            values = stored
            if len(present) < len(stored):
                values = [stored[i] for i in present]
                starts = starts[present]
                state_keys = _Keys([names[i] for i in present],
                                   [state_keys.key_groups[i] for i in present])
                names = state_keys.unique
            old = self._decode(values)[1]
            pending = np.asarray(old[0], dtype=bool)
            limit = _clamp(time - (self.size - 1))
            fire = pending & (starts <= limit)
            clean = starts <= (limit if time == MAX_WATERMARK
                               else _clamp(time - (self.size - 1) - self.allowed_lateness))
            if fire.any():   # in time order, then in the order the windows were registered
                chosen = np.flatnonzero(fire)
                chosen = chosen[np.argsort(starts[chosen], kind="stable")]
                self._output([names[i][0] for i in chosen.tolist()], starts[chosen],
                             [(np.array(o, dtype=object) if j in self.object_fields else np.asarray(o))[chosen]
                              for j, o in enumerate(old[1:])])
            if self.distinct is not None and clean.any():
                cleaned = np.flatnonzero(clean).tolist()
                self.distinct.clear([names[i] for i in cleaned], [state_keys.key_groups[i] for i in cleaned])
            if clean.all():
                if not whole:       # (taken whole, nothing is left to delete)
                    self.windows.put_many(state_keys, [None] * len(present))
            elif (clean | fire).any():      # only the windows that changed: dropped, or fired
                changed = np.flatnonzero(clean | fire).tolist()
                fields = self._fields()
                groups = state_keys.key_groups
                self.windows.put_many(
                    _Keys([names[i] for i in changed], [groups[i] for i in changed]),
                    [None if clean[i] else partial_rows.with_first_cleared(values[i], fields) for i in changed])
        self.index.retire(due)
        if self._known is not None:
            for start in due.clean:
                self._known.drop(start)
        self._flush([])

    def process_watermark(self, timestamp: int) -> None:
        if timestamp > self._watermark:
            self._watermark = timestamp
            if self.event_time:
                self._run_timers(timestamp)
        self.output.emit_watermark(timestamp)

    def _run_timers(self, time: int) -> None:
        try:
            self._advance(time)
        except Exception as exc:
            raise user_error(self, f"<windows due at {time}>", exc) from None

    def _on_processing_time(self, scheduled: int) -> None:
        if self._wakeup_at == scheduled:
            self._wakeup_at = None
        now = max(current_millis(self.ctx.clock), scheduled)
        self._processing_time = max(self._processing_time, now)
        if not self.event_time:
            self._run_timers(self._processing_time)
        self._schedule_wakeup(self.index.next_time())

    # ------------------------------------------------------------------ output
    def _output(self, keys: list, starts: np.ndarray, merged: list[np.ndarray],
                ends: np.ndarray | None = None) -> None:
        """Rows of fired windows, as one Arrow batch built from the numpy results (no dict per
        row): `merged` is ``[rows, (valid, sum, min, max) per column]``; `ends` default to the
        starts plus the window size. Types are what the rows' values would infer (int64,
        float64, string; keys as Arrow infers them); keys Arrow cannot type go out as rows,
        for the stream's schema check to name."""
        if not len(starts):
            return
        names = list(self.key.columns) if self.key.function is None else ["key"]
        names += ["window_start", "window_end"] + [a.output for a in self.aggregates]
        aggregates = self._aggregate_arrays(merged)
        ends = starts + self.size if ends is None else ends
        key_columns = [list(c) for c in zip(*keys)] if self.key.function is None and len(self.key.columns) > 1 \
            else [keys]
        try:
            key_arrays = [pa.array(c) for c in key_columns]
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            columns = key_columns + [starts.tolist(), ends.tolist()] + [a.to_pylist() for a in aggregates]
            self._out.append([dict(zip(names, row)) for row in zip(*columns)])
            return
        arrays = key_arrays + [pa.array(np.asarray(starts, dtype=np.int64)), pa.array(np.asarray(ends, dtype=np.int64))]
        self._out.append(pa.RecordBatch.from_arrays(arrays + aggregates, names=names))

    def _aggregate_arrays(self, merged: list[np.ndarray]) -> list[pa.Array]:
        """Each aggregate's output column: null where a window had no valid value."""
        position = {c: 1 + 4 * i for i, c in enumerate(self.columns)}
        distinct = {s: 1 + 4 * len(self.columns) + d for d, s in enumerate(self.distinct_specs)}
        out = []
        for aggregate in self.aggregates:
            if aggregate.function == "count":
                out.append(pa.array(np.asarray(merged[0], dtype=np.int64)))
                continue
            if aggregate.function == "count_distinct":
                out.append(pa.array(np.asarray(merged[distinct[DistinctSpec(aggregate.column, aggregate.where)]],
                                               dtype=np.int64)))
                continue
            i = position[aggregate.column]
            valid = np.asarray(merged[i])
            some = valid > 0
            if aggregate.function == "mean":
                values = np.divide(merged[i + 1], valid, out=np.zeros(len(valid)), where=some)
            else:
                values = np.asarray(merged[i + {"sum": 1, "min": 2, "max": 3}[aggregate.function]])
            if values.dtype == object:     # min/max of a column that may be strings: as inferred
                out.append(pa.array([v if s else None for v, s in zip(values.tolist(), some.tolist())]))
                continue
            values = values.astype(np.float64 if values.dtype.kind == "f" else np.int64, copy=False)
            out.append(pa.array(values, mask=None if some.all() else ~some))
        return out

    def _flush(self, late: list) -> None:
        """Emit the fired windows' batches in order (and late rows to their side output)."""
        out, self._out = self._out, []
        for part in out:
            self.output.emit(part if self._conform is None or type(part) is list else self._conform(part))
        if late:
            self.output.emit_side(self.late_tag, late)
        self._flush_side()


def _clamp(value: int) -> int:
    """A Python int threshold compared with int64 arrays."""
    return max(min(value, MAX_WATERMARK), MIN_WATERMARK)


class _TimerView:
    """`timer_service` of the operator, read-only: the times and the windows' pending timers
    (each registered window has a cleanup timer; pending ones also their trigger's)."""

    def __init__(self, operator: VectorizedWindowOperator):
        self._op = operator

    @property
    def current_watermark(self) -> int:
        return self._op._watermark

    @property
    def current_processing_time(self) -> int:
        return self._op._processing_time

    def _timers(self) -> int:
        index = self._op.index
        if self._op.allowed_lateness == 0:
            return len(index)      # trigger and cleanup timer coincide: one timer
        return len(index) + index.num_pending()

    def num_event_time_timers(self) -> int:
        return self._timers() if self._op.event_time else 0

    def num_processing_time_timers(self) -> int:
        return 0 if self._op.event_time else self._timers()

    def next_event_time(self) -> int | None:
        return self._op.index.next_time() if self._op.event_time else None

    def next_processing_time(self) -> int | None:
        return None if self._op.event_time else self._op.index.next_time()


@dataclass(frozen=True)
class VectorizedWindowOperatorFactory(OperatorFactory):
    key: KeySelector
    assigner: WindowAssigner
    allowed_lateness: int
    aggregates: tuple[ColumnAggregate, ...]
    late_tag: str | None = None
    timestamps: object = None
    declared: object = None          # the results' schema when the user declared one
    keyed = True
    input_format = "batch"

    def create(self, ctx: OperatorContext) -> VectorizedWindowOperator:
        return VectorizedWindowOperator(ctx, self.key, self.assigner, self.allowed_lateness,
                                        self.aggregates, self.late_tag, self.timestamps, self.declared)

    def describe(self) -> str:
        return f"window({type(self.assigner).__name__}).aggregate_columns"


__all__ = ["AGGREGATES", "ColumnAggregate", "VectorizedWindowOperator",
           "VectorizedWindowOperatorFactory"]
