"""Time and timers as injected dependencies, so protocol logic runs on a fake clock in tests.

The coordinator, the failure manager and the barrier handlers never read the system clock or
start threads: they are handed a `Clock` and a `Scheduler`. Production passes the JobMaster's
event loop; tests pass `ManualScheduler` and advance time by hand (Flink tests its coordinator
the same way with a manually triggered executor).
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Callable, Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def wall(self) -> float: ...


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Clock, Protocol):
    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class _Timer:
    __slots__ = ("due", "seq", "callback", "cancelled")

    def __init__(self, due: float, seq: int, callback: Callable[[], None]):
        self.due, self.seq, self.callback, self.cancelled = due, seq, callback, False

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: "_Timer") -> bool:
        return (self.due, self.seq) < (other.due, other.seq)


class TimerQueue:
    """A heap of timers; the owner decides when to run the due ones (single-threaded)."""

    def __init__(self, clock: Clock):
        self._clock = clock
        self._heap: list[_Timer] = []
        self._seq = itertools.count()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        timer = _Timer(self._clock.monotonic() + max(0.0, delay), next(self._seq), callback)
        heapq.heappush(self._heap, timer)
        return timer

    def next_due(self) -> float | None:
        while self._heap and self._heap[0].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0].due if self._heap else None

    def run_due(self) -> int:
        """Run every timer due by now, in due order; returns how many ran."""
        ran = 0
        now = self._clock.monotonic()
        while self._heap and self._heap[0].due <= now:
            timer = heapq.heappop(self._heap)
            if not timer.cancelled:
                timer.cancelled = True
                timer.callback()
                ran += 1
            now = self._clock.monotonic()
        return ran

    def pending(self) -> int:
        return sum(1 for t in self._heap if not t.cancelled)


class ManualScheduler:
    """A fake clock with timers, for deterministic tests: time moves only in `advance`."""

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_700_000_000.0):
        self._now = start
        self._wall_offset = wall_offset
        self._timers = TimerQueue(self)

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        return self._timers.call_later(delay, callback)

    def advance(self, seconds: float) -> int:
        """Move time forward, firing timers at their due times in order; returns how many ran."""
        target = self._now + seconds
        ran = 0
        while True:
            due = self._timers.next_due()
            if due is None or due > target:
                break
            self._now = max(self._now, due)
            ran += self._timers.run_due()
        self._now = target
        return ran

    def run_due(self) -> int:
        return self._timers.run_due()

    def pending_timers(self) -> int:
        return self._timers.pending()
