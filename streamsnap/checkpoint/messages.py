"""Messages a task sends the checkpoint coordinator about a checkpoint.

Plain frozen values with a msgpack-safe wire form; the control RPC carries them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streamsnap.checkpoint.handles import TaskStateSnapshot, task_state_from_wire, task_state_to_wire
from streamsnap.checkpoint.reasons import CheckpointFailureReason
from streamsnap.graph.ids import ExecutionAttemptId


@dataclass(frozen=True)
class CheckpointMetrics:
    """Per-subtask figures of one checkpoint (Flink's CheckpointMetrics), in seconds/bytes."""

    sync_duration: float = 0.0
    async_duration: float = 0.0
    alignment_duration: float = 0.0
    # From the coordinator's trigger timestamp to the first barrier reaching this task.
    start_delay: float = 0.0
    bytes_processed_during_alignment: int = 0
    # Bytes of in-flight data persisted (unaligned checkpoints).
    bytes_persisted_of_in_flight_data: int = 0
    # The subtask took this checkpoint unaligned (its barrier overtook in-flight data).
    unaligned: bool = False
    # Calls on checkpoint storage its asynchronous part retried (throttling, 5xx: storage_retry).
    storage_retries: int = 0

    def to_wire(self) -> list:
        return [self.sync_duration, self.async_duration, self.alignment_duration,
                self.start_delay, self.bytes_processed_during_alignment,
                self.bytes_persisted_of_in_flight_data, self.unaligned, self.storage_retries]

    @classmethod
    def from_wire(cls, data: list) -> "CheckpointMetrics":
        return cls(float(data[0]), float(data[1]), float(data[2]), float(data[3]),
                   int(data[4]), int(data[5]), bool(data[6]) if len(data) > 6 else False,
                   int(data[7]) if len(data) > 7 else 0)


@dataclass(frozen=True)
class AcknowledgeCheckpoint:
    attempt: ExecutionAttemptId
    checkpoint_id: int
    subtask_state: TaskStateSnapshot = field(default_factory=dict)
    metrics: CheckpointMetrics = CheckpointMetrics()
    # The directory the task wrote into (its handles are relative to it), so state that arrives
    # after the coordinator forgot the checkpoint is still found and deleted.
    location: str = ""

    def to_wire(self) -> dict:
        return {"attempt": self.attempt.to_wire(), "checkpoint_id": self.checkpoint_id,
                "state": task_state_to_wire(self.subtask_state), "metrics": self.metrics.to_wire(),
                "location": self.location}

    @classmethod
    def from_wire(cls, data: dict) -> "AcknowledgeCheckpoint":
        return cls(ExecutionAttemptId.from_wire(data["attempt"]), int(data["checkpoint_id"]),
                   task_state_from_wire(data["state"]), CheckpointMetrics.from_wire(data["metrics"]),
                   str(data.get("location", "")))


@dataclass(frozen=True)
class DeclineCheckpoint:
    attempt: ExecutionAttemptId
    checkpoint_id: int
    reason: CheckpointFailureReason
    detail: str = ""

    def to_wire(self) -> dict:
        return {"attempt": self.attempt.to_wire(), "checkpoint_id": self.checkpoint_id,
                "reason": self.reason.name, "detail": self.detail}

    @classmethod
    def from_wire(cls, data: dict) -> "DeclineCheckpoint":
        return cls(ExecutionAttemptId.from_wire(data["attempt"]), int(data["checkpoint_id"]),
                   CheckpointFailureReason[data["reason"]], str(data.get("detail", "")))
