"""The one line that says why a Spark job failed, out of a Spark/py4j error's pages.

A barrier stage aborted by one task surfaces as a JVM exception with a stack trace, and through
Spark Connect with JVM exception names after the Python traceback. The JobMaster
(cluster/jobmaster.py) and the submitter of a job in the cluster (cluster/submitter.py) report
the task's own failure instead.
"""

from __future__ import annotations

import re

_JVM_PACKAGES = ("org.", "java.", "javax.", "scala.", "py4j.", "io.", "com.")
_PYTHON_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*: \S")


def _python_exception(lines: list[str]) -> str:
    """The last `Name: message` line of the Python traceback in a Spark error (Connect servers
    put JVM exception names after it, which are not what went wrong in the task)."""
    start = next((i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line), None)
    if start is None:
        return ""
    # The exception line follows the last frame ('File "...", line N, in f' and its code line).
    frames = [i for i in range(start + 1, len(lines)) if lines[i].startswith('File "')]
    after = frames[-1] + 1 if frames else start + 1
    return next((line for line in lines[after:]
                 if _PYTHON_EXCEPTION_LINE.match(line) and not line.startswith(_JVM_PACKAGES)), "")


def spark_error_summary(error: BaseException) -> str:
    """The first meaningful line of a Spark/py4j error, without the JVM stack trace; for a
    barrier stage aborted by one task, also why that task failed (the line after Spark's
    "finished unsuccessfully", and a Python traceback's last line), which is what explains a
    task that died without telling the JobMaster."""
    text = str(error)
    lines = [line.strip() for line in text.splitlines()]
    summary = next((line for line in lines if "Exception" in line or "Error" in line), text)[:500]
    for i, line in enumerate(lines):
        if line.endswith("finished unsuccessfully."):
            reason = next((later for later in lines[i + 1:] if later), "")
            traceback_end = _python_exception(lines[i:]) or next(
                (later for later in reversed(lines) if later and not later.startswith(("at ", "File ", "...", "Caused by"))
                 and ("Error" in later or "Exception" in later)), "")
            details = [part for part in (reason, traceback_end) if part and part not in summary]
            if details:
                summary += " — the task's failure: " + " / ".join(dict.fromkeys(d[:300] for d in details))
            break
    return f"the Spark job failed: {summary}"


__all__ = ["spark_error_summary"]
