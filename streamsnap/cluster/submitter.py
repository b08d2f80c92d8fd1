"""The client side of a job whose JobMaster runs in the cluster (cluster/in_cluster.py).

`RemoteJob` is what a `JobClient` holds for such a job, in any process: status and history
from the job's registry record, requests (savepoint, stop, cancel, statistics) over an
authenticated control connection to the current leader — found again in the registry after
every failover. `SubmittedJob` is also the submitter: it writes the record and the secret,
runs the Spark job (one collect of the barrier stage), and submits a new Spark job when
Spark's own stage retries are spent while the job goes on; task 0's last row is the result.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import threading
import time

from streamsnap.cluster import wire_objects
from streamsnap.cluster.exception_history import ExceptionHistory
from streamsnap.cluster.job_control import JobControl, LeaderUnavailable
from streamsnap.cluster.log_buffer import LIMIT_RECORDS
from streamsnap.cluster.registry import TERMINAL, JobRegistry
from streamsnap.cluster.status import JobStatus
from streamsnap.errors import JobExecutionError, StreamsnapError

log = logging.getLogger(__name__)

_exiting = False


def _at_exit() -> None:
    global _exiting
    _exiting = True


atexit.register(_at_exit)

RETRY = 0.2              # seconds between attempts to reach a leader that is failing over
LOG_POLL = 0.5           # seconds between fetches of the tasks' log records (attached jobs)
STALLED_SUBMISSIONS = 3  # Spark jobs in a row that ended without any JobMaster taking an epoch


class RemoteJob:
    """A job in the cluster, seen from a client process through its registry and control port."""

    def __init__(self, registry: JobRegistry, secret: bytes | None = None, via: str = "control"):
        self.registry = registry
        self.job_id = registry.job_id
        self._secret = secret
        self._via = via          # "control": the leader's control port; "storage": files (cluster/storage_control.py)
        self._control: JobControl | None = None
        self._control_epoch = None
        self._lock = threading.Lock()
        self._metrics: dict = {}

    # ------------------------------------------------------------------ state
    def record(self) -> dict:
        record = self.registry.read()
        if record is None:
            raise StreamsnapError(f"no job {self.job_id} in {self.registry} (never submitted there, or its "
                                  f"directory was deleted)")
        return record

    @property
    def job_name(self) -> str:
        return self.record().get("job_name", "")

    @property
    def status(self) -> JobStatus:
        return JobStatus(self.record().get("status", JobStatus.CREATED.value))

    @property
    def slots(self) -> tuple:
        return tuple(range(int(self.record().get("slots", 0))))

    @property
    def restarts(self) -> int:
        return int(self.record().get("restarts", 0))

    @property
    def recovery_log(self) -> list[dict]:
        return list(self.record().get("recoveries", []))

    @property
    def exceptions(self) -> ExceptionHistory:
        """The job's exception history as its JobMaster last recorded it (the web UI's and the
        live status line's source, as a local JobMaster's own history is)."""
        history = ExceptionHistory()
        encoded = self.record().get("exceptions")
        if encoded:
            history.extend(wire_objects.decode(encoded))
        return history

    def ended(self) -> bool:
        record = self.record()
        return bool(record.get("ending")) and record.get("status") in TERMINAL

    # ------------------------------------------------------------------ requests
    def _leader(self) -> JobControl:
        record = self.record()
        if "control" not in record:
            raise LeaderUnavailable(f"job {self.job_id} has no JobMaster yet (status {record.get('status')})")
        with self._lock:
            if self._control is not None and (self._control.closed or self._control_epoch != record.get("epoch")):
                self._control.close()
                self._control = None
            if self._control is None:
                if self._secret is None:
                    self._secret = self.registry.read_secret()
                self._control = JobControl(tuple(record["control"]), self._secret, self.job_id)
                self._control_epoch = record.get("epoch")
            return self._control

    def call(self, call: str, timeout: float = 60.0, **arguments):
        """Ask the current leader; while it fails over (no leader, a dropped connection) ask again."""
        if self._via == "storage":
            from streamsnap.cluster.storage_control import StorageControl

            if self._secret is None:
                self._secret = self.registry.read_secret()
            return StorageControl(self.registry, self._secret).call(call, timeout, **arguments)
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self._leader().call(call, max(0.1, deadline - time.monotonic()), **arguments)
            except (OSError, LeaderUnavailable) as exc:
                if self.ended() or time.monotonic() > deadline:
                    raise
                log.debug("job %s: %s; asking again", self.job_id, exc)
                time.sleep(RETRY)

    def _future(self, fn) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run():
            try:
                future.set_result(fn())
            except BaseException as exc:   # handed to whoever waits on the future
                future.set_exception(exc)
        threading.Thread(target=run, name=f"job-{self.job_id[:8]}-request", daemon=True).start()
        return future

    def cancel(self) -> None:
        if self.ended():
            return
        try:
            self.call("cancel")
        except (OSError, StreamsnapError):
            if not self.ended():      # it ended meanwhile: what was asked has happened
                raise

    def trigger_checkpoint(self) -> concurrent.futures.Future:
        return self._future(lambda: self.call("checkpoint", timeout=600.0))

    def trigger_savepoint(self, directory: str, terminate: bool = False, drain: bool = False) -> concurrent.futures.Future:
        return self._future(lambda: self.call("savepoint", timeout=600.0, directory=directory,
                                              terminate=terminate, drain=drain))

    def checkpoint_stats(self):
        """Live from the leader; once the job has ended, the final figures from its record."""
        try:
            value = self.call("stats")
        except (OSError, StreamsnapError):
            if not self.ended():
                raise
            result = (self.record().get("payload") or {}).get("result")
            return wire_objects.decode(result).checkpoints if result else None
        return None if value is None else wire_objects.decode(value)

    def subtasks(self) -> list:
        """The current attempt's subtasks; none once the job has ended (its JobMaster is gone)."""
        try:
            return wire_objects.decode(self.call("subtasks"))
        except (OSError, StreamsnapError):
            if not self.ended():
                raise
            return []

    def request_metrics(self) -> None:
        """Fetch the subtasks' counters (the JobMaster asks them for fresh ones as it answers);
        while no leader answers (a failover) the last ones stay: status lines do not wait."""
        try:
            self._metrics = wire_objects.decode(self.call("metrics", 2.0) if self._via == "storage"
                                                else self._leader().call("metrics", 2.0))
        except (OSError, TimeoutError, StreamsnapError) as exc:
            log.debug("job %s: no counters now (%s)", self.job_id, exc)

    def operator_metrics(self) -> dict:
        """The latest counters `request_metrics` fetched, by (vertex id, subtask index)."""
        return dict(self._metrics)

    # ------------------------------------------------------------------ the end
    def wait_terminal(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.ended():
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(RETRY)
        return True

    def wait(self, timeout: float | None = None):
        if not self.wait_terminal(timeout):
            raise TimeoutError(f"job {self.job_id} did not end within {timeout} s")
        payload = self.record().get("payload") or {}
        if payload.get("error"):
            e = payload["error"]
            raise JobExecutionError(e["message"], job_name=self.job_name, cause=e.get("cause"), reason=e.get("reason"))
        return wire_objects.decode(payload["result"]) if payload.get("result") else None

    def close(self) -> None:
        with self._lock:
            if self._control is not None:
                self._control.close()
                self._control = None


class SubmittedJob(RemoteJob):
    """A job this process submitted: it runs the Spark job and holds task 0's result."""

    def __init__(self, spark, job, job_name: str):
        from streamsnap.cluster.spark_bridge import bridge_for

        super().__init__(job.registry, job.deployment.secret)
        self._job = job
        self._bridge = bridge_for(spark)
        self._name = job_name
        self._done = threading.Event()
        self._result = None
        self._error: BaseException | None = None
        self._tag = submission_tag(job)
        self._cancelled_locally = False   # no leader answered a cancel: the Spark job was interrupted here
        self._thread = threading.Thread(target=self._run, name=f"submitter-{self.job_id[:8]}", daemon=True)

    def start(self, record: bool = True, follow_logs: bool = True) -> None:
        """Run the job; `record=False` when the record was written by a client that launched us;
        `follow_logs`: re-emit the tasks' log records in this process's `logging` (attached jobs)."""
        if record:
            record_submission(self.registry, self._job, self._name, self._bridge.kind)
        self._thread.start()
        if follow_logs:
            threading.Thread(target=self._follow_logs, name=f"logs-{self.job_id[:8]}", daemon=True).start()

    def _follow_logs(self) -> None:
        """Fetch the task log records the JobMaster in the cluster keeps (cluster/log_buffer.py)
        and re-emit them here, as a JobMaster in this process would; across failovers too."""
        from streamsnap.runtime.log_relay import emit_on_driver

        epoch, after = None, 0
        while not self._done.wait(LOG_POLL):
            try:
                reply = self._leader().call("logs", 5.0, epoch=epoch, after=after)
            except (OSError, TimeoutError, StreamsnapError) as exc:   # failing over, or not started yet
                log.debug("job %s: no task logs now (%s)", self.job_id, exc)
                continue
            if reply["missed_batches"]:
                log.warning("job '%s': %d batch(es) of task log records were dropped before they could be "
                            "fetched (the JobMaster keeps the newest %d records); they are in the executors' logs",
                            self._name, reply["missed_batches"], LIMIT_RECORDS)
            for batch in reply["batches"]:
                attempt = batch.get("attempt")
                emit_on_driver(batch, attempt[-1] if isinstance(attempt, list) and attempt else None)
            epoch, after = reply["epoch"], reply["next"]

    def _run(self) -> None:
        from streamsnap.cluster.in_cluster import cluster_slot_runner, decode_payload
        from streamsnap.cluster.spark_errors import spark_error_summary

        stalled, submissions = 0, 0
        while True:
            epoch_before = self.registry.latest_epoch()
            submissions += 1
            try:
                rows = self._bridge.run_cluster_stage(
                    len(self._job.deployment.slots), cluster_slot_runner(self._job), self._tag,
                    f"streamsnap job '{self._name}' (Spark job {submissions})")
            except BaseException as exc:
                if _exiting:      # this process is going away: its Spark client with it
                    log.debug("job '%s': the submitting process exits; not resubmitting (%s)", self._name, exc)
                    return
                if self.ended():
                    self._finish_from_record()
                    return
                stalled = stalled + 1 if self.registry.latest_epoch() == epoch_before else 0
                if stalled >= STALLED_SUBMISSIONS or self._cancelled_locally:
                    self._fail(f"the job's Spark job failed {stalled} time(s) in a row before any JobMaster "
                               f"started: {spark_error_summary(exc)}" if not self._cancelled_locally
                               else f"job '{self._name}' was cancelled", exc)
                    return
                log.warning("job '%s': Spark job %d ended (%s); the job goes on in a new Spark job",
                            self._name, submissions, spark_error_summary(exc).splitlines()[0])
                continue
            payloads = [row[3] for row in rows if int(row[0]) == -1]
            if not payloads:
                self._fail("the job's Spark job ended without its JobMaster's row", None)
                return
            self._result, self._error = decode_payload(bytes(payloads[0]))
            if self._error is not None:
                self._error.job_name = self._name
            self._done.set()
            return

    @property
    def slots(self) -> tuple:
        return self._job.deployment.slots

    @property
    def settings(self):
        return self._job.settings

    @property
    def execution_graph(self):
        return self._job.deployment.execution_graph

    def _finish_from_record(self) -> None:
        try:
            self._result = RemoteJob.wait(self, 0)
        except BaseException as exc:    # the job's own error, handed to wait()
            self._error = exc
        self._done.set()

    def _fail(self, message: str, cause: BaseException | None) -> None:
        self._error = JobExecutionError(message, job_name=self._name, cause=repr(cause) if cause else None,
                                        reason="SPARK_JOB_FAILED")
        try:
            self.registry.update(status=JobStatus.FAILED.value, ending=True,
                                 payload={"status": "FAILED", "error": {"message": message, "reason": "SPARK_JOB_FAILED"}})
        except OSError as exc:
            log.warning("could not record the failure of job %s in %s: %s", self.job_id, self.registry, exc)
        self._done.set()

    def cancel(self) -> None:
        try:
            super().cancel()
        except (OSError, StreamsnapError) as exc:   # no leader to ask: stop the Spark job itself
            log.info("job %s: %s; cancelling its Spark job", self.job_id, exc)
            self._cancelled_locally = True
            self._bridge.cancel(self._tag)

    def wait_terminal(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def wait(self, timeout: float | None = None):
        if not self._done.wait(timeout):
            raise TimeoutError(f"job '{self._name}' did not end within {timeout} s")
        self.close()
        if self._error is not None:
            raise self._error
        return self._result


def submission_tag(job) -> str:
    """The Spark job tag (job group) of a job's Spark jobs: what interrupting them names."""
    return f"streamsnap-{job.deployment.job_id}-{job.deployment.run_id}"


def record_submission(registry: JobRegistry, job, job_name: str, session: str, detached: bool = False) -> None:
    """The job's first record and its secret, before any Spark job: `list` shows it from now on."""
    registry.write_secret(job.deployment.secret)
    registry.write({"job_name": job_name, "status": JobStatus.CREATED.value, "run_id": job.deployment.run_id,
                    "submitted_at": time.time(), "slots": len(job.deployment.slots), "ending": False,
                    "job_master": "cluster", "session": session, "detached": detached})


__all__ = ["RemoteJob", "SubmittedJob", "record_submission", "submission_tag"]
