"""`streamsnap ui DIR`: the web UI and REST API for a checkpoint directory after the job is
gone, read-only, checked against the checkpoint history the running job reported."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

import streamsnap as ss
from tests.integration.support import RunningSum, wait_status
from tests.web.support import CHROMIUM, browser_page, call, event

pytestmark = pytest.mark.spark

def _ms(seconds):
    return int(round(seconds * 1000))


def _check_in_a_browser(base: str, tmp_path) -> None:
    """The page for the archive: its checkpoints and drill-down, no trigger button, no errors."""
    problems: list[str] = []
    with browser_page(problems) as page:
        page.goto(base)
        page.wait_for_selector("#job-state.ARCHIVED")
        page.wait_for_selector('#history tr[data-checkpoint="3"]')
        assert page.locator("#history tr").count() == 2 and not page.is_visible("#trigger")
        page.click('#history tr[data-checkpoint="3"]')
        page.wait_for_selector("#details table.subtasks tr[data-subtask]")
        assert page.locator("#details table.subtasks tbody tr").count() == 4
        page.screenshot(path=str(tmp_path / "archive-ui.png"), full_page=True)
    assert problems == []


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
    client.cancel()
    retained = {s.checkpoint_id: s for s in stats.history if s.checkpoint_id in (2, 3)}

    server = subprocess.Popen([sys.executable, "-m", "streamsnap.cli", "ui", directory], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "300"})
    try:
        line = server.stdout.readline()
        match = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
        assert match, line + server.stderr.read()
        base = match.group(1)
        assert call(f"{base}/jobs", token=None)[1] == {"jobs": [{"id": client.job_id, "status": "ARCHIVED"}]}
        jobs = f"{base}/jobs/{client.job_id}"

        job = call(jobs, token=None)[1]
        assert job["name"] == "archived job" and job["read-only"] is True
        names = {v["id"]: [op["name"] for op in v["operators"]] for v in job["vertices"]}
        assert names == {"events": ["Source: events"], "sum": ["sum", "out"]}

        cps = call(f"{jobs}/checkpoints", token=None)[1]
        assert cps["counts"]["completed"] == 2 and [h["id"] for h in cps["history"]] == [3, 2]
        for entry in cps["history"]:
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

        status, text = call(f"{base}/metrics", token=None)
        assert status == 200 and f'numberOfCompletedCheckpoints{{job="archived job",job_id="{client.job_id}"}} 2.0' in text
        assert f'lastCheckpointSize{{job="archived job",job_id="{client.job_id}"}} {float(retained[3].checkpointed_size)}' in text
        assert "<title>streamsnap</title>" in call(f"{base}/", token=None)[1]
        if CHROMIUM is not None:
            _check_in_a_browser(base, tmp_path)
        # Read-only: nothing can be triggered.
        status, body = call(f"{jobs}/checkpoints", method="POST", token=None)
        assert status == 405 and "read-only" in body["errors"][0]
        assert call(f"{jobs}/savepoints", method="POST", body={"target-directory": str(tmp_path)}, token=None)[0] == 405
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 0
        server.stdout.close()
        server.stderr.close()
