"""Finding a running job's web endpoint from its checkpoint directory (web/discovery.py):
announced files are checked against the endpoint; stale and malformed ones are named."""

from __future__ import annotations

import socket

import pytest

from streamsnap.web import discovery


def test_an_announcement_whose_endpoint_does_not_answer_is_stale_and_withdrawing_removes_it(tmp_path):
    with socket.socket() as s:            # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    path = discovery.announce(str(tmp_path), "job-1", "a job", url)
    assert discovery.live_jobs(str(tmp_path), timeout=0.5) == [
        {"job_id": "job-1", "job_name": "a job", "url": url, "ui_url": url, "live": False}]
    assert discovery.live_jobs(str(tmp_path / "job-1"), timeout=0.5)[0]["job_id"] == "job-1"  # a job's own directory
    discovery.withdraw(path)
    assert discovery.live_jobs(str(tmp_path)) == []
    # The UI's URL with the job's action token is for whoever can read the job's directory.
    discovery.announce(str(tmp_path), "job-1", "a job", url, f"{url}/#token=abc")
    assert discovery.live_jobs(str(tmp_path), timeout=0.5)[0]["ui_url"] == f"{url}/#token=abc"
    assert discovery.live_jobs(str(tmp_path / "missing")) == []


def test_a_malformed_announcement_is_named(tmp_path):
    (tmp_path / "job-2").mkdir()
    (tmp_path / "job-2" / discovery.LIVE_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=r"job-2/web.json is not a streamsnap live-endpoint file.*delete it"):
        discovery.live_jobs(str(tmp_path))
