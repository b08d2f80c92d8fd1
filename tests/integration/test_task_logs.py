"""Task logs reach the driver's log (runtime/log_relay.py): a user function's `logging` call
arrives in the driver's `logging`, named by operator and subtask; the error that fails the task
reaches the driver as the task's failure report and is shown once, in the job's error — not
relayed as a log record as well (tests/integration/test_root_cause.py)."""

from __future__ import annotations

import logging

import pytest

import streamsnap as ss

pytestmark = pytest.mark.spark


def chatty(row):
    if row["i"] == 3:
        logging.getLogger("user.chatty").warning("row %d looks odd", row["i"])
    if row["i"] == 7:
        raise RuntimeError("row 7 is the last straw")
    return row


def test_a_user_functions_log_line_reaches_the_drivers_log_and_its_failure_the_jobs_error(spark, caplog):
    caplog.set_level(logging.WARNING)
    env = ss.StreamEnvironment(parallelism=1, spark=spark)
    (env.from_source(ss.sources.Generator(lambda i: {"i": i}, count=10), name="rows")
        .map(chatty, name="chatty").sink_to(ss.sinks.Collect()))
    with pytest.raises(ss.JobExecutionError, match="row 7 is the last straw"):
        env.execute("task logs")
    relayed = [r for r in caplog.records if r.name.startswith("streamsnap.task.")]
    warning = next(r for r in relayed if r.getMessage() == "[user.chatty] row 3 looks odd")
    assert "chatty" in warning.task_operator and warning.task_subtask == "1/1"
    assert warning.name == f"streamsnap.task.{warning.task_operator}.0"
    assert warning.funcName == "chatty" and warning.levelno == logging.WARNING
    assert not [r for r in relayed if r.levelno >= logging.ERROR]       # the failure is the job's error
    assert "row 7 is the last straw" not in caplog.text


def noted(row):
    if row["i"] == 3:
        logging.getLogger("user.noted").warning("row %d noted in the cluster", row["i"])
    return row


def test_with_the_job_master_in_the_cluster_task_log_lines_reach_the_attached_client(spark, tmp_path, caplog):
    """Nothing in the cluster connects to the client: it fetches the records the JobMaster keeps."""
    caplog.set_level(logging.WARNING)
    env = ss.StreamEnvironment(parallelism=1, spark=spark, job_master="cluster",
                               checkpointing=ss.CheckpointConfig(interval=0.5, directory=str(tmp_path / "ckpt")))
    (env.from_source(ss.sources.Generator(lambda i: {"i": i}, count=4_000, rate=2_000), name="rows")
        .map(noted, name="noted").sink_to(ss.sinks.FileSink(str(tmp_path / "out"), format="parquet")))
    assert env.execute("cluster task logs").status == "FINISHED"
    relayed = [r for r in caplog.records if r.getMessage() == "[user.noted] row 3 noted in the cluster"]
    assert len(relayed) == 1, [r.getMessage() for r in caplog.records]
    assert relayed[0].name.startswith("streamsnap.task.") and relayed[0].task_subtask == "1/1"
    assert relayed[0].funcName == "noted"
