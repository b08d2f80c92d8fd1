"""What a fault test measured, as one line benchmarks/fault_matrix reads from its captured output
(pytest --junitxml with junit_logging=system-out): the faults it injected, the restarts they
caused, and — where the test knows when it struck — how long the job took to notice the fault
and to put out its first row after it."""

from __future__ import annotations

import json

MARKER = "FAULT-FIGURES"


def report(scenario: str, *, faults: int, restarts: int, fault_at: float | None = None,
           recoveries=()) -> dict:
    """Print (and return) the figures of one run of `scenario`; `fault_at` is the wall-clock time
    the (first) fault struck, `recoveries` the job's failovers (JobResult.recoveries)."""
    figures: dict = {"scenario": scenario, "faults": faults, "restarts": restarts}
    if fault_at is not None and recoveries:
        first = recoveries[0]
        figures["detection_s"] = round(first["failed_at"] - fault_at, 3)
        if first.get("first_output_at") is not None:
            figures["first_output_s"] = round(first["first_output_at"] - fault_at, 3)
    print(MARKER, json.dumps(figures), flush=True)
    return figures
