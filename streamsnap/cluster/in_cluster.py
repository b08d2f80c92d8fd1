"""The JobMaster inside the job's own barrier stage (docs/architecture/deployment-decision.md).

Task 0 of the barrier stage forks the JobMaster into a process of its own (it ends with task 0:
parent-death signal — SIGTERM, so it first records the loss of its host as the attempt's
failure, then exits within HOST_LOSS_GRACE). The JobMaster takes the next epoch in the job's
registry (cluster/registry.py), recovers the latest completed checkpoint, decides what this attempt
restores and publishes its control address there; every slot of the stage reads that entry,
derives the same restore plan from the checkpoint's `_metadata`, and runs its subtasks against
it. Nothing in the cluster connects back to the client.

One JobMaster leads one attempt. A failure ends the attempt by failing every task of the
stage — never by returning, or Spark would keep the "successful" tasks and re-run only the
missing ones — and Spark's own stage retry starts the next attempt, whose task 0 starts the
next epoch's JobMaster. That includes the JobMaster's process being SIGKILLed: task 0 sees its
child gone and fails, and the next epoch charges the lost JobMaster to the restart strategy
like any other failure. Only the job's real end (FINISHED, CANCELED, or FAILED because no
restart is left) lets the tasks return, after the leader marked the record `ending`; task 0's
row then carries the JobResult to whoever submitted the Spark job.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass

import msgpack

from streamsnap.cluster import storage_control, wire_objects
from streamsnap.cluster.jobmaster import JobMaster, JobSettings
from streamsnap.cluster.log_buffer import LogBuffer
from streamsnap.cluster.process_liveness import parent_gone, process_start_time
from streamsnap.cluster.registry import TERMINAL, FencedError, JobRegistry
from streamsnap.cluster.request_files import RequestFileWatch
from streamsnap.cluster.status import JobStatus
from streamsnap.cluster.submitter_watch import SubmitterWatch
from streamsnap.errors import JobExecutionError, StreamsnapError
from streamsnap.runtime.deployment import Deployment

log = logging.getLogger(__name__)

LEADER_WAIT = 180.0        # seconds a slot waits for its stage attempt's JobMaster to publish itself
POLL = 0.02                # registry polling while waiting for the leader (seconds)
FATE_POLL = 0.1            # registry polling while waiting for the job's end after the slot's tasks ended
EXIT_FAILOVER = 75         # the JobMaster process's exit code when its attempt failed over
HOST_LOSS_GRACE = 5.0      # seconds a JobMaster whose task 0 died has to record it before it exits


@dataclass
class ClusterJob:
    """What the barrier stage's closure carries: the deployment every attempt copies (its
    attempt, JobMaster address and restore come from the registry) and the JobMaster's settings."""

    deployment: Deployment
    settings: JobSettings
    directory: str          # CheckpointConfig.directory: the registry is <directory>/<job id>/
    local: bool             # local[N] master: bind to loopback
    connect: str | None = None   # detached jobs: the Connect URL a replacement submitter uses

    @property
    def registry(self) -> JobRegistry:
        return JobRegistry(self.directory, self.deployment.job_id)

    def __setstate__(self, state: dict) -> None:
        """Unpickled in a Python worker: when, and after how much CPU time of the worker
        (`unpickled_at`, `unpickled_cpu`, not fields), for a recovery's timeline — it tells the
        closure's loading apart from the worker's start and the task's, and waiting from working."""
        self.__dict__.update(state)
        self.unpickled_at = time.time()
        self.unpickled_cpu = time.process_time()   # CPU seconds of this worker (a fork) until now


class AttemptEnded(StreamsnapError):
    """This stage attempt is over and the job goes on (a failover): the Spark task must fail."""


# ====================================================================== the JobMaster side
class ClusterJobMaster(SubmitterWatch, RequestFileWatch, JobMaster):
    """A JobMaster leading exactly one attempt, from inside the barrier stage; it also watches a
    detached job's submitter (cluster/submitter_watch.py) and answers request files
    (cluster/request_files.py)."""

    def __init__(self, job: ClusterJob, task0_tid: int, host: str, started: dict | None = None):
        d = job.deployment
        # The address the other executors know task 0's executor by (Spark's), or the user's choice.
        bind = "127.0.0.1" if job.local else (job.settings.network.bind_host or host)
        super().__init__(None, d.execution_graph, job.settings, secret=d.secret, run_id=d.run_id,
                         control_bind=bind, local=job.local)
        self.registry = job.registry
        self._job = job
        self._submitter_replaced = False
        # Task log records for the attached client (`logs` requests); fed on connection threads.
        self._log_buffer = LogBuffer(-1)
        self._log_lock = threading.Lock()
        self._storage_control = storage_control.StorageControl(self.registry, d.secret)
        self._request_files_seen: set[str] = set()
        self._task0_tid = task0_tid
        self._host = host
        self.epoch = -1
        self.outcome: tuple | None = None      # ("ended", payload) or ("failover", None)
        self._record: dict = {}
        # When this attempt's task 0 got going (worker_started_at, task_started_at): with
        # leader_at and deployed_at below they time a recovery step by step (benchmarks).
        self._started = dict(started or {})

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        record = self.registry.read() or {}
        if record.get("run_id") != self.run_id:
            raise StreamsnapError(f"job {self.job_id} in {self.registry} belongs to another run "
                                  f"({record.get('run_id')}); this stage attempt of run {self.run_id} stops")
        if record.get("ending"):
            # Spark re-ran the stage after the job had ended (a task failed while ending): nothing to do.
            self.outcome = ("ended", record.get("payload"))
            self._done.set()
            return
        # The previous leader's address and restore are not this attempt's.
        self._record = {k: v for k, v in record.items() if k not in ("control", "restore", "task0_tid")}
        self.epoch = self.registry.take_epoch({"host": self._host, "pid": os.getpid(), "task0_tid": self._task0_tid})
        self._log_buffer.epoch = self.epoch
        self._attempts.current = self.epoch - 1       # the deploy below runs attempt == epoch
        self.recovery_log = list(record.get("recoveries", []))
        self.exceptions.extend(wire_objects.decode(record["exceptions"]) if record.get("exceptions") else ())
        self._restore_backoff(record.get("backoff"))
        first = record.get("epoch") is None
        if self.settings.checkpoint is not None:
            self.coordinator = self._create_coordinator()
            if first:
                self._recover_earlier_run()
                resumed = self.coordinator.completed_store.latest() is not None
                self._record["checkpoint_floor"] = 0 if resumed else self.coordinator.next_checkpoint_id
            else:
                self.coordinator.recover_completed_checkpoints(min_id=int(record.get("checkpoint_floor", 0)))
                self.coordinator.discard_abandoned_locations()
        delay = 0.0
        # A replaced submitter ended the previous attempt (its Spark job was interrupted): that is
        # the cause to show, whatever the interrupted leader managed to record.
        submitter_lost = record.get("submitter_lost")
        if submitter_lost and submitter_lost.get("charged"):
            submitter_lost = None
        if submitter_lost:
            self._record["submitter_lost"] = dict(submitter_lost, charged=True)
        if not first and record.get("status") != JobStatus.RESTARTING.value:
            # The previous leader died without recording why (SIGKILL, its host lost): charge it.
            lost, reason, task = (f"the JobMaster of epoch {record.get('epoch')} (pid {record.get('pid')} on "
                                  f"{record.get('host')}) was lost: its process died or was killed",
                                  "JOBMASTER_LOST", "JobMaster")
            if submitter_lost:
                lost, reason, task = submitter_lost["cause"], "SUBMITTER_LOST", "submitter"
            self.recovery_log.append({"failed_at": time.time(), "cause": lost})
            self.exceptions.root(int(record.get("attempt", self.epoch - 1)), lost, reason, task)
            self._backoff.notify_failure(self._clock.monotonic())
            if self._backoff.can_restart():
                self._backoff.notify_restart()
                delay = self._backoff.backoff_time
            else:
                self._failure, self._failure_reason = lost, reason
                self._finalize(JobStatus.FAILED, JobExecutionError(
                    f"job failed after {self._backoff.restarts} restart(s) ({self._backoff.describe()}); "
                    f"last failure:\n{lost}", job_name=self.settings.job_name, cause=lost, reason=reason))
                return
        elif not first:
            delay = max(0.0, float(record.get("not_before", 0.0)) - time.time())
            if submitter_lost:
                self.exceptions.replace_root(int(record.get("attempt", self.epoch - 1)), submitter_lost["cause"],
                                             "SUBMITTER_LOST", "submitter")
        if not first and self.recovery_log and "running_at" not in self.recovery_log[-1]:
            self.recovery_log[-1].update(self._started, leader_at=time.time())
        try:
            self._serve_web()
        except Exception as exc:   # deterministic (a taken port...): every epoch would fail the same way
            message = f"the JobMaster of job '{self.settings.job_name}' could not start: {exc}"
            self._finalize(JobStatus.FAILED, JobExecutionError(message, job_name=self.settings.job_name,
                                                                cause=message, reason="CONFIGURATION"))
            return
        self._server.start()
        self._loop_thread.start()
        if self._job.connect is not None and record.get("detached"):
            self._post(self._watch_submitter)
        self._post(self._watch_request_files)
        self._attempts.request_deploy()
        if delay > 0:
            log.info("job '%s' epoch %d deploys in %.1f s (restart delay)", self.settings.job_name, self.epoch, delay)
            self._post(lambda: self._timers.call_later(delay, self._deploy))
        else:
            self._post(self._deploy)

    def host_lost(self, parent_pid: int) -> None:
        """SIGTERM: task 0's Python worker (this process's parent, which also runs slot 0) died —
        SIGKILLed, or Spark killed it — or someone asked this process to stop. Fail the attempt
        with that cause, as for a lost subtask, so the record says what happened and when,
        instead of the next leader finding this JobMaster gone ("was lost") seconds later."""
        gone = parent_gone(parent_pid)
        cause = (f"Spark task 0's Python worker (pid {parent_pid} on {self._host}), which hosts slot 0 and this "
                 f"JobMaster, died or was killed" if gone else
                 f"the JobMaster (pid {os.getpid()} on {self._host}) was sent SIGTERM")
        log.warning("job '%s' epoch %d: %s; failing the attempt", self.settings.job_name, self.epoch, cause)
        self._post(lambda: self._handle_failure(cause, "TASK_LOST", self._attempt, "slot 0" if gone else "JobMaster"))

    def _serve_web(self) -> None:
        """`StreamEnvironment(web=...)`: the REST API and web UI, from this process (rest.py)."""
        if self.settings.web is None:
            return
        from streamsnap.web.rest import WebServer

        self._web = WebServer(self.settings.web)
        self._web.serve(self)
        self._record["web_url"] = self._web.url

    def _restore_backoff(self, saved: dict | None) -> None:
        if saved:
            self._backoff.load_history(saved, self._to_wall())

    def _saved_backoff(self) -> dict:
        return self._backoff.history(self._to_wall())

    def _to_wall(self) -> float:
        """This process's monotonic clock -> wall clock (the record is read on other hosts)."""
        return time.time() - self._clock.monotonic()

    # ------------------------------------------------------------------ the registry
    @property
    def advertised_address(self) -> list:
        bound, port = self._server.address
        return [self._host if bound in ("", "0.0.0.0", "::") else bound, port]

    def _publish(self, status: str | None = None, **extra) -> None:
        """Write the job's record — unless a newer JobMaster leads the job: then this one steps
        down without writing (its tasks see the newer epoch and fail; `_step_down`)."""
        self._record.update(
            status=status or self.status.value, epoch=self.epoch, attempt=self._attempt,
            control=self.advertised_address, host=self._host, pid=os.getpid(), task0_tid=self._task0_tid,
            restarts=self._backoff.restarts, backoff=self._saved_backoff(), recoveries=self.recovery_log,
            last_failure=self._failure, exceptions=wire_objects.encode(self.exceptions.entries()), **extra)
        try:
            self.registry.fence(self.epoch)
        except FencedError as exc:
            self._step_down(exc)
            return
        self.registry.write(self._record)

    def _step_down(self, reason: FencedError) -> None:
        log.warning("job '%s': %s; this JobMaster stops", self.settings.job_name, reason)
        self.outcome = ("failover", str(reason))
        self._send_all({"type": "cancel"})
        if self._checkpoint_io is not None:
            self._checkpoint_io.shutdown(wait=False)
        self._server.close()
        self._done.set()

    def _set_status(self, status: JobStatus) -> None:
        changed = status is not self.status
        super()._set_status(status)
        if changed and not status.is_terminal and self.epoch >= 0:
            if status is JobStatus.RUNNING:
                self._record["running_since"] = time.time()
            self._publish()

    def _leadership_check(self):
        return lambda: self.registry.fence(self.epoch)

    # ------------------------------------------------------------------ the attempt
    def _launch_attempt(self, deployment: Deployment) -> None:
        """The stage's tasks already run: tell them what this attempt restores."""
        if self.recovery_log and "running_at" not in self.recovery_log[-1]:
            self.recovery_log[-1]["deployed_at"] = time.time()
        self._publish(restore=self._restore_entry())
        self._arm_deploy_timer()

    def _schedule_restart(self, delay: float) -> None:
        """The next attempt is Spark's stage retry: record the decision, then end this process."""
        if self.recovery_log:
            self.recovery_log[-1]["attempt_ended_at"] = time.time()
        self._publish(JobStatus.RESTARTING.value, not_before=time.time() + delay)
        self.outcome = ("failover", None)
        # Not `_cleanup()`: the task-local state copies are for the next attempt.
        if self._checkpoint_io is not None:
            self._checkpoint_io.shutdown(wait=True)
        self._server.close()
        self._done.set()

    def _after_subtask_finished(self) -> None:
        if self._failing or self.status.is_terminal:
            return
        if all(s.state.value == "FINISHED" for s in self._subtasks.values()):
            self._finalize(JobStatus.FINISHED)

    def _on_finalized(self, status: JobStatus) -> None:
        payload = {"status": status.value}
        if self._result is not None:
            payload["result"] = wire_objects.encode(self._result)
        if self._error is not None:
            payload["error"] = {"message": str(self._error), "cause": getattr(self._error, "cause", None),
                                "reason": getattr(self._error, "reason", None)}
        summary = {k: v for k, v in payload.items() if k != "result"}
        if self._result is not None:   # the registry keeps the result without the collected rows
            summary["result"] = wire_objects.encode(dataclasses.replace(self._result, collected={}))
        self._publish(status.value, ending=True, payload=summary, ended_at=time.time())
        self.outcome = ("ended", payload)

    # ------------------------------------------------------------------ clients
    def _on_control_message(self, conn, message: dict) -> None:
        if message.get("type") == "client":
            if message.get("call") == "logs":     # answered here: the event loop may be busy
                with self._log_lock:
                    value = self._log_buffer.since(message.get("epoch"), int(message.get("after", 0)))
                conn.send({"type": "reply", "id": message.get("id"), "ok": True, "value": value})
                return
            self._post(lambda: self._answer(conn, message))
            return
        super()._on_control_message(conn, message)

    def _relay_logs(self, message: dict) -> None:
        """Kept for attached clients (they fetch them with `logs`), and re-emitted here too."""
        with self._log_lock:
            self._log_buffer.append(message)
        super()._relay_logs(message)

    def _answer(self, conn, message: dict) -> None:
        """One request of a JobClient in another process (cluster/job_control.py)."""
        call, request_id = message.get("call"), message.get("id")

        def reply(value=None, error: BaseException | None = None):
            answer = {"type": "reply", "id": request_id, "ok": error is None}
            if error is None:
                answer["value"] = value
            else:
                answer["error"] = f"{type(error).__name__}: {error}"
            conn.send(answer)

        def reply_future(future, transform):
            future.add_done_callback(lambda f: reply(error=f.exception()) if f.exception() is not None
                                     else reply(transform(f.result())))
        try:
            if call == "describe":
                reply({"status": self.status.value, "epoch": self.epoch, "restarts": self._backoff.restarts,
                       "recoveries": self.recovery_log})
            elif call == "stats":
                reply(None if self.coordinator is None else wire_objects.encode(self.coordinator.stats.snapshot()))
            elif call == "subtasks":
                reply(wire_objects.encode(self.subtasks()))
            elif call == "metrics":       # the latest counters; asks the subtasks for fresh ones
                self.request_metrics()
                reply(wire_objects.encode(self.operator_metrics()))
            elif call == "cancel":
                reply(self.status.value)     # first: cancelling closes every connection
                self._cancel()
            elif call == "checkpoint":
                reply_future(self.trigger_checkpoint(), lambda cp: cp.checkpoint_id)
            elif call == "savepoint":
                future = self.trigger_savepoint(str(message["directory"]), bool(message.get("terminate")),
                                                bool(message.get("drain")))
                reply_future(future, str)
            else:
                reply(error=StreamsnapError(f"unknown request {call!r}"))
        except Exception as exc:   # answered, not raised into the event loop
            reply(error=exc)


def _jobmaster_process(job: ClusterJob, task0_tid: int, host: str, sender, parent_pid: int, started: dict) -> None:
    from streamsnap.runtime.slot import _die_with_parent

    _die_with_parent(parent_pid, signal.SIGTERM)   # until the handler below: SIGTERM's default, exit
    logging.basicConfig(level=getattr(logging, job.settings.log_level, logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    master = ClusterJobMaster(job, task0_tid, host, started)

    def on_sigterm(_signum, _frame):
        if not getattr(on_sigterm, "seen", False):
            on_sigterm.seen = True
            # Whatever the failover path does, this process is gone after the grace.
            threading.Timer(HOST_LOSS_GRACE, os._exit, (EXIT_FAILOVER,)).start()
            master.host_lost(parent_pid)
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        master.start()
        master.wait_terminal()
    except BaseException as exc:
        log.exception("the JobMaster of job %s could not run", job.deployment.job_id)
        sender.send(("failover", f"{type(exc).__name__}: {exc}"))
        sender.close()
        os._exit(EXIT_FAILOVER)
    try:
        sender.send(master.outcome or ("failover", "the JobMaster ended without an outcome"))
        sender.close()
    except OSError:   # task 0 is gone (host_lost): the registry holds the outcome
        log.info("job %s: task 0 is gone; the JobMaster's outcome is in the registry only", job.deployment.job_id)
    # Daemon threads (control connections, timers) must not hold the process at exit.
    os._exit(0 if master.outcome and master.outcome[0] == "ended" else EXIT_FAILOVER)


# ====================================================================== the slot side
def run_cluster_slot(job: ClusterJob, slot: int, host: str, tid: int, n: int) -> list[tuple]:
    """Slot `slot` of a stage attempt: (slot 0: start the JobMaster,) find the attempt's leader,
    run the slot's subtasks, then return only if the job ended — raise if it goes on without us.
    Rows: (task_index, vertex, outcome, payload); task 0 adds the JobMaster's row (index -1)."""
    from streamsnap.runtime.slot import run_slot

    job.deployment.use_storage_options()   # the registry lies in the checkpoint directory
    master = receiver = None
    if slot == 0:
        started = {"task_started_at": time.time(), "worker_started_at": process_start_time(),
                   "closure_loaded_at": getattr(job, "unpickled_at", None),
                   "closure_loaded_cpu": getattr(job, "unpickled_cpu", None)}
        context = multiprocessing.get_context("fork")
        receiver, sender = context.Pipe(duplex=False)
        master = context.Process(target=_jobmaster_process, args=(job, tid, host, sender, os.getpid(), started),
                                 name="streamsnap-jobmaster", daemon=False)
        master.start()
        sender.close()
    try:
        entry = _await_leader(job, tid, n, master)
        outcomes = []
        if entry is not None:
            outcomes = [(*o, None) for o in run_slot(_attempt_deployment(job, entry), slot, host)]
        if master is not None:
            outcome = _master_outcome(master, receiver)
            if outcome[0] != "ended":
                raise AttemptEnded(f"job {job.deployment.job_id}: the attempt failed over "
                                   f"({outcome[1] or 'see the JobMaster log'}); Spark retries the stage")
            return outcomes + [(-1, "JobMaster", "ENDED", msgpack.packb(outcome[1], use_bin_type=True))]
        if entry is not None:
            _await_job_end(job, entry["epoch"])
        return outcomes
    except BaseException:
        if master is not None and master.is_alive():
            master.kill()
        raise


def _await_leader(job: ClusterJob, tid: int, n: int, master) -> dict | None:
    """The registry entry of this stage attempt's JobMaster (its task 0 has a task id within n
    of ours: a barrier attempt's tasks are launched together), or None if the job has ended."""
    registry = job.registry
    deadline = time.monotonic() + LEADER_WAIT
    while True:
        record = registry.read() or {}
        if record.get("ending") and record.get("status") in TERMINAL:
            return None
        if ("control" in record and "restore" in record and record.get("status") != JobStatus.RESTARTING.value
                and abs(int(record.get("task0_tid", -10 ** 9)) - tid) < n):
            return record
        if master is not None and not master.is_alive():
            raise AttemptEnded(f"job {job.deployment.job_id}: the JobMaster process ended (exit code "
                               f"{master.exitcode}) before it published itself in {registry}")
        if time.monotonic() > deadline:
            raise AttemptEnded(f"job {job.deployment.job_id}: no JobMaster of this stage attempt published itself in "
                               f"{registry} within {LEADER_WAIT:.0f} s")
        time.sleep(POLL)


def _attempt_deployment(job: ClusterJob, entry: dict) -> Deployment:
    """The template deployment made this attempt's: its number, its leader, what it restores."""
    return dataclasses.replace(job.deployment, allow_non_restored_state=job.settings.allow_non_restored_state) \
        .for_attempt(int(entry["epoch"]), entry.get("restore"), driver_address=tuple(entry["control"]))


def _master_outcome(master, receiver) -> tuple:
    try:
        outcome = receiver.recv()
    except EOFError:      # SIGKILL: the next epoch records it
        outcome = ("failover", f"the JobMaster process died (exit code {master.exitcode})")
    master.join()
    receiver.close()
    return outcome


def _await_job_end(job: ClusterJob, epoch: int) -> None:
    """After this slot's subtasks ended: return once the leader marked the job ending; raise if
    the attempt failed over instead (a restart, or a newer leader)."""
    registry = job.registry
    while True:
        record = registry.read() or {}
        if record.get("epoch") != epoch or record.get("status") == JobStatus.RESTARTING.value:
            raise AttemptEnded(f"job {job.deployment.job_id}: attempt {epoch} failed over; Spark retries the stage")
        if record.get("ending"):
            return
        time.sleep(FATE_POLL)


def decode_payload(payload: bytes):
    """Task 0's last row, as the submitter reads it: (JobResult or None, JobExecutionError or None)."""
    outcome = msgpack.unpackb(payload, raw=False)
    result = wire_objects.decode(outcome["result"]) if outcome.get("result") else None
    error = None
    if outcome.get("error"):
        e = outcome["error"]
        error = JobExecutionError(e["message"], cause=e.get("cause"), reason=e.get("reason"))
    return result, error


__all__ = ["ClusterJob", "ClusterJobMaster", "run_cluster_slot", "decode_payload", "AttemptEnded"]


def cluster_slot_runner(job: ClusterJob):
    """The function each barrier task runs: `run(slot, host, tid, n)` (cluster/spark_bridge.py)."""

    def run(slot: int, host: str, tid: int, n: int):
        return run_cluster_slot(job, slot, host, tid, n)

    return run
