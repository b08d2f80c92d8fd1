"""Testing users' functions and jobs: `harness(...)` runs a function on the real operators
without Spark (harness.py); `pytest_plugin.py` gives integration tests one local Spark session
and `run_to_completion(env)`. See docs/testing.md."""

from streamsnap.testing.harness import Harness, HarnessError, RegisteredTimer, Snapshot, harness
from streamsnap.testing.jobs import run_to_completion

__all__ = ["harness", "Harness", "HarnessError", "RegisteredTimer", "Snapshot", "run_to_completion"]
