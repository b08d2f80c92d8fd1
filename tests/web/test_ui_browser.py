"""The web UI in a real headless Chromium (Debian's package, driven by Playwright): it loads
without console errors, shows the running job and its checkpoints as they complete, and opens
a checkpoint's per-subtask view. The screenshot is kept under the test's tmp_path."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

import streamsnap as ss
from streamsnap.api.environment import CLI_DEFAULTS
from tests.web.support import CHROMIUM, browser_page, call, start_job

pytestmark = pytest.mark.spark


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine: apt-get install chromium")
def test_the_web_ui_shows_the_job_its_checkpoints_and_a_subtask_drill_down(spark, tmp_path, monkeypatch,
                                                                          no_leaked_threads):
    announced = []   # what `streamsnap run` prints
    monkeypatch.setitem(CLI_DEFAULTS, "on_web_url", lambda name, url: announced.append((name, url)))
    client = start_job(spark, tmp_path, ss.WebConfig(port=0), "web ui job")
    assert announced == [("web ui job", client.web_url)] and client.web_url.startswith("http://127.0.0.1:")
    problems: list[str] = []
    with browser_page(problems) as page:
        page.goto(client.web_url)
        page.wait_for_selector("#job-state.RUNNING")
        assert client.job_id in page.inner_text("#job-name")
        page.wait_for_selector('#operators tr[data-operator="sum"]')
        assert page.locator("#operators tr").count() == 3   # source, sum, sink

        client.trigger_checkpoint()
        page.wait_for_selector('#history tr[data-checkpoint="1"]')
        page.click("#trigger")                              # the UI's own POST
        page.wait_for_function("document.getElementById('trigger-status').textContent.includes('completed')")
        page.wait_for_selector('#history tr[data-checkpoint="2"]')
        assert page.inner_text('#counts [data-count="Completed"]') == "Completed: 2"
        assert page.locator("#chart polyline").count() == 2

        page.click('#history tr[data-checkpoint="1"]')
        page.wait_for_selector("#details table.subtasks tr[data-subtask]")
        assert "Checkpoint 1 (COMPLETED" in page.inner_text("#details-title")
        rows = page.locator("#details table.subtasks tbody tr")
        assert rows.count() == len(client.subtasks()) == 4
        assert "completed" in rows.first.inner_text()
        page.wait_for_function("document.querySelector('#operators tr[data-operator=\"sum\"]')"
                               ".children[4].textContent !== '0'")   # records arrive
        # Two readings of the tasks' time account give each task its backpressure level.
        page.wait_for_selector('#operators td[data-backpressure="ok"], #operators td[data-backpressure="low"], '
                               '#operators td[data-backpressure="high"]')
        page.screenshot(path=str(tmp_path / "web-ui.png"), full_page=True)
    # What a web page elsewhere could send to this loopback endpoint is refused: a cross-site POST,
    # and (DNS rebinding) a request addressed to another host name.
    jobs = f"{client.web_url}/jobs"
    assert call(jobs, token=None)[0] == 200
    assert call(f"{jobs}/{client.job_id}/checkpoints", method="POST", token=None,
                headers={"Origin": "https://evil.example"})[0] == 403
    assert call(jobs, token=None, headers={"Host": f"evil.example:{urlsplit(jobs).port}"})[0] == 403
    client.cancel()
    assert (tmp_path / "web-ui.png").stat().st_size > 10_000
    assert problems == []
