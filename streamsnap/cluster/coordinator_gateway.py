"""What the checkpoint coordinator sees of the JobMaster (checkpoint/coordinator.py's ports).

The coordinator is sans-I/O: it schedules through a Scheduler and reaches tasks through a
CheckpointTaskGateway. The JobMaster (cluster/jobmaster.py) gives it these two, so its timers
run on the JobMaster's event loop and its messages go over the subtasks' control connections,
with completions held back by the sinks' commit gate (cluster/commit_gate.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from streamsnap.clock import SystemClock, TimerQueue
from streamsnap.graph.ids import ExecutionAttemptId

if TYPE_CHECKING:
    from streamsnap.cluster.jobmaster import JobMaster


class LoopScheduler:
    """The Scheduler the coordinator sees: timers run on the JobMaster's thread."""

    def __init__(self, clock: SystemClock, timers: TimerQueue):
        self._clock = clock
        self._timers = timers

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def wall(self) -> float:
        return self._clock.wall()

    def call_later(self, delay: float, callback: Callable[[], None]):
        return self._timers.call_later(delay, callback)


class CoordinatorGateway:
    """CheckpointTaskGateway over the control connections."""

    def __init__(self, master: "JobMaster"):
        self._master = master

    def _send(self, attempt: ExecutionAttemptId, message: dict) -> None:
        subtask = self._master._subtask_of(attempt)
        if subtask is not None and subtask.connection is not None:
            subtask.connection.send(message)

    def trigger_checkpoint(self, attempt, checkpoint_id, timestamp, options) -> None:
        pending = self._master.coordinator.pending_checkpoint(checkpoint_id)
        self._send(attempt, {"type": "trigger_checkpoint", "checkpoint_id": checkpoint_id,
                             "timestamp": timestamp, "options": options.to_wire(),
                             # sources advance event time to its end before this barrier
                             "drain": pending is not None and pending.properties.drain})

    def notify_checkpoint_complete(self, attempt, checkpoint_id, timestamp) -> None:
        self._master.commit_gate.hold(checkpoint_id, lambda: self._send(
            attempt, {"type": "notify_complete", "checkpoint_id": checkpoint_id, "timestamp": timestamp}))

    def notify_checkpoint_aborted(self, attempt, checkpoint_id) -> None:
        self._send(attempt, {"type": "notify_aborted", "checkpoint_id": checkpoint_id})


__all__ = ["LoopScheduler", "CoordinatorGateway"]
