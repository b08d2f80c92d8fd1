"""Without Spark: the endpoint of a job still starting (its graph, INITIALIZING "starting
Spark") and the rule that actions (POST, PATCH) need the job's token even on loopback."""

from __future__ import annotations

import pytest

import streamsnap as ss
from streamsnap.web.rest import WebServer
from tests.web.support import TOKEN, call


@pytest.fixture
def starting(no_leaked_threads):
    env = ss.StreamEnvironment(parallelism=2)
    (env.from_collection([{"key": 1, "value": 1}], name="rows", uid="rows")
        .key_by("key").map(lambda r: r, name="same", uid="same")
        .rebalance().sink_to(ss.sinks.Collect(), name="out", uid="out"))
    web = WebServer(ss.WebConfig())
    web.starting("job-1", "starting job", env._plan("starting job"), checkpointing=False)
    yield web
    web.close()


def test_a_starting_job_shows_its_graph_and_what_it_waits_for(starting):
    base = starting.url
    assert starting.ui_url == f"{base}/#token={starting.action_token}" and len(starting.action_token) >= 32
    status, job = call(f"{base}/jobs/job-1", token=None)
    assert status == 200 and (job["state"], job["status-detail"]) == ("INITIALIZING", "starting Spark")
    names = {v["id"]: v["name"] for v in job["vertices"]}
    edges = {(names[e["source"]], names[e["target"]]): e["ship_strategy"] for e in job["plan"]["edges"]}
    assert edges == {("Source: rows", "same"): "hash", ("same", "out"): "rebalance"}
    assert len(job["plan"]["nodes"]) == 3
    assert call(f"{base}/jobs/job-1/exceptions", token=None)[1]["exceptionHistory"] == {"entries": [],
                                                                                         "truncated": False}
    status, text = call(f"{base}/metrics", token=None)
    assert status == 200 and 'numRestarts{job="starting job",job_id="job-1"} 0.0' in text
    assert call(f"{base}/jobs/job-1/checkpoints", token=None)[0] == 409   # none yet, and it says why


def test_actions_need_the_jobs_token_even_on_loopback(starting):
    base, jobs = starting.url, f"{starting.url}/jobs/job-1"
    body = {"target-directory": "/tmp"}
    for method, url in [("POST", f"{jobs}/savepoints"), ("POST", f"{jobs}/stop"), ("POST", f"{jobs}/checkpoints"),
                        ("PATCH", jobs)]:
        for token in (None, TOKEN):      # none, and a wrong one
            status, answer = call(url, method=method, body=body, token=token)
            assert status == 401 and "#token=" in answer["errors"][0], (method, url, token)
        # With the job's token the request reaches the job, which is not running yet.
        status, answer = call(url, method=method, body=body, token=starting.action_token)
        assert status == 409 and "INITIALIZING (starting Spark)" in answer["errors"][0], (method, url)
    # Reads stay open on loopback; another site's page cannot even send an authorized action.
    assert call(f"{base}/jobs", token=None)[0] == 200
    assert call(f"{jobs}/savepoints", method="POST", body=body, token=starting.action_token,
                headers={"Origin": "https://evil.example"})[0] == 403
