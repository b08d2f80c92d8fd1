"""`streamsnap run`'s live status line and final summary: the rendering from plain values
(no terminal needed), then real runs of the CLI on Spark — plain periodic lines when stdout is
not a terminal, rich's in-place redraw when it is."""

from __future__ import annotations

import io
import re
import textwrap

import pytest
from rich.console import Console
from typer.testing import CliRunner

from streamsnap import cli
from streamsnap.api.result import JobResult
from streamsnap.web.terminal import StatusFigures, figures, status_line, summary_lines
from tests.web.test_views import history, sample


def test_the_status_line_from_a_sample_and_checkpoint_stats():
    f = figures(sample(), history().snapshot())
    # Sources: the vertices without inputs; 40 + 60 rows out at 25 rows/s.
    assert f == StatusFigures("my job", "RUNNING", 10.5, 100, 25.0, 3, 1, 4.0, 1)
    assert status_line(f) == ("my job: RUNNING | up 10 s | 25 records/s (100 total) | "
                              "checkpoints 3 completed, 1 failed, last took 4,000 ms | 1 restart(s)")
    without = figures(sample(), None)
    assert status_line(without) == "my job: RUNNING | up 10 s | 25 records/s (100 total) | 1 restart(s)"
    assert "up 1h01m05s" in status_line(StatusFigures("j", "RUNNING", 3665, 0, 0.0, 0, 0, None, 0))


def test_the_final_summary():
    result = JobResult("j1", "my job", "FINISHED", 4.0, {}, {}, history().snapshot(), restarts=1)
    assert summary_lines(result) == [
        "my job: FINISHED after 4.0 s, 0 source records (0 records/s), 1 restart(s)",
        "  checkpoints: 3 completed, 1 failed; last: #3 in 4,000 ms, 70 bytes written of 70"]


JOB = """
import streamsnap as ss

env = ss.StreamEnvironment(parallelism=1, checkpointing=ss.CheckpointConfig(interval=0.5, directory={ckpt!r}))
env.from_source(ss.sources.Generator(lambda i: {{"key": i % 5, "value": i}}, count=2500, rate=1000),
                name="events").key_by("key").sum("value").sink_to(ss.sinks.Collect(), name="out")
env.execute("cli status job")
"""


@pytest.mark.spark
@pytest.mark.parametrize("terminal", [False, True], ids=["plain", "terminal"])
def test_streamsnap_run_shows_a_live_status_and_a_summary(spark, tmp_path, monkeypatch, no_leaked_threads, terminal):
    tmp_path.mkdir(exist_ok=True)
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(JOB.format(ckpt=str(tmp_path / "ckpt"))))
    out = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=out, force_terminal=terminal, width=200))
    result = CliRunner().invoke(cli.app, ["run", str(job), "--status-every", "0.5"])
    assert result.exit_code == 0, result.output + out.getvalue()
    text = out.getvalue()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)   # without terminal control sequences
    summary = next(line for line in plain.splitlines() if line.startswith("cli status job: FINISHED after"))
    assert "2,500 source records" in summary
    assert "checkpoints:" in text and "completed" in text.split("checkpoints:")[-1]
    if terminal:
        # Live redraws in place: cursor movement and erase-line sequences, no stacked lines.
        assert "\x1b[2K" in text and "records/s" in text
    else:
        lines = [line for line in text.splitlines() if line.startswith("cli status job: RUNNING | up")]
        assert len(lines) >= 2, text      # a ~2.5 s job, a line every 0.5 s
        assert "records/s" in lines[-1] and "checkpoints" in lines[-1] and "restart(s)" in lines[-1]
        assert "\x1b[" not in text
