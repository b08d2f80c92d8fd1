"""Restart backoff: whether and when to restart after a failure (Flink's RestartBackoffTimeStrategy).

Sans-I/O: fed failure times, answers `can_restart()` and `backoff_time`. Fixed delay allows a
number of restarts with a constant pause; exponential delay doubles (x multiplier) the pause up
to a maximum and forgets the failure history after `reset_after` seconds without failure.
Failure rate restarts after a constant pause unless the failure is the (n+1)-th within
`interval` seconds; its only memory is the times of the last n failures, so the history is a
count and a short list of timestamps that could be stored and reloaded as they are.
"""

from __future__ import annotations

from streamsnap.api.config import RestartStrategy


class RestartBackoff:
    def __init__(self, strategy: RestartStrategy):
        self._strategy = strategy
        self.restarts = 0
        self._current_delay = strategy.initial
        self._last_failure: float | None = None
        # failure_rate: times of the failures within `interval` of the latest, oldest first
        # (at most attempts + 1 of them).
        self.failure_times: list[float] = []

    def notify_failure(self, now: float) -> None:
        s = self._strategy
        if s.kind == "failure_rate":
            self.failure_times = [t for t in self.failure_times if now - t < s.interval]
            self.failure_times.append(now)
            del self.failure_times[:-(s.attempts + 1)]
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
        if s.kind == "failure_rate":
            return len(self.failure_times) <= s.attempts
        return s.attempts < 0 or self.restarts < s.attempts

    @property
    def backoff_time(self) -> float:
        s = self._strategy
        return s.delay if s.kind in ("fixed_delay", "failure_rate") else self._current_delay

    def notify_restart(self) -> None:
        self.restarts += 1

    def history(self, to_wall: float) -> dict:
        """The failure history as plain values, for the next JobMaster of the job (in_cluster.py).
        Failure times are this process's clock plus `to_wall` (its offset to the wall clock),
        because the next JobMaster may run on another host."""
        return {"restarts": self.restarts, "current_delay": self._current_delay,
                "last_failure": None if self._last_failure is None else self._last_failure + to_wall,
                "failure_times": [t + to_wall for t in self.failure_times]}

    def load_history(self, history: dict, to_wall: float) -> None:
        """Continue from `history()` of an earlier JobMaster (`to_wall`: this process's offset)."""
        self.restarts = int(history["restarts"])
        self._current_delay = float(history["current_delay"])
        last = history.get("last_failure")
        self._last_failure = None if last is None else float(last) - to_wall
        self.failure_times = [float(t) - to_wall for t in history.get("failure_times", [])]

    def describe(self) -> str:
        s = self._strategy
        if s.kind == "none":
            return "no restarts (RestartStrategy.none())"
        if s.kind == "fixed_delay":
            return f"fixed delay: {s.attempts} restarts, {s.delay:g} s apart"
        if s.kind == "failure_rate":
            return (f"failure rate: at most {s.attempts} failure(s) restarted per {s.interval:g} s, "
                    f"{s.delay:g} s apart")
        limit = "unlimited" if s.attempts < 0 else str(s.attempts)
        return f"exponential delay: {limit} restarts, {s.initial:g}s .. {s.max_delay:g}s"
