"""Why a checkpoint failed, and what an acknowledgement did — Flink's two vocabularies.

`CheckpointFailureReason` mirrors Flink's enum of the same name. Reasons flagged
`pre_flight` are refusals before anything was triggered (too many concurrent checkpoints,
minimum pause, a task not running): the failure manager does not count them against
`tolerable_failures`, exactly as Flink's `CheckpointFailureManager` ignores them.
"""

from __future__ import annotations

import enum


class CheckpointFailureReason(enum.Enum):
    def __new__(cls, message: str, pre_flight: bool = False):
        obj = object.__new__(cls)
        obj._value_ = message
        obj.pre_flight = pre_flight
        return obj

    PERIODIC_SCHEDULER_SHUTDOWN = ("Periodic checkpoint scheduler is shut down.", True)
    TOO_MANY_CHECKPOINT_REQUESTS = ("The maximum number of queued checkpoint requests exceeded", True)
    MINIMUM_TIME_BETWEEN_CHECKPOINTS = (
        "The minimum time between checkpoints is still pending. Checkpoint will be triggered later.", True)
    NOT_ALL_REQUIRED_TASKS_RUNNING = ("Not all required tasks are currently running.", True)
    CHECKPOINT_COORDINATOR_SHUTDOWN = ("CheckpointCoordinator shutdown.", True)
    CHECKPOINT_COORDINATOR_SUSPEND = ("Checkpoint Coordinator is suspending.", True)
    TRIGGER_CHECKPOINT_FAILURE = ("Trigger checkpoint failure.")
    IO_EXCEPTION = ("An Exception occurred while triggering the checkpoint.")
    CHECKPOINT_ASYNC_EXCEPTION = ("Asynchronous task checkpoint failed.")
    CHECKPOINT_EXPIRED = ("Checkpoint expired before completing.")
    CHECKPOINT_SUBSUMED = ("Checkpoint has been subsumed.")
    CHECKPOINT_DECLINED = ("Checkpoint was declined.")
    CHECKPOINT_DECLINED_TASK_NOT_READY = ("Checkpoint was declined (tasks not ready)")
    CHECKPOINT_DECLINED_TASK_CLOSING = ("Checkpoint was declined (task is closing)")
    CHECKPOINT_DECLINED_SUBSUMED = ("Checkpoint was canceled because a barrier from newer checkpoint was received.")
    CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER = ("Task received cancellation from one of its inputs")
    CHECKPOINT_DECLINED_ALIGNMENT_LIMIT_EXCEEDED = (
        "The checkpoint alignment phase needed to buffer more than the configured maximum bytes")
    CHECKPOINT_DECLINED_INPUT_END_OF_STREAM = (
        "Checkpoint was declined because one input stream is finished")
    TASK_FAILURE = ("Task Failure")
    TASK_CHECKPOINT_FAILURE = ("Task local checkpoint failure.")
    UNKNOWN_TASK_CHECKPOINT_NOTIFICATION_FAILURE = ("Unknown task for the checkpoint to notify.")
    FINALIZE_CHECKPOINT_FAILURE = ("Failure to finalize checkpoint.")
    SHARED_STATE_DISCARDED = ("An incremental snapshot reuses shared state files that no retained "
                              "checkpoint references any more; the next checkpoint uploads them again.")
    JOB_FAILOVER = ("The job is failing over; pending checkpoints are aborted.", True)

    @property
    def message(self) -> str:
        return self._value_


class AcknowledgeResult(enum.Enum):
    """Outcome of `PendingCheckpoint.acknowledge_task` (Flink's TaskAcknowledgeResult)."""

    SUCCESS = "success"        # first ack of a task we wait for
    DUPLICATE = "duplicate"    # the task had already acknowledged
    UNKNOWN = "unknown"        # not a task of this checkpoint (e.g. an old attempt)
    DISCARDED = "discarded"    # the checkpoint was already aborted/disposed


class CheckpointException(Exception):
    """A checkpoint failed for `reason`; carries the reason so it can be counted."""

    def __init__(self, reason: CheckpointFailureReason, detail: str | None = None,
                 checkpoint_id: int | None = None):
        self.reason = reason
        self.detail = detail
        self.checkpoint_id = checkpoint_id
        text = reason.message if not detail else f"{reason.message} {detail}"
        if checkpoint_id is not None:
            text = f"checkpoint {checkpoint_id}: {text}"
        super().__init__(f"{reason.name}: {text}")
