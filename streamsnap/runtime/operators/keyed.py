"""What keyed operators share: the keys and key groups of a batch, and processing time.

`keys_of` gives a keyed operator (process, windows, joins) the keys and key groups of a batch's
rows — column-wise for Arrow batches, per row for row lists, from the sender's shipped key
groups when a hash edge attached them (runtime/shipped_key_groups.py), and from a bounded cache
for one-column string keys. `ProcessingTimeWakeups` fires an operator's processing-time timers
from the task's mailbox thread; `current_millis` is processing time (wall-clock epoch ms).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.errors import DataError
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.batches import Batch
from streamsnap.runtime.operators.base import StreamOperator, user_error
from streamsnap.state.key_groups import assign_key_groups


def keys_of(op: "StreamOperator", batch: Batch, rows: list, key: KeySelector | None = None,
            columns: list | None = None, key_groups: list | None = None) -> tuple[list, list]:
    """The keys and key groups of a batch's rows for a keyed operator (`key`, default `op.key`):
    column-wise for Arrow batches (one to_pylist, key groups hashed vectorized), per row for row
    lists. columns: the batch's columns as Python lists, when the caller has them already
    (`batches.rows_of`), so a key column is not converted twice. key_groups: the rows' key
    groups as the sender computed them (runtime/shipped_key_groups.py): only the keys are read."""
    key, max_parallelism = key or op.key, op.ctx.max_parallelism
    try:
        # A one-column key whose values the caller already has as a Python list.
        position = -1
        if columns is not None and key.function is None and len(key.columns) == 1 \
                and isinstance(batch, pa.RecordBatch):
            position = batch.schema.get_field_index(key.columns[0])
        if key_groups is not None:
            return (columns[position] if position >= 0 else key.keys_of_batch(batch, rows)), key_groups
        if isinstance(batch, pa.RecordBatch):
            if position >= 0:
                cache = op.__dict__.get("_key_group_cache")
                if cache is None:
                    cache = op._key_group_cache = {}
                return _column_keys(key, batch, position, columns[position], max_parallelism, cache)
            keys = key.keys_of_batch(batch, rows)
            groups = key.key_groups(batch, max_parallelism, keys=keys if key.function is not None else None)
        else:
            keys = key.keys_of_rows(rows)
            groups = key.key_groups(rows, max_parallelism, keys=keys)
    except DataError:
        raise   # a null key: the data's fault, not the function's (as where a hash edge routes it)
    except Exception as exc:
        raise user_error(op, rows[0], exc) from None
    return keys, groups.tolist()


# Distinct string/binary keys whose key group an operator remembers (words, user ids, ...),
# and the longest key remembered: together they bound the cache (~20 MB at most), however
# long the keys of a job are; longer keys are hashed with their batch every time.
KEY_GROUP_CACHE_ENTRIES = 1 << 16
KEY_GROUP_CACHE_KEY_LENGTH = 64


def _column_keys(key: KeySelector, batch: pa.RecordBatch, position: int, values: list,
                 max_parallelism: int, cache: dict) -> tuple[list, list]:
    """Keys and key groups of a one-column key whose values are already Python objects.

    A string or binary key is hashed once per distinct key: from the operator's `cache` of
    key → key group when every key of the batch is in it (a dict lookup per row, a third of
    hashing the batch's dictionary in Arrow), else dictionary-encoded and hashed in Arrow, the
    new keys up to KEY_GROUP_CACHE_KEY_LENGTH long remembered until the cache holds
    KEY_GROUP_CACHE_ENTRIES."""
    column = batch.column(position)
    if column.null_count and not key.allow_null:
        key._check_columns(batch)   # raises NullKeyError naming the row
    t = column.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t):
        try:
            return values, [cache[v] for v in values]
        except KeyError:
            groups = assign_key_groups(pc.dictionary_encode(column), max_parallelism).tolist()
            if len(cache) < KEY_GROUP_CACHE_ENTRIES:
                longest = KEY_GROUP_CACHE_KEY_LENGTH
                cache.update((v, g) for v, g in zip(values, groups) if v is None or len(v) <= longest)
            return values, groups
    return values, assign_key_groups(column, max_parallelism).tolist()


class ProcessingTimeWakeups:
    """Fires an operator's processing-time timers from the task's mailbox thread: one wake-up on
    the task's timer queue for the earliest timer, re-armed after each firing. The operator
    provides `timer_service`, `ctx` and `_fire_timers(timers)`."""

    _wakeup_at: int | None = None   # earliest processing-time wake-up scheduled

    def _schedule_wakeup(self, timestamp: int | None) -> None:
        if timestamp is None or (self._wakeup_at is not None and self._wakeup_at <= timestamp):
            return
        timers = self.ctx.timers
        if timers is None:
            raise RuntimeError(f"operator '{self.ctx.name}' runs outside a task: processing-time "
                               f"timers need the task's timer queue")
        self._wakeup_at = timestamp
        delay = (timestamp - current_millis(self.ctx.clock)) / 1000.0
        timers.call_later(delay, lambda: self._on_processing_time(timestamp))

    def _on_processing_time(self, scheduled: int) -> None:
        if self._wakeup_at == scheduled:
            self._wakeup_at = None
        # The queue may wake us a little early (monotonic vs wall clock): never fire early.
        now = max(current_millis(self.ctx.clock), scheduled)
        self._fire_timers(self.timer_service.advance_processing_time(now))
        self._schedule_wakeup(self.timer_service.next_processing_time())


def current_millis(clock) -> int:
    """Processing time: wall-clock epoch milliseconds."""
    return int(clock.wall() * 1000)
