"""Count-distinct for the vectorized window aggregate: exact distinct sets per key and window.

Flink SQL's ``COUNT(DISTINCT x) [FILTER (WHERE p)]`` in a window keeps, per key and window, a
MapState of the values seen; so does this: per counted column a MapState (`_window.distinct.<i>`)
with an entry per (key, window start) state key (the window's namespace, in the key's key
group), whose map holds each distinct value seen, with a bit per count of that column (plain
and filtered) that has seen it. A batch only *adds* its new values (the stored set is never
copied per row or per batch) and reads what its values had seen, in all its groups at once,
with one `MapState.get_all_many` per column (RocksDB: one multi-get); the count itself lives in the window's partial
aggregate, so firing reads no set. Sets are checkpointed, restored
and rescaled with their key group like any keyed state (heap: copy-on-write per checkpoint;
RocksDB: one entry per value), and cleared when their window is cleaned up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.graph.keys import BatchKeys
from streamsnap.runtime.operators.seen_filter import FiltersByStart, mix
from streamsnap.state.descriptors import MapStateDescriptor

DISTINCT = "_window.distinct"
_NO_ROWS = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class DistinctSpec:
    """The distinct values of `column` over the rows where `where` (a boolean or 0/1 column) holds."""

    column: str
    where: str | None = None


def row_mask(batch: pa.RecordBatch, spec: DistinctSpec) -> np.ndarray:
    """Rows that count: `column` not null and, with `where`, `where` true (nonzero; null: no)."""
    mask = batch.column(batch.schema.get_field_index(spec.column)).is_valid().to_numpy(zero_copy_only=False)
    if spec.where is not None:
        condition = batch.column(batch.schema.get_field_index(spec.where))
        if not pa.types.is_boolean(condition.type):
            condition = pc.not_equal(condition, 0)
        mask = mask & pc.fill_null(condition, False).to_numpy(zero_copy_only=False)
    return mask


def seen_pairs(values: pa.Array, bits: np.ndarray, groups: np.ndarray):
    """The distinct (group, value) pairs among `values` (row i in group `groups[i]`; rows already
    filtered: no nulls, bits > 0), sorted by group: (their groups, their value codes into
    `dictionary`, the OR of their rows' `bits`, `dictionary` as Arrow, as Python values)."""
    encoded = pc.dictionary_encode(values)
    dictionary = encoded.dictionary
    size = max(1, len(dictionary))
    codes = groups.astype(np.int64) * size + encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.argsort(codes, kind="stable")
    codes = codes[order]
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]]) if len(codes) else _NO_ROWS
    pair_bits = np.bitwise_or.reduceat(bits[order], starts) if len(codes) else _NO_ROWS
    pair_groups, pair_codes = np.divmod(codes[starts], size)
    return pair_groups, pair_codes, pair_bits, dictionary, dictionary.to_pylist()


def value_hashes(dictionary: pa.Array, values: list) -> np.ndarray:
    """A uint64 hash per dictionary value: integers as they are, others by Python's hash (the
    filters live in one process, so its per-process string seed does not matter)."""
    if pa.types.is_integer(dictionary.type):
        return dictionary.to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
    return np.fromiter((hash(v) for v in values), dtype=np.int64, count=len(values)).view(np.uint64)


def _slices(sorted_groups: np.ndarray):
    """(group, start, stop) of each run of equal values in `sorted_groups`."""
    if not len(sorted_groups):
        return []
    cut = np.flatnonzero(sorted_groups[1:] != sorted_groups[:-1]) + 1
    bounds = np.r_[0, cut, len(sorted_groups)].tolist()
    return list(zip(sorted_groups[bounds[:-1]].tolist(), bounds[:-1], bounds[1:]))


class DistinctSets:
    """The distinct sets of one operator's windows: per column a MapState keyed by (key, window
    start), mapping ``value -> bits``: bit s set when spec s (of that column) has seen the
    value, so the filtered and unfiltered counts of one column share one entry, and a batch
    reads one entry per (window, column, distinct value). (Plain map keys, not tuples: their
    writes skip the encodability check.)

    Lookups skipped: a window created in this process (its sets empty then) is *tracked*: every
    value its sets store is also added to a filter per (column, window start), and a value
    the filter has certainly not seen is known absent without a state lookup; so are all values
    of a window new in this batch. Windows restored from a checkpoint are not tracked and look
    every value up. Untracked again when cleared; a filter goes with the last tracked window of
    its start."""

    def __init__(self, backend, specs: tuple[DistinctSpec, ...]):
        self.backend = backend
        self.specs = specs
        self.columns = tuple(dict.fromkeys(s.column for s in specs))
        # per column: [(spec position, bit)] of the specs counting it
        self.bits = [[(i, 1 << j) for j, i in enumerate(i for i, s in enumerate(specs) if s.column == c)]
                     for c in self.columns]
        self.states = [backend.get_state(MapStateDescriptor(f"{DISTINCT}.{i}")) for i in range(len(self.columns))]
        # Filters only where a lookup costs more than a filter's probe (not on the heap).
        self.filtered = not backend.LOOKUPS_ARE_CHEAP
        self.tracked: dict = {}                     # (key, window start) -> None, windows tracked
        self.tracked_per_start: dict[int, int] = {}
        self.filters = [FiltersByStart() for _ in self.columns]   # per column, per window start
        self.lookups = 0                            # values looked up in state
        self.skipped = 0                            # values known absent without a lookup

    def _track(self, names: list, starts: list, fresh: np.ndarray) -> np.ndarray:
        """Track the `fresh` groups (windows new in this batch); per group, whether tracked."""
        tracked = self.tracked
        for g in np.flatnonzero(fresh).tolist():
            name = names[g]
            if name not in tracked:
                tracked[name] = None
                start = starts[g]
                self.tracked_per_start[start] = self.tracked_per_start.get(start, 0) + 1
        return np.fromiter((n in tracked for n in names), dtype=bool, count=len(names))

    def add(self, batch: pa.RecordBatch, rows: np.ndarray, row_groups: np.ndarray, names: list,
            key_groups: list, starts: list, fresh: np.ndarray, name_hashes: np.ndarray | None) -> list[np.ndarray]:
        """Add the batch's (row, window) pairs (`rows`: batch row per pair; `row_groups`: its
        (key, window) group, named `names[g]` in `key_groups[g]`, of window start `starts[g]`,
        `fresh[g]` when the window is new in this batch, `name_hashes[g]` its name's
        `seen_filter.name_hashes`, needed when `filtered`) to the sets; returns per spec the
        number of values new to each group's set."""
        num = len(names)
        new = [np.zeros(num, dtype=np.int64) for _ in self.specs]
        if not self.filtered:
            tracked, group_hash = np.zeros(num, dtype=bool), None
        else:
            tracked = self._track(names, starts, fresh)
            group_starts = np.asarray(starts, dtype=np.int64)
            group_hash = name_hashes
        for c, (column, specs, state) in enumerate(zip(self.columns, self.bits, self.states)):
            bits = np.zeros(len(rows), dtype=np.int64)
            for i, bit in specs:
                bits |= np.where(row_mask(batch, self.specs[i])[rows], bit, 0)
            some = bits > 0
            if not some.any():
                continue
            values = batch.column(batch.schema.get_field_index(column)).take(pa.array(rows[some], pa.int64()))
            groups, codes, pair_bits, dictionary, python_values = seen_pairs(values, bits[some], row_groups[some])
            look = ~fresh[groups]           # a new window's sets are empty: nothing to look up
            hashes = None
            if group_hash is not None and tracked.any():
                hashes = mix(group_hash[groups] ^ mix(value_hashes(dictionary, python_values))[codes])
                check = np.flatnonzero(tracked[groups] & look)
                if len(check):
                    look[check] = self.filters[c].might_contain(group_starts[groups[check]], hashes[check], unknown=True)
            had = np.zeros(len(groups), dtype=np.int64)
            where = np.flatnonzero(look)
            self.lookups += len(where)
            self.skipped += len(groups) - len(where)
            if len(where):
                runs = _slices(groups[where])
                keys = BatchKeys([names[g] for g, _, _ in runs], _NO_ROWS, [key_groups[g] for g, _, _ in runs])
                wanted = codes[where].tolist()
                stored = state.get_all_many(keys, [[python_values[v] for v in wanted[a:b]] for _, a, b in runs], 0)
                had[where] = [h for found in stored for h in found]
            added = pair_bits & ~had
            grown = added != 0
            if not grown.any():
                continue
            for i, bit in specs:
                counted = (added & bit) != 0
                if counted.any():
                    new[i] += np.bincount(groups[counted], minlength=num)
            at = np.flatnonzero(grown)
            runs = _slices(groups[at])
            wanted, merged = codes[at].tolist(), (had[at] | pair_bits[at]).tolist()
            state.put_all_many(
                BatchKeys([names[g] for g, _, _ in runs], _NO_ROWS, [key_groups[g] for g, _, _ in runs]),
                [{python_values[v]: b for v, b in zip(wanted[a:b], merged[a:b])} for _, a, b in runs])
            if hashes is not None:
                stored_now = np.flatnonzero(grown & (had == 0) & tracked[groups])   # values new to a tracked set
                if len(stored_now):
                    self.filters[c].add(group_starts[groups[stored_now]], hashes[stored_now])
        return new

    def clear(self, names: list, key_groups: list) -> None:
        """Drop the sets of these (key, window start) state keys (their windows were cleaned up)."""
        for name, key_group in zip(names, key_groups):
            self.backend.set_current_key(name, key_group)
            for state in self.states:
                state.clear()
            if name in self.tracked:
                del self.tracked[name]
                start = name[1]
                left = self.tracked_per_start[start] - 1
                if left:
                    self.tracked_per_start[start] = left
                else:
                    del self.tracked_per_start[start]
                    for filters in self.filters:
                        filters.drop(start)


__all__ = ["DISTINCT", "DistinctSets", "DistinctSpec", "row_mask", "seen_pairs", "value_hashes"]
