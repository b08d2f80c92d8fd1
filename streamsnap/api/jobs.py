"""Jobs running under a checkpoint directory, from any process (Flink's `flink list`).

A job whose JobMaster runs in the cluster (`StreamEnvironment(job_master="cluster")`, the
default on Spark Connect, and every detached job) records itself in its directory of
checkpoint storage (cluster/registry.py). `list(DIR)` reads those records; `attach(DIR, id)`
returns a `JobClient` that controls the job through its JobMaster's authenticated control
port — the secret is read from the job's directory, so whoever may read the checkpoints may
control the job, and nobody else.

    for job in ss.jobs.list("s3://bucket/ckpt"):
        print(job.job_id, job.status)
    client = ss.jobs.attach("s3://bucket/ckpt", job_id)
    client.stop_with_savepoint("s3://bucket/savepoints")
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass

from streamsnap.api.result import JobClient
from streamsnap.errors import ConfigurationError


@dataclass(frozen=True)
class JobInfo:
    """One job's record, as `ss.jobs.list(directory)` returns it.

    job_id, job_name: the job (`ss.jobs.attach(directory, job_id)` controls it); status: as the
    JobMaster last wrote it ("RUNNING", "FINISHED", ...); submitted_at: epoch seconds; epoch:
    how many JobMasters led it, minus one; restarts: failovers so far; live: whether a
    JobMaster answers right now (False for an ended job, or one whose JobMaster was lost and not
    yet replaced — a killed process leaves "RUNNING" behind); job_master: its control address
    (host, port); last_failure: the last failure's message; web_url: its REST API / web UI.

    `repr(info)` is one line: id, name, status, live, restarts.
    """

    job_id: str
    job_name: str
    status: str
    submitted_at: float | None       # epoch seconds
    epoch: int | None                # how many JobMasters led it, minus one
    restarts: int
    live: bool
    job_master: tuple[str, int] | None
    last_failure: str | None
    web_url: str | None = None

    def __repr__(self) -> str:
        live = "live" if self.live else "not answering"
        text = f"<JobInfo {self.job_id} '{self.job_name}' {self.status}, {live}, {self.restarts} restart(s)"
        if self.last_failure:
            failure = self.last_failure.splitlines()[0]
            text += f", last failure: {failure[:80]}{'...' if len(failure) > 80 else ''}"
        return text + ">"


def list(directory: str, probe_timeout: float = 2.0) -> builtins.list[JobInfo]:
    """The jobs recorded under `directory` (the jobs' `CheckpointConfig.directory`, a path or
    fsspec URL), newest first; each job's JobMaster is asked whether it is live, waiting at
    most `probe_timeout` seconds.

        for job in ss.jobs.list("/tmp/ckpt"):
            print(job)          # <JobInfo clicks-1a2b3c4d 'clicks' RUNNING, live, 0 restart(s)>
    """
    from streamsnap.cluster.registry import TERMINAL, JobRegistry, list_jobs
    from streamsnap.cluster.submitter import RemoteJob

    _check_directory(directory, "ss.jobs.list")
    jobs = []
    for record in list_jobs(directory):
        live = False
        if record.get("status") not in TERMINAL and "control" in record:
            remote = RemoteJob(JobRegistry(directory, record["job_id"]))
            try:
                remote._leader().call("describe", probe_timeout)
                live = True
            except Exception:   # not answering: reported as not live, not an error
                live = False
            finally:
                remote.close()
        jobs.append(JobInfo(record["job_id"], record.get("job_name", ""), record.get("status", "?"),
                            record.get("submitted_at"), record.get("epoch"), int(record.get("restarts", 0)), live,
                            tuple(record["control"]) if "control" in record else None,
                            (record.get("last_failure") or None), record.get("web_url")))
    return jobs


def attach(directory: str, job_id: str, via: str = "control") -> JobClient:
    """A `JobClient` for the job `job_id` (see `list`) running under `directory` — from any
    process that can read that directory; raises ConfigurationError naming the jobs there when
    there is no such job.

    via: "control" (default) asks the job's JobMaster over its authenticated control port;
      "storage" through request and response files in the job's directory, for a client that
      cannot reach the cluster's hosts (a laptop with a Connect session to managed compute).

        client = ss.jobs.attach("/tmp/ckpt", "clicks-1a2b3c4d")
        client.stop_with_savepoint("/tmp/savepoints")
    """
    from streamsnap.cluster.registry import JobRegistry
    from streamsnap.cluster.submitter import RemoteJob

    _check_directory(directory, "ss.jobs.attach")
    if not isinstance(job_id, str) or not job_id:
        raise ConfigurationError(f"ss.jobs.attach needs a job id (see ss.jobs.list), got {job_id!r}")
    if via not in ("control", "storage"):
        raise ConfigurationError(f"ss.jobs.attach(via=...) must be 'control' or 'storage', got {via!r}")
    registry = JobRegistry(directory, job_id)
    if registry.read() is None:
        known = ", ".join(j.job_id for j in list(directory, probe_timeout=0.5)) or "none"
        raise ConfigurationError(f"no job {job_id!r} is recorded under {directory} (jobs there: {known})")
    return JobClient(RemoteJob(registry, via=via))


def _check_directory(directory, call: str) -> None:
    if not isinstance(directory, str) or not directory:
        raise ConfigurationError(f"{call} needs the jobs' checkpoint directory (CheckpointConfig.directory), "
                                 f"got {directory!r}")


__all__ = ["JobInfo", "list", "attach"]


def __dir__() -> builtins.list[str]:
    return sorted(__all__)
