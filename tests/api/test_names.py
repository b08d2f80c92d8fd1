"""Names agree across a job's views: the summary, `JobClient.subtasks()`, the REST API, the CLI
and the savepoint's directory name show the same vertex ids, operator uids and names."""

from __future__ import annotations

import os
import urllib.parse

import pytest
from typer.testing import CliRunner

import streamsnap as ss
from streamsnap.api.result import JobResult, OperatorMetrics
from streamsnap.cli import app
from tests.integration.support import RunningSum, wait_status
from tests.web.support import call, event, wait_for


def test_the_summary_names_each_operator_and_its_uid_and_says_what_it_restored():
    metrics = {"source__events-0": OperatorMetrics("Source: events", "source__events-0", 2, 400, 400),
               "sum": OperatorMetrics("sum", "sum", 2, 400, 10)}
    summary = JobResult("j", "job", "FINISHED", 1.0, metrics, {}, attempt=1, restarts=1,
                        restored_checkpoint=4).summary()
    assert "  Source: events [source__events-0]  parallelism 2 " in summary
    assert "  sum [sum]" in summary
    assert "since it restored checkpoint 4 —" in summary and "checkpoint 4 it restored" not in summary


@pytest.mark.spark
def test_summary_subtasks_rest_cli_and_savepoint_name_agree(spark, tmp_path):
    config = ss.CheckpointConfig(interval=None, directory=str(tmp_path / "ckpt"))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, web=ss.WebConfig(port=0))
    # No uids given: the ids are generated from the names ("Source: events" -> "source__events-0").
    (env.from_source(ss.sources.Generator(event, rate=500), name="events")
        .key_by("key").process(RunningSum(), name="running sum")
        .sink_to(ss.sinks.Collect(), name="out"))
    client = env.execute_async("names agree across views")
    wait_status(client, "RUNNING")

    base = f"http://127.0.0.1:{urllib.parse.urlsplit(client.web_url).port}"
    status, details = call(f"{base}/jobs/{client.job_id}", token=None)
    assert status == 200
    rest_vertices = {v["id"]: v["name"] for v in details["vertices"]}
    rest_operators = {op["uid"]: op["name"] for v in details["vertices"] for op in v["operators"]}
    assert rest_operators["source__events-0"] == "Source: events"

    subtasks = wait_for(lambda: [s for s in client.subtasks() if s.state == "RUNNING"] or None, "running subtasks")
    assert {(s.vertex, s.vertex_name) for s in client.subtasks()} == set(rest_vertices.items())
    assert all(str(s).startswith(f"{s.vertex}[{s.index}] '{s.vertex_name}'") for s in subtasks)

    savepoint = client.stop_with_savepoint(str(tmp_path / "savepoints"))
    result = client.wait(60)
    # The savepoint's directory holds the whole job id, not a prefix of it.
    assert os.path.basename(savepoint).startswith(f"savepoint-{client.job_id}-")

    summary = result.summary()
    for uid, name in rest_operators.items():
        assert f"{name} [{uid}]" in summary, (uid, name, summary)
        assert result.operators[uid].name == name
    # Each vertex id is the uid of its chain's first operator, whose name starts the vertex name.
    for vertex_id, vertex_name in rest_vertices.items():
        assert vertex_name.split(" -> ")[0] == rest_operators[vertex_id]

    inspected = CliRunner().invoke(app, ["savepoint", "inspect", savepoint], env={"COLUMNS": "200"})
    assert inspected.exit_code == 0, inspected.output
    for uid, name in rest_operators.items():
        line = next((row for row in inspected.output.splitlines() if f" {uid} " in row), None)
        assert line is not None and name in line, (uid, name, inspected.output)
