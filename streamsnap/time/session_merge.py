"""Merging session windows of many keys at once, with numpy: the core of the vectorized
session aggregate.

A session window of an element at time t is ``[t, t + gap)``; two windows of one key merge
when they overlap or touch (``a.start <= b.end and b.start <= a.end``, Flink's
`TimeWindow.intersects`), transitively. Given any mix of intervals — a batch's rows and the
key's sessions stored so far — `merge_sessions` sorts them by (key, start) and finds where a
new session begins: where the key changes or an interval starts after every earlier interval
of its key ended. The caller then folds each session's partial aggregates with
``ufunc.reduceat(values[order], bounds)``: no Python per element.

Sans-I/O: arrays in, arrays out; the operator (runtime/operators/vectorized_sessions.py)
reads and writes the state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_LIMIT = 1 << 62     # key rank x span stays below this: the offset trick cannot overflow int64


@dataclass(frozen=True)
class MergedSessions:
    """Sessions made of the given intervals: `order` sorts the intervals by (key, start);
    session i is ``order[bounds[i]:bounds[i + 1]]``, of key `key[i]`, spanning
    ``[start[i], end[i])``. Sessions are sorted by key, then start."""

    order: np.ndarray
    bounds: np.ndarray
    key: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def __len__(self) -> int:
        return len(self.bounds)

    def session_of(self) -> np.ndarray:
        """The session (index) of every input interval."""
        out = np.empty(len(self.order), dtype=np.int64)
        sizes = np.diff(np.r_[self.bounds, len(self.order)])
        out[self.order] = np.repeat(np.arange(len(self.bounds), dtype=np.int64), sizes)
        return out


def _reach_before(keys: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                  new_key: np.ndarray) -> np.ndarray:
    """Per interval (sorted by key, start), the latest end of the earlier intervals of its key
    (undefined where `new_key`): a running maximum restarted at every key."""
    rank = np.cumsum(new_key) - 1
    low = int(starts.min())
    span = int(ends.max()) - low + 1
    if int(rank[-1]) * span < _LIMIT:
        # Lift each key's ends above every earlier key's: one running maximum does them all.
        lifted = (ends - low) + rank * span
        reach = np.maximum.accumulate(lifted) - rank * span + low
    else:   # a huge time span and many keys: a running maximum per key
        reach = np.empty_like(ends)
        cut = np.r_[np.flatnonzero(new_key), len(ends)]
        for a, b in zip(cut[:-1].tolist(), cut[1:].tolist()):
            reach[a:b] = np.maximum.accumulate(ends[a:b])
    return np.r_[np.int64(0), reach[:-1]]


def merge_sessions(keys: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> MergedSessions:
    """The sessions formed by intervals ``[starts[i], ends[i])`` of key `keys[i]` (int64 codes;
    ``starts < ends``), overlapping or touching intervals of a key merged transitively."""
    keys = np.asarray(keys, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if not len(keys):
        empty = np.empty(0, dtype=np.int64)
        return MergedSessions(empty, empty, empty, empty, empty)
    order = np.lexsort((starts, keys))
    k, s, e = keys[order], starts[order], ends[order]
    new_key = np.r_[True, k[1:] != k[:-1]]
    begins = new_key | (s > _reach_before(k, s, e, new_key))
    bounds = np.flatnonzero(begins)
    return MergedSessions(order, bounds, k[bounds], s[bounds], np.maximum.reduceat(e, bounds))


__all__ = ["MergedSessions", "merge_sessions"]
