"""Timers of a KeyedBatchFunction: registered and fired a batch of keys at a time.

A per-row KeyedProcessFunction registers a timer for the current key; a vectorized function
has no current key, so it registers arrays — one time per distinct key of its batch
(`BatchKeys.unique`, the order `get_many`/`put_many` use) — and gets its due timers back as a
batch in `on_timers(timers, ctx)`, with `timers.keys` a BatchKeys it can read and write state
with in bulk. Underneath they are the same timers as the per-row API's (InternalTimerService,
stored as keyed state), so they are checkpointed, restored and rescaled with their key groups.

Due timers are handed over in timestamp order, in rounds in which every key appears at most
once (so `get_many`/`put_many` stay well defined); a key with two due timers is in two rounds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from streamsnap.errors import UsageError
from streamsnap.graph.keys import BatchKeys
from streamsnap.time.timers import TimeDomain


@dataclass(frozen=True)
class FiredTimers:
    """One round of due timers: `keys` (each key once), `timestamps` (int64, aligned with
    `keys.unique`) and their time domain."""

    keys: BatchKeys
    timestamps: np.ndarray
    domain: TimeDomain

    def __len__(self) -> int:
        return len(self.keys.unique)


class BatchTimerService:
    """`ctx.timer_service()` in a KeyedBatchFunction's `open(ctx)`; times are epoch ms."""

    def __init__(self, internal, backend, on_processing_timer: Callable[[int], None], operator: str):
        self._internal = internal                        # time.timers.InternalTimerService
        self._backend = backend                          # the keyed state backend
        self._on_processing_timer = on_processing_timer  # makes the task wake up in time
        self._operator = operator

    def current_watermark(self) -> int:
        return self._internal.current_watermark

    def current_processing_time(self) -> int:
        return int(time.time() * 1000)

    def _times(self, keys: BatchKeys, timestamps, what: str) -> list[int]:
        """One checked time per distinct key of `keys` (a scalar stands for all of them)."""
        if not isinstance(keys, BatchKeys):
            raise UsageError(f"operator '{self._operator}': {what} takes the BatchKeys process_batch got "
                            f"(or a FiredTimers' .keys), not {type(keys).__name__}")
        times = np.asarray(timestamps)
        if times.ndim == 0:
            times = np.full(len(keys.unique), times)
        if times.shape != (len(keys.unique),) or not np.issubdtype(times.dtype, np.integer):
            raise ValueError(
                f"operator '{self._operator}': {what} needs one integer time (epoch ms) per distinct key "
                f"({len(keys.unique)} keys, aligned with keys.unique), got {times.dtype} of shape {times.shape}; "
                f"e.g. reduce a timestamp column per key with np.maximum.at, or pass one int for all keys")
        return times.tolist()

    def _each(self, keys: BatchKeys, timestamps, what: str):
        """Each key's time, with that key current in the backend while it is handled."""
        backend = self._backend
        previous = (backend.current_key, backend.current_key_group)
        try:
            for key, key_group, ts in zip(keys.unique, keys.key_groups, self._times(keys, timestamps, what)):
                backend.set_current_key(key, key_group)
                yield ts
        finally:
            backend.set_current_key(*previous)

    def register_event_time_timers(self, keys: BatchKeys, timestamps) -> None:
        """For each distinct key, `on_timers` once the watermark reaches its time (registered
        in bulk: one state write for the batch's new timers)."""
        times = self._times(keys, timestamps, "register_event_time_timers")
        self._internal.register_event_time_timers(keys, times)

    def register_processing_time_timers(self, keys: BatchKeys, timestamps) -> None:
        """For each distinct key, `on_timers` once the wall clock reaches its time."""
        times = self._times(keys, timestamps, "register_processing_time_timers")
        self._internal.register_processing_time_timers(keys, times)
        if times:
            self._on_processing_timer(min(times))

    def delete_event_time_timers(self, keys: BatchKeys, timestamps) -> None:
        for ts in self._each(keys, timestamps, "delete_event_time_timers"):
            self._internal.delete_event_time_timer(ts)

    def delete_processing_time_timers(self, keys: BatchKeys, timestamps) -> None:
        for ts in self._each(keys, timestamps, "delete_processing_time_timers"):
            self._internal.delete_processing_time_timer(ts)


def rounds(timers, backend) -> "Any":
    """Group due timers (an iterator yielding each with its key current) into FiredTimers rounds
    of distinct keys and one domain, in firing order."""
    keys: list = []
    groups: list = []
    stamps: list = []
    seen: set = set()
    domain = None
    for timer in timers:
        group = backend.current_key_group   # the timer's, now: handing out a round may move it
        marker = _hashable(timer.key)
        if marker in seen or (domain is not None and timer.domain is not domain):
            yield _round(keys, groups, stamps, domain)
            keys, groups, stamps, seen = [], [], [], set()
        domain = timer.domain
        seen.add(marker)
        keys.append(timer.key)
        groups.append(group)
        stamps.append(timer.timestamp)
    if keys:
        yield _round(keys, groups, stamps, domain)


def _round(keys, groups, stamps, domain) -> FiredTimers:
    return FiredTimers(BatchKeys(keys, np.arange(len(keys)), groups), np.asarray(stamps, dtype=np.int64), domain)


def _hashable(key):
    try:
        hash(key)
        return key
    except TypeError:
        return repr(key)


__all__ = ["BatchTimerService", "FiredTimers", "rounds"]
