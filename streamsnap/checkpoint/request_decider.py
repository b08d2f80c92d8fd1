"""Which checkpoint request runs now, which waits, which is dropped (Flink's CheckpointRequestDecider).

Requests wait in a queue ordered by priority: savepoints first (the user asked and may be
stopping the job), then manual checkpoints, then periodic ones; FIFO within a class. The head
runs when fewer than `max_concurrent` checkpoints are pending; a savepoint runs regardless
(it is *forced*). A periodic request also waits for `min_pause` after the last completion:
if it is too early it is dropped with MINIMUM_TIME_BETWEEN_CHECKPOINTS and the caller is told
when to retry, which is how the periodic trigger is pushed back.

Periodic requests carry no information beyond "a checkpoint is due", so at most one waits:
another one arriving meanwhile is dropped (TOO_MANY_CHECKPOINT_REQUESTS) instead of piling up
into a burst of back-to-back checkpoints once the slow one finishes. The queue as a whole is
bounded by `max_queued`; when full, the lowest-priority request is dropped, and a new request
is refused outright if only user requests are waiting.

Pure decision logic: it reads the clock, never touches futures or timers. Every decision lists
the requests it rejected and why; the caller fails their futures.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from concurrent.futures import Future
from dataclasses import dataclass, field

from streamsnap.checkpoint.completed import CheckpointProperties
from streamsnap.checkpoint.reasons import CheckpointFailureReason
from streamsnap.clock import Clock

logger = logging.getLogger(__name__)

DEFAULT_MAX_QUEUED = 1000


@dataclass(frozen=True, eq=False)
class CheckpointTriggerRequest:
    """One call of trigger_checkpoint / trigger_savepoint; `future` completes with its outcome."""

    properties: CheckpointProperties
    target_directory: str | None = None
    future: Future = field(default_factory=Future, repr=False)

    @property
    def is_periodic(self) -> bool:
        return self.properties.is_periodic

    @property
    def is_savepoint(self) -> bool:
        return self.properties.is_savepoint

    @property
    def forced(self) -> bool:
        return self.properties.forced

    @property
    def priority(self) -> int:
        """0 savepoints, 1 manual checkpoints, 2 periodic checkpoints (lower runs first)."""
        return 0 if self.is_savepoint else 2 if self.is_periodic else 1


@dataclass(frozen=True)
class Rejection:
    request: CheckpointTriggerRequest
    reason: CheckpointFailureReason


@dataclass(frozen=True)
class TriggerDecision:
    """execute: the request to trigger now, if any. rejected: requests dropped, with why.
    retry_after: seconds until min_pause has passed, when a periodic request was too early."""

    execute: CheckpointTriggerRequest | None = None
    rejected: tuple[Rejection, ...] = ()
    retry_after: float | None = None


class CheckpointRequestDecider:
    def __init__(self, max_concurrent: int, min_pause: float, clock: Clock,
                 max_queued: int = DEFAULT_MAX_QUEUED):
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        if min_pause < 0:
            raise ValueError(f"min_pause must be >= 0, got {min_pause}")
        if max_queued < 1:
            raise ValueError(f"max_queued must be >= 1, got {max_queued}")
        self.max_concurrent = max_concurrent
        self.min_pause = min_pause
        self.max_queued = max_queued
        self._clock = clock
        self._seq = itertools.count()
        self._queue: list[tuple[int, int, CheckpointTriggerRequest]] = []

    @property
    def queued(self) -> list[CheckpointTriggerRequest]:
        """Waiting requests, in the order they would run."""
        return [request for _, _, request in self._queue]

    def __len__(self) -> int:
        return len(self._queue)

    def choose_request_to_execute(self, request: CheckpointTriggerRequest, *, is_triggering: bool,
                                  num_pending: int, last_completion: float | None) -> TriggerDecision:
        """Take a new request: queue it (or refuse it), then pick what to run now.

        is_triggering: a trigger is in progress (nothing else starts until it returns).
        num_pending: checkpoints currently pending. last_completion: monotonic time of the
        last completed checkpoint, None if none completed yet.
        """
        rejected: list[Rejection] = []
        if request.is_periodic and any(r.is_periodic for _, _, r in self._queue):
            logger.debug("dropping periodic checkpoint request: one is already waiting")
            return TriggerDecision(rejected=(Rejection(request, CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS),))
        if len(self._queue) >= self.max_queued and not self._queue[-1][2].is_periodic:
            return TriggerDecision(rejected=(Rejection(request, CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS),))
        bisect.insort(self._queue, (request.priority, next(self._seq), request), key=lambda e: e[:2])
        while len(self._queue) > self.max_queued:
            rejected.append(Rejection(self._queue.pop()[2], CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS))
        decision = self._choose(is_triggering, num_pending, last_completion)
        return TriggerDecision(decision.execute, tuple(rejected) + decision.rejected, decision.retry_after)

    def choose_queued_request(self, *, is_triggering: bool, num_pending: int,
                              last_completion: float | None) -> TriggerDecision:
        """Pick a waiting request to run, e.g. after a checkpoint completed or was aborted."""
        return self._choose(is_triggering, num_pending, last_completion)

    def _choose(self, is_triggering: bool, num_pending: int, last_completion: float | None) -> TriggerDecision:
        if is_triggering or not self._queue:
            return TriggerDecision()
        first = self._queue[0][2]
        if num_pending >= self.max_concurrent and not first.forced:
            return TriggerDecision()
        if first.is_periodic and not first.forced:
            wait = self.remaining_pause(last_completion)
            if wait > 0:
                self._queue.pop(0)
                return TriggerDecision(
                    rejected=(Rejection(first, CheckpointFailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS),),
                    retry_after=wait)
        self._queue.pop(0)
        return TriggerDecision(execute=first)

    def remaining_pause(self, last_completion: float | None) -> float:
        """Seconds until `min_pause` has passed since the last completion (0 if it has)."""
        if last_completion is None or self.min_pause <= 0:
            return 0.0
        return max(0.0, last_completion + self.min_pause - self._clock.monotonic())

    def drain(self) -> list[CheckpointTriggerRequest]:
        """Remove and return every waiting request (coordinator stopping or shutting down)."""
        requests = self.queued
        self._queue.clear()
        return requests


__all__ = ["CheckpointRequestDecider", "CheckpointTriggerRequest", "TriggerDecision", "Rejection",
           "DEFAULT_MAX_QUEUED"]
