"""Testing users' functions and jobs: `harness(...)` runs a function on the real operators
without Spark (harnesses.py — not harness.py, so that `streamsnap.testing.harness` is the
function); `pytest_plugin.py` gives integration tests one local Spark session and
`run_to_completion(env)` (jobs.py). See docs/testing.md."""

from streamsnap.testing.harnesses import Harness, HarnessError, RegisteredTimer, Snapshot, harness
from streamsnap.testing.jobs import run_to_completion

__all__ = ["harness", "Harness", "HarnessError", "RegisteredTimer", "Snapshot", "run_to_completion"]
