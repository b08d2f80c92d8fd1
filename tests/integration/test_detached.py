"""Detached jobs (issue 29): control of jobs that are not there fails cleanly, and a classic
session cannot detach. The detached jobs themselves run through Spark Connect, so their tests are
in tests/integration/test_connect.py, beside the other tests of the shared Connect server (one
file: `--dist loadfile` then starts that server on one xdist worker only)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import streamsnap as ss
from streamsnap.cli import app
from streamsnap.errors import ConfigurationError

pytestmark = pytest.mark.spark


def test_control_of_jobs_fails_cleanly_on_bad_input(spark, tmp_path):
    with pytest.raises(ConfigurationError, match="no job 'nope' is recorded under .*jobs there: none"):
        ss.jobs.attach(str(tmp_path), "nope")
    result = CliRunner().invoke(app, ["cancel", str(tmp_path), "nope"])
    assert result.exit_code == 1 and "no job 'nope'" in result.output
    result = CliRunner().invoke(app, ["savepoint", str(tmp_path)])
    assert result.exit_code == 2 and "usage: streamsnap savepoint DIR JOB PATH" in result.output
    env = ss.StreamEnvironment(parallelism=1, spark=spark,
                               checkpointing=ss.CheckpointConfig(interval=1, directory=str(tmp_path / "ckpt")))
    env.from_collection([{"a": 1}]).sink_to(ss.sinks.Collect())
    with pytest.raises(ConfigurationError, match="detached=True.* needs a Spark Connect session.*spark-submit"):
        env.execute_async("classic", detached=True)
