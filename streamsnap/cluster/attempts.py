"""Which deployment attempt is current, and whether it may still fail (Flink ties every failure
to the execution attempt it belongs to and ignores anything from an attempt that is no longer
current).

The JobMaster deploys attempts 0, 1, 2, ...; an attempt *ends* once — when its first failure is
charged, or when it is cancelled. From then until the next deploy (FAILING, RESTARTING, the
restart delay) it is still the newest attempt, but nothing its subtasks report counts any more:
a second subtask's dropped connection, a task's error message, a late ack, the Spark job's
own end. At most one deploy is pending at any time, so one failure means one restart. One
exception: a report naming a root cause (`replaces_cause`) still replaces the recorded cause of
the attempt that is stopping — it does not charge it again.

Sans-I/O: plain state fed attempt numbers, returning whether an event counts.
"""

from __future__ import annotations

# Failure reasons that name a root cause, by precedence (others, e.g. a lost task, rank 0; a
# subtask that failed because it lost a neighbour — FOLLOW_ON — ranks below all of them).
_CAUSE_RANK = {"FOLLOW_ON": -1, "USER_FUNCTION": 1, "DATA_ERROR": 2}


def replaces_cause(reason: str, current: str | None) -> bool:
    """Whether a failure of reason `reason` is a truer cause than `current` of the same attempt:
    a task whose user function raised closes its channels as it fails, and a downstream task's
    report of the lost connection can reach the driver first."""
    return _CAUSE_RANK.get(reason, 0) > _CAUSE_RANK.get(current, 0)


class AttemptTracker:
    def __init__(self) -> None:
        self.current = -1
        self.ended = True            # nothing is deployed yet
        self.deploy_pending = False
        self.failures = 0            # failures charged, one per attempt at most

    def is_live(self, attempt: int) -> bool:
        """Whether reports from `attempt` still count: it is the current one and has not ended."""
        return attempt == self.current and not self.ended

    def charge_failure(self, attempt: int) -> bool:
        """True if this failure is the one that ends `attempt`; False for a straggler."""
        if not self.is_live(attempt):
            return False
        self.ended = True
        self.failures += 1
        return True

    def retire(self, attempt: int) -> None:
        """The attempt ends without a failure (the job is being cancelled)."""
        if attempt == self.current:
            self.ended = True

    def request_deploy(self) -> bool:
        """True if a deploy may be scheduled now; False if one is already pending."""
        if self.deploy_pending:
            return False
        self.deploy_pending = True
        return True

    def cancel_deploy(self) -> None:
        self.deploy_pending = False

    def begin_deploy(self) -> int:
        """The pending deploy runs: a new attempt becomes current and live."""
        if not self.deploy_pending:
            raise RuntimeError("begin_deploy() without a pending deploy")
        self.deploy_pending = False
        self.current += 1
        self.ended = False
        return self.current
