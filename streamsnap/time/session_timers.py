"""Which keys have a session due, for the vectorized session aggregate.

With the default event-time trigger every session has a cleanup timer at ``end - 1 + allowed
lateness`` and, until it fired, a trigger timer at ``end - 1``: both are implied by the key's
stored sessions (their ends and a "pending" flag), so no timer is stored. This index, rebuilt
from the state on restore (never checkpointed, like the timer heap of Flink's
`InternalTimerService`), holds per key only its earliest due time.

Why columns instead of a heap: a batch reschedules every key it touched (in Nexmark q11 most
of ~900 bidders a batch, their sessions' ends moving on), and a heap push plus the stale entry
it leaves cost Python work per key each time; here a key has a slot, a batch's keys find their
slots with one dict lookup each and their times are set with one numpy assignment, and finding
the due keys is a numpy comparison over the slots of the keys with sessions (those within a
gap of the watermark, plus those waiting for their cleanup) instead of heap pops.

Sans-I/O: plain Python and numpy, no state backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_FREE = np.iinfo(np.int64).max       # the due time of a free slot (which has no sessions)


class SessionTimers:
    """key -> slot, and per slot the key's earliest due time, sessions and pending sessions."""

    def __init__(self, capacity: int = 1024) -> None:
        self._slot: dict[Any, int] = {}
        self._keys: list = [None] * capacity
        self._groups = np.zeros(capacity, dtype=np.int64)
        self._due = np.full(capacity, _FREE, dtype=np.int64)
        self._counts = np.zeros(capacity, dtype=np.int64)     # sessions per slot
        self._pendings = np.zeros(capacity, dtype=np.int64)   # pending sessions per slot
        self._free: list[int] = list(range(capacity - 1, -1, -1))
        self._sessions = 0
        self._pending = 0

    def __len__(self) -> int:
        """Sessions registered (each holds state until its cleanup time)."""
        return self._sessions

    def num_pending(self) -> int:
        """Sessions that have not fired since they last changed (their trigger timer)."""
        return self._pending

    def schedule_many(self, keys: list, key_groups, times: np.ndarray, sessions: np.ndarray,
                      pending: np.ndarray) -> None:
        """Distinct `keys` (in `key_groups`) now have `sessions` sessions each, `pending` of
        them waiting to fire, the earliest due at `times` (int64 arrays); 0 sessions forgets a
        key."""
        if not len(keys):
            return
        slot = self._slot
        found = [slot.get(k, -1) for k in keys]
        slots = np.fromiter(found, dtype=np.int64, count=len(found))
        known = slots >= 0
        if known.any():
            old = slots[known]
            self._sessions -= int(self._counts[old].sum())
            self._pending -= int(self._pendings[old].sum())
        keep = sessions > 0
        new = np.flatnonzero(~known & keep)
        if len(new):
            slots[new] = self._allocate(len(new))
            names = self._keys
            groups = np.asarray(key_groups, dtype=np.int64)
            for i, s in zip(new.tolist(), slots[new].tolist()):
                slot[keys[i]] = s
                names[s] = keys[i]
            self._groups[slots[new]] = groups[new]
        gone = np.flatnonzero(known & ~keep)
        if len(gone):
            freed = slots[gone]
            for i in gone.tolist():
                del slot[keys[i]]
            self._release(freed)
        live = slots[keep]
        self._due[live] = times[keep]
        self._counts[live] = sessions[keep]
        self._pendings[live] = pending[keep]
        self._sessions += int(sessions[keep].sum())
        self._pending += int(pending[keep].sum())

    def _allocate(self, n: int) -> np.ndarray:
        free = self._free
        if len(free) < n:
            self._grow(n - len(free))
        out = free[-n:]
        del free[-n:]
        return np.asarray(out, dtype=np.int64)

    def _grow(self, at_least: int) -> None:
        old = len(self._keys)
        size = max(2 * old, old + at_least)
        extra = size - old
        self._keys.extend([None] * extra)
        self._groups = np.r_[self._groups, np.zeros(extra, dtype=np.int64)]
        self._due = np.r_[self._due, np.full(extra, _FREE, dtype=np.int64)]
        self._counts = np.r_[self._counts, np.zeros(extra, dtype=np.int64)]
        self._pendings = np.r_[self._pendings, np.zeros(extra, dtype=np.int64)]
        self._free[:0] = range(size - 1, old - 1, -1)

    def _release(self, slots: np.ndarray) -> None:
        self._due[slots] = _FREE
        self._counts[slots] = 0
        self._pendings[slots] = 0
        names = self._keys
        for s in slots.tolist():
            names[s] = None
        self._free.extend(slots.tolist())

    def pop_due(self, time: int) -> tuple[list, list]:
        """Keys (and their key groups) with a session due at `time`, earliest first (equal
        times in slot order); they are forgotten until `schedule_many`d again."""
        due = np.flatnonzero((self._due <= time) & (self._counts > 0))
        if not len(due):
            return [], []
        due = due[np.argsort(self._due[due], kind="stable")]
        names = self._keys
        keys = [names[s] for s in due.tolist()]
        key_groups = self._groups[due].tolist()
        slot = self._slot
        for k in keys:
            del slot[k]
        self._sessions -= int(self._counts[due].sum())
        self._pending -= int(self._pendings[due].sum())
        self._release(due)
        return keys, key_groups

    def next_time(self) -> int | None:
        """The earliest due time of any key (None: no sessions)."""
        if not self._slot:
            return None
        return int(self._due[self._counts > 0].min())


__all__ = ["SessionTimers"]
