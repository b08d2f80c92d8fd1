"""Restart backoff: whether and when to restart after a failure (Flink's RestartBackoffTimeStrategy).

Sans-I/O: fed failure times, answers `can_restart()` and `backoff_time`. Fixed delay allows a
number of restarts with a constant pause; exponential delay doubles (x multiplier) the pause up
to a maximum and forgets the failure history after `reset_after` seconds without failure.
"""

from __future__ import annotations

from streamsnap.api.config import RestartStrategy


class RestartBackoff:
    def __init__(self, strategy: RestartStrategy):
        self._strategy = strategy
        self.restarts = 0
        self._current_delay = strategy.initial
        self._last_failure: float | None = None

    def notify_failure(self, now: float) -> None:
        s = self._strategy
        if s.kind == "exponential_delay":
            if self._last_failure is not None and now - self._last_failure >= s.reset_after:
                self._current_delay = s.initial
                self.restarts = 0
            elif self._last_failure is not None:
                self._current_delay = min(s.max_delay, self._current_delay * s.multiplier)
        self._last_failure = now

    def can_restart(self) -> bool:
        s = self._strategy
        if s.kind == "none":
            return False
        if s.kind == "fixed_delay":
            return self.restarts < s.attempts
        return s.attempts < 0 or self.restarts < s.attempts

    @property
    def backoff_time(self) -> float:
        s = self._strategy
        return s.delay if s.kind == "fixed_delay" else self._current_delay

    def notify_restart(self) -> None:
        self.restarts += 1

    def describe(self) -> str:
        s = self._strategy
        if s.kind == "none":
            return "no restarts (RestartStrategy.none())"
        if s.kind == "fixed_delay":
            return f"fixed delay: {s.attempts} restarts, {s.delay:g} s apart"
        limit = "unlimited" if s.attempts < 0 else str(s.attempts)
        return f"exponential delay: {limit} restarts, {s.initial:g}s .. {s.max_delay:g}s"
