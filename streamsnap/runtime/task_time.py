"""Where a task's time goes: waiting for input (idle), waiting for output room (backpressured), or working.

The mailbox loop waits in exactly one place — its poll on the network when a step did no work.
If the outputs had room, the task waited for input (or a timer, or a source with nothing due):
idle. If an output channel was full (no credit downstream, its send queue at its bound), the
task waited for the network to take its output: backpressured. Everything else is busy, as
Flink derives busyTimeMsPerSecond. Only waits are timed (one clock read after each), so the
cost is per wait, never per record.

The account is read from the control thread (`report_metrics`) while the loop runs; a wait
still in progress counts up to the moment of the reading, so a task blocked for seconds does
not look busy. Sans-I/O: callers pass the time.
"""

from __future__ import annotations

import threading


class TaskTimeAccount:
    def __init__(self, now: float):
        self._lock = threading.Lock()
        self._started = now
        self._idle = 0.0
        self._backpressured = 0.0
        self._waiting_since: float | None = None
        self._waiting_backpressured = False

    def begin_wait(self, now: float, backpressured: bool) -> None:
        with self._lock:
            self._waiting_since = now
            self._waiting_backpressured = backpressured

    def end_wait(self, now: float) -> None:
        with self._lock:
            since = self._waiting_since
            if since is None:
                return
            if self._waiting_backpressured:
                self._backpressured += now - since
            else:
                self._idle += now - since
            self._waiting_since = None

    def reading(self, now: float) -> dict:
        """Seconds since the task started running, and of those idle and backpressured."""
        with self._lock:
            idle, backpressured = self._idle, self._backpressured
            if self._waiting_since is not None:
                ongoing = max(0.0, now - self._waiting_since)
                if self._waiting_backpressured:
                    backpressured += ongoing
                else:
                    idle += ongoing
        return {"elapsed": now - self._started, "idle": idle, "backpressured": backpressured}


def time_shares(before: dict | None, after: dict) -> dict | None:
    """Milliseconds per second idle, backpressured and busy between two readings of one task's
    account (None when no time passed between them, or the task restarted in between: its
    account started again: it counts from its start, telling attempts apart by "attempt")."""
    if before is None or before.get("attempt") != after.get("attempt") or after["elapsed"] < before["elapsed"]:
        before = {"elapsed": 0.0, "idle": 0.0, "backpressured": 0.0}
    span = after["elapsed"] - before["elapsed"]
    if span <= 0:
        return None
    idle = min(1000.0, max(0.0, (after["idle"] - before["idle"]) / span * 1000))
    backpressured = min(1000.0 - idle, max(0.0, (after["backpressured"] - before["backpressured"]) / span * 1000))
    return {"idle": idle, "backpressured": backpressured, "busy": 1000.0 - idle - backpressured}


def backpressure_level(ratio: float) -> str:
    """Flink's thresholds: up to 10 % of the time backpressured is ok, up to 50 % low, then high."""
    if ratio <= 0.10:
        return "ok"
    if ratio <= 0.5:
        return "low"
    return "high"
