"""What a job returns (`JobResult`) and how a running job is controlled (`JobClient`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OperatorMetrics:
    name: str
    uid: str
    parallelism: int
    records_in: int
    records_out: int


@dataclass(frozen=True)
class SubtaskInfo:
    """One subtask of the current attempt, so that operators can be watched (and tests can kill
    them). `state` says whether it still runs; `pid` is None once it ended (FINISHED, FAILED,
    CANCELED) — its process may be an idle Spark Python worker by then, not the subtask's."""

    vertex: str
    index: int
    attempt: int
    host: str | None
    pid: int | None
    state: str
    task_index: int
    data_address: tuple[str, int] | None = None  # where upstream subtasks connect (None: a source)


@dataclass(frozen=True)
class JobResult:
    job_id: str
    job_name: str
    status: str
    duration: float                      # seconds from submission to the end
    operators: dict[str, OperatorMetrics]  # by uid
    collected: dict[str, list[dict]]     # rows of each Collect sink, by sink name
    checkpoints: Any = None              # checkpoint.stats snapshot, None without checkpointing
    restarts: int = 0
    network: dict = field(default_factory=dict)
    # One entry per failover: failed_at (noticed), running_at (all subtasks running again),
    # first_output_at (first row reached a sink after the restore); wall-clock seconds. With
    # local recovery also `restore`: files and bytes the subtasks restored from task-local
    # copies (local_files, local_bytes) and from checkpoint storage (remote_files,
    # remote_bytes), copies missing or rejected, in total and per subtask ("subtasks").
    recoveries: tuple[dict, ...] = ()
    # Record counts (`operators`, `records_in`) are those of the last deployment attempt
    # (`attempt`, 0 = the first): after a restart or a restore they count the rows processed
    # since `restored_checkpoint` (the checkpoint or savepoint id it started from) — rows before
    # it were processed by earlier attempts/jobs and are in the output, not in these counts.
    attempt: int = 0
    restored_checkpoint: int | None = None
    # With local recovery, over the last attempt's subtasks: local copies written (files,
    # bytes, failures to write one) and what their restore read locally and remotely.
    local_recovery: dict | None = None
    # The job's exception history (Flink's exceptions tab), oldest first: one
    # cluster.exception_history.ExceptionHistoryEntry per failed attempt — `exception`,
    # `root_cause` (the user's traceback first, then where), `timestamp`, `task`, `attempt`,
    # `reason` and the `concurrent` failures of other subtasks that followed from it.
    exceptions: tuple = ()

    def rows(self, sink: str | None = None) -> list[dict]:
        """Rows of the Collect sink `sink` (the only one when omitted)."""
        if sink is None:
            if len(self.collected) != 1:
                raise KeyError(f"this job has {len(self.collected)} collect sinks "
                               f"({', '.join(self.collected) or 'none'}); name the one you want")
            return next(iter(self.collected.values()))
        if sink not in self.collected:
            raise KeyError(f"no collect sink named {sink!r}; sinks: {', '.join(self.collected) or 'none'}")
        return self.collected[sink]

    def to_dataframe(self, spark, sink: str | None = None):
        """The rows of a Collect sink as a Spark DataFrame (types inferred by Arrow over all rows;
        large outputs belong in a FileSink, read with `FileSink.to_dataframe(spark)`)."""
        import pyarrow as pa

        rows = self.rows(sink)
        if not rows:
            from pyspark.sql.types import StructType

            return spark.createDataFrame([], StructType([]))
        return spark.createDataFrame(pa.Table.from_pylist(rows))

    @property
    def records_in(self) -> int:
        """Rows the sources emitted in the last attempt (see `attempt`, `restored_checkpoint`)."""
        return sum(m.records_in for m in self.operators.values() if m.name.startswith("Source"))

    def summary(self) -> str:
        lines = [f"job '{self.job_name}' {self.status} in {self.duration:.2f} s"
                 + (f" after {self.restarts} restart(s)" if self.restarts else "")]
        if self.restored_checkpoint is not None:
            lines.append(f"  record counts below: attempt {self.attempt + 1} only, since checkpoint "
                         f"{self.restored_checkpoint} it restored — rows before that checkpoint were processed "
                         f"{'by earlier attempts' if self.restarts else 'by the job that took it'} and are in "
                         f"the output, not in these counts")
        for m in self.operators.values():
            lines.append(f"  {m.name:<28} parallelism {m.parallelism:<3} in {m.records_in:>12,}  out {m.records_out:>12,}")
        if self.checkpoints is not None:
            c = self.checkpoints.counts
            lines.append(f"  checkpoints: {c.completed} completed, {c.failed} failed")
        return "\n".join(lines)


class JobClient:
    """Handle on a job started with `execute_async` (Flink's JobClient)."""

    def __init__(self, job_master, web=None):
        self._master = job_master
        self._web = web

    @property
    def web_url(self) -> str | None:
        """Where the job's REST API, `/metrics` and web UI are served while it runs (None without
        `StreamEnvironment(web=ss.WebConfig(...))`)."""
        return self._web.url if self._web is not None else None

    @property
    def job_id(self) -> str:
        return self._master.job_id

    @property
    def slots(self) -> int:
        """Spark task slots the job holds: its barrier stage's task count (see slot_sharing)."""
        return len(self._master.slots)

    def status(self) -> str:
        return self._master.status.value

    def wait(self, timeout: float | None = None) -> JobResult:
        """Block until the job ends; returns its result or raises JobExecutionError."""
        return self._master.wait(timeout)

    def cancel(self, timeout: float | None = 60.0) -> None:
        self._master.cancel()
        self._master.wait_terminal(timeout)

    def checkpoint_stats(self):
        return self._master.checkpoint_stats()

    def recoveries(self) -> list[dict]:
        """Failovers so far: failed_at, running_at, first_output_at (wall-clock seconds)."""
        return [dict(r) for r in self._master.recovery_log]

    def subtasks(self) -> list[SubtaskInfo]:
        return self._master.subtasks()

    def trigger_checkpoint(self, timeout: float | None = 60.0):
        """Take a checkpoint now; returns the completed checkpoint."""
        return self._master.trigger_checkpoint().result(timeout)

    def trigger_savepoint(self, directory: str, timeout: float | None = 120.0) -> str:
        """Take a savepoint into `directory`; returns the savepoint's path."""
        _check_savepoint_directory(directory, "trigger_savepoint")
        return self._master.trigger_savepoint(directory, terminate=False).result(timeout)

    def stop_with_savepoint(self, directory: str, drain: bool = False, timeout: float | None = 120.0) -> str:
        """Take a savepoint, then stop the job; returns the savepoint's path."""
        _check_savepoint_directory(directory, "stop_with_savepoint")
        path = self._master.trigger_savepoint(directory, terminate=True, drain=drain).result(timeout)
        self._master.wait_terminal(timeout)
        return path


def _check_savepoint_directory(directory, call: str) -> None:
    """Probe the target now: a bad path fails in milliseconds, naming it, not as a failed savepoint."""
    from streamsnap.api.preflight import check_directory
    from streamsnap.errors import ConfigurationError

    if not isinstance(directory, str) or not directory:
        raise ConfigurationError(f"{call} needs a directory path or fsspec URL, got {directory!r}")
    check_directory(directory, "the savepoint directory", f"{call}(directory)")
