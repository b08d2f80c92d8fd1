"""When failed checkpoints fail the job (Flink's CheckpointFailureManager).

A job whose checkpoints keep failing makes no recoverable progress: after a failure its
sources would rewind further and further. So consecutive checkpoint failures are counted and,
once there are more than `tolerable_failures`, the job is failed over (restarted from the
latest completed checkpoint). A completed checkpoint resets the count.

Only failures that say something about the job's ability to checkpoint are counted, each
checkpoint id at most once. Not counted: refusals before anything was triggered (reasons
flagged `pre_flight`), checkpoints subsumed by newer ones, declines that are side effects of
normal operation (task not ready, closing, input ended, cancelled by a newer barrier), failures
of the tasks themselves (the job fails over for those anyway), savepoint failures (reported to
the user who asked for them), and failures of checkpoints older than the last successful one.

Deviation from Flink, on purpose: TASK_CHECKPOINT_FAILURE and TRIGGER_CHECKPOINT_FAILURE are
counted. In Flink a task whose local snapshot fails also fails itself; a streamsnap task only
declines, so a task that can never snapshot would otherwise leave the job running forever
without a single new checkpoint.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Callable

from streamsnap.checkpoint.reasons import CheckpointException, CheckpointFailureReason as R

logger = logging.getLogger(__name__)

COUNTED_REASONS = frozenset({
    R.CHECKPOINT_EXPIRED,
    R.CHECKPOINT_DECLINED,
    R.CHECKPOINT_ASYNC_EXCEPTION,
    R.TASK_CHECKPOINT_FAILURE,
    R.IO_EXCEPTION,
    R.FINALIZE_CHECKPOINT_FAILURE,
    R.TRIGGER_CHECKPOINT_FAILURE,
})

IGNORED_REASONS = frozenset(r for r in R if r not in COUNTED_REASONS)


class CheckpointFailureThresholdExceeded(CheckpointException):
    """The job failed because more consecutive checkpoints failed than it tolerates.

    `reason` is the reason of the failure that crossed the threshold.
    """


class CheckpointFailureManager:
    def __init__(self, tolerable_failures: int, fail_job: Callable[[Exception], None]):
        if tolerable_failures < 0:
            raise ValueError(f"tolerable_failures must be >= 0, got {tolerable_failures}")
        self.tolerable_failures = tolerable_failures
        self._fail_job = fail_job
        self._continuous_failures = 0
        self._counted_ids: set[int] = set()
        self._last_succeeded_id = 0
        self._failure_counts: Counter[R] = Counter()

    @staticmethod
    def counts_toward_tolerance(reason: R) -> bool:
        return reason in COUNTED_REASONS

    @property
    def continuous_failures(self) -> int:
        return self._continuous_failures

    def failure_counts(self) -> dict[R, int]:
        """Every failure reported so far, by reason (counted or not), for statistics."""
        return dict(self._failure_counts)

    def handle_checkpoint_failure(self, exception: CheckpointException, checkpoint_id: int | None = None,
                                  *, is_savepoint: bool = False) -> None:
        """Count a failed checkpoint (or a failed trigger, checkpoint_id None); may fail the job."""
        reason = exception.reason
        self._failure_counts[reason] += 1
        if is_savepoint or not self.counts_toward_tolerance(reason):
            return
        if checkpoint_id is not None:
            if checkpoint_id <= self._last_succeeded_id or checkpoint_id in self._counted_ids:
                return
            self._counted_ids.add(checkpoint_id)
        self._continuous_failures += 1
        logger.info("checkpoint %s failed (%s): %d consecutive failure(s), %d tolerated",
                    checkpoint_id if checkpoint_id is not None else "trigger", reason.name,
                    self._continuous_failures, self.tolerable_failures)
        if self._continuous_failures > self.tolerable_failures:
            failures = self._continuous_failures
            self._clear()
            error = CheckpointFailureThresholdExceeded(
                reason,
                f"Exceeded the checkpoint tolerable failure threshold: {failures} consecutive "
                f"checkpoint failure(s), tolerable_failures={self.tolerable_failures}. The job fails "
                f"over to its latest completed checkpoint. Look at the failed checkpoints in the "
                f"checkpoint statistics, or raise CheckpointConfig.tolerable_failures.",
                checkpoint_id)
            error.__cause__ = exception
            logger.warning("%s", error)
            self._fail_job(error)

    def handle_checkpoint_success(self, checkpoint_id: int) -> None:
        if checkpoint_id > self._last_succeeded_id:
            self._last_succeeded_id = checkpoint_id
            self._clear()

    def _clear(self) -> None:
        self._continuous_failures = 0
        self._counted_ids.clear()


__all__ = ["CheckpointFailureManager", "CheckpointFailureThresholdExceeded", "COUNTED_REASONS",
           "IGNORED_REASONS"]
