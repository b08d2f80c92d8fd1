"""What a job returns (`JobResult`) and how a running job is controlled (`JobClient`).

Names agree everywhere a job is shown: an operator is its `name` ("Source: events") and its
`uid` ("source__events-0", the id its state is stored under); a vertex (a chain of operators
run in one task) is the uid of its first operator and the names of its operators joined by
" -> ". `JobResult.summary()`, `JobClient.subtasks()` (`SubtaskInfo.vertex` / `.vertex_name`),
the REST API (`/jobs/:id`: vertices' `id` / `name`, operators' `uid` / `name`) and the CLI
(`streamsnap savepoint inspect`: operator uids) all use these strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamsnap.checkpoint.stats import CheckpointStatsSnapshot


@dataclass(frozen=True)
class OperatorMetrics:
    """One operator's record counts in a `JobResult` (over all its subtasks, last attempt).

    name: the operator's name, e.g. "Source: events"; uid: its stable id, e.g.
    "source__events-0" (the key of `JobResult.operators`); parallelism: its subtask count;
    records_in / records_out: rows read and written.
    """

    name: str
    uid: str
    parallelism: int
    records_in: int
    records_out: int


@dataclass(frozen=True)
class SubtaskInfo:
    """One subtask of the current attempt, so that operators can be watched (and tests can kill them).

    vertex: the vertex id — the uid of the chain's first operator, e.g. "source__events-0"
      (the uid the summary shows in brackets, the REST API's vertex `id`);
    vertex_name: the chain's operator names, e.g. "Source: events -> Map" (the REST API's
      vertex `name`); index: the subtask index, 0-based; attempt: the deployment attempt, 0 =
      the first; host, pid: where it runs — `pid` is None once it ended (FINISHED, FAILED,
      CANCELED): its process may be an idle Spark Python worker by then, not the subtask's;
      state: "DEPLOYING", "RUNNING", "FINISHED", ...; task_index: its position in the job's
      barrier stage; data_address: where upstream subtasks connect (None: a source).
    """

    vertex: str
    index: int
    attempt: int
    host: str | None
    pid: int | None
    state: str
    task_index: int
    data_address: tuple[str, int] | None = None  # where upstream subtasks connect (None: a source)
    vertex_name: str = ""

    def __str__(self) -> str:
        name = f" {self.vertex_name!r}" if self.vertex_name else ""
        return (f"{self.vertex}[{self.index}]{name} {self.state} (attempt {self.attempt}, "
                f"{self.host or '?'} pid {self.pid or '?'})")


@dataclass(frozen=True)
class JobResult:
    """What `env.execute(...)` / `JobClient.wait()` return when a job ends.

    job_id, job_name: the job; status: "FINISHED", "CANCELED" or "FAILED"; duration: seconds
    from submission to the end; operators: `OperatorMetrics` by operator uid; collected: the
    rows of each `ss.sinks.Collect`, by sink name (read them with `rows()`); checkpoints: a
    `CheckpointStatsSnapshot` (None without checkpointing; `.counts.completed` is the number of
    completed checkpoints); restarts: failovers; recoveries: one dict per failover (below);
    attempt / restored_checkpoint: which attempt the record counts are of (below).

    `print(result)` prints `summary()`; `repr(result)` is one line.

        result = env.execute("word count")
        print(result.summary())
        counts = {r["word"]: r["count"] for r in result.rows()}
    """

    job_id: str
    job_name: str
    status: str
    duration: float                      # seconds from submission to the end
    operators: dict[str, OperatorMetrics]  # by uid
    collected: dict[str, list[dict]]     # rows of each Collect sink, by sink name
    checkpoints: CheckpointStatsSnapshot | None = None   # None without checkpointing
    restarts: int = 0
    network: dict = field(default_factory=dict)
    # One entry per failover: failed_at (noticed), running_at (all subtasks running again),
    # first_output_at (first row reached a sink after the restore); wall-clock seconds;
    # restart: "in place" (the slots that survived ran the next attempt) or "new stage" (a
    # slot was lost: a new Spark barrier stage), absent with a JobMaster in the cluster. With
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
        """A few lines: the job's end, then per operator its name, [uid], parallelism and
        record counts, then the checkpoint counts — e.g.

            job 'word count' FINISHED in 2.31 s
              Source: words [source__words-0]     parallelism 2   in       1,000  out       1,000
              checkpoints: 3 completed, 0 failed
        """
        lines = [f"job '{self.job_name}' {self.status} in {self.duration:.2f} s"
                 + (f" after {self.restarts} restart(s)" if self.restarts else "")]
        if self.restored_checkpoint is not None:
            lines.append(f"  record counts below: attempt {self.attempt + 1} only, since it restored checkpoint "
                         f"{self.restored_checkpoint} — rows before that checkpoint were processed "
                         f"{'by earlier attempts' if self.restarts else 'by the job that took it'} and are in "
                         f"the output, not in these counts")
        labels = {uid: f"{m.name} [{uid}]" for uid, m in self.operators.items()}
        width = max((len(label) for label in labels.values()), default=0)
        for uid, m in self.operators.items():
            lines.append(f"  {labels[uid]:<{width}}  parallelism {m.parallelism:<3} in {m.records_in:>12,}  "
                         f"out {m.records_out:>12,}")
        if self.checkpoints is not None:
            c = self.checkpoints.counts
            lines.append(f"  checkpoints: {c.completed} completed, {c.failed} failed")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        """One line: the job, its end, and how much it did (`summary()` has the details)."""
        rows = sum(len(r) for r in self.collected.values())
        text = (f"<JobResult '{self.job_name}' ({self.job_id}) {self.status} in {self.duration:.2f} s, "
                f"{len(self.operators)} operator(s), {len(self.collected)} collect sink(s) with {rows:,} row(s)")
        if self.checkpoints is not None:
            text += f", {self.checkpoints.counts.completed} checkpoint(s)"
        if self.restarts:
            text += f", {self.restarts} restart(s)"
        return text + ">"


class JobClient:
    """Handle on a running job (Flink's JobClient): from `env.execute_async(...)`, or
    `ss.jobs.attach(directory, job_id)` for a job started elsewhere.

        client = env.execute_async("clicks")
        client.trigger_checkpoint()
        print(client.status(), client.checkpoint_stats())
        path = client.stop_with_savepoint("/tmp/savepoints")
    """

    def __init__(self, job_master, web=None):
        self._master = job_master
        self._web = web

    def __repr__(self) -> str:
        return f"<JobClient {self.job_id}>"

    @property
    def web_url(self) -> str | None:
        """Where the job's REST API, `/metrics` and web UI are served while it runs (None with
        `StreamEnvironment(web=False)`)."""
        if self._web is not None:
            return self._web.url
        record = getattr(self._master, "record", None)   # a JobMaster in the cluster serves it there
        return record().get("web_url") if record is not None else None

    @property
    def ui_url(self) -> str | None:
        """The web UI's address with the token its actions need (savepoint, stop, cancel) in
        the fragment: what the job printed when it started; None without a UI in this process."""
        return self._web.ui_url if self._web is not None else None

    @property
    def job_id(self) -> str:
        """The job's id: its directory under the checkpoint directory (`ss.jobs.list` shows it)."""
        return self._master.job_id

    @property
    def slots(self) -> int:
        """Spark task slots the job holds: its barrier stage's task count (see slot_sharing)."""
        return len(self._master.slots)

    def status(self) -> str:
        """The job's status now: "CREATED", "RUNNING", "RESTARTING", "FINISHED", "CANCELED", "FAILED", ..."""
        return self._master.status.value

    def wait(self, timeout: float | None = None) -> JobResult:
        """Block until the job ends; returns its result or raises JobExecutionError."""
        return self._master.wait(timeout)

    def cancel(self, timeout: float | None = 60.0) -> None:
        """Cancel the job without a savepoint and wait up to `timeout` seconds (None: no limit)
        for it to end; output not covered by a completed checkpoint is not committed."""
        self._master.cancel()
        self._master.wait_terminal(timeout)

    def checkpoint_stats(self) -> CheckpointStatsSnapshot | None:
        """The job's checkpoint statistics now (None without checkpointing).

        `.counts` (triggered, in_progress, completed, failed, restored), `.latest_completed`,
        `.latest_savepoint`, `.latest_failed` (each a CheckpointStats: id, duration in seconds,
        sizes in bytes, per-subtask figures), `.summary` (min/avg/max), `.history` (newest
        first); `print(stats)` shows them in a few lines, e.g.
        `client.checkpoint_stats().counts.completed`.
        """
        return self._master.checkpoint_stats()

    def recoveries(self) -> list[dict]:
        """Failovers so far: failed_at, running_at, first_output_at (wall-clock seconds)."""
        return [dict(r) for r in self._master.recovery_log]

    def subtasks(self) -> list[SubtaskInfo]:
        """The job's subtasks now, in task order: vertex id and name, index, attempt, host,
        pid and state each (see `SubtaskInfo`)."""
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
