"""What `streamsnap run` shows while a job runs, and when it ends.

A status line — job state, records per second out of the sources, checkpoints completed and
failed, the last checkpoint's duration, restarts — built from the same samples the web UI
reads (`web.progress.JobProgress` polls the JobMaster, which asks the subtasks for their
counters). On a terminal it is redrawn in place with rich's Live display; otherwise (a pipe,
a log file, CI) a plain line is printed every `plain_every` seconds, so logs stay readable.
`status_line` and `summary_lines` are pure functions of plain values, tested without a TTY.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.text import Text

from streamsnap.web.progress import JobProgress, JobSample

REFRESH = 1.0          # seconds between samples
PLAIN_EVERY = 10.0     # seconds between lines when stdout is not a terminal


@dataclass(frozen=True)
class StatusFigures:
    name: str
    status: str
    uptime: float                      # seconds
    records: int                       # rows out of the sources, current attempt
    records_per_second: float
    completed: int | None              # checkpoints; None without checkpointing
    failed: int | None
    last_duration: float | None        # seconds, latest completed checkpoint
    restarts: int


def figures(sample: JobSample, stats) -> StatusFigures:
    """The status line's figures from a job sample and a checkpoint stats snapshot (or None)."""
    sources = [v.operators[0] for v in sample.vertices if not v.inputs and v.operators]
    latest = stats.latest_completed if stats is not None else None
    return StatusFigures(
        sample.name, sample.status, sample.uptime, sum(op.total_out for op in sources),
        sum(op.records_out_per_second for op in sources),
        stats.counts.completed if stats is not None else None, stats.counts.failed if stats is not None else None,
        latest.end_to_end_duration if latest is not None else None, sample.restarts)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def status_line(f: StatusFigures) -> str:
    parts = [f"{f.name}: {f.status}", f"up {_duration(f.uptime)}",
             f"{f.records_per_second:,.0f} records/s ({f.records:,} total)"]
    if f.completed is not None:
        text = f"checkpoints {f.completed} completed, {f.failed} failed"
        if f.last_duration is not None:
            text += f", last took {f.last_duration * 1000:,.0f} ms"
        parts.append(text)
    parts.append(f"{f.restarts} restart(s)")
    return " | ".join(parts)


def summary_lines(result) -> list[str]:
    """The final summary of a `JobResult`: outcome, throughput, checkpoints, restarts."""
    records = result.records_in
    rate = records / result.duration if result.duration > 0 else 0.0
    lines = [f"{result.job_name}: {result.status} after {_duration(result.duration)}, {records:,} source records "
             f"({rate:,.0f} records/s)" + (f", {result.restarts} restart(s)" if result.restarts else "")]
    stats = result.checkpoints
    if stats is not None:
        c = stats.counts
        text = f"  checkpoints: {c.completed} completed, {c.failed} failed"
        latest = stats.latest_completed
        if latest is not None:
            text += (f"; last: #{latest.checkpoint_id} in {(latest.end_to_end_duration or 0) * 1000:,.0f} ms, "
                     f"{latest.checkpointed_size:,} bytes written of {latest.state_size:,}")
        lines.append(text)
    return lines


class LiveStatus:
    """Shows one job's status line until the job ends (a thread; it ends with the job)."""

    def __init__(self, master, console: Console, refresh: float = REFRESH, plain_every: float = PLAIN_EVERY):
        self._master = master
        self._console = console
        self._refresh = refresh
        self._plain_every = plain_every
        self._progress = JobProgress(master)
        self._thread = threading.Thread(target=self._run, name=f"status-{master.job_id[:8]}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def line(self) -> str:
        return status_line(figures(self._progress.sample(), self._master.checkpoint_stats()))

    def _run(self) -> None:
        if self._console.is_terminal:
            with Live(Text(self.line()), console=self._console, refresh_per_second=4, transient=True) as live:
                while not self._tick():
                    live.update(Text(self.line()))
            return
        last_printed = time.monotonic()
        while not self._tick():
            if time.monotonic() - last_printed >= self._plain_every:
                self._console.print(self.line(), markup=False, highlight=False, soft_wrap=True)
                last_printed = time.monotonic()

    def _tick(self) -> bool:
        """Ask for fresh counters, wait a refresh interval; True once the job has ended."""
        self._progress.poll()
        return self._master.wait_terminal(self._refresh)
