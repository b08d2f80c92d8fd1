"""Deduplication: one row per key, the first or the last (Flink SQL's `ROW_NUMBER() OVER
(PARTITION BY key ORDER BY t) = 1` deduplication, which its planner runs as a Deduplicate
operator).

* keep="first" without order_by: the key's first row is emitted, every later one dropped (an
  append-only stream); the state is one flag per key.
* keep="first" with order_by: a row that ranks strictly before the key's held row (smaller
  order_by value: an earlier event time) replaces it and is emitted.
* keep="last" with order_by: a row whose order_by value is not smaller than the held row's
  replaces it and is emitted (on ties the later arrival wins, as in Flink).
* keep="last" without order_by: every row is the key's newest, so every row is emitted; no state.

Whenever a key can emit more than once, the output is an **upsert stream keyed by the key**:
each row replaces the key's previous one, and the key's current answer is its last row. There
is no retraction row (streamsnap rows carry no change kind); a sink that upserts by the key
(or a downstream keyed operator that keeps the last row) reads it correctly.

The kept row's order values (all a later row is compared with: the rows emitted are the
input's own, and no retraction of the replaced row is emitted) live in keyed `ValueState`, so
they are checkpointed, restored and rescaled with their key group on both backends; `ttl` (a `StateTtlConfig`) forgets a key that long after its last
write, bounding the state as Flink's `table.exec.state.ttl` does.

Two ways to run it, with the same output and the same state ("deduplicate"): when the stream's
schema is known, `DeduplicateBatches` reads each key's held row once per batch and writes back
the keys that changed (`get_many`/`put_many`), deciding the batch's rows with numpy
(`decide_batch`: ranks of the order columns, a running best per key) when its order columns
are integers, floats or strings without nulls, else in order in Python; `Deduplicate`, per
row, for rows of unknown schema.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from streamsnap.api.functions import KeyedBatchFunction, KeyedProcessFunction
from streamsnap.errors import ConfigurationError
from streamsnap.runtime.operators.row_order import RowOrder
from streamsnap.state.descriptors import ValueStateDescriptor
from streamsnap.state.ttl import StateTtlConfig

KEEP = ("first", "last")


def check_keep(keep) -> str:
    if keep not in KEEP:
        raise ConfigurationError(
            f"deduplicate: keep must be 'first' or 'last' (which row per key to keep), got {keep!r}")
    return keep


def ttl_config(ttl, what: str) -> StateTtlConfig | None:
    """`ttl=`: None, a StateTtlConfig, or seconds / a timedelta (made a StateTtlConfig)."""
    if ttl is None or isinstance(ttl, StateTtlConfig):
        return ttl
    try:
        return StateTtlConfig(ttl)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{what}: ttl must be seconds, a timedelta or an ss.StateTtlConfig; {exc}") from None


def replaces(keep: str, order: RowOrder | None, held: dict | None, row: dict) -> bool:
    """Whether `row` becomes the key's kept row (and is emitted), given the row held so far."""
    if held is None:
        return True
    if order is None:
        return keep == "last"
    return order.before(row, held) if keep == "first" else not order.before(row, held)


class Deduplicate(KeyedProcessFunction):
    """Keeps the first or last row per key (see the module docstring)."""

    def __init__(self, keep: str, order: RowOrder | None = None, ttl: StateTtlConfig | None = None):
        self.keep = check_keep(keep)
        self.order = order
        self.ttl = ttl

    def open(self, ctx):
        self._name = ctx.operator_name
        self._held = ctx.get_state(ValueStateDescriptor("deduplicate", ttl=self.ttl))

    def process_element(self, row, ctx):
        order = self.order
        if order is None:
            if self.keep == "last":
                return row   # every row is the newest: nothing to remember
            held = self._held
            if held.value() is not None:
                return None
            held.update(True)   # a flag: the first row is never compared with
            return row
        order.check(row, self._name)
        held = self._held.value()
        if not replaces(self.keep, order, held, row):
            return None
        self._held.update({column: row[column] for column in order.columns})
        return row


def decide_batch(keep: str, order: RowOrder, batch: pa.RecordBatch, index: np.ndarray,
                 held: list) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`replaces` for a whole batch at once, with numpy: the rows emitted (in batch order), and
    per key that changed (its position in `held`) the row it keeps. A row replaces its key's
    held row when it ranks not before it (keep="last") or strictly before it (keep="first"),
    the held row being the key's stored one or the batch's last replacement before it — so a
    row's bar is the best rank among its key's stored row and earlier rows. None when the order
    columns hold nulls or values `RowOrder.ranks` does not order (decided row by row then)."""
    columns = [batch.column(c) for c in order.columns]
    if any(c.null_count for c in columns):
        return None
    stored = [u for u, h in enumerate(held) if h is not None]
    values = []
    for name, column in zip(order.columns, columns):
        ours = column.to_numpy(zero_copy_only=False)      # numbers, or strings as objects
        if ours.dtype.kind not in "iufO":
            return None
        theirs = [held[u].get(name) for u in stored]
        # Stored numbers as numbers (a None among them makes an object array: ranks refuses it).
        theirs = np.array(theirs, dtype=object if ours.dtype.kind == "O" else None) if stored \
            else np.zeros(0, dtype=ours.dtype)
        values.append(np.concatenate([theirs, ours]))
    ranks = order.ranks(values)
    if ranks is None:
        return None
    if keep == "first":           # strictly before the best so far: flip, then "strictly above"
        ranks = ranks.max(initial=0) - ranks
    bar = np.full(len(held), -1, dtype=np.int64)      # no stored row: any row replaces
    bar[stored] = ranks[:len(stored)] + (1 if keep == "first" else 0)
    rows = ranks[len(stored):]
    by_key = np.argsort(index, kind="stable")
    key = index[by_key].astype(np.int64)
    span = int(max(rows.max(initial=0), bar.max(initial=0))) + 3
    # The best rank of earlier rows of the same key: a running maximum over the rows sorted by
    # key (each key's values lifted above the keys before it), shifted by one row.
    lifted = key * span + rows[by_key] + (1 if keep == "first" else 0) + 1
    running = np.maximum.accumulate(lifted) if len(lifted) else lifted
    first_of_key = np.r_[True, key[1:] != key[:-1]] if len(key) else np.zeros(0, bool)
    earlier = np.where(first_of_key, 0, np.r_[0, running[:-1]] - key * span) - 1
    threshold = np.maximum(earlier, bar[key])
    accepted = np.empty(len(rows), dtype=bool)
    accepted[by_key] = rows[by_key] >= threshold
    emitted = np.flatnonzero(accepted)
    changed, last_in_reverse = np.unique(index[emitted][::-1], return_index=True)
    return emitted, changed, emitted[::-1][last_in_reverse]


class DeduplicateBatches(Deduplicate, KeyedBatchFunction):
    """Deduplicate a batch at a time: rows in batch order, as Deduplicate emits them, held rows
    read once per key and batch and written back once when they changed; the rows it emits are
    the batch's own, taken from it."""

    def process_batch(self, batch, keys):
        keep, order = self.keep, self.order
        if order is None and keep == "last":
            return batch      # every row is the newest: nothing to remember
        held = self._held.get_many(keys)
        emitted: list[int] = []          # the rows emitted are the batch's own: taken, not rebuilt
        if order is None:     # keep the first: a flag per key
            first: list[int] = []
            for i, u in enumerate(keys.index.tolist()):
                if held[u] is None:
                    held[u] = True
                    first.append(u)
                    emitted.append(i)
            if first:
                self._held.put_many(keys.subset(first), [True] * len(first))
        elif (decided := decide_batch(keep, order, batch, keys.index, held)) is not None:
            emitted_rows, changed, kept = decided
            if len(changed):
                self._held.put_many(keys.subset(changed.tolist()),
                                    batch.select(list(order.columns)).take(pa.array(kept, pa.int64())).to_pylist())
            emitted = emitted_rows.tolist()
        else:     # compared by the order columns alone; full rows built only for those kept
            name = self._name
            last: dict[int, int] = {}    # key -> the row of this batch it keeps
            for i, (row, u) in enumerate(zip(batch.select(list(order.columns)).to_pylist(),
                                             keys.index.tolist())):
                order.check(row, name)
                if replaces(keep, order, held[u], row):
                    held[u] = row
                    last[u] = i
                    emitted.append(i)
            if last:
                self._held.put_many(keys.subset(list(last)), [held[u] for u in last])
        if len(emitted) == batch.num_rows:
            return batch
        return batch.take(pa.array(emitted, pa.int64())) if emitted else None


__all__ = ["Deduplicate", "DeduplicateBatches", "KEEP", "check_keep", "replaces", "ttl_config"]
