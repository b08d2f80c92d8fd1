"""`streamsnap ui DIR`: the web UI and REST API for a checkpoint directory after its jobs are
gone, read-only, checked against what the running jobs reported: a CANCELED job (its retained
checkpoints with per-subtask figures) and a FINISHED one (whose checkpoints were deleted) show
their real final status, records and checkpoints."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

import streamsnap as ss
from tests.integration.support import RunningSum, wait_status
from tests.web.support import CHROMIUM, browser_page, call, event, wait_for

pytestmark = pytest.mark.spark

def _ms(seconds):
    return int(round(seconds * 1000))


def _check_in_a_browser(base: str, tmp_path) -> None:
    """The page for the archive: its checkpoints and drill-down, no trigger button, no errors."""
    problems: list[str] = []
    with browser_page(problems) as page:
        page.goto(base)
        page.wait_for_selector("#job-state.CANCELED")
        page.wait_for_selector('#history tr[data-checkpoint="3"]')
        assert page.locator("#history tr").count() == 3 and not page.is_visible("#trigger")
        assert page.locator('#history tr[data-retained="no"]').count() == 1   # checkpoint 1, deleted since
        assert not page.is_visible("#actions")
        assert page.inner_text('#operators tr[data-operator="sum"] td:nth-child(5)') != "0"   # records in
        page.click('#history tr[data-checkpoint="3"]')
        page.wait_for_selector("#details table.subtasks tr[data-subtask]")
        assert page.locator("#details table.subtasks tbody tr").count() == 4
        page.screenshot(path=str(tmp_path / "archive-ui.png"), full_page=True)
    assert problems == []


def _finished_job(spark, directory: str):
    """A bounded job that finishes; its retention deletes its checkpoints."""
    env = ss.StreamEnvironment(parallelism=2, spark=spark, web=False,
                               checkpointing=ss.CheckpointConfig(interval=None, directory=directory))
    (env.from_source(ss.sources.Generator(event, count=3_000), name="events", uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.Collect(), name="out", uid="out"))
    return env.execute("finished job")


def test_streamsnap_ui_serves_a_finished_jobs_checkpoints_read_only(spark, tmp_path, no_leaked_threads):
    directory = str(tmp_path / "ckpt")
    config = ss.CheckpointConfig(interval=None, directory=directory, num_retained=2,
                                 retention="retain_on_cancellation")
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config)
    (env.from_source(ss.sources.Generator(event, rate=500), name="events", uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.Collect(), name="out", uid="out"))
    client = env.execute_async("archived job")
    wait_status(client, "RUNNING")
    for _ in range(3):
        client.trigger_checkpoint()
    stats = client.checkpoint_stats()
    live = f"{client.web_url}/jobs/{client.job_id}"
    seen = wait_for(lambda: (d := call(live, token=None)[1]) and all(
        op["read-records"] > 0 for v in d["vertices"] for op in v["operators"] if op["uid"] != "events") and d,
        "records in every operator")
    seen = {op["uid"]: op for v in seen["vertices"] for op in v["operators"]}
    client.cancel()
    retained = {s.checkpoint_id: s for s in stats.history if s.checkpoint_id in (2, 3)}
    finished = _finished_job(spark, directory)

    server = subprocess.Popen([sys.executable, "-m", "streamsnap.cli", "ui", directory], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "300"})
    try:
        line = server.stdout.readline()
        match = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
        assert match, line + server.stderr.read()
        base = match.group(1)
        listed = call(f"{base}/jobs", token=None)[1]["jobs"]
        assert sorted(listed, key=lambda j: j["status"]) == [{"id": client.job_id, "status": "CANCELED"},
                                                            {"id": finished.job_id, "status": "FINISHED"}]
        jobs = f"{base}/jobs/{client.job_id}"

        job = call(jobs, token=None)[1]
        assert job["name"] == "archived job" and job["read-only"] is True and job["state"] == "CANCELED"
        names = {v["id"]: [op["name"] for op in v["operators"]] for v in job["vertices"]}
        assert names == {"events": ["Source: events"], "sum": ["sum", "out"]}
        assert [(e["ship_strategy"], e["target"]) for e in job["plan"]["edges"]] == [("hash", "sum")]
        ops = {op["uid"]: op for v in job["vertices"] for op in v["operators"]}
        for uid in ("events", "sum", "out"):   # the counts the tasks reported last, at least what was seen live
            assert ops[uid]["read-records"] >= seen[uid]["read-records"]
            assert ops[uid]["write-records"] >= seen[uid]["write-records"]
        assert ops["sum"]["read-records"] > 0 and job["end-time"] >= job["start-time"] > 0

        cps = call(f"{jobs}/checkpoints", token=None)[1]
        # Every checkpoint the job completed, those deleted since (subsumed) marked as not retained.
        assert cps["counts"]["completed"] == stats.counts.completed == 3
        assert [(h["id"], h["retained"]) for h in cps["history"]] == [(3, True), (2, True), (1, False)]
        for entry in cps["history"][:2]:
            live = retained[entry["id"]]
            assert entry["state_size"] == live.state_size and entry["checkpointed_size"] == live.checkpointed_size
            assert entry["trigger_timestamp"] == _ms(live.trigger_timestamp)
            assert entry["end_to_end_duration"] == _ms(live.end_to_end_duration)
            assert entry["num_acknowledged_subtasks"] == entry["num_subtasks"] == 4
        details = call(f"{jobs}/checkpoints/details/3", token=None)[1]
        assert sorted(details["tasks"]) == ["events", "sum"]
        for live in retained[3].subtasks:
            got = details["tasks"][live.vertex_id]["subtasks"][live.index]
            assert got["status"] == "completed" and got["state_size"] == live.state_size
            assert got["checkpoint"] == {"sync": _ms(live.sync_duration), "async": _ms(live.async_duration)}
            assert got["alignment"]["duration"] == _ms(live.alignment_duration)
            assert got["start_delay"] == _ms(live.start_delay)
        assert call(f"{jobs}/checkpoints/details/1", token=None)[0] == 404   # subsumed, not retained

        # The FINISHED job: its status, exact records, and its checkpoints although they were deleted.
        done = call(f"{base}/jobs/{finished.job_id}", token=None)[1]
        assert done["state"] == "FINISHED" and done["name"] == "finished job"
        ops = {op["uid"]: op for v in done["vertices"] for op in v["operators"]}
        for uid, metrics in finished.operators.items():
            assert (ops[uid]["read-records"], ops[uid]["write-records"]) == (metrics.records_in, metrics.records_out)
        assert ops["events"]["write-records"] == ops["out"]["read-records"] == 3_000
        cps = call(f"{base}/jobs/{finished.job_id}/checkpoints", token=None)[1]
        assert cps["counts"]["completed"] == finished.checkpoints.counts.completed >= 1   # the final checkpoint
        assert cps["history"] and not any(h["retained"] for h in cps["history"])

        status, text = call(f"{base}/metrics", token=None)
        assert status == 200 and f'numberOfCompletedCheckpoints{{job="archived job",job_id="{client.job_id}"}} 2.0' in text
        assert f'lastCheckpointSize{{job="archived job",job_id="{client.job_id}"}} {float(retained[3].checkpointed_size)}' in text
        assert "<title>streamsnap</title>" in call(f"{base}/", token=None)[1]
        if CHROMIUM is not None:
            _check_in_a_browser(f"{base}/?job={client.job_id}", tmp_path)
        # Read-only: nothing can be triggered.
        status, body = call(f"{jobs}/checkpoints", method="POST", token=None)
        assert status == 405 and "read-only" in body["errors"][0]
        assert call(f"{jobs}/savepoints", method="POST", body={"target-directory": str(tmp_path)}, token=None)[0] == 405
        assert call(jobs, method="PATCH", token=None)[0] == 405
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 0
        server.stdout.close()
        server.stderr.close()
