"""The JobMaster: runs one job on Spark from the driver (Flink's JobMaster + scheduler).

Everything happens on one event-loop thread, so the checkpoint coordinator and the job's state
are never touched concurrently: control messages from tasks, the end of a Spark job, timers,
and user requests (cancel, savepoint) are all posted to it as events.

A deployment attempt is one Spark barrier stage with a task per subtask. Tasks register over
the control endpoint; once all did, the JobMaster sends everyone the data addresses of their
peers (a millisecond exchange, where `BarrierTaskContext.allGather` costs a second). When all
report RUNNING the job is RUNNING and the coordinator's periodic trigger starts.

Failure is noticed by whichever comes first — a task's report, a control connection dropping
(a killed process closes its sockets at once), or the Spark job aborting — then the attempt is
cancelled (tasks are told to stop, the Spark job group cancelled), and the restart strategy
decides: redeploy every subtask from the latest completed checkpoint (full restart failover),
or fail the job with its root cause.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from streamsnap.api.config import CheckpointConfig, NetworkConfig, RestartStrategy
from streamsnap.api.result import JobResult, SubtaskInfo
from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.io import ThreadedIO
from streamsnap.checkpoint.messages import AcknowledgeCheckpoint, DeclineCheckpoint
from streamsnap.checkpoint.reasons import CheckpointFailureReason
from streamsnap.clock import SystemClock, TimerQueue
from streamsnap.cluster.attempts import AttemptTracker
from streamsnap.cluster.commit_gate import CommitGate
from streamsnap.cluster.coordinator_gateway import CoordinatorGateway, LoopScheduler
from streamsnap.cluster.exception_history import ExceptionHistory, one_line
from streamsnap.web.job_summary import describe_graph, summary_of, write_summary
from streamsnap.cluster.failover import FOLLOW_ON_GRACE, Failover, failure_reason, failure_report
from streamsnap.cluster.job_result import ResultReport
from streamsnap.cluster.restart import RestartBackoff
from streamsnap.cluster.spark_bridge import bridge_for
from streamsnap.cluster.spark_session import control_host, is_local
from streamsnap.cluster.savepoint_stop import SavepointStop
from streamsnap.cluster.slot_restart import SlotRecord, SlotRestart
from streamsnap.cluster.spark_errors import spark_error_summary
from streamsnap.cluster.status import ExecutionState, JobStatus
from streamsnap.cluster.subtask_record import SubtaskRecord
from streamsnap.errors import JobExecutionError, RestoreError, StreamsnapError
from streamsnap.graph.execution_graph import ExecutionGraph
from streamsnap.graph.ids import ExecutionAttemptId, job_id_for_name
from streamsnap.graph.slot_sharing import plan_slots
from streamsnap.graph.stream_graph import NodeKind
from streamsnap.network import auth
from streamsnap.network.control import ControlConnection, ControlServer
from streamsnap.runtime.deployment import Deployment, slot_runner
from streamsnap.runtime.log_relay import emit_on_driver

log = logging.getLogger(__name__)

DEPLOY_TIMEOUT = 180.0
FINAL_CHECKPOINT_RETRY = 0.5
# How long a cancelled attempt's Spark job may take to end before the JobMaster stops waiting
# for it (Flink's task cancellation timeout plays the same role).
SPARK_CANCEL_GRACE = 20.0


@dataclass
class JobSettings:
    job_name: str
    checkpoint: CheckpointConfig | None
    restart: RestartStrategy
    network: NetworkConfig
    state_backend: str = "hashmap"
    restore_from: str | None = None
    allow_non_restored_state: bool = False
    log_level: str = "WARNING"
    test_hooks: dict = field(default_factory=dict)
    job_id: str | None = None  # stable across runs (names the checkpoint directory); None: from the name
    local_recovery: bool = False
    local_recovery_dir: str | None = None  # None: the executors' scratch directory
    slot_sharing: bool = True  # one Spark task slot per subtask index, not per subtask
    web: Any = None            # WebConfig a JobMaster in the cluster serves (a client's serves its own)


class JobMaster(SlotRestart, Failover, SavepointStop, ResultReport):
    """One job's master. Mixins beside it: restarts in the surviving slots (cluster/slot_restart.py),
    failover decisions (cluster/failover.py), savepoints and
    stop-with-savepoint (cluster/savepoint_stop.py), its result (cluster/job_result.py)."""

    def __init__(self, spark, execution_graph: ExecutionGraph, settings: JobSettings, *,
                 secret: bytes | None = None, run_id: str | None = None, control_bind: str | None = None,
                 local: bool | None = None):
        self.job_id = settings.job_id or job_id_for_name(settings.job_name)
        if settings.checkpoint is not None:   # (again) in a JobMaster process of the cluster
            filesystem.configure(settings.checkpoint.directory, settings.checkpoint.storage_options)
        # This run of the job: attempts of an earlier run (a driver that died) never share names
        # (Spark job groups, in-progress sink files) with this one's.
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.settings = settings
        self.execution_graph = execution_graph
        self.job_graph = execution_graph.job_graph
        self.slots = plan_slots(execution_graph, settings.slot_sharing)
        self._spark = spark
        # Classic or Spark Connect session (cluster/spark_bridge.py); None for a JobMaster hosted
        # inside the job's own barrier stage (cluster/in_cluster.py), which submits nothing.
        self._bridge = bridge_for(spark) if spark is not None else None
        self._local = is_local(spark) if local is None else local
        self.status = JobStatus.CREATED
        self._events: queue.Queue = queue.Queue()
        self._clock = SystemClock()
        self._timers = TimerQueue(self._clock)
        self._scheduler = LoopScheduler(self._clock, self._timers)
        self._secret = secret or auth.new_secret()
        self._lock = threading.Lock()
        self._subtasks: dict[int, SubtaskRecord] = {}
        self._attempts = AttemptTracker()
        self._restart_timer = None
        self._backoff = RestartBackoff(settings.restart)
        self._failing = False
        self._failure: str | None = None
        self._failure_reason: str | None = None
        self._lost_upstream: tuple[int, str, int] | None = None   # (attempt, vertex, index) a neighbour lost
        self._cancel_requested = False
        self._spark_running = False
        self._abandoned_spark_jobs: set[int] = set()
        self._spark_threads: dict[int, threading.Thread] = {}
        self._deploy_timer = None
        self._init_slot_restart()
        self._final_checkpoint_pending = False
        # A completed stop-with-savepoint waiting for the job to finish: (savepoint path, future,
        # drained). A drained one must not be resumed past after a failure.
        self._stopping: tuple[str, concurrent.futures.Future, bool] | None = None
        # The current attempt restored a drained stop-with-savepoint: it commits and finishes at once.
        self._ends_at_restore = False
        self.started_at = time.monotonic()
        self._done = threading.Event()
        self._result: JobResult | None = None
        self._error: BaseException | None = None
        self._loop_thread = threading.Thread(target=self._run_loop, name=f"jobmaster-{self.job_id[:8]}", daemon=True)
        # Per failure: when it was noticed, when the job ran again, when the first row reached a
        # driver-side sink after the restore (wall-clock seconds) — the recovery-time figures.
        self.recovery_log: list[dict] = []
        # Flink's exceptions tab: each failed attempt's root cause, with its follow-on failures.
        self.exceptions = ExceptionHistory()
        # Task-local recovery: (host, root) of the subtasks' local stores, cleaned at the end.
        self._local_roots: set[tuple[str | None, str]] = set()
        # The checkpoint the current attempt restored (None: a fresh start); the result's record
        # counts are this attempt's, i.e. rows after that checkpoint.
        self._restored_checkpoint_id: int | None = None
        self._sinks: dict[str, Any] = {}
        self._end_listeners: list[Callable[[JobStatus], None]] = []
        self._sink_names: dict[str, str] = {}
        for node in self.job_graph.stream_graph.nodes.values():
            if node.kind is NodeKind.SINK:
                component = node.operator.sink.create_driver_component()
                if component is not None:
                    self._sinks[node.uid] = component
                    self._sink_names[node.uid] = node.name
                    if callable(getattr(component, "attach", None)):   # a global committer (lakehouse sinks)
                        component.attach(job_id=self.job_id, run_id=self.run_id, uid=node.uid,
                                         fail=self._fail_from_sink, hooks=settings.test_hooks, post=self._post,
                                         on_committed=lambda _: self.commit_gate.release())
        # Completions and the job's end wait for the table commits of the sinks' committers.
        self.commit_gate = CommitGate(self._sinks.values())
        self.coordinator = None
        self._checkpoint_io = None
        self._server = ControlServer(control_host(spark) if control_bind is None else control_bind, self._secret, lambda conn: None,
                                     self._on_control_message, self._on_control_close,
                                     settings.network.peer_timeout)

    @property
    def _attempt(self) -> int:
        return self._attempts.current

    # ================================================================ public (any thread)
    def start(self) -> None:
        if self.settings.checkpoint is not None:
            self.coordinator = self._create_coordinator()
            self._recover_earlier_run()
        self._server.start()
        self._loop_thread.start()
        self._attempts.request_deploy()
        self._post(self._deploy)

    def wait(self, timeout: float | None = None) -> JobResult:
        if not self._done.wait(timeout):
            raise TimeoutError(f"job '{self.settings.job_name}' did not end within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def wait_terminal(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def cancel(self) -> None:
        self._post(self._cancel)

    def trigger_checkpoint(self) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()

        def trigger():
            if self.coordinator is None:
                future.set_exception(StreamsnapError("checkpointing is not configured for this job"))
                return
            _chain(self.coordinator.trigger_checkpoint(is_periodic=False), future, lambda cp: cp)
        self._post(trigger)
        return future

    def trigger_savepoint(self, directory: str, terminate: bool = False, drain: bool = False) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._post(lambda: self._trigger_savepoint(directory, terminate, drain, future))
        return future

    @property
    def control_address(self) -> tuple[str, int]:
        return self._server.address

    def checkpoint_stats(self):
        if self.coordinator is None:
            return None
        return self._call_in_loop(lambda: self.coordinator.stats.snapshot())

    @property
    def restarts(self) -> int:
        return self._backoff.restarts

    def request_metrics(self) -> None:
        """Ask the running subtasks for their counters; `operator_metrics()` has them when they reply."""
        self._post(lambda: self._send_all({"type": "report_metrics"}, ExecutionState.RUNNING))

    def operator_metrics(self) -> dict[tuple[str, int], dict]:
        """The current attempt's latest counters per (vertex, subtask index): records in/out per operator."""
        with self._lock:
            return {(s.attempt_id.vertex_id, s.attempt_id.index): s.metrics
                    for s in self._subtasks.values() if s.metrics is not None}

    def subtasks(self) -> list[SubtaskInfo]:
        """The current attempt's subtasks; an ended one (FINISHED, FAILED, CANCELED) has no pid:
        the process it ran in may by then be an idle Spark Python worker, or another task's."""
        names = {vertex_id: vertex.name for vertex_id, vertex in self.job_graph.vertices.items()}
        ended = (ExecutionState.FINISHED, ExecutionState.FAILED, ExecutionState.CANCELED)
        with self._lock:
            return [SubtaskInfo(s.attempt_id.vertex_id, s.attempt_id.index, s.attempt_id.attempt, s.host,
                                None if s.state in ended else s.pid, s.state.value, s.task_index,
                                tuple(s.data_address) if s.data_address else None,
                                names.get(s.attempt_id.vertex_id, ""))
                    for s in sorted(self._subtasks.values(), key=lambda s: s.task_index)]

    # ================================================================ event loop
    def _post(self, fn: Callable[[], None]) -> None:
        self._events.put(fn)

    def _call_in_loop(self, fn, timeout: float = 30.0):
        if self._done.is_set() or threading.current_thread() is self._loop_thread:
            return fn()
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run():
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)
        self._post(run)
        # The job may end between the check above and the loop taking the call: then the loop
        # has exited and the call would never run; read directly instead of waiting it out.
        deadline = time.monotonic() + timeout
        while True:
            try:
                return future.result(min(0.1, max(0.0, deadline - time.monotonic())))
            except concurrent.futures.TimeoutError:
                if self._done.is_set() and not self._loop_thread.is_alive():
                    return fn()
                if time.monotonic() >= deadline:
                    raise

    def _run_loop(self) -> None:
        try:
            while not self._done.is_set():
                due = self._timers.next_due()
                timeout = None if due is None else max(0.0, due - self._clock.monotonic())
                try:
                    fn = self._events.get(timeout=min(timeout, 1.0) if timeout is not None else 1.0)
                except queue.Empty:
                    fn = None
                if fn is not None:
                    fn()
                self._timers.run_due()
        except BaseException as exc:
            log.exception("the job master of '%s' failed", self.settings.job_name)
            self._error = JobExecutionError(f"internal error in the job master: {exc!r}",
                                            job_name=self.settings.job_name, cause=repr(exc))
            self._cancel_spark()
            self._cleanup()
            self._done.set()

    # ================================================================ deployment
    def _create_coordinator(self):
        from streamsnap.checkpoint.coordinator import CheckpointCoordinator
        from streamsnap.checkpoint.storage import CheckpointStorage

        config = self.settings.checkpoint
        storage = CheckpointStorage(config.directory, self.job_id)
        self._checkpoint_io = ThreadedIO(self._post)
        coordinator = CheckpointCoordinator(
            job_id=self.job_id, config=config, storage=storage, scheduler=self._scheduler,
            gateway=CoordinatorGateway(self), fail_job=self._on_checkpoint_failure_limit,
            io=self._checkpoint_io, fence=self._leadership_check())
        for component in self._sinks.values():
            if hasattr(component, "notify_checkpoint_complete"):
                coordinator.add_listener(component)
        return coordinator

    def _leadership_check(self) -> Callable[[], None] | None:
        """What the coordinator runs before finalizing a checkpoint; a JobMaster in the client
        is the only one of its run. In the cluster, epochs fence older leaders (in_cluster.py)."""
        return None

    def _recover_earlier_run(self) -> None:
        """Resume from the checkpoints an earlier run of this job left (its driver died), or say
        why not. Runs before anything is deployed; a RestoreError fails `execute()` itself."""
        config, name = self.settings.checkpoint, self.settings.job_name
        where = filesystem.user_path(self.coordinator.storage.job_directory)
        if self.settings.restore_from is None and config.resume == "latest":
            recovered = self.coordinator.recover_completed_checkpoints()
            if recovered:
                log.warning("job '%s' resumes from checkpoint %d of an earlier run (%s holds its completed "
                            "checkpoints); CheckpointConfig(resume='never') starts fresh instead",
                            name, recovered[-1], where)
        else:
            earlier = self.coordinator.storage.completed_ids()
            if earlier:
                why = "restore_from was given" if self.settings.restore_from else "CheckpointConfig(resume='never')"
                log.warning("job '%s' does not resume from the completed checkpoint(s) %s of an earlier run in %s "
                            "(%s); they are left in place", name, earlier, where, why)
        self.coordinator.discard_abandoned_locations()  # what a dead driver's tasks left half-written

    def _subtask_of(self, attempt: ExecutionAttemptId) -> SubtaskRecord | None:
        for subtask in self._subtasks.values():
            if subtask.attempt_id == attempt:
                return subtask
        return None

    def _deploy(self) -> None:
        self._restart_timer = None
        if self.status.is_terminal or not self._attempts.deploy_pending:
            log.debug("deploy skipped: the job is %s", self.status.value)
            return
        if self._cancel_requested:
            self._attempts.cancel_deploy()
            self._finalize(JobStatus.CANCELED)
            return
        self._attempts.begin_deploy()
        try:
            plan = self._restore_plan()
        except RestoreError as exc:
            self._finalize(JobStatus.FAILED, JobExecutionError(str(exc), job_name=self.settings.job_name,
                                                                cause=str(exc)))
            return
        eg = self.execution_graph
        deployment = new_deployment(self.job_id, self.run_id, self.settings, eg, self._secret, self.slots,
                                    self._local, self._attempt, self._server.address, plan, self._ends_at_restore,
                                    supervised_slots=self._bridge is not None)
        with self._lock:
            self._subtasks = {v.task_index: SubtaskRecord(deployment.attempt_id(v.task_index), v.task_index)
                              for v in eg.vertices}
        if self.coordinator is not None:
            self._configure_coordinator()
        self._launch_attempt(deployment)

    def _launch_attempt(self, deployment: Deployment) -> None:
        """Start the attempt's tasks: in the running stage's slots if they survived
        (cluster/slot_restart.py), else one Spark barrier stage, run on a thread of its own."""
        if self._deploy_in_place(deployment):
            self._arm_deploy_timer()
            return
        group = f"streamsnap-{self.job_id}-{self.run_id}-{self._attempt}"
        self._spark_group = group
        self._spark_running = True
        thread = threading.Thread(target=self._run_spark_job, args=(deployment, group, self._attempt),
                                  name=f"spark-job-{self._attempt}", daemon=True)
        self._spark_threads[self._attempt] = thread
        thread.start()
        self._arm_deploy_timer()

    def _arm_deploy_timer(self) -> None:
        """Fail the attempt if its subtasks are not all RUNNING within DEPLOY_TIMEOUT."""
        self._deploy_timer = self._timers.call_later(DEPLOY_TIMEOUT, lambda a=self._attempt: self._deploy_timed_out(a))

    def _configure_coordinator(self) -> None:
        from streamsnap.checkpoint.coordinator import OperatorInfo

        attempts = [s.attempt_id for s in self._subtasks.values()]
        sources = [s.attempt_id for s in self._subtasks.values()
                   if self.execution_graph.job_vertex(s.attempt_id.vertex_id).is_source]
        operators = {}
        for vertex in self.job_graph.vertices.values():
            for node_id in vertex.nodes:
                node = self.job_graph.node(node_id)
                operators[node.uid] = OperatorInfo(vertex.id, vertex.parallelism, node.max_parallelism)
        self.coordinator.set_execution_attempts(sources, attempts, attempts, operators)
        self.coordinator.describe_job(describe_graph(self.job_graph, self.settings.job_name))

    def _run_spark_job(self, deployment: Deployment, group: str, attempt: int) -> None:
        error = None
        try:
            self._bridge.run_barrier_stage(len(deployment.slots), slot_runner(deployment), group,
                                           f"streamsnap job '{self.settings.job_name}' attempt {attempt}")
        except BaseException as exc:
            error = exc
        self._post(lambda: self._on_spark_job_end(attempt, error))

    def _deploy_timed_out(self, attempt: int) -> None:
        if not self._attempts.is_live(attempt) or self.status is JobStatus.RUNNING:
            return
        missing = [str(s.attempt_id) for s in self._subtasks.values() if s.state is not ExecutionState.RUNNING]
        self._handle_failure(f"subtasks did not start within {DEPLOY_TIMEOUT:.0f} s: {', '.join(missing)} "
                             f"(are there enough free Spark task slots?)", "DEPLOY_TIMEOUT", attempt)

    # ================================================================ restore
    def _restore_plan(self):
        """What every (operator uid, subtask) of this attempt restores, or None for a fresh start.

        A restart restores the latest completed checkpoint (the coordinator falls back to an
        older one if the latest is unreadable); the first attempt restores `restore_from`.
        """
        from streamsnap.checkpoint.metadata import read_metadata
        from streamsnap.checkpoint.restore import plan_restore
        from streamsnap.checkpoint.storage import resolve_restore_path

        metadata = base = None
        self._ends_at_restore = False
        self._restore_source: tuple[str, str] | None = None   # (its _metadata, its base directory)
        if self.coordinator is not None:
            completed = self.coordinator.restore_latest_checkpoint()
            if completed is not None:
                metadata, base = completed.metadata, completed.location.url
                self._restore_source = (completed.location.metadata_url, base)
                self._ends_at_restore = completed.properties.drain
                if self._ends_at_restore:
                    log.warning("job '%s' restores the stop-with-savepoint %s, which drained (event time ended "
                                "there and every window fired into it): the job commits what it covers and "
                                "finishes, it does not run past its drain", self.settings.job_name,
                                filesystem.user_path(base))
        if metadata is None and self.settings.restore_from is not None:
            metadata_url, base = resolve_restore_path(self.settings.restore_from)
            metadata = read_metadata(metadata_url)
            self._restore_source = (metadata_url, base)
            if self.coordinator is not None:
                self.coordinator.restored_from(metadata.checkpoint_id, base, metadata.checkpoint_type)
        self._restored_checkpoint_id = metadata.checkpoint_id if metadata is not None else None
        if metadata is None:
            return None
        plan = plan_restore(metadata, base, self.job_graph, self.settings.allow_non_restored_state)
        log.info("job '%s' attempt %d restores from checkpoint %d (%s)", self.settings.job_name,
                 self._attempt, metadata.checkpoint_id, base)
        return plan


    def _restore_entry(self) -> dict | None:
        """Where the attempt's checkpoint is, for slots that derive their restore plan themselves
        (Deployment.for_attempt): never the state objects, only the `_metadata` to read."""
        source = self._restore_source
        return None if source is None else {"metadata": source[0], "base": source[1],
                                            "finish_at_restore": self._ends_at_restore}

    def _release_local_state(self) -> None:
        """Delete the job's task-local copies on this host: in local mode the tasks ran here;
        on a cluster finished tasks delete their own, Spark's scratch cleanup the rest."""
        from streamsnap.state.local_recovery import remove_tree

        if not self._local:
            return
        for _, root in sorted(self._local_roots):
            remove_tree(os.path.join(root, self.job_id))

    # ================================================================ control messages
    def _on_control_message(self, conn: ControlConnection, message: dict) -> None:
        if message.get("type") == "logs":
            # Task log records (runtime.log_relay), from any attempt — the records before a
            # failure matter most — re-emitted on the connection's thread, not the JobMaster's.
            self._relay_logs(message)
            return
        if message.get("type") in ("slot", "slot_stopped", "slot_done"):   # a supervised slot's (cluster/slot_restart.py)
            self._post(lambda: self._handle_slot_message(conn, message))
            return
        if message.get("type") == "failed" and message.get("logs"):
            # The failed task's last records: after its root cause is recorded, before anything
            # the loop does next can end the job (runtime/task.py run_task).
            logs = {**message.pop("logs"), "attempt": message.get("attempt")}
            self._post(lambda: (self._handle_message(conn, message), self._relay_logs(logs)))
            return
        self._post(lambda: self._handle_message(conn, message))

    def _relay_logs(self, message: dict) -> None:
        """Re-emit a task's batch of log records in this process's `logging` (runtime.log_relay)."""
        attempt = message.get("attempt")
        emit_on_driver(message, attempt[-1] if isinstance(attempt, list) and attempt else None)

    def _on_control_close(self, conn: ControlConnection, error) -> None:
        self._post(lambda: self._slot_closed(conn, error) if isinstance(conn.context, SlotRecord)
                   else self._handle_close(conn, error))

    def _handle_message(self, conn: ControlConnection, message: dict) -> None:
        kind = message.get("type")
        attempt = ExecutionAttemptId.from_wire(message["attempt"])
        if kind == "ack":
            if self.coordinator is not None:
                self.coordinator.receive_acknowledge(AcknowledgeCheckpoint.from_wire(message))
            return
        if kind == "decline":
            if self.coordinator is not None:
                self.coordinator.receive_decline(DeclineCheckpoint.from_wire(message))
            return
        subtask = self._subtask_of(attempt)
        if kind == "failed" and subtask is not None and self._upgrades_cause(failure_reason(message), attempt.attempt):
            # The attempt ended with an earlier report (a knock-on failure); this is its root cause.
            self._handle_failure(attempt=attempt.attempt, **failure_report(message))
            return
        if kind == "failed" and not self._attempts.is_live(attempt.attempt):
            # A neighbour of the failure that ended the attempt: counted in its history entry.
            self.exceptions.follow_on(attempt.attempt, message.get("task"),
                                      message.get("exception") or one_line(str(message["error"])))
        if subtask is None or not self._attempts.is_live(attempt.attempt):
            # A previous attempt, or the current one after it failed or was cancelled: whatever
            # its tasks still say (errors, rows for a sink) is past the checkpoint we restore.
            log.debug("message %s from %s ignored (its attempt has ended)", kind, attempt)
            if kind == "register":   # a task of another attempt must not wait here for peers
                conn.send({"type": "cancel"})
            return
        if kind == "register":
            with self._lock:
                subtask.connection = conn
                subtask.pid = int(message["pid"])
                subtask.host = str(message["host"])
                subtask.data_address = tuple(message["data_address"]) if message.get("data_address") else None
                subtask.state = ExecutionState.INITIALIZING
            conn.context = subtask
            if all(s.connection is not None for s in self._subtasks.values()):
                addresses = {s.task_index: list(s.data_address) for s in self._subtasks.values() if s.data_address}
                for s in self._subtasks.values():
                    s.connection.send({"type": "peers", "addresses": addresses})
        elif kind == "running":
            with self._lock:
                subtask.state = ExecutionState.RUNNING
                subtask.local_recovery = message.get("local_recovery")
            if subtask.local_recovery is not None:
                self._local_roots.add((subtask.host, subtask.local_recovery["root"]))
            if self.coordinator is not None:
                self.coordinator.execution_state_changed(subtask.attempt_id, ExecutionState.RUNNING)
            if all(s.state is ExecutionState.RUNNING for s in self._subtasks.values()):
                if self._deploy_timer is not None:
                    self._deploy_timer.cancel()
                if self.recovery_log and "running_at" not in self.recovery_log[-1]:
                    self.recovery_log[-1]["running_at"] = time.time()
                    if self.settings.local_recovery:
                        self.recovery_log[-1]["restore"] = self._restore_sources()
                self._set_status(JobStatus.RUNNING)
                if self._ends_at_restore and self.coordinator is not None:
                    self.coordinator.stop_periodic_scheduler()   # the tasks are finishing
        elif kind == "end_of_data":
            subtask.end_of_data = True
            if all(s.end_of_data for s in self._subtasks.values()):
                self._on_all_end_of_data()
        elif kind == "finished":
            with self._lock:
                subtask.state = ExecutionState.FINISHED
                subtask.metrics = message.get("metrics")
            if self.coordinator is not None:
                self.coordinator.execution_state_changed(subtask.attempt_id, ExecutionState.FINISHED)
            self._after_subtask_finished()
        elif kind == "metrics":
            with self._lock:
                if subtask.state is ExecutionState.RUNNING:   # a finished subtask's final counters stay
                    subtask.metrics = message["metrics"]
        elif kind == "failed":
            with self._lock:
                subtask.state = ExecutionState.FAILED
            report = failure_report(message)
            if message.get("follow_on") and message.get("lost"):
                vertex, index = message["lost"]
                self._lost_upstream = (attempt.attempt, str(vertex), int(index))
                # The upstream it lost is the likely root cause, and its own failure (its dropped
                # connection, its report) usually arrives within milliseconds: let it come first.
                self._timers.call_later(FOLLOW_ON_GRACE, lambda: self._handle_failure(attempt=attempt.attempt,
                                                                                      **report))
                return
            self._handle_failure(attempt=attempt.attempt, **report)
        elif kind == "first_output":
            if self.recovery_log and "first_output_at" not in self.recovery_log[-1]:
                self.recovery_log[-1]["first_output_at"] = float(message["at"])
        elif kind == "sink":
            component = self._sinks.get(message["uid"])
            if component is None:
                log.warning("message for unknown sink %s ignored", message["uid"])
            else:
                component.on_message(int(message["subtask"]), message)
        else:
            log.warning("unknown control message %r from %s", kind, attempt)

    def _after_subtask_finished(self) -> None:
        """Here the job ends with its Spark job (`_on_spark_job_end`); in_cluster.py ends it earlier."""


    # ================================================================ job end
    def _on_all_end_of_data(self) -> None:
        if self.coordinator is None or self._stopping is not None or self._ends_at_restore:
            return  # no final checkpoint: tasks finish on their own, or the savepoint was the last one
        self.coordinator.stop_periodic_scheduler()
        self._trigger_final_checkpoint()

    def _trigger_final_checkpoint(self) -> None:
        if self._failing or self.status is not JobStatus.RUNNING or self._final_checkpoint_pending:
            return
        self._final_checkpoint_pending = True
        attempt = self._attempt
        future = self.coordinator.trigger_checkpoint(is_periodic=False)
        future.add_done_callback(lambda f: self._post(lambda: self._after_final_checkpoint(attempt, f)))

    def _after_final_checkpoint(self, attempt: int, future) -> None:
        self._final_checkpoint_pending = False
        if attempt != self._attempt or self._failing or self.status is not JobStatus.RUNNING:
            return
        if future.exception() is not None:
            log.info("final checkpoint failed (%s); retrying", future.exception())
            self._timers.call_later(FINAL_CHECKPOINT_RETRY, self._trigger_final_checkpoint)
            return
        self._send_all({"type": "finish", "drain": True})

    def _send_all(self, message: dict, state: ExecutionState | None = None) -> None:
        for subtask in self._subtasks.values():
            if subtask.connection is not None and state in (None, subtask.state):
                subtask.connection.send(dict(message))

    def _on_spark_job_end(self, attempt: int, error: BaseException | None) -> None:
        attempt = self._stage_ended_attempt(attempt)
        if attempt != self._attempt or attempt in self._abandoned_spark_jobs or not self._spark_running:
            log.debug("end of the Spark job of attempt %d ignored (no longer awaited)", attempt)
            return
        self._spark_running = False
        if self._failing:
            self._after_attempt_stopped()
        elif self._cancel_requested:
            self._finalize(JobStatus.CANCELED)
        elif all(s.state is ExecutionState.FINISHED for s in self._subtasks.values()):
            self._finalize(JobStatus.FINISHED)
        elif error is None:
            self._await_last_reports(attempt)
        else:
            self._handle_failure(spark_error_summary(error), "SPARK_JOB_FAILED", attempt)

    def _handle_failure(self, cause: str, reason: str, attempt: int, task: str | None = None,
                        exception: str | None = None) -> None:
        """A failure of `attempt`: charged once, and only while that attempt is current and live.

        The first report ends the attempt, but it is not always the root cause: a task whose user
        function raised closes its channels as it fails, and a downstream task that notices the
        lost connection may report first. A user or data error of the same attempt arriving
        while it stops replaces such a cause (not the charge), so the job's error — and the
        decision that a data error must not restart — are about what actually went wrong."""
        if self._upgrades_cause(reason, attempt):
            log.info("job '%s' attempt %d: root cause %s replaces %s", self.settings.job_name, attempt,
                     reason, self._failure_reason)
            self.exceptions.replace_root(attempt, cause, reason, task, exception)
            self._failure, self._failure_reason = cause, reason
            if self.recovery_log:
                self.recovery_log[-1]["cause"] = cause
            return
        if self.status.is_terminal or not self._attempts.charge_failure(attempt):
            # Folded into the attempt's history entry (one count in the job's error), not logged.
            self.exceptions.follow_on(attempt, task, exception or one_line(cause))
            return
        self._failing = True
        self._failure, self._failure_reason = cause, reason
        self.exceptions.root(attempt, cause, reason, task, exception)
        if self._stopping is not None and not self._stopping[2]:
            path, stop, _ = self._stopping
            self._stopping = None
            stop.set_exception(self._stop_interrupted(path))
        # A drained stop stays in `_stopping`: the restart restores its savepoint, commits and
        # finishes (`_ends_at_restore`), and the stop resolves when the job is FINISHED.
        # The cause itself is shown once: in the restart's warning, or in the job's error.
        log.info("job '%s' attempt %d failed (%s%s); stopping it", self.settings.job_name, self._attempt, reason,
                 f" in {task}" if task else "")
        self.recovery_log.append({"failed_at": time.time(), "cause": cause})
        if self._deploy_timer is not None:
            self._deploy_timer.cancel()
        self._set_status(JobStatus.FAILING)
        if self.coordinator is not None:
            self.coordinator.abort_pending_checkpoints(CheckpointFailureReason.JOB_FAILOVER)
        self.commit_gate.clear()   # the attempt's tasks are going; the restore re-sends the files
        for component in self._sinks.values():
            if hasattr(component, "on_failover"):
                component.on_failover()
        self._stop_attempt()
        if not self._spark_running:
            self._after_attempt_stopped()
        else:
            self._timers.call_later(SPARK_CANCEL_GRACE, lambda a=self._attempt: self._spark_job_overdue(a))


    def _spark_job_overdue(self, attempt: int) -> None:
        """The cancelled attempt's Spark job has not ended: stop waiting for it."""
        if attempt != self._attempt or not self._failing or not self._spark_running:
            return
        try:
            active = self._bridge.active_jobs()
        except Exception as exc:  # only for the log line; the decision does not depend on it
            active = f"unknown ({exc!r})"
        log.warning("the Spark job of attempt %d did not end %.0f s after it was cancelled (active Spark jobs: "
                    "%s); cancelling it again and going on without it", attempt, SPARK_CANCEL_GRACE, active)
        self._cancel_spark()
        self._abandoned_spark_jobs.add(attempt)
        self._spark_running = False
        self._after_attempt_stopped()

    def _stop_attempt(self) -> None:
        if self._stop_in_place():
            return
        self._send_all({"type": "cancel"})
        self._cancel_spark()

    def _cancel_spark(self) -> None:
        if self._spark_running and self._bridge is not None:
            try:
                self._bridge.cancel(self._spark_group)
            except Exception:  # the session may already be stopping; the job ends either way
                log.debug("cancelling Spark job group %s failed", self._spark_group, exc_info=True)


    def _schedule_restart(self, delay: float) -> None:
        self._restart_timer = self._timers.call_later(delay, self._deploy)


    def _cancel(self) -> None:
        if self.status.is_terminal:
            return
        self._cancel_requested = True
        self._attempts.retire(self._attempt)
        if self._failing:
            return  # _after_attempt_stopped finalizes as CANCELED
        if self._restart_timer is not None:  # RESTARTING: nothing runs, nothing will be deployed
            self._restart_timer.cancel()
            self._restart_timer = None
            self._attempts.cancel_deploy()
            self._finalize(JobStatus.CANCELED)
            return
        self._set_status(JobStatus.CANCELLING)
        self._stop_attempt()
        if not self._spark_running:
            self._finalize(JobStatus.CANCELED)
        else:
            self._timers.call_later(SPARK_CANCEL_GRACE, lambda a=self._attempt: self._cancel_overdue(a))

    def _cancel_overdue(self, attempt: int) -> None:
        if self.status.is_terminal or not self._spark_running or attempt != self._attempt:
            return
        log.warning("the Spark job of attempt %d did not end %.0f s after the job was cancelled; "
                    "cancelling it again and reporting the job CANCELED", attempt, SPARK_CANCEL_GRACE)
        self._cancel_spark()
        self._abandoned_spark_jobs.add(attempt)
        self._spark_running = False
        self._finalize(JobStatus.CANCELED)


    def _set_status(self, status: JobStatus) -> None:
        if status is self.status:
            return
        log.info("job '%s' %s -> %s", self.settings.job_name, self.status.value, status.value)
        self.status = status
        if self.coordinator is not None:
            self.coordinator.job_status_changed(status)

    def _finalize(self, status: JobStatus, error: BaseException | None = None) -> None:
        self._release_slots()
        if status is JobStatus.FINISHED:   # the sinks' last commits; a failed one fails the job
            latest = self.coordinator.completed_store.latest() if self.coordinator is not None else None
            failed = self.commit_gate.finish(self.coordinator is not None,
                                             latest and filesystem.user_path(latest.external_pointer))
            if failed is not None:
                self.exceptions.root(self._attempt, failed, "SINK_COMMIT_FAILED")
                status, error = JobStatus.FAILED, JobExecutionError(
                    failed, job_name=self.settings.job_name, cause=failed, reason="SINK_COMMIT_FAILED",
                    history=self.exceptions.entries())
        self._set_status(status)
        stats = None
        if self.coordinator is not None:
            stats = self.coordinator.stats.snapshot()
            self.coordinator.shutdown(status)
            # How it ended, for `streamsnap ui DIR` (web/job_summary.py).
            write_summary(self.coordinator.storage.job_directory, summary_of(self, status.value, stats))
        if self._stopping is not None:
            path, stop, _ = self._stopping
            self._stopping = None
            if status is JobStatus.FINISHED:
                stop.set_result(path)
            else:
                stop.set_exception(StreamsnapError(f"the job ended {status.value} after the stop-with-savepoint's "
                                                   f"savepoint completed at {path}"))
        if status is JobStatus.FINISHED:
            self._result = self._build_result(stats)
        elif error is None:
            error = JobExecutionError(f"job '{self.settings.job_name}' was cancelled",
                                      job_name=self.settings.job_name, reason="CANCELED")
        self._error = error
        self._cleanup()
        self._on_finalized(status)
        for listener in self._end_listeners:
            try:
                listener(status)
            except Exception:   # one listener's failure must not keep the job from ending
                log.exception("job '%s': an end-of-job listener (%r) failed", self.settings.job_name, listener)
        self._done.set()

    def on_end(self, listener: Callable[[JobStatus], None]) -> None:
        """Call `listener(status)` as the job ends, before `wait()` returns: whoever put something
        beside the job (the web endpoint's announcement) withdraws it before the caller looks."""
        self._end_listeners.append(listener)

    def _on_finalized(self, status: JobStatus) -> None:
        """The job has ended and cleaned up; in_cluster.py records it in the registry."""

    def _cleanup(self) -> None:
        if self._checkpoint_io is not None:
            self._checkpoint_io.shutdown(wait=True)  # the last deletions (retention, sweep) finish
        for component in self._sinks.values():
            if callable(getattr(component, "stop_worker", None)):
                component.stop_worker()   # a lakehouse committer's: a commit in flight finishes
        self._server.close()
        for attempt, thread in self._spark_threads.items():
            if attempt not in self._abandoned_spark_jobs:
                thread.join(30)
        self._release_local_state()


def new_deployment(job_id: str, run_id: str, settings: JobSettings, eg: ExecutionGraph, secret: bytes, slots,
                   local: bool, attempt: int = -1, driver_address: tuple = ("", 0), plan=None,
                   finish_at_restore: bool = False, supervised_slots: bool = False) -> Deployment:
    """The Deployment of one attempt (`plan`: what it restores, None for a fresh start); with the
    defaults, the template a JobMaster in the cluster completes per attempt (in_cluster.py)."""
    return Deployment(
        job_id=job_id, run_id=run_id, job_name=settings.job_name, attempt=attempt,
        execution_graph=eg, secret=secret, driver_address=driver_address,
        bind_host=settings.network.bind_host or ("127.0.0.1" if local else ""),
        network=settings.network, state_backend=settings.state_backend,
        checkpointing=settings.checkpoint is not None,
        exactly_once=settings.checkpoint is None or settings.checkpoint.exactly_once,
        unaligned_checkpoints=settings.checkpoint is not None and settings.checkpoint.unaligned,
        restore=plan.states if plan else {}, restore_base=plan.base_location if plan else None,
        restored_operators=plan.restored_operators if plan else frozenset(),
        restored_checkpoint_id=plan.checkpoint_id if plan else None, finish_at_restore=finish_at_restore,
        log_level=settings.log_level, echo_logs=not local, test_hooks=settings.test_hooks,
        storage_options=_storage_options(settings), local_recovery=settings.local_recovery,
        local_recovery_dir=settings.local_recovery_dir, slots=slots,
        allow_non_restored_state=settings.allow_non_restored_state, supervised_slots=supervised_slots)


def _storage_options(settings: JobSettings) -> tuple:
    """(directory, storage options) of the job's checkpoint storage, for its executors."""
    config = settings.checkpoint
    if config is None or not config.storage_options:
        return ()
    return ((config.directory, dict(config.storage_options)),)


def _chain(source: concurrent.futures.Future, target: concurrent.futures.Future, transform) -> None:
    def done(f):
        if f.exception() is not None:
            target.set_exception(f.exception())
        else:
            target.set_result(transform(f.result()))
    source.add_done_callback(done)


