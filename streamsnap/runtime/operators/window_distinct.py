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


def seen_per_group(values: pa.Array, bits: np.ndarray, groups: np.ndarray, num_groups: int) -> list[dict]:
    """Per group (0..num_groups-1), {distinct value: OR of the `bits` of its rows} among `values`,
    where `groups[i]` is row i's group. Rows must already be filtered (no nulls, bits > 0)."""
    out: list[dict] = [{} for _ in range(num_groups)]
    if not len(values):
        return out
    encoded = pc.dictionary_encode(values)
    dictionary = encoded.dictionary.to_pylist()
    codes = groups.astype(np.int64) * len(dictionary) + encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.argsort(codes, kind="stable")
    codes = codes[order]
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    pair_bits = np.bitwise_or.reduceat(bits[order], starts).tolist()
    pair_groups, pair_values = np.divmod(codes[starts], len(dictionary))
    for g, v, b in zip(pair_groups.tolist(), pair_values.tolist(), pair_bits):
        out[g][dictionary[v]] = b
    return out


class DistinctSets:
    """The distinct sets of one operator's windows: per column a MapState keyed by (key, window
    start), mapping ``value -> bits``: bit s set when spec s (of that column) has seen the
    value, so the filtered and unfiltered counts of one column share one entry, and a batch
    reads one entry per (window, column, distinct value). (Plain map keys, not tuples: their
    writes skip the encodability check.)"""

    def __init__(self, backend, specs: tuple[DistinctSpec, ...]):
        self.backend = backend
        self.specs = specs
        self.columns = tuple(dict.fromkeys(s.column for s in specs))
        # per column: [(spec position, bit)] of the specs counting it
        self.bits = [[(i, 1 << j) for j, i in enumerate(i for i, s in enumerate(specs) if s.column == c)]
                     for c in self.columns]
        self.states = [backend.get_state(MapStateDescriptor(f"{DISTINCT}.{i}")) for i in range(len(self.columns))]

    def add(self, batch: pa.RecordBatch, rows: np.ndarray, row_groups: np.ndarray, names: list,
            key_groups: list) -> list[np.ndarray]:
        """Add the batch's (row, window) pairs (`rows`: batch row per pair; `row_groups`: its
        (key, window) group, named `names[g]` in `key_groups[g]`) to the sets; returns per spec
        the number of values new to each group's set."""
        num = len(names)
        per_column = []
        for column, specs in zip(self.columns, self.bits):
            bits = np.zeros(len(rows), dtype=np.int64)
            for i, bit in specs:
                bits |= np.where(row_mask(batch, self.specs[i])[rows], bit, 0)
            some = bits > 0
            values = batch.column(batch.schema.get_field_index(column)).take(pa.array(rows[some], pa.int64()))
            per_column.append(seen_per_group(values, bits[some], row_groups[some], num))
        new = [np.zeros(num, dtype=np.int64) for _ in self.specs]
        for state, specs, seen in zip(self.states, self.bits, per_column):
            groups = [g for g in range(num) if seen[g]]
            if not groups:
                continue
            keys = BatchKeys([names[g] for g in groups], _NO_ROWS, [key_groups[g] for g in groups])
            stored = state.get_all_many(keys, [list(seen[g]) for g in groups], 0)
            grew, fresh = [], []         # only the groups that saw new values are written
            for p, (g, before) in enumerate(zip(groups, stored)):
                added_values = {}
                for (value, bits), had in zip(seen[g].items(), before):
                    added = bits & ~had
                    if added:
                        added_values[value] = had | bits
                        for i, bit in specs:
                            if added & bit:
                                new[i][g] += 1
                if added_values:
                    grew.append(p)
                    fresh.append(added_values)
            if grew:
                state.put_all_many(keys.subset(grew), fresh)
        return new

    def clear(self, names: list, key_groups: list) -> None:
        """Drop the sets of these (key, window start) state keys (their windows were cleaned up)."""
        for name, key_group in zip(names, key_groups):
            self.backend.set_current_key(name, key_group)
            for state in self.states:
                state.clear()


__all__ = ["DISTINCT", "DistinctSets", "DistinctSpec", "row_mask", "seen_per_group"]
