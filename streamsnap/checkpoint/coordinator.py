"""The checkpoint coordinator: the driver-side state machine of the checkpoint protocol.

It decides when to checkpoint (periodic trigger, request decider), tells the source tasks to
inject barriers, collects acknowledgements into pending checkpoints, completes them (writes
`_metadata`, retains them, tells every task to commit) or aborts them (deletes their state,
tells every task to abort), counts failures against `tolerable_failures`, keeps statistics and
picks the checkpoint to restore from. See ARCHITECTURE.md, "The checkpoint lifecycle".

Sans-I/O: it is fed calls (status changes, task messages) and timer callbacks from the
injected scheduler, and talks to tasks only through a `CheckpointTaskGateway`. It is not
thread-safe: the JobMaster calls it from one thread (its event loop). Callbacks it makes
(`fail_job`, the gateway, listeners) may call back into it.
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Callable, Iterable, Mapping, Protocol

from streamsnap.api.config import CheckpointConfig
from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.completed import (CheckpointProperties, CompletedCheckpoint, CompletedCheckpointStore,
                                         retained_on_shutdown)
from streamsnap.checkpoint.failure_manager import CheckpointFailureManager
from streamsnap.checkpoint.id_counter import CheckpointIdCounter
from streamsnap.checkpoint.messages import AcknowledgeCheckpoint, DeclineCheckpoint
from streamsnap.checkpoint.io import CheckpointIO, InlineIO
from streamsnap.checkpoint.job_end import JobEnd, read_job_end, write_job_end
from streamsnap.checkpoint.metadata import (damaged_changelog_segments, missing_incremental_files, read_metadata,
                                            write_metadata)
from streamsnap.checkpoint.pending import OperatorInfo, PendingCheckpoint, discard_subtask_state
from streamsnap.checkpoint.reasons import AcknowledgeResult, CheckpointException, CheckpointFailureReason as R
from streamsnap.checkpoint.restore_point import (RestorePoint, delete_restore_point, read_restore_point,
                                                 restore_point_url, write_restore_point)
from streamsnap.checkpoint.request_decider import (DEFAULT_MAX_QUEUED, CheckpointRequestDecider,
                                                   CheckpointTriggerRequest, TriggerDecision)
from streamsnap.checkpoint.shared_registry import SharedStateRegistry
from streamsnap.checkpoint.stats import CheckpointStatsTracker
from streamsnap.checkpoint.storage import (METADATA_FILE_NAME, CheckpointStorage, CheckpointStorageLocation,
                                           resolve_restore_path)
from streamsnap.clock import Cancellable, Scheduler
from streamsnap.cluster.status import ExecutionState, JobStatus
from streamsnap.errors import RestoreError
from streamsnap.graph.ids import ExecutionAttemptId
from streamsnap.runtime.events import CheckpointOptions, CheckpointType

logger = logging.getLogger(__name__)

# How many finished checkpoint ids are remembered to recognise late acknowledgements.
NUM_RECENT_CHECKPOINTS = 16


class CheckpointTaskGateway(Protocol):
    """How the coordinator reaches tasks; implemented by the JobMaster over the control RPC."""

    def trigger_checkpoint(self, attempt: ExecutionAttemptId, checkpoint_id: int, timestamp: float,
                           options: CheckpointOptions) -> None: ...

    def notify_checkpoint_complete(self, attempt: ExecutionAttemptId, checkpoint_id: int,
                                   timestamp: float) -> None: ...

    def notify_checkpoint_aborted(self, attempt: ExecutionAttemptId, checkpoint_id: int) -> None: ...


class CheckpointListener(Protocol):
    """A driver-side participant of the checkpoint, e.g. the committer of a collect sink."""

    def notify_checkpoint_complete(self, checkpoint: CompletedCheckpoint) -> None: ...

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None: ...


class CheckpointListenerError(Exception):
    """A driver-side checkpoint listener raised when told of a completed or aborted checkpoint:
    handed to `fail_job` (a global failover), never only logged."""

    reason = "CHECKPOINT_LISTENER_FAILURE"   # how the job's exception history names it


@dataclass(frozen=True)
class _Finished:
    """A recently finished checkpoint, to recognise (and clean up after) late acknowledgements."""

    location: CheckpointStorageLocation
    completed: bool


class CheckpointCoordinator:
    def __init__(self, job_id: str, config: CheckpointConfig, storage: CheckpointStorage,
                 scheduler: Scheduler, gateway: CheckpointTaskGateway,
                 fail_job: Callable[[Exception], None], *,
                 id_counter: CheckpointIdCounter | None = None,
                 completed_store: CompletedCheckpointStore | None = None,
                 stats: CheckpointStatsTracker | None = None,
                 rng: random.Random | None = None,
                 max_queued_requests: int = DEFAULT_MAX_QUEUED,
                 io: CheckpointIO | None = None, fence: Callable[[], None] | None = None):
        self.job_id = job_id
        # Raises if a newer JobMaster leads the job (cluster/registry.py): checked on the I/O
        # side right before `_metadata` is written, so a fenced leader completes nothing and
        # never tells a sink to commit.
        self._fence = fence
        self.config = config
        self.storage = storage
        self._scheduler = scheduler
        self._gateway = gateway
        self._rng = rng or random.Random()
        self._io = io or InlineIO()  # _metadata writes and deletions; see checkpoint/io.py
        self._id_counter = id_counter or CheckpointIdCounter(storage.id_counter_url)
        existing = storage.existing_checkpoint_ids()
        if existing:
            # Never reuse the id of a directory already there, even if the counter was lost.
            self._id_counter.set_count(existing[-1] + 1)
        self._store = completed_store or CompletedCheckpointStore(
            config.num_retained, SharedStateRegistry(owned_directory=storage.job_directory, delete=self._io.delete),
            delete=self._io.delete)
        self._stats = stats or CheckpointStatsTracker()
        self._fail_job = fail_job
        self._failure_manager = CheckpointFailureManager(config.tolerable_failures, fail_job)
        self._decider = CheckpointRequestDecider(config.max_concurrent, config.min_pause, scheduler,
                                                 max_queued_requests)
        # Checkpointing more often than the minimum pause allows makes no sense.
        self._base_interval = None if config.interval is None else max(config.interval, config.min_pause)

        self._trigger_attempts: tuple[ExecutionAttemptId, ...] = ()
        self._ack_attempts: tuple[ExecutionAttemptId, ...] = ()
        self._commit_attempts: tuple[ExecutionAttemptId, ...] = ()
        self._operators: dict[str, OperatorInfo] = {}
        self._job_graph: Mapping | None = None
        self._task_states: dict[ExecutionAttemptId, ExecutionState] = {}

        self._pending: dict[int, PendingCheckpoint] = {}
        self._futures: dict[int, Future] = {}
        self._timeouts: dict[int, Cancellable] = {}
        self._recent: OrderedDict[int, _Finished] = OrderedDict()
        self._listeners: list[CheckpointListener] = []
        self._last_completion: float | None = None
        self._triggering = False
        self._periodic = False
        self._periodic_timer: Cancellable | None = None
        self._periodic_due = 0.0
        self._job_running = False
        self._shutdown = False

    # ------------------------------------------------------------------ introspection

    @property
    def stats(self) -> CheckpointStatsTracker:
        return self._stats

    @property
    def completed_store(self) -> CompletedCheckpointStore:
        return self._store

    @property
    def id_counter(self) -> CheckpointIdCounter:
        return self._id_counter

    @property
    def failure_manager(self) -> CheckpointFailureManager:
        return self._failure_manager

    @property
    def pending_checkpoint_ids(self) -> list[int]:
        return sorted(self._pending)

    def pending_checkpoint(self, checkpoint_id: int) -> PendingCheckpoint | None:
        return self._pending.get(checkpoint_id)

    @property
    def num_queued_requests(self) -> int:
        return len(self._decider)

    @property
    def is_periodic_scheduling(self) -> bool:
        return self._periodic

    @property
    def is_shutdown(self) -> bool:
        return self._shutdown

    # ------------------------------------------------------------------ deployment and status

    def describe_job(self, job_graph: Mapping) -> None:
        """The job's vertices and operators (names, parallelism, inputs) as plain values, kept in
        each checkpoint's `_metadata` so `streamsnap ui DIR` can draw the job graph later."""
        self._job_graph = job_graph

    def set_execution_attempts(self, trigger: Iterable[ExecutionAttemptId], ack: Iterable[ExecutionAttemptId],
                               commit: Iterable[ExecutionAttemptId], operators: Mapping[str, OperatorInfo]) -> None:
        """Tell the coordinator the tasks of a (re)deployment.

        trigger: the source tasks, told to start a checkpoint. ack: every task, each must
        acknowledge. commit: tasks told when a checkpoint completed. operators: every operator
        uid with the vertex it is chained into. New attempts count as not RUNNING until
        `execution_state_changed` says so. Pending checkpoints still waiting for an attempt
        that is gone can never complete and are aborted (JOB_FAILOVER).
        """
        trigger, ack, commit = tuple(trigger), tuple(ack), tuple(commit)
        operators = dict(operators)
        ack_vertices = {a.vertex_id for a in ack}
        missing = sorted({info.vertex_id for info in operators.values()} - ack_vertices)
        if missing:
            raise ValueError(f"operators are chained into vertices {missing} that have no task to "
                             f"acknowledge checkpoints; pass every task of the job in `ack`")
        self._trigger_attempts, self._ack_attempts, self._commit_attempts = trigger, ack, commit
        self._operators = operators
        self._task_states = {a: self._task_states.get(a, ExecutionState.CREATED)
                             for a in (*trigger, *ack, *commit)}
        current = set(ack)
        for pending in list(self._pending.values()):
            gone = [a for a in pending.not_yet_acknowledged if a not in current]
            if gone:
                self._abort(pending, CheckpointException(
                    R.JOB_FAILOVER, f"the job was redeployed; {gone[0]} will never acknowledge",
                    pending.checkpoint_id), run_queued=False)
        self._run_queued()

    def execution_state_changed(self, attempt: ExecutionAttemptId, state: ExecutionState) -> None:
        """A task changed state. A task that failed or finished will not acknowledge pending
        checkpoints that still wait for it, so those are aborted right away."""
        if attempt not in self._task_states:
            return  # an attempt of an earlier deployment
        self._task_states[attempt] = state
        if state in (ExecutionState.FAILED, ExecutionState.CANCELED, ExecutionState.FINISHED):
            reason = R.CHECKPOINT_DECLINED_TASK_CLOSING if state is ExecutionState.FINISHED else R.TASK_FAILURE
            for pending in list(self._pending.values()):
                if pending.waits_for(attempt):
                    self._abort(pending, CheckpointException(reason, f"{attempt} is {state.value}",
                                                             pending.checkpoint_id), run_queued=False)
            self._run_queued()

    def job_status_changed(self, status: JobStatus) -> None:
        """RUNNING starts the periodic trigger; any other status stops it and aborts what is in
        flight or queued (CHECKPOINT_COORDINATOR_SUSPEND), as its tasks are going away."""
        self._job_running = status is JobStatus.RUNNING
        if status is JobStatus.RUNNING:
            if self._shutdown:
                raise RuntimeError("the checkpoint coordinator is shut down; create a new one")
            if self._base_interval is not None:
                self._start_periodic()
        else:
            self._stop(CheckpointException(R.CHECKPOINT_COORDINATOR_SUSPEND, f"the job is {status.value}"))

    # ------------------------------------------------------------------ periodic trigger

    def stop_periodic_scheduler(self) -> None:
        """No more periodic triggers; checkpoints in flight and queued requests carry on.

        Used once every task's input has ended: the only checkpoint still wanted is the final one.
        """
        self._periodic = False
        self._cancel_periodic_timer()

    def _start_periodic(self) -> None:
        self._cancel_periodic_timer()
        self._periodic = True
        low, high = self.config.min_pause, self._base_interval
        initial_delay = low + self._rng.random() * (high - low)  # in [min_pause, interval)
        logger.info("job %s: periodic checkpoints every %.3f s, first in %.3f s", self.job_id, high, initial_delay)
        self._schedule_periodic(initial_delay)

    def _schedule_periodic(self, delay: float) -> None:
        self._cancel_periodic_timer()
        self._periodic_due = self._scheduler.monotonic() + delay
        self._periodic_timer = self._scheduler.call_later(delay, self._on_periodic_timer)

    def _on_periodic_timer(self) -> None:
        if not self._periodic:
            return
        now = self._scheduler.monotonic()
        due = self._periodic_due + self._base_interval
        if due <= now:  # the loop fell behind: skip the missed beats instead of bursting
            due = now + self._base_interval
        self._periodic_due = due
        self._periodic_timer = self._scheduler.call_later(due - now, self._on_periodic_timer)
        self.trigger_checkpoint(is_periodic=True)

    def _cancel_periodic_timer(self) -> None:
        if self._periodic_timer is not None:
            self._periodic_timer.cancel()
            self._periodic_timer = None

    def _stop(self, exception: CheckpointException) -> None:
        self._periodic = False
        self._cancel_periodic_timer()
        for request in self._decider.drain():
            self._fail_request(request, exception)
        for pending in list(self._pending.values()):
            self._abort(pending, CheckpointException(exception.reason, exception.detail, pending.checkpoint_id),
                        run_queued=False)

    # ------------------------------------------------------------------ triggering

    def trigger_checkpoint(self, is_periodic: bool = False) -> "Future[CompletedCheckpoint]":
        """Request a checkpoint; the future completes with it or fails with a CheckpointException."""
        return self._submit(CheckpointTriggerRequest(CheckpointProperties.for_checkpoint(is_periodic)))

    def trigger_savepoint(self, target_directory: str, terminate: bool = False,
                          drain: bool = False) -> "Future[CompletedCheckpoint]":
        """Request a savepoint into a new directory under `target_directory`.

        It goes ahead of waiting checkpoints and ignores max_concurrent and min_pause. With
        `terminate` (stop-with-savepoint) the tasks are told to commit when it completes and
        then finish; a plain savepoint commits nothing. `drain` marks a stop-with-savepoint
        whose sources end event time first: the job may never run past it.
        """
        if not target_directory:
            raise ValueError("trigger_savepoint needs a target directory (a path or fsspec URL)")
        request = CheckpointTriggerRequest(CheckpointProperties.for_savepoint(terminate, drain),
                                           target_directory=target_directory)
        if terminate and self._periodic:
            # The job is about to stop: no new periodic checkpoints, unless stopping fails.
            self._periodic = False
            self._cancel_periodic_timer()
            request.future.add_done_callback(self._resume_periodic_if_failed)
        return self._submit(request)

    def _resume_periodic_if_failed(self, future: Future) -> None:
        if future.cancelled():
            return
        if future.exception() is not None and not self._shutdown and not self._periodic \
                and self._base_interval is not None and self._job_running:
            logger.info("stop-with-savepoint failed; resuming periodic checkpoints")
            self._start_periodic()

    def _submit(self, request: CheckpointTriggerRequest) -> Future:
        if self._shutdown:
            self._fail_request(request, CheckpointException(R.CHECKPOINT_COORDINATOR_SHUTDOWN))
            return request.future
        decision = self._decider.choose_request_to_execute(
            request, is_triggering=self._triggering, num_pending=len(self._pending),
            last_completion=self._last_completion)
        if self._apply(decision):
            self._run_queued()
        return request.future

    def _run_queued(self) -> None:
        """Start waiting requests for as long as the decider lets them run."""
        while not self._triggering and not self._shutdown:
            decision = self._decider.choose_queued_request(
                is_triggering=self._triggering, num_pending=len(self._pending),
                last_completion=self._last_completion)
            if not self._apply(decision):
                break

    def _apply(self, decision: TriggerDecision) -> bool:
        """Carry out a decision; True if a request was started."""
        for rejection in decision.rejected:
            self._fail_request(rejection.request, CheckpointException(rejection.reason))
        if decision.retry_after is not None and self._periodic:
            logger.debug("periodic checkpoint postponed by %.3f s (min_pause)", decision.retry_after)
            self._schedule_periodic(decision.retry_after)
        if decision.execute is None:
            return False
        self._triggering = True
        try:
            self._trigger(decision.execute)
        finally:
            self._triggering = False
        return True

    def _pre_check(self, request: CheckpointTriggerRequest) -> None:
        if self._shutdown:
            raise CheckpointException(R.CHECKPOINT_COORDINATOR_SHUTDOWN)
        if request.is_periodic and not self._periodic:
            raise CheckpointException(R.PERIODIC_SCHEDULER_SHUTDOWN)
        if not self._ack_attempts:
            raise CheckpointException(R.NOT_ALL_REQUIRED_TASKS_RUNNING, "no tasks are deployed")
        not_running = [a for a in dict.fromkeys((*self._trigger_attempts, *self._ack_attempts))
                       if self._task_states.get(a) is not ExecutionState.RUNNING]
        if not_running:
            shown = ", ".join(f"{a} ({self._task_states.get(a, ExecutionState.CREATED).value})"
                              for a in not_running[:5])
            more = f" and {len(not_running) - 5} more" if len(not_running) > 5 else ""
            raise CheckpointException(R.NOT_ALL_REQUIRED_TASKS_RUNNING, f"not RUNNING: {shown}{more}")

    def _trigger(self, request: CheckpointTriggerRequest) -> None:
        try:
            self._pre_check(request)
        except CheckpointException as exc:
            self._fail_request(request, exc)
            return
        props = request.properties
        timestamp = self._scheduler.wall()
        checkpoint_id = None
        try:
            checkpoint_id = self._id_counter.get_and_increment()
            if props.is_savepoint:
                location = self.storage.initialize_savepoint_location(request.target_directory, checkpoint_id,
                                                                      self._rng)
            else:
                location = self.storage.initialize_location(checkpoint_id)
        except Exception as exc:  # storage backends raise more than OSError
            reason = R.IO_EXCEPTION if isinstance(exc, OSError) else R.TRIGGER_CHECKPOINT_FAILURE
            self._fail_request(request, CheckpointException(
                reason, f"could not prepare the checkpoint location: {exc!r}", checkpoint_id), checkpoint_id)
            return
        unaligned = self.config.unaligned and not props.is_savepoint
        options = CheckpointOptions(props.checkpoint_type, location.url, self.config.exactly_once, unaligned,
                                    self.config.aligned_timeout if unaligned else None)
        pending = PendingCheckpoint(self.job_id, checkpoint_id, timestamp, props, options, location,
                                    self._ack_attempts, self._operators, self._store.registry, self._io.delete,
                                    self._job_graph)
        self._pending[checkpoint_id] = pending
        self._futures[checkpoint_id] = request.future
        self._stats.report_pending(checkpoint_id, timestamp, props.checkpoint_type, pending.num_tasks)
        self._timeouts[checkpoint_id] = self._scheduler.call_later(
            self.config.timeout, partial(self._on_timeout, checkpoint_id))
        logger.info("triggering %s %d for job %s at %s", props.checkpoint_type.value, checkpoint_id,
                    self.job_id, location.url)
        for attempt in self._trigger_attempts:
            try:
                self._gateway.trigger_checkpoint(attempt, checkpoint_id, timestamp, options)
            except Exception as exc:  # the RPC layer may raise anything; the checkpoint cannot go on
                if checkpoint_id in self._pending:
                    self._abort(pending, CheckpointException(
                        R.TRIGGER_CHECKPOINT_FAILURE, f"could not tell {attempt} to start it: {exc!r}",
                        checkpoint_id), run_queued=False)
                return

    def _on_timeout(self, checkpoint_id: int) -> None:
        pending = self._pending.get(checkpoint_id)
        if pending is None:
            return
        self._timeouts.pop(checkpoint_id, None)
        waiting = sorted(map(str, pending.not_yet_acknowledged))
        shown = ", ".join(waiting[:5]) + (f" and {len(waiting) - 5} more" if len(waiting) > 5 else "")
        self._abort(pending, CheckpointException(
            R.CHECKPOINT_EXPIRED, f"not complete after {self.config.timeout:g} s "
                                  f"(CheckpointConfig.timeout); still waiting for {shown}", checkpoint_id))

    # ------------------------------------------------------------------ task messages

    def receive_acknowledge(self, ack: AcknowledgeCheckpoint) -> AcknowledgeResult | None:
        """A task finished its part of a checkpoint.

        Returns what the pending checkpoint made of it; DISCARDED for a checkpoint that recently
        completed or was aborted, None for an id this coordinator does not know. State that
        does not become part of a checkpoint (unknown attempt, late, unknown id) is deleted so
        nothing lingers; files a retained checkpoint references are never touched.
        """
        checkpoint_id = ack.checkpoint_id
        pending = self._pending.get(checkpoint_id)
        if pending is None:
            finished = self._recent.get(checkpoint_id)
            if finished is not None:
                logger.info("late acknowledgement of finished checkpoint %d from %s; deleting its state",
                               checkpoint_id, ack.attempt)
                base = finished.location.url
            else:
                logger.debug("acknowledgement of unknown checkpoint %d from %s; deleting its state",
                             checkpoint_id, ack.attempt)
                # Long forgotten (a savepoint lives elsewhere): the task says where it wrote.
                base = (ack.location if ack.location and self.storage.is_location_of(ack.location, checkpoint_id)
                        else self.storage.checkpoint_directory(checkpoint_id))
            self._discard_stray_state(ack, base)
            if not (finished is not None and finished.completed):
                self._io.run(partial(_delete_unless_completed, base), _log_io_failure)  # re-created by the late writer
            return AcknowledgeResult.DISCARDED if finished is not None else None

        timestamp = self._scheduler.wall()
        result = pending.acknowledge_task(ack, timestamp)
        if result is AcknowledgeResult.SUCCESS:
            acknowledged = pending.acknowledgements[ack.attempt]
            self._stats.report_subtask(checkpoint_id, ack.attempt, timestamp, acknowledged.state_size,
                                       ack.metrics, acknowledged.checkpointed_size)
            if pending.missing_shared_state:
                self._abort(pending, CheckpointException(
                    R.SHARED_STATE_DISCARDED, f"{ack.attempt} reuses {pending.missing_shared_state[0]}",
                    checkpoint_id))
            elif pending.is_fully_acknowledged:
                self._complete(pending)
        elif result is AcknowledgeResult.DUPLICATE:
            logger.debug("duplicate acknowledgement of checkpoint %d from %s", checkpoint_id, ack.attempt)
        else:
            logger.warning("acknowledgement of checkpoint %d from %s: %s; deleting its state", checkpoint_id,
                           ack.attempt, "unknown task attempt" if result is AcknowledgeResult.UNKNOWN
                           else "checkpoint already discarded")
            self._discard_stray_state(ack, pending.location.url)
        return result

    def receive_decline(self, decline: DeclineCheckpoint) -> None:
        """A task could not take its part of a checkpoint: abort the checkpoint with its reason."""
        pending = self._pending.get(decline.checkpoint_id)
        if pending is None:
            logger.debug("decline of unknown or finished checkpoint %d from %s ignored",
                         decline.checkpoint_id, decline.attempt)
            return
        if not pending.involves(decline.attempt):
            logger.warning("decline of checkpoint %d from %s ignored: not a task of this checkpoint",
                           decline.checkpoint_id, decline.attempt)
            return
        detail = f"declined by {decline.attempt}" + (f": {decline.detail}" if decline.detail else "")
        self._abort(pending, CheckpointException(decline.reason, detail, decline.checkpoint_id))

    def _keep_predicate(self, location_url: str) -> Callable[[str], bool]:
        """Files that must survive discarding state: anything a retained checkpoint references,
        task-owned files, and anything outside this job's directory and the checkpoint's own."""
        referenced = self._store.referenced_files()
        owned = (self.storage.job_directory.rstrip("/") + "/", filesystem.normalize(location_url).rstrip("/") + "/")
        task_owned = self.storage.task_owned_directory.rstrip("/") + "/"

        def keep(url: str) -> bool:
            url = filesystem.normalize(url)
            return url in referenced or url.startswith(task_owned) or not url.startswith(owned)

        return keep

    def _discard_stray_state(self, ack: AcknowledgeCheckpoint, base_url: str) -> None:
        keep = self._keep_predicate(base_url)
        for state in ack.subtask_state.values():
            discard_subtask_state(state, base_url, registry=self._store.registry, keep=keep, delete=self._io.delete)

    # ------------------------------------------------------------------ completion and abort

    def _complete(self, pending: PendingCheckpoint) -> None:
        """Fully acknowledged: write `_metadata` on the I/O side, then `_on_finalized` here.

        A stop-with-savepoint becomes the job's failover point outside the job directory, so its
        completion also records it there (`restore_point.py`) before anything it subsumes is
        deleted: a new run of the job must find it. Either write failing fails the savepoint."""
        metadata = pending.prepare_metadata(self._scheduler.wall())
        work = partial(write_metadata, pending.location.url, metadata)
        if self._fence is not None:
            work = partial(_write_both, self._fence, work)
        if pending.properties.is_terminating:
            point = RestorePoint(pending.checkpoint_id, pending.location.url, pending.properties.checkpoint_type,
                                 pending.properties.drain, metadata.completion_timestamp)
            work = partial(_write_both, work, partial(write_restore_point, self.storage.job_directory, point))
        self._io.run(work, partial(self._on_finalized, pending, metadata))

    def _on_finalized(self, pending: PendingCheckpoint, metadata, _result, error: BaseException | None) -> None:
        checkpoint_id, props = pending.checkpoint_id, pending.properties
        if pending.is_disposed:
            # Aborted (expired, subsumed, failover, shutdown) while `_metadata` was written; the
            # abort's deletion of its directory was queued behind the write, so nothing stays.
            logger.debug("checkpoint %d was aborted while its _metadata was written", checkpoint_id)
            return
        if error is not None:  # any failure to write _metadata makes the checkpoint unusable
            logger.warning("could not finalize checkpoint %d: %r", checkpoint_id, error)
            self._abort(pending, CheckpointException(
                R.FINALIZE_CHECKPOINT_FAILURE, f"writing {pending.location.metadata_url} failed: {error!r}",
                checkpoint_id))
            return
        completed = pending.mark_completed(metadata)
        if props.is_terminating:
            # The sinks commit on this savepoint, so it must be the failover point until the job
            # finishes: a restore from an older checkpoint would replay committed output
            # (FLINK-26783). The savepoint stays the user's: the store never deletes it.
            completed = CompletedCheckpoint(completed.metadata, completed.location, props.as_failover_point())
        if not props.is_savepoint or props.is_terminating:
            try:
                self._store.add_checkpoint(completed)
            except Exception as exc:
                logger.warning("could not retain checkpoint %d: %r", checkpoint_id, exc)
                self._io.delete(completed.location.url, recursive=True)
                self._after_failure(pending, CheckpointException(
                    R.FINALIZE_CHECKPOINT_FAILURE, f"could not be retained: {exc!r}", checkpoint_id), run_queued=True)
                return
        self._forget(checkpoint_id, _Finished(completed.location, completed=True))
        self._last_completion = self._scheduler.monotonic()
        if not props.is_savepoint:
            for older in [p for p in self._pending.values() if p.checkpoint_id < checkpoint_id
                          and not p.properties.is_savepoint]:
                self._abort(older, CheckpointException(
                    R.CHECKPOINT_SUBSUMED, f"checkpoint {checkpoint_id} completed first", older.checkpoint_id),
                    run_queued=False)
        self._failure_manager.handle_checkpoint_success(checkpoint_id)  # savepoints too, as in Flink
        self._stats.report_completed(checkpoint_id, completed.completion_timestamp, completed.state_size,
                                     completed.external_pointer, completed.checkpointed_size)
        logger.info("completed %s %d for job %s (%d bytes in %.3f s) at %s", props.checkpoint_type.value,
                    checkpoint_id, self.job_id, completed.state_size, completed.duration, completed.external_pointer)
        if not props.is_savepoint or props.is_terminating:
            # A plain savepoint is a copy for the user: committing side effects on it would
            # publish output that a restore from the latest checkpoint replays again.
            for attempt in self._commit_attempts:
                self._call("notify_checkpoint_complete", self._gateway.notify_checkpoint_complete,
                           attempt, checkpoint_id, completed.timestamp)
            self._notify_listeners("notify_checkpoint_complete", checkpoint_id, completed)
        self._run_queued()
        _resolve(self._futures.pop(checkpoint_id, None), result=completed)

    def _abort(self, pending: PendingCheckpoint, exception: CheckpointException, run_queued: bool = True) -> None:
        if pending.is_disposed:
            return
        pending.abort(exception.reason, keep=self._keep_predicate(pending.location.url))
        self._after_failure(pending, exception, run_queued)

    def _after_failure(self, pending: PendingCheckpoint, exception: CheckpointException, run_queued: bool) -> None:
        checkpoint_id = pending.checkpoint_id
        self._forget(checkpoint_id, _Finished(pending.location, completed=False))
        self._stats.report_failed(checkpoint_id, self._scheduler.wall(), exception.reason, exception.detail)
        log = logger.warning if self._failure_manager.counts_toward_tolerance(exception.reason) else logger.info
        log("%s %d of job %s aborted: %s", pending.properties.checkpoint_type.value, checkpoint_id,
            self.job_id, exception)
        self._failure_manager.handle_checkpoint_failure(exception, checkpoint_id,
                                                        is_savepoint=pending.properties.is_savepoint)
        for attempt in dict.fromkeys((*self._ack_attempts, *self._commit_attempts)):
            self._call("notify_checkpoint_aborted", self._gateway.notify_checkpoint_aborted, attempt, checkpoint_id)
        self._notify_listeners("notify_checkpoint_aborted", checkpoint_id, checkpoint_id)
        _resolve(self._futures.pop(checkpoint_id, None), exception=exception)
        if run_queued:
            self._run_queued()

    def _forget(self, checkpoint_id: int, finished: _Finished) -> None:
        """Remove a finished checkpoint from the pending ones, remembering it for late messages."""
        self._pending.pop(checkpoint_id, None)
        timer = self._timeouts.pop(checkpoint_id, None)
        if timer is not None:
            timer.cancel()
        self._recent[checkpoint_id] = finished
        while len(self._recent) > NUM_RECENT_CHECKPOINTS:
            self._recent.popitem(last=False)

    def _fail_request(self, request: CheckpointTriggerRequest, exception: CheckpointException,
                      checkpoint_id: int | None = None) -> None:
        """A request that never became a pending checkpoint."""
        log = logger.debug if exception.reason.pre_flight else logger.warning
        log("%s request not triggered: %s", request.properties.checkpoint_type.value, exception)
        if not exception.reason.pre_flight:
            self._stats.report_failed_without_in_progress(exception.reason)
        self._failure_manager.handle_checkpoint_failure(exception, checkpoint_id, is_savepoint=request.is_savepoint)
        _resolve(request.future, exception=exception)

    def _call(self, what: str, fn: Callable, *args) -> None:
        try:
            fn(*args)
        except Exception:  # one unreachable task must not stop the others; its failure is noticed apart
            logger.warning("%s to %s failed", what, args[0], exc_info=True)

    def _notify_listeners(self, what: str, checkpoint_id: int, argument) -> None:
        """Tell every driver-side listener (a sink's global committer); one that raises fails the
        job, as Flink's OperatorCoordinatorHolder turns a coordinator's notifyCheckpointComplete
        error into a global failover: its side effect (a table commit) did not happen, and only
        a restore does it again. The other listeners are still told."""
        for listener in list(self._listeners):
            try:
                getattr(listener, what)(argument)
            except Exception as exc:
                logger.error("%s of checkpoint %d failed in the checkpoint listener %r; failing the job",
                             what, checkpoint_id, listener, exc_info=True)
                error = CheckpointListenerError(
                    f"{what} of checkpoint {checkpoint_id} failed in the checkpoint listener {listener!r}: {exc!r}")
                error.__cause__ = exc
                self._fail_job(error)

    def abort_pending_checkpoints(self, reason: R) -> None:
        """Abort every pending checkpoint, e.g. with JOB_FAILOVER when the job fails over."""
        for pending in list(self._pending.values()):
            self._abort(pending, CheckpointException(reason, None, pending.checkpoint_id), run_queued=False)
        self._run_queued()

    def discard_abandoned_locations(self) -> None:
        """Delete checkpoint directories nobody will complete: what tasks of aborted checkpoints
        or of a cancelled attempt wrote after the abort. Called once an attempt's tasks are gone
        and at shutdown, so the job directory holds the retained and pending checkpoints only —
        and `shared/` only files a retained or pending checkpoint references (an incremental
        upload whose ack never came is swept; files written after this call are left alone)."""
        keep = set(self._pending)
        referenced = self._store.registry.registered_files()
        now = time.time()

        def sweep():
            for url in self.storage.abandoned_locations(keep):
                logger.info("deleting abandoned checkpoint directory %s", url)
                filesystem.delete(url, recursive=True)
            for url in self.storage.unreferenced_shared_files(referenced, now):
                logger.info("deleting unreferenced shared state file %s", url)
                filesystem.delete(url)
        self._io.run(sweep, _log_io_failure)

    # ------------------------------------------------------------------ listeners

    def add_listener(self, listener: CheckpointListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: CheckpointListener) -> None:
        self._listeners.remove(listener)

    # ------------------------------------------------------------------ restore

    def restore_latest_checkpoint(self) -> CompletedCheckpoint | None:
        """The newest retained checkpoint, read back, or None if none is retained.

        The sinks committed the newest checkpoint's output when it completed, so falling back to
        an older one would emit that output again. With exactly-once that is refused with a
        RestoreError that says how to go on; with at-least-once (repeats allowed) an unreadable
        newer checkpoint is skipped with a warning. The id counter moves past the restored id.
        Raises RestoreError too if checkpoints are retained but none is readable: silently
        starting from empty state would lose it.
        """
        candidates = self._store.all()
        problems = []
        for checkpoint in reversed(candidates):
            try:
                metadata = _read_completed(checkpoint.location, checkpoint.checkpoint_id)
            except RestoreError as exc:
                problems.append((checkpoint, str(exc)))
                if self.config.exactly_once:
                    continue  # looked at below: only to name the fallback in the error
                logger.warning("cannot restore checkpoint %d: %s; falling back to the previous retained "
                               "checkpoint (at-least-once: output committed since then repeats)",
                               checkpoint.checkpoint_id, exc)
                continue
            if problems and self.config.exactly_once:
                raise self._unsafe_fallback(problems, checkpoint)
            restored = CompletedCheckpoint(metadata, checkpoint.location, checkpoint.properties)
            self.restored_from(restored.checkpoint_id, restored.external_pointer, restored.checkpoint_type)
            return restored
        if candidates:
            raise RestoreError(
                f"none of the {len(candidates)} retained checkpoint(s) of job {self.job_id} can be read "
                f"({'; '.join(p for _, p in problems)}); restore from a savepoint explicitly "
                f"(restore_from=...), or raise CheckpointConfig.num_retained to keep more fallbacks")
        return None

    def _unsafe_fallback(self, problems: list, older: CompletedCheckpoint) -> RestoreError:
        newest, problem = problems[0]
        return RestoreError(
            f"the newest completed checkpoint {newest.checkpoint_id} of job {self.job_id} cannot be read "
            f"({problem}). Its output was already committed by the sinks, so restoring the older checkpoint "
            f"{older.checkpoint_id} would commit that output a second time, which exactly-once forbids. "
            f"To go on: restore {newest.location.metadata_url} from a backup and run the job again; or accept "
            f"repeated output and restore the older checkpoint explicitly with "
            f"restore_from={filesystem.user_path(older.external_pointer)!r} (streamsnap run --from ...)")

    @property
    def next_checkpoint_id(self) -> int:
        """The id the next triggered checkpoint gets."""
        return self._id_counter.current

    def recover_completed_checkpoints(self, min_id: int = 0) -> list[int]:
        """Load the completed checkpoints an earlier run of this job left in its directory (its
        driver died, or it failed or was cancelled with retention) into the store, so the next
        restore resumes from the newest (Flink's CompletedCheckpointStore.recover). Returns
        their ids; the store keeps `num_retained` of them and deletes the rest as subsumed.

        A `_metadata` that does not read back is skipped with a warning; `restore_latest_checkpoint`
        then decides as for any unreadable newest checkpoint (exactly-once refuses the fallback).
        `min_id`: ignore older ids — a new JobMaster of a run that did not resume (a fresh start,
        `restore_from`) recovers only what this run completed.
        """
        ids = []
        unreadable = []
        # The final checkpoint a FINISHED run kept (retain_on_finish) is state to read, not a
        # point to resume from: the job had finished. A new run starts fresh.
        end = read_job_end(self.storage.job_directory)
        kept = end.kept_checkpoint if end is not None and end.finished_with_state else -1
        if kept >= min_id:
            logger.info("job %s: checkpoint %d is the final checkpoint of a run that FINISHED; a new run does not "
                        "resume from it (restore_from=... does)", self.job_id, kept)
        floor = max(kept, min_id - 1)   # ids at or below it are not recovered
        for checkpoint_id in self.storage.existing_checkpoint_ids():
            if checkpoint_id <= floor:
                continue
            location = CheckpointStorageLocation(self.storage.checkpoint_directory(checkpoint_id), checkpoint_id)
            if not filesystem.exists(location.metadata_url):
                continue  # never completed: swept as abandoned
            try:
                metadata = _read_completed(location, checkpoint_id)
            except RestoreError as exc:
                unreadable.append((checkpoint_id, location, str(exc)))
                continue
            if any(c.checkpoint_id == checkpoint_id for c in self._store.all()):
                continue
            self._store.add_checkpoint(CompletedCheckpoint(metadata, location, CheckpointProperties.for_checkpoint()))
            ids.append(checkpoint_id)
        recorded = self._recover_restore_point(max((*ids, *(i for i, _, _ in unreadable), floor), default=-1))
        if recorded is not None:
            ids.append(recorded)
        newest_readable = max(ids, default=-1)
        for checkpoint_id, location, problem in unreadable:
            if checkpoint_id < newest_readable:
                logger.warning("ignoring unreadable older checkpoint %d at %s: %s", checkpoint_id, location.url,
                               problem)
                continue
            message = (f"the newest completed checkpoint {checkpoint_id} of job {self.job_id} cannot be read "
                       f"({problem})")
            if self.config.exactly_once:
                older = self._store.latest()
                raise RestoreError(
                    message + ". Its output was already committed by the sinks, so resuming from an older "
                    "checkpoint would commit that output a second time, which exactly-once forbids. To go on: "
                    f"restore {location.metadata_url} from a backup and run the job again"
                    + (f"; or accept repeated output and restore the older checkpoint explicitly with "
                       f"restore_from={filesystem.user_path(older.external_pointer)!r}" if older else "")
                    + "; or start fresh with CheckpointConfig(resume='never')")
            logger.warning("%s; resuming from an older one (at-least-once: output committed since then repeats)",
                           message)
        return sorted(c.checkpoint_id for c in self._store.all())

    def _recover_restore_point(self, newest_on_disk: int) -> int | None:
        """Load the savepoint `_restore_point` names (a completed stop-with-savepoint the job
        committed on) if no `chk-<n>` is newer; returns its id. Raises RestoreError if it cannot
        be read and exactly-once forbids falling back."""
        point = read_restore_point(self.storage.job_directory)
        if point is None or point.checkpoint_id <= newest_on_disk:
            return None  # none, or superseded by a newer checkpoint in the job directory
        location = CheckpointStorageLocation(point.path, point.checkpoint_id, point.checkpoint_type.is_savepoint)
        try:
            metadata = _read_completed(location, point.checkpoint_id)
        except RestoreError as exc:
            url = restore_point_url(self.storage.job_directory)
            message = (f"job {self.job_id} last committed its output on {point.checkpoint_type.value} "
                       f"{point.checkpoint_id} at {filesystem.user_path(point.path)} (recorded in {url}), "
                       f"which cannot be read: {exc}")
            if self.config.exactly_once:
                raise RestoreError(
                    message + ". Resuming from an older checkpoint would commit that output a second time, which "
                    "exactly-once forbids. To go on: restore that savepoint from a backup and run the job again; "
                    "or start fresh with CheckpointConfig(resume='never')") from None
            logger.warning("%s; resuming from an older checkpoint (at-least-once: output committed since "
                           "then repeats)", message)
            return None
        if any(c.checkpoint_id == point.checkpoint_id for c in self._store.all()):
            return point.checkpoint_id
        self._store.add_checkpoint(CompletedCheckpoint(
            metadata, location, CheckpointProperties.for_restored(point.checkpoint_type, point.drained)))
        return point.checkpoint_id

    def restore_from(self, path: str) -> CompletedCheckpoint:
        """Load a savepoint or retained checkpoint named by the user (`restore_from=` / `--from`).

        It becomes the failover point until the job completes a checkpoint of its own, but the
        job never deletes it: it belongs to the user.
        """
        metadata_url, base = resolve_restore_path(path)
        metadata = read_metadata(metadata_url)
        location = CheckpointStorageLocation(base, metadata.checkpoint_id, metadata.checkpoint_type.is_savepoint)
        restored = CompletedCheckpoint(metadata, location, CheckpointProperties.for_restored(metadata.checkpoint_type))
        if all(c.checkpoint_id != metadata.checkpoint_id for c in self._store.all()):
            self._store.add_checkpoint(restored)
        self.restored_from(restored.checkpoint_id, restored.external_pointer, restored.checkpoint_type)
        return restored

    def restored_from(self, checkpoint_id: int, external_pointer: str | None = None,
                      checkpoint_type: CheckpointType = CheckpointType.CHECKPOINT) -> None:
        """Record that the job restores from a snapshot loaded by the caller: new checkpoint
        ids continue after its id (its directory may be this job's), and the stats show it."""
        self._id_counter.set_count(checkpoint_id + 1)
        self._stats.report_restored(checkpoint_id, self._scheduler.wall(), external_pointer or "",
                                    checkpoint_type)
        logger.info("job %s restores from %s %d at %s", self.job_id, checkpoint_type.value, checkpoint_id,
                    external_pointer or "(location not given)")

    # ------------------------------------------------------------------ shutdown

    def shutdown(self, job_status: JobStatus) -> None:
        """Stop for good: abort what is pending or queued and apply the retention policy."""
        if self._shutdown:
            return
        self._shutdown = True
        self._stop(CheckpointException(R.CHECKPOINT_COORDINATOR_SHUTDOWN, f"the job is {job_status.value}"))
        latest = self._store.latest()
        kept = retained_on_shutdown(job_status, self.config.retention)
        self._store.shutdown(job_status, self.config.retention)
        if kept != "all":
            # Nothing to resume from any more: a new run starts fresh, as without the record.
            self._io.run(partial(delete_restore_point, self.storage.job_directory), _log_io_failure)
        if job_status in (JobStatus.FINISHED, JobStatus.CANCELED):
            # Why the checkpoints are gone (or which one a FINISHED job kept), for readers and new runs.
            end = JobEnd(job_status.value, self.config.retention,
                         latest.checkpoint_id if latest is not None and kept != "none" else None,
                         self._scheduler.wall())
            self._io.run(partial(write_job_end, self.storage.job_directory, end), _log_io_failure)
        self.discard_abandoned_locations()


def _read_completed(location: CheckpointStorageLocation, checkpoint_id: int):
    """Read a retained checkpoint back; a missing file of one of its incremental or changelog
    snapshots, or a damaged changelog segment, makes it unreadable like a damaged `_metadata`
    (the same fallback rules apply)."""
    metadata = read_metadata(location.metadata_url)
    if metadata.checkpoint_id != checkpoint_id:
        raise RestoreError(f"{location.metadata_url} holds checkpoint {metadata.checkpoint_id}, expected {checkpoint_id}")
    missing = missing_incremental_files(metadata, location.url)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise RestoreError(f"checkpoint {checkpoint_id} at {location.url} references the incremental state file "
                           f"{missing[0]}{more}, which is missing (deleted from the shared directory?)")
    damaged = damaged_changelog_segments(metadata, location.url)
    if damaged:
        more = f" and {len(damaged) - 1} more" if len(damaged) > 1 else ""
        raise RestoreError(f"checkpoint {checkpoint_id} at {location.url}: {damaged[0]}{more}")
    return metadata


def _write_both(first: Callable[[], object], second: Callable[[], object]) -> object:
    result = first()
    second()
    return result


def _delete_unless_completed(location_url: str) -> None:
    if not filesystem.exists(filesystem.join(location_url, METADATA_FILE_NAME)):
        filesystem.delete(location_url, recursive=True)


def _log_io_failure(_result, error: BaseException | None) -> None:
    if error is not None:
        logger.warning("checkpoint storage clean-up failed: %r; the files stay until deleted by hand", error)


def _resolve(future: Future | None, *, result=None, exception: BaseException | None = None) -> None:
    if future is None or future.done():
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)


__all__ = ["CheckpointCoordinator", "CheckpointTaskGateway", "CheckpointListener", "CheckpointListenerError",
           "OperatorInfo"]
