"""Processing time for a test harness: whole milliseconds that move only when the test says so.

The operators schedule their processing-time wake-ups on the task's timer queue with a delay in
seconds computed from `clock.wall()` (runtime/operators/keyed.py); a float clock would make
`int(wall * 1000)` land one millisecond short now and then (4.35 * 1000 is 4349.999...), so a
timer due "now" could miss its firing. This clock keeps integer milliseconds, rounds delays to
whole milliseconds, and reports `wall()` half a millisecond into the current one, so what the
operators read back is exactly the time the test set. Sans-I/O: no thread, no sleep.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Callable

from streamsnap.clock import _Timer


class ManualClock:
    """A `streamsnap.clock.Scheduler` on integer milliseconds, advanced by the test.

    Processing time starts at `start_ms` (epoch milliseconds as the operators see them).
    `advance_to` runs every callback due by the target in due order, with the clock set to each
    one's due time while it runs, so a timer sees the time it was set for.
    """

    def __init__(self, start_ms: int = 0):
        self.now_ms = start_ms
        self._heap: list[_Timer] = []    # streamsnap.clock's timers, due in whole ms
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self.now_ms / 1000.0

    def wall(self) -> float:
        # Half a millisecond in: int(wall() * 1000) is now_ms whatever the float rounding.
        return (self.now_ms + 0.5) / 1000.0

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        call = _Timer(self.now_ms + max(0, round(delay * 1000)), next(self._seq), callback)
        heapq.heappush(self._heap, call)
        return call

    def advance_to(self, target_ms: int) -> int:
        """Move processing time to `target_ms`, running what falls due; returns how many ran."""
        ran = 0
        heap = self._heap
        while heap and heap[0].due <= target_ms:
            call = heapq.heappop(heap)
            if call.cancelled:
                continue
            call.cancelled = True
            self.now_ms = max(self.now_ms, call.due)
            call.callback()
            ran += 1
        self.now_ms = max(self.now_ms, target_ms)
        return ran

    def pending(self) -> int:
        return sum(1 for call in self._heap if not call.cancelled)


__all__ = ["ManualClock"]
