"""Which keys have a session due, for the vectorized session aggregate.

With the default event-time trigger every session has a cleanup timer at ``end - 1 + allowed
lateness`` and, until it fired, a trigger timer at ``end - 1``: both are implied by the key's
stored sessions (their ends and a "pending" flag), so no timer is stored. This index, rebuilt
from the state on restore (never checkpointed, like the timer heap of Flink's
`InternalTimerService`), holds per key only its earliest due time, in a heap: a key whose
sessions changed is pushed again at its new time, and heap entries that no longer match the
key's time are skipped when reached. Advancing time costs O(due keys · log n), never a scan.

Sans-I/O: plain Python, no state backend.
"""

from __future__ import annotations

import heapq
from itertools import count
from typing import Any


class SessionTimers:
    """key -> (earliest due time, sessions, pending sessions), and a heap of due times."""

    def __init__(self) -> None:
        self._next: dict[Any, tuple[int, int, int]] = {}
        self._heap: list[tuple[int, int, Any, int]] = []
        self._seq = count()
        self._sessions = 0
        self._pending = 0

    def __len__(self) -> int:
        """Sessions registered (each holds state until its cleanup time)."""
        return self._sessions

    def num_pending(self) -> int:
        """Sessions that have not fired since they last changed (their trigger timer)."""
        return self._pending

    def _drop(self, key) -> None:
        old = self._next.pop(key, None)
        if old is not None:
            self._sessions -= old[1]
            self._pending -= old[2]

    def schedule(self, key, key_group: int, time: int, sessions: int, pending: int) -> None:
        """`key` (in `key_group`) now has `sessions` sessions, `pending` of them waiting to
        fire, the earliest due at `time`; `sessions` 0 forgets the key."""
        old = self._next.get(key)
        self._drop(key)
        if not sessions:
            return
        self._next[key] = (time, sessions, pending)
        self._sessions += sessions
        self._pending += pending
        if old is None or old[0] != time:
            heapq.heappush(self._heap, (time, next(self._seq), key, key_group))

    def pop_due(self, time: int) -> tuple[list, list]:
        """Keys (and their key groups) with a session due at `time`, earliest first; they are
        forgotten until `schedule`d again."""
        keys, key_groups = [], []
        heap, current = self._heap, self._next
        while heap and heap[0][0] <= time:
            due, _, key, key_group = heapq.heappop(heap)
            entry = current.get(key)
            if entry is not None and entry[0] == due:
                self._drop(key)
                keys.append(key)
                key_groups.append(key_group)
        return keys, key_groups

    def next_time(self) -> int | None:
        """The earliest due time of any key (None: no sessions)."""
        heap, current = self._heap, self._next
        while heap:
            due, _, key, _ = heap[0]
            entry = current.get(key)
            if entry is not None and entry[0] == due:
                return due
            heapq.heappop(heap)
        return None


__all__ = ["SessionTimers"]
