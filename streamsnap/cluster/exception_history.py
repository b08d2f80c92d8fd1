"""A job's exception history (Flink's exceptions tab): one entry per failure that ended a
deployment attempt, with the failures of neighbouring subtasks it caused folded into it.

Why: when one subtask fails, its neighbours fail too — a downstream subtask loses its input
(`UpstreamLostError`), an upstream one the connection it was writing to (`ConnectionLost`) —
and each reports it. Shown one by one they bury the root cause under their tracebacks; here
they are the entry's `concurrent` failures, counted in one line (`follow_on_line`).

The JobMaster feeds it on its own thread: `root` when a failure ends an attempt, `replace_root`
when a truer cause of the same attempt arrives after a follow-on one (a user function's error
reported after the lost connection it caused), `follow_on` for every other failure report.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class ConcurrentFailure:
    """A failure of another subtask in the same attempt, after (or because of) the root cause."""

    task: str | None          # "after -> Collect (3/4)"
    exception: str            # one line: "UpstreamLostError: lost the connection from upstream ..."


@dataclass(frozen=True)
class ExceptionHistoryEntry:
    """One failure that ended a deployment attempt (`attempt`, 0 = the first deployment)."""

    exception: str            # one line: the exception's class and message
    root_cause: str           # the full text: the user's traceback first, then where it happened
    timestamp: float          # wall-clock seconds when the JobMaster learned of it
    task: str | None          # the subtask that failed ("boom (4/4)"); None: not a subtask's failure
    attempt: int
    reason: str               # USER_FUNCTION, DATA_ERROR, TASK_LOST, TASK_FAILURE, SPARK_JOB_FAILED, ...
    concurrent: tuple[ConcurrentFailure, ...] = field(default=())

    def follow_on_line(self) -> str | None:
        """The concurrent failures in one line, or None when there were none."""
        return follow_on_line(self.concurrent)


def follow_on_line(failures: tuple[ConcurrentFailure, ...] | list[ConcurrentFailure]) -> str | None:
    if not failures:
        return None
    kinds = Counter(f.exception.split(":", 1)[0] for f in failures)
    counted = ", ".join(f"{kind} ×{n}" if n > 1 else kind for kind, n in kinds.most_common())
    return (f"{len(failures)} other subtask failure(s) followed from it ({counted}); their details are in "
            f"the job's exception history (JobResult.exceptions / JobExecutionError.history)")


def one_line(text: str) -> str:
    """The line of a failure text that names the exception: a traceback's last line, else the
    first non-empty line."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].startswith("Traceback (most recent call last)"):
        for line in reversed(lines):
            if not line.startswith((" ", "\t")) and ":" in line and not line.startswith(("where:", "in ")):
                return line
    return lines[0]


class ExceptionHistory:
    """The entries of one job, oldest first; only the JobMaster's thread changes it."""

    def __init__(self, clock=time.time):
        self._clock = clock
        self._entries: list[ExceptionHistoryEntry] = []

    def root(self, attempt: int, cause: str, reason: str, task: str | None = None,
             exception: str | None = None) -> ExceptionHistoryEntry:
        """The failure that ends `attempt`."""
        entry = ExceptionHistoryEntry(exception or one_line(cause), cause, self._clock(), task, attempt, reason)
        self._entries.append(entry)
        return entry

    def replace_root(self, attempt: int, cause: str, reason: str, task: str | None = None,
                     exception: str | None = None) -> None:
        """A truer cause of `attempt` than its current root: the old root becomes concurrent."""
        current = self._latest(attempt)
        if current is None:
            self.root(attempt, cause, reason, task, exception)
            return
        demoted = ConcurrentFailure(current.task, current.exception)
        self._entries[-1] = replace(current, exception=exception or one_line(cause), root_cause=cause,
                                    task=task, reason=reason, concurrent=(demoted,) + current.concurrent)

    def follow_on(self, attempt: int, task: str | None, exception: str) -> None:
        """Another subtask of `attempt` failed after its root cause; ignored without one."""
        current = self._latest(attempt)
        if current is not None:
            self._entries[-1] = replace(current, concurrent=current.concurrent + (ConcurrentFailure(task, exception),))

    def extend(self, earlier: tuple[ExceptionHistoryEntry, ...]) -> None:
        """Entries of earlier attempts led by another JobMaster (cluster/in_cluster.py), in front."""
        self._entries[:0] = list(earlier)

    def latest(self) -> ExceptionHistoryEntry | None:
        return self._entries[-1] if self._entries else None

    def entries(self) -> tuple[ExceptionHistoryEntry, ...]:
        return tuple(self._entries)

    def _latest(self, attempt: int) -> ExceptionHistoryEntry | None:
        return self._entries[-1] if self._entries and self._entries[-1].attempt == attempt else None
