"""The `streamsnap` command (mirrors Flink's `flink` CLI where it makes sense).

    streamsnap run job.py [--from PATH] [--allow-non-restored-state] [--detach]
    streamsnap list DIR
    streamsnap savepoint DIR JOB PATH          (take a savepoint of a running job)
    streamsnap stop DIR JOB --savepoint PATH [--drain]
    streamsnap cancel DIR JOB
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
console = _own_console = Console()


@app.callback()
def _each_command() -> None:
    """streamsnap: stateful, exactly-once stream processing on Spark."""
    # A console per command: Rich reads COLUMNS when a Console is made, so one made at import
    # would keep the width of whichever environment first imported this module. (A console
    # set from outside — an embedding program's, a test's — is kept.)
    global console, _own_console
    if console is _own_console:
        console = _own_console = Console()


@app.command()
def run(job: Path = typer.Argument(..., help="Python file that builds a pipeline and calls env.execute()."),
        restore_from: str = typer.Option(None, "--from", "-s", help="Checkpoint or savepoint to start from."),
        allow_non_restored_state: bool = typer.Option(False, "--allow-non-restored-state",
                                                      help="Skip state of operators the job no longer has."),
        status_every: float = typer.Option(PLAIN_EVERY, "--status-every", min=0.1,
                                           help="Seconds between status lines when stdout is not a terminal "
                                                "(on a terminal the line is redrawn in place every second)."),
        detach: bool = typer.Option(False, "--detach", "-d",
                                    help="Submit and return once the job runs; it outlives this command "
                                         "(Spark Connect sessions: the job file builds its session with "
                                         "SparkSession.builder.remote(...))."),
        ) -> None:
    """Run a job file on the embedded (or active) Spark session, show a live status line and a summary."""
    if not job.is_file():
        console.print(f"[red]no such job file: {job}[/red]")
        raise typer.Exit(2)
    environment.CLI_DEFAULTS.update(restore_from=restore_from, allow_non_restored_state=allow_non_restored_state)
    if detach:
        _run_detached(job)
        return
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


def _run_detached(job: Path) -> None:
    from streamsnap.errors import StreamsnapError

    environment.CLI_DEFAULTS["detached"] = True
    sys.argv = [str(job)]
    sys.path.insert(0, str(job.resolve().parent))
    try:
        runpy.run_path(str(job), run_name="__main__")
    except environment.DetachedSubmission as submitted:
        print(f"job {submitted.client.job_id} is RUNNING, detached "
              f"(streamsnap list / stop / cancel DIR {submitted.client.job_id})")
        return
    except StreamsnapError as exc:
        console.print(str(exc), style="red", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    finally:
        environment.CLI_DEFAULTS.pop("detached", None)
    console.print(f"[yellow]{job} submitted no job (does it call env.execute()?)[/yellow]")
    raise typer.Exit(1)


@app.command("list")
def list_jobs(directory: str = typer.Argument(..., help="Checkpoint directory the jobs write to.")) -> None:
    """List the jobs recorded under DIR (JobMaster in the cluster, or detached), newest first."""
    from streamsnap.api import jobs

    found = _or_exit(lambda: jobs.list(directory))
    if not found:
        console.print(f"no jobs are recorded under {directory}")
        raise typer.Exit(1)
    table = Table(title=f"jobs under {directory}")
    for column in ("job id", "name", "status", "submitted", "JobMaster", "restarts", "last failure"):
        table.add_column(column, no_wrap=column != "last failure", overflow="fold")
    for job in found:
        where = f"{job.job_master[0]}:{job.job_master[1]} (epoch {job.epoch})" if job.job_master else "-"
        if job.job_master and job.status not in ("FINISHED", "CANCELED", "FAILED") and not job.live:
            where += ", not answering"
        table.add_row(job.job_id, job.job_name, job.status,
                      time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.submitted_at)) if job.submitted_at else "-",
                      where, str(job.restarts), (job.last_failure or "").splitlines()[0] if job.last_failure else "-")
    Console(width=max(console.width, 160)).print(table)


def _via_option():
    return typer.Option("control", "--via", help="control: the JobMaster's control port; storage: request files in "
                                                 "the job's directory (from outside the cluster's network).")


@app.command()
def stop(directory: str = typer.Argument(..., help="Checkpoint directory the job writes to."),
         job_id: str = typer.Argument(..., help="The job's id (streamsnap list DIR)."),
         savepoint: str = typer.Option(..., "--savepoint", "-p", help="Directory to write the final savepoint to."),
         drain: bool = typer.Option(False, "--drain", help="End event time first: every window fires (Flink's --drain)."),
         timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait for the job to stop."),
         via: str = _via_option()) -> None:
    """Stop a running job with a savepoint (Flink's `flink stop --savepointPath`)."""
    from streamsnap.api import jobs

    client = _or_exit(lambda: jobs.attach(directory, job_id, via))
    path = _or_exit(lambda: client.stop_with_savepoint(savepoint, drain=drain, timeout=timeout))
    print(f"job {job_id} stopped with savepoint {path}")


@app.command()
def cancel(directory: str = typer.Argument(..., help="Checkpoint directory the job writes to."),
           job_id: str = typer.Argument(..., help="The job's id (streamsnap list DIR)."),
           timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait for the job to end."),
           via: str = _via_option()) -> None:
    """Cancel a running job (no savepoint)."""
    from streamsnap.api import jobs

    client = _or_exit(lambda: jobs.attach(directory, job_id, via))
    _or_exit(lambda: client.cancel(timeout))
    print(f"job {job_id} {client.status()}")


@app.command()
def savepoint(arguments: list[str] = typer.Argument(..., metavar="DIR JOB PATH | inspect PATH",
                                                    help="DIR JOB PATH: take a savepoint of a running job into PATH. "
                                                         "inspect PATH: show what a savepoint holds."),
              via: str = _via_option()) -> None:
    """Take a savepoint of a running job (`savepoint DIR JOB PATH`), or inspect one (`savepoint inspect PATH`)."""
    if arguments[:1] == ["inspect"] and len(arguments) == 2:
        _savepoint_inspect(arguments[1])
        return
    if len(arguments) != 3:
        console.print("usage: streamsnap savepoint DIR JOB PATH  |  streamsnap savepoint inspect PATH")
        raise typer.Exit(2)
    from streamsnap.api import jobs

    directory, job_id, target = arguments
    client = _or_exit(lambda: jobs.attach(directory, job_id, via))
    path = _or_exit(lambda: client.trigger_savepoint(target))
    print(f"savepoint of job {job_id} at {path}")


def _or_exit(action):
    """Run a control action; a streamsnap error is printed (no traceback) and exits with 1."""
    from streamsnap.errors import StreamsnapError

    try:
        return action()
    except (StreamsnapError, TimeoutError) as exc:
        console.print(str(exc), style="red", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


@app.command()
def checkpoints(directory: str = typer.Argument(..., help="Checkpoint directory (or one job's directory).")) -> None:
    """List the completed checkpoints under DIR, verifying their checksums (a table on a
    terminal; tab-separated full values into a pipe or a file)."""
    from streamsnap.checkpoint.listing import list_checkpoints

    summaries = list_checkpoints(directory)
    if not summaries:
        console.print(f"no checkpoints under {directory}")
        raise typer.Exit(1)
    # "state size": every file the checkpoint consists of; "checkpointed": what it wrote itself
    # (smaller for incremental RocksDB and changelog checkpoints, which reuse earlier files), as
    # in the web UI and lastCheckpointSize. "in flight": data an unaligned checkpoint saved
    # between subtasks ("-": none, aligned).
    columns = ("job", "checkpoint", "type", "status", "completed at", "state size", "checkpointed", "in flight",
               "operators", "path")
    rows = [(s.job_id, str(s.checkpoint_id), s.checkpoint_type.value if s.checkpoint_type else "-", s.status,
             time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.completed_at)) if s.completed_at else "-",
             _size(s.state_size) if s.state_size is not None else "-",
             _size(s.incremental_size) if s.incremental_size is not None else "-",
             _in_flight(s), str(s.num_operators) if s.num_operators is not None else "-", s.path)
            for s in summaries]
    if not console.is_terminal:
        # A pipe or a file: every value in full, tab-separated (a table would cut them to the
        # 80 columns Rich assumes without a terminal).
        for row in (columns, *rows):
            print("\t".join(row))
    else:
        table = Table(title=f"checkpoints under {directory}")
        for column in columns[:-1]:
            table.add_column(column, no_wrap=True)
        table.add_column("path", overflow="fold")
        for row in rows:
            table.add_row(row[0][:12], *row[1:])
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
        console.print(f"job '{job['job_name']}' ({job['job_id']}) {state} {job['ui_url']}", markup=False,
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


def _savepoint_inspect(path: str) -> None:
    """Show what a savepoint (or checkpoint) holds, per operator."""
    from streamsnap.checkpoint.metadata import read_metadata
    from streamsnap.checkpoint.storage import resolve_restore_path

    metadata_url, _ = resolve_restore_path(path)
    metadata = read_metadata(metadata_url)
    console.print(f"{metadata.checkpoint_type.value} {metadata.checkpoint_id} of job {metadata.job_id}, "
                  f"{_size(metadata.state_size)} of state")
    # Operator names as the job graph recorded them: the names the summary, subtasks() and the
    # REST API show next to the same uids ("-" for files of versions that did not record it).
    names = {op["uid"]: op["name"] for vertex in (metadata.job_graph or {}).get("vertices", [])
             for op in vertex.get("operators", [])}
    table = Table()
    for column in ("operator uid", "operator name", "parallelism", "max parallelism", "state size"):
        table.add_column(column, overflow="fold")
    for uid, op in sorted(metadata.operators.items()):
        table.add_row(uid, names.get(uid, "-"), str(op.parallelism), str(op.max_parallelism), _size(op.state_size))
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
