"""Which keys have a window due, for aligned (tumbling/sliding) windows with the default trigger.

With the default trigger every window of an aligned assigner has exactly two timers: the
trigger's at its end (``start + size - 1``, registered when an element arrives before the
watermark passed it) and the cleanup timer at ``end + allowed lateness`` (registered with its
first element). Both are implied by the window's state (its accumulator, and a "pending" flag
for the trigger's timer), so the vectorized window operator keeps no per-window timer state:
this index, rebuilt from the keyed state on restore (never checkpointed, like the timer heap of
`InternalTimerService`), says which keys to look at when time advances. All keys' windows share
their boundaries, so it is a dict ``window start -> chunks of keys`` — one entry per batch and
window start, not per key — and advancing time costs O(due windows), never a scan of all keys.

Sans-I/O: plain Python, no state backend; the operator reads and writes the windows' state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streamsnap.time.watermarks import MAX_WATERMARK


@dataclass
class Due:
    """What advancing time to `time` makes due: windows to fire (their trigger timer) and to
    clean up (cleanup timer), by start, and the registrations of those starts: `keys`,
    their `key_groups` and `starts`, in time order, then in registration order."""

    time: int
    fire: list[int]
    clean: list[int]
    keys: list = field(default_factory=list)
    key_groups: list = field(default_factory=list)
    starts: list = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.fire or self.clean)


class AlignedWindowIndex:
    """Window start -> keys that have (had) state for that window, plus the starts that still
    wait for their trigger timer."""

    def __init__(self, size: int, allowed_lateness: int):
        self.size = size
        self.allowed_lateness = allowed_lateness
        self._keys: dict[int, list[tuple[list, list]]] = {}   # start -> [(keys, key groups)]
        self._counts: dict[int, int] = {}                     # start -> windows registered
        self._pending: set[int] = set()

    def __len__(self) -> int:
        """Windows registered (each holds state until its cleanup)."""
        return sum(self._counts.values())

    def fire_time(self, start: int) -> int:
        return start + self.size - 1

    def cleanup_time(self, start: int) -> int:
        return min(start + self.size - 1 + self.allowed_lateness, MAX_WATERMARK)

    def add(self, start: int, keys: list, key_groups: list) -> None:
        """New windows (no state before) starting at `start` for `keys` (each key is listed
        once per start it is added for)."""
        if not keys:
            return
        self._keys.setdefault(start, []).append((keys, key_groups))
        self._counts[start] = self._counts.get(start, 0) + len(keys)

    def mark_pending(self, starts) -> None:
        """Windows starting at `starts` wait for their trigger timer."""
        self._pending.update(starts)

    def num_pending(self) -> int:
        return sum(self._counts.get(s, 0) for s in self._pending)

    def next_time(self) -> int | None:
        """The earliest time at which something becomes due (None: nothing registered)."""
        times = [self.fire_time(s) for s in self._pending]
        times += [self.cleanup_time(s) for s in self._keys]
        return min(times) if times else None

    def due(self, time: int) -> Due:
        """The windows due at `time` (not yet retired: call `retire` once they are handled)."""
        fire = sorted(s for s in self._pending if self.fire_time(s) <= time)
        clean = sorted(s for s in self._keys if self.cleanup_time(s) <= time)
        result = Due(time, fire, clean)
        if result:
            for start in sorted(set(fire) | set(clean)):
                for chunk_keys, chunk_groups in self._keys.get(start, ()):
                    result.keys += chunk_keys
                    result.key_groups += chunk_groups
                    result.starts += [start] * len(chunk_keys)
        return result

    def retire(self, due: Due) -> None:
        """`due`'s windows were fired and/or cleaned up."""
        self._pending.difference_update(due.fire)
        for start in due.clean:
            self._keys.pop(start, None)
            self._counts.pop(start, None)
            self._pending.discard(start)


__all__ = ["AlignedWindowIndex", "Due"]
