"""The web UI in a real headless Chromium (Debian's package, driven by Playwright), one job:
it loads without console errors from the URL the job printed, draws the job graph (tasks as
boxes, edges with their partitioning), shows checkpoints as they complete with a per-subtask
drill-down, the exception history after a subtask is killed, and its actions work — a
savepoint taken from the UI restores exactly, stop-with-savepoint from the UI ends the job.
The screenshot is kept under the test's tmp_path."""

from __future__ import annotations

import os
import re
import signal
from urllib.parse import urlsplit

import pytest

import streamsnap as ss
from streamsnap.api.environment import CLI_DEFAULTS
from tests.integration.support import RunningSum
from tests.web.support import CHROMIUM, browser_page, call, event, refused, start_job, wait_for

pytestmark = pytest.mark.spark

RESTORED_ROWS = 40_000   # the restored job's bounded input: every key's final total is RESTORED_ROWS / 20


def _restore_exactly(spark, tmp_path, savepoint: str) -> None:
    """A bounded run of the same job from the UI's savepoint: each key's final total counts
    every row exactly once, those before the savepoint (its state) and those after."""
    config = ss.CheckpointConfig(interval=None, directory=str(tmp_path / "restored"))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config)
    (env.from_source(ss.sources.Generator(event, count=RESTORED_ROWS), name="events", uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.Collect(), name="out", uid="out"))
    result = env.execute("restored from the UI's savepoint", restore_from=savepoint)
    assert result.restored_checkpoint is not None
    final: dict[int, int] = {}
    for row in result.rows("out"):
        final[row["key"]] = max(final.get(row["key"], 0), row["total"])
    assert final == {key: RESTORED_ROWS // 20 for key in range(20)}


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine: apt-get install chromium")
def test_the_web_ui_draws_the_graph_shows_failures_and_its_actions_work(spark, tmp_path, monkeypatch,
                                                                        no_leaked_threads):
    announced = []   # what `streamsnap run` prints, and what the endpoint says at that moment

    def on_web_url(name, url):
        jobs = call(url.split("/#")[0] + "/jobs")[1]["jobs"]
        job = call(f"{url.split('/#')[0]}/jobs/{jobs[0]['id']}")[1]
        announced.append((name, url, job["state"], job["status-detail"], len(job["plan"]["nodes"])))
    monkeypatch.setitem(CLI_DEFAULTS, "on_web_url", on_web_url)
    client = start_job(spark, tmp_path, True, "web ui job")    # the default UI: web=True
    # Serving as the job is submitted, before it is deployed: its graph, and what it waits for.
    assert announced == [("web ui job", client.ui_url, "INITIALIZING", "deploying", 2)]
    assert client.web_url.startswith("http://127.0.0.1:")
    assert client.ui_url.startswith(client.web_url + "/#token=")
    problems: list[str] = []
    with browser_page(problems, width=1400) as page:
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(client.ui_url)
        page.wait_for_selector("#job-state.RUNNING")
        assert "#token" not in page.url                     # taken out of the address bar
        assert client.job_id in page.inner_text("#job-name")
        page.wait_for_selector('#operators tr[data-operator="sum"]')
        assert page.locator("#operators tr").count() == 3   # source, sum, sink

        # The graph: two tasks (the source; sum chained with the sink) and the hash edge between.
        page.wait_for_selector("#plan g.vertex")
        assert page.locator("#plan g.vertex").count() == 2 and page.locator("#plan rect.box").count() == 2
        assert page.locator("#plan g.edge").count() == 1
        assert page.text_content("#plan g.edge text") == "HASH"
        assert "sum" in page.text_content('#plan g.vertex:not([data-vertex="events"])')
        page.wait_for_function("[...document.querySelectorAll('#plan g.vertex text.rates')]"
                               ".some(t => !t.textContent.startsWith('0.0 in/s · 0.0 out/s'))")   # rates arrive
        # Everything fits a 1400 px window: no horizontal scrolling.
        assert page.evaluate("document.documentElement.scrollWidth") <= 1400

        client.trigger_checkpoint()
        page.wait_for_selector('#history tr[data-checkpoint="1"]')
        page.click("#trigger")                              # the UI's own POST, with the token
        page.wait_for_function("document.getElementById('trigger-status').textContent.includes('completed')")
        page.wait_for_selector('#history tr[data-checkpoint="2"]')
        assert page.inner_text('#counts [data-count="Completed"]') == "Completed: 2"
        page.click('#history tr[data-checkpoint="1"]')
        page.wait_for_selector("#details table.subtasks tr[data-subtask]")
        assert page.locator("#details table.subtasks tbody tr").count() == len(client.subtasks()) == 4
        page.wait_for_selector('#operators td[data-backpressure="ok"], #operators td[data-backpressure="low"], '
                               '#operators td[data-backpressure="high"]')

        # An injected failure: the exception history names it, with time, task and attempt.
        killed = next(s for s in client.subtasks() if s.vertex == "events").pid
        # The slot's process forked its other subtask (runtime/slot.py), which dies with it.
        with open(f"/proc/{killed}/task/{killed}/children") as f:
            slot_pids = {killed, *map(int, f.read().split())}
        os.kill(killed, signal.SIGKILL)
        page.wait_for_selector('#exceptions tr[data-attempt="0"]', timeout=120_000)
        page.wait_for_selector("#job-state.RUNNING", timeout=120_000)
        row = page.inner_text('#exceptions tr[data-attempt="0"]')
        # The killed slot is the root cause, even when a downstream subtask reports the lost
        # channel first. Both its processes die at once (the forked one by its parent-death
        # signal), so either subtask's dropped connection may be the one named.
        named = re.search(r"lost subtask \S+ \(pid (\d+) on ", row)
        assert named and int(named.group(1)) in slot_pids and re.search(r"\d+:\d+:\d+", row), (row, slot_pids)
        history = call(f"{client.web_url}/jobs/{client.job_id}/exceptions")[1]["exceptionHistory"]["entries"]
        assert [e["attempt"] for e in history] == [0] and history[0]["stacktrace"]

        # A savepoint from the UI (into the prefilled directory), then stop-with-savepoint.
        page.click("#savepoint")
        page.wait_for_function("document.getElementById('action-status').textContent.includes('completed: ')",
                               timeout=120_000)
        savepoint = page.inner_text("#action-status").split("completed: ", 1)[1].strip()
        assert savepoint.startswith(str(tmp_path / "ckpt" / "savepoints"))
        assert os.path.isfile(os.path.join(savepoint, "_metadata"))
        page.screenshot(path=str(tmp_path / "web-ui.png"), full_page=True)
        page.click("#stop")
        page.wait_for_selector("#job-state.FINISHED", timeout=120_000)
        assert client.status() == "FINISHED"
        # The endpoint answers the ended job's last reads (the stop's own status among them),
        # then closes; the page has stopped polling by then, so nothing it asks for fails.
        page.wait_for_function("document.getElementById('action-status').textContent"
                               ".includes('stop with savepoint completed: ')", timeout=30_000)
        wait_for(lambda: refused(client.web_url), "the endpoint to close after its job", timeout=30)
        page.wait_for_timeout(2_500)                        # over two of the page's poll intervals
    assert (tmp_path / "web-ui.png").stat().st_size > 10_000
    assert problems == []
    _restore_exactly(spark, tmp_path, savepoint)


def test_what_other_sites_send_to_the_loopback_endpoint_is_refused(tmp_path):
    """A cross-site POST, and (DNS rebinding) a request addressed to another host name."""
    from streamsnap.web.rest import WebServer

    web = WebServer(ss.WebConfig())
    web.serve_archive([])
    try:
        jobs = f"{web.url}/jobs"
        assert call(jobs, token=None)[0] == 200
        assert call(f"{jobs}/x/checkpoints", method="POST", token=None, headers={"Origin": "https://evil.example"})[0] == 403
        assert call(jobs, token=None, headers={"Host": f"evil.example:{urlsplit(jobs).port}"})[0] == 403
    finally:
        web.close()
