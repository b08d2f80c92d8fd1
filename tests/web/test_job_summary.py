"""The record of how a job ended (web/job_summary.py), as `streamsnap ui` reads it back: the
exception history survives the round trip through JSON, and a damaged record is named."""

from __future__ import annotations

import dataclasses
import json

import pytest

from streamsnap.cluster.exception_history import ExceptionHistory
from streamsnap.web.job_summary import SUMMARY_FILE, exceptions_of, read_summary, write_summary


def test_the_exception_history_round_trips_and_a_damaged_summary_is_named(tmp_path):
    history = ExceptionHistory(clock=lambda: 1_700_000_000.5)
    history.root(0, "Traceback (most recent call last):\n  ...\nValueError: bad row", "USER_FUNCTION", "map (1/2)")
    history.follow_on(0, "sink (2/2)", "UpstreamLostError: lost the connection from upstream")
    history.root(1, "lost subtask sum#0", "TASK_LOST")
    summary = {"version": 1, "status": "FAILED", "exceptions": [dataclasses.asdict(e) for e in history.entries()]}
    write_summary(str(tmp_path), summary)
    back = read_summary(str(tmp_path))
    assert back == json.loads(json.dumps(summary))
    assert exceptions_of(back) == history.entries()
    assert exceptions_of(back)[0].follow_on_line().startswith("1 other subtask failure(s) followed from it")

    assert read_summary(str(tmp_path / "elsewhere")) is None       # still running, or its driver died
    (tmp_path / SUMMARY_FILE).write_text('{"version": 7}')
    with pytest.raises(ValueError, match=r"_job_summary.json is not a streamsnap job summary \(unknown version 7\); "
                                         r"delete it"):
        read_summary(str(tmp_path))
