"""The `streamsnap` command (mirrors Flink's `flink` CLI where it makes sense).

    streamsnap run job.py [--from PATH] [--allow-non-restored-state]
    streamsnap checkpoints DIR
    streamsnap ui DIR [--port N]
    streamsnap savepoint inspect PATH
"""

from __future__ import annotations

import runpy
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from streamsnap.api import environment
from streamsnap.web.terminal import PLAIN_EVERY, LiveStatus, summary_lines

app = typer.Typer(help="streamsnap: stateful, exactly-once stream processing on Spark.", no_args_is_help=True,
                  add_completion=False)
savepoint_app = typer.Typer(help="Inspect savepoints.", no_args_is_help=True)
app.add_typer(savepoint_app, name="savepoint")
console = Console()


@app.command()
def run(job: Path = typer.Argument(..., help="Python file that builds a pipeline and calls env.execute()."),
        restore_from: str = typer.Option(None, "--from", "-s", help="Checkpoint or savepoint to start from."),
        allow_non_restored_state: bool = typer.Option(False, "--allow-non-restored-state",
                                                      help="Skip state of operators the job no longer has."),
        status_every: float = typer.Option(PLAIN_EVERY, "--status-every", min=0.1,
                                           help="Seconds between status lines when stdout is not a terminal "
                                                "(on a terminal the line is redrawn in place every second)."),
        ) -> None:
    """Run a job file on the embedded (or active) Spark session, show a live status line and a summary."""
    if not job.is_file():
        console.print(f"[red]no such job file: {job}[/red]")
        raise typer.Exit(2)
    environment.CLI_DEFAULTS.update(restore_from=restore_from, allow_non_restored_state=allow_non_restored_state)
    environment.CLI_DEFAULTS["results"] = []
    # A job built with StreamEnvironment(web=ss.WebConfig(...)): say where to watch it.
    environment.CLI_DEFAULTS["on_web_url"] = lambda name, url: console.print(f"[bold]{name}[/bold]: monitoring at {url}")
    statuses: list[LiveStatus] = []

    def on_job_started(master) -> None:
        status = LiveStatus(master, console, plain_every=status_every)
        statuses.append(status)
        status.start()
    environment.CLI_DEFAULTS["on_job_started"] = on_job_started
    started = time.monotonic()
    sys.argv = [str(job)]
    sys.path.insert(0, str(job.resolve().parent))
    try:
        runpy.run_path(str(job), run_name="__main__")
    finally:
        environment.CLI_DEFAULTS.update(restore_from=None, allow_non_restored_state=False)
        environment.CLI_DEFAULTS.pop("on_web_url", None)
        environment.CLI_DEFAULTS.pop("on_job_started", None)
        for status in statuses:   # a finished job's line is gone before the summary prints
            status.join(timeout=5.0)
    results = environment.CLI_DEFAULTS.pop("results", [])
    for result in results:
        for line in summary_lines(result):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        for number, recovery in enumerate(result.recoveries, 1):
            if "restore" in recovery:
                console.print(f"  recovery {number}: {_restore_sources(recovery['restore'])}")
    if not results:
        console.print(f"[yellow]{job} ran for {time.monotonic() - started:.1f} s but executed no job "
                      f"(does it call env.execute()?)[/yellow]")


@app.command()
def checkpoints(directory: str = typer.Argument(..., help="Checkpoint directory (or one job's directory).")) -> None:
    """List the completed checkpoints under DIR, verifying their checksums."""
    from streamsnap.checkpoint.listing import list_checkpoints

    summaries = list_checkpoints(directory)
    if not summaries:
        console.print(f"no checkpoints under {directory}")
        raise typer.Exit(1)
    table = Table(title=f"checkpoints under {directory}")
    # "state size": every file the checkpoint consists of; "checkpointed": what it wrote itself
    # (smaller for incremental RocksDB and changelog checkpoints, which reuse earlier files), as
    # in the web UI and lastCheckpointSize. "in flight": data an unaligned checkpoint saved
    # between subtasks ("-": none, aligned).
    for column in ("job", "checkpoint", "type", "status", "completed at", "state size", "checkpointed", "in flight",
                   "operators"):
        table.add_column(column, no_wrap=True)
    table.add_column("path", overflow="fold")
    for s in summaries:
        table.add_row(s.job_id[:12], str(s.checkpoint_id), s.checkpoint_type.value if s.checkpoint_type else "-",
                      s.status,
                      time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.completed_at)) if s.completed_at else "-",
                      _size(s.state_size) if s.state_size is not None else "-",
                      _size(s.incremental_size) if s.incremental_size is not None else "-",
                      _in_flight(s),
                      str(s.num_operators) if s.num_operators is not None else "-", s.path)
    console.print(table)
    bad = [s for s in summaries if s.status != "COMPLETED"]
    if bad:
        console.print(f"[yellow]{len(bad)} incomplete or corrupt checkpoint(s) are not usable for restore[/yellow]")


def _in_flight(s) -> str:
    """'-' for an aligned checkpoint; else what the unaligned one saved and processed."""
    if not s.num_subtasks:
        return _size(s.in_flight_size) if s.in_flight_size else "-"
    return (f"{_size(s.in_flight_size or 0)} saved, {_size(s.in_flight_processed or 0)} processed, "
            f"{s.unaligned_subtasks}/{s.num_subtasks} subtasks unaligned")


@app.command()
def ui(directory: str = typer.Argument(..., help="Checkpoint directory (or one job's directory)."),
       port: int = typer.Option(0, "--port", help="TCP port (0: any free one)."),
       bind: str = typer.Option("127.0.0.1", "--bind", help="Address to listen on; other than loopback needs a token."),
       token: str = typer.Option(None, "--token", envvar="STREAMSNAP_WEB_TOKEN",
                                 help="Bearer token required of every request (better passed in STREAMSNAP_WEB_TOKEN)."),
       ) -> None:
    """Name the live web UI of each job running with `web=` under DIR, and serve the web UI and
    REST API for the completed checkpoints under DIR, read-only, until Ctrl-C."""
    from streamsnap.errors import StreamsnapError
    from streamsnap.web.archive import archived_jobs
    from streamsnap.web.config import WebConfig
    from streamsnap.web.discovery import live_jobs
    from streamsnap.web.rest import WebServer

    try:
        running = live_jobs(directory, token)
        jobs = archived_jobs(directory)
        server = WebServer(WebConfig(port=port, bind=bind, token=token))
    except (FileNotFoundError, ValueError, StreamsnapError) as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    for job in running:
        state = "running, live UI at" if job["live"] else "announced but not answering (stale: its driver is gone?) at"
        console.print(f"job '{job['job_name']}' ({job['job_id']}) {state} {job['url']}", markup=False,
                      highlight=False, soft_wrap=True)
    if not jobs:
        server.close()
        if any(job["live"] for job in running):
            raise typer.Exit(0)
        console.print(f"no checkpoints under {directory}")
        raise typer.Exit(1)
    server.serve_archive(jobs)
    console.print(f"checkpoints of {len(jobs)} job(s) under {directory}, read-only, at {server.url}  (Ctrl-C stops)",
                  markup=False, highlight=False, soft_wrap=True)
    sys.stdout.flush()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        console.print("stopped")
    finally:
        server.close()


@savepoint_app.command("inspect")
def savepoint_inspect(path: str = typer.Argument(..., help="Savepoint or checkpoint directory.")) -> None:
    """Show what a savepoint (or checkpoint) holds, per operator."""
    from streamsnap.checkpoint.metadata import read_metadata
    from streamsnap.checkpoint.storage import resolve_restore_path

    metadata_url, _ = resolve_restore_path(path)
    metadata = read_metadata(metadata_url)
    console.print(f"{metadata.checkpoint_type.value} {metadata.checkpoint_id} of job {metadata.job_id}, "
                  f"{_size(metadata.state_size)} of state")
    table = Table()
    for column in ("operator uid", "parallelism", "max parallelism", "state size"):
        table.add_column(column)
    for uid, op in sorted(metadata.operators.items()):
        table.add_row(uid, str(op.parallelism), str(op.max_parallelism), _size(op.state_size))
    console.print(table)


def _restore_sources(restore: dict) -> str:
    """Where a recovery's keyed state came from (task-local recovery)."""
    text = (f"keyed state from local copies {restore['local_files']} file(s), "
            f"{_size(restore['local_bytes'])}; from checkpoint storage {restore['remote_files']} "
            f"file(s), {_size(restore['remote_bytes'])}")
    unusable = restore["local_missing"] + restore["local_rejected"]
    if unusable:
        text += (f" ({restore['local_missing']} local copies missing, {restore['local_rejected']} "
                 f"rejected as corrupt)")
    return text


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


if __name__ == "__main__":
    app()
