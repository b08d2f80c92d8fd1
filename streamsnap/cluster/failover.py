"""Failover: which failure is an attempt's root cause, and what follows once the attempt stopped.

A failed attempt is noticed by whichever report comes first — a task's `failed` message, a
control connection dropping, a driver-side sink or the coordinator giving up — and that is not
always the root cause: a task whose input was lost reports first, its upstream's death follows
(FOLLOW_ON_GRACE, `_lost_by_neighbour`). Once the attempt's Spark job ended, the restart
strategy decides: deploy again from the latest completed checkpoint, or fail the job with its
root cause. A Spark job that ends cleanly before every subtask's `finished` report was handled
is not yet a failure: those reports may still be on their way (LAST_REPORTS_GRACE). The
JobMaster (cluster/jobmaster.py) charges failures (`_handle_failure`); this mixin holds the
rest, on its event loop.
"""

from __future__ import annotations

import logging

from streamsnap.checkpoint.coordinator import CheckpointListenerError
from streamsnap.cluster.attempts import replaces_cause
from streamsnap.cluster.status import ExecutionState, JobStatus
from streamsnap.cluster.subtask_record import SubtaskRecord
from streamsnap.errors import JobExecutionError
from streamsnap.network.control import ControlConnection

log = logging.getLogger("streamsnap.cluster.jobmaster")   # the JobMaster's log, as before the split

# Seconds a failure report that followed from a lost upstream waits for that upstream's own failure.
FOLLOW_ON_GRACE = 0.3
# Seconds a Spark job that ended cleanly waits for its subtasks' last reports still being read.
LAST_REPORTS_GRACE = 2.0


def failure_reason(message: dict) -> str:
    """The reason a task's `failed` report gives: a data error, a user function's error, a
    neighbour's failure it followed from (a lost input or output connection), or other."""
    return ("DATA_ERROR" if message.get("data_error") else
            "USER_FUNCTION" if message.get("user_error") else
            "FOLLOW_ON" if message.get("follow_on") else "TASK_FAILURE")


def failure_report(message: dict) -> dict:
    """`_handle_failure`'s arguments from a task's `failed` report, but the attempt."""
    return {"cause": str(message["error"]), "reason": failure_reason(message), "task": message.get("task"),
            "exception": message.get("exception")}


class Failover:
    """Mixin of the JobMaster: lost subtasks, root causes, and the restart-or-fail decision."""

    def _handle_close(self, conn: ControlConnection, error) -> None:
        subtask = conn.context
        if not isinstance(subtask, SubtaskRecord):
            return
        if subtask.state in (ExecutionState.FINISHED, ExecutionState.FAILED, ExecutionState.CANCELED):
            return
        current = self._subtask_of(subtask.attempt_id) is subtask
        if not current or not self._attempts.is_live(subtask.attempt_id.attempt):
            if not (current and self._lost_by_neighbour(subtask)):
                log.debug("connection of %s closed (its attempt has ended)", subtask.attempt_id)
                return
            # The attempt ended on a downstream report that this subtask's data connection
            # dropped; now its own connection drops too: it died, and that is the root cause.
        if self.status.is_terminal or self.status is JobStatus.CANCELLING:
            return
        with self._lock:
            subtask.state = ExecutionState.FAILED
        where = f"pid {subtask.pid} on {subtask.host}" if subtask.pid else "before it registered"
        self._handle_failure(
            f"lost subtask {subtask.attempt_id.vertex_id}#{subtask.attempt_id.index} ({where}): its "
            f"connection to the driver dropped — the task process died or was killed"
            + (f" ({error})" if error else ""), "TASK_LOST", subtask.attempt_id.attempt, self._task_name(subtask))

    def _lost_by_neighbour(self, subtask: SubtaskRecord) -> bool:
        """Whether the failure that ended `subtask`'s attempt was a neighbour losing its data connection from it."""
        a = subtask.attempt_id
        return self._failure_reason == "FOLLOW_ON" and self._lost_upstream == (a.attempt, a.vertex_id, a.index)

    def _task_name(self, subtask: SubtaskRecord) -> str:
        """The name a task gives itself ("sum -> out (2/2)"), for a subtask that cannot say it."""
        vertex = self.execution_graph.job_graph.vertices.get(subtask.attempt_id.vertex_id)
        if vertex is None:
            return subtask.attempt_id.vertex_id
        return f"{vertex.name} ({subtask.attempt_id.index + 1}/{vertex.parallelism})"

    def _await_last_reports(self, attempt: int) -> None:
        """Spark says the attempt's stage returned cleanly, yet a subtask's `finished` is not handled
        yet: on a loaded driver its connection thread may still be reading it. Wait (bounded by
        LAST_REPORTS_GRACE) for the unfinished subtasks' connections to close, then once more
        behind what they queued, before the early end counts as a failure."""
        self._check_last_reports(attempt, self._clock.monotonic() + LAST_REPORTS_GRACE, drained=False)

    def _check_last_reports(self, attempt: int, deadline: float, drained: bool) -> None:
        if attempt != self._attempt or self._done.is_set():
            return
        if self._failing:   # a connection closed unfinished: that failure is the cause, handled
            return
        unfinished = [s for s in self._subtasks.values() if s.state is not ExecutionState.FINISHED]
        if not unfinished:
            self._finalize(JobStatus.FINISHED)
            return
        reading = [s for s in unfinished if s.connection is not None and not s.connection.closed]
        if self._clock.monotonic() < deadline and (reading or not drained):
            if reading:
                self._timers.call_later(0.02, lambda: self._check_last_reports(attempt, deadline, False))
            else:
                self._post(lambda: self._check_last_reports(attempt, deadline, True))
            return
        self._handle_failure("the Spark job ended before all subtasks finished", "SPARK_JOB_FAILED", attempt)

    def _fail_from_sink(self, cause: str, recurs: bool = False) -> None:
        """A driver-side sink component could not do its part (a global committer's commit):
        fail over, so the restore commits again what the latest checkpoint pre-committed — or,
        when the same rows would fail the same way again (`recurs`: the stream's schema does not
        fit the table), fail the job at once, as a data error does."""
        self._post(lambda: self._handle_failure(cause, "DATA_ERROR" if recurs else "SINK_COMMIT_FAILED",
                                                self._attempt))

    def _upgrades_cause(self, reason: str, attempt: int) -> bool:
        """Whether a failure report is the root cause of the attempt already failing (`_handle_failure`)."""
        return (self._failing and attempt == self._attempt and not self.status.is_terminal
                and replaces_cause(reason, self._failure_reason))

    def _after_attempt_stopped(self) -> None:
        """The failed attempt's Spark job ended (or was given up on): restart once, or fail."""
        self._failing = False
        for subtask in self._subtasks.values():
            if subtask.connection is not None:
                subtask.connection.close()
        if self._cancel_requested:
            self._finalize(JobStatus.CANCELED)
            return
        if self.coordinator is not None:
            self.coordinator.discard_abandoned_locations()  # what the stopped tasks left behind
        if self._attempts.deploy_pending:
            log.debug("a deploy is already pending; attempt %d is not restarted twice", self._attempt)
            return
        self._backoff.notify_failure(self._clock.monotonic())
        # A data error (errors.DataError) meets the same row again after any restore: fail at once.
        if self._failure_reason != "DATA_ERROR" and self._backoff.can_restart():
            self._attempts.request_deploy()
            self._backoff.notify_restart()
            self._set_status(JobStatus.RESTARTING)
            delay = self._backoff.backoff_time
            latest = self.exceptions.latest()
            log.warning("job '%s' restarting (restart %d, %s) in %.1f s after %s%s%s", self.settings.job_name,
                        self._backoff.restarts, self._backoff.describe(), delay,
                        latest.exception if latest else self._failure_reason,
                        f" in {latest.task}" if latest and latest.task else "",
                        f" (and {len(latest.concurrent)} follow-on failure(s) of other subtasks)"
                        if latest and latest.concurrent else "")
            self._schedule_restart(delay)
            return
        restarts = self._backoff.restarts
        message = self._failure
        if self._failure_reason == "DATA_ERROR":
            message = (f"job failed without a restart ({restarts} earlier restart(s)): a data error recurs "
                       f"whenever the same input is replayed, so restarting cannot help:\n{message}")
        elif restarts:
            message = f"job failed after {restarts} restart(s) ({self._backoff.describe()}); last failure:\n{message}"
        elif message.startswith("Traceback"):   # a user function's: its traceback first, then where
            message = f"job '{self.settings.job_name}' failed in your code:\n{message}"
        latest = self.exceptions.latest()
        if latest is not None and latest.follow_on_line():
            message += "\n" + latest.follow_on_line()
        if self._stopping is not None:
            message += (f"\nThe stop-with-savepoint's savepoint {self._stopping[0]} had completed and drained: a new "
                        f"run of this job (same checkpoint directory) commits what it covers and finishes")
        self._finalize(JobStatus.FAILED, JobExecutionError(message, job_name=self.settings.job_name,
                                                            cause=self._failure, reason=self._failure_reason,
                                                            history=self.exceptions.entries()))

    def _on_checkpoint_failure_limit(self, exc: BaseException) -> None:
        """The coordinator fails the job: more checkpoint failures than tolerated, or a
        driver-side checkpoint listener (a sink's committer) raised. Fail over."""
        listener = isinstance(exc, CheckpointListenerError)
        cause = str(exc) if listener else f"too many checkpoint failures: {exc}"
        reason = exc.reason if listener else getattr(getattr(exc, "reason", None), "name", "CHECKPOINT_FAILURE")
        attempt = self._attempt  # the coordinator calls this on the loop thread, for the current attempt
        self._post(lambda: self._handle_failure(cause, reason, attempt))


__all__ = ["Failover", "FOLLOW_ON_GRACE", "LAST_REPORTS_GRACE", "failure_reason", "failure_report"]
