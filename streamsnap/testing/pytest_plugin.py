"""A pytest plugin for users' integration tests: one shared local Spark session for the whole
run (starting one takes seconds, so every test reusing it is what keeps a suite fast), and
`run_to_completion(env)` on it.

Enable it in a conftest.py with ``pytest_plugins = ["streamsnap.testing.pytest_plugin"]``.
Nothing starts until a test asks for a fixture, and a session already active in the process
(one a conftest built, or a user's own) is the one used; the plugin stops only a session it
started itself.

    def test_running_sum(run_to_completion):
        env = ss.StreamEnvironment(parallelism=2)
        env.from_collection(rows).key_by("key").process(RunningSum()).sink_to(ss.sinks.Collect())
        assert run_to_completion(env).rows() == expected

Settings (pytest.ini / pyproject `[tool.pytest.ini_options]`): ``streamsnap_spark_slots``, the
task slots of a session the plugin starts (default 8: a job needs one per subtask).
"""

from __future__ import annotations

import pytest

from streamsnap.testing.jobs import run_to_completion as _run_to_completion


def pytest_addoption(parser) -> None:
    parser.addini("streamsnap_spark_slots", "task slots of the local Spark session the streamsnap "
                  "plugin starts (one per subtask of the largest job)", default="8")


@pytest.fixture(scope="session")
def streamsnap_spark(pytestconfig):
    """The process's active SparkSession, or a local one started for this test run."""
    from pyspark.sql import SparkSession

    from streamsnap.cluster.spark_session import embedded_session

    active = SparkSession.getActiveSession()
    session = active if active is not None else embedded_session(
        int(pytestconfig.getini("streamsnap_spark_slots")))
    yield session
    if active is None:
        session.stop()


@pytest.fixture
def run_to_completion(streamsnap_spark):
    """`run_to_completion(env, job_name=..., timeout=120)`: the job run on the shared session
    (environments built without `spark=` use the active session), its JobResult returned."""
    def run(env, job_name: str = "test job", **options):
        return _run_to_completion(env, job_name, **options)
    return run
