"""A checkpoint that was triggered and is collecting acknowledgements (Flink's PendingCheckpoint).

It knows up front which task attempts must acknowledge and which operators (uid → vertex,
parallelism, max parallelism) the job has, so the `_metadata` it finally writes lists every
operator, also those whose subtasks reported no state. It ends exactly once: finalized into a
CompletedCheckpoint, or aborted (its state files deleted). Acknowledgements arriving after
that are answered DISCARDED; the caller deletes their files.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.completed import CheckpointProperties, CompletedCheckpoint
from streamsnap.checkpoint.handles import (SHARED_STATE_HANDLES, ChangelogStateHandle, FileHandle,
                                           OperatorSubtaskState, TaskStateSnapshot)
from streamsnap.checkpoint.messages import AcknowledgeCheckpoint, CheckpointMetrics
from streamsnap.checkpoint.metadata import CheckpointMetadata, OperatorState, state_file_urls, write_metadata
from streamsnap.checkpoint.reasons import AcknowledgeResult, CheckpointFailureReason
from streamsnap.checkpoint.shared_registry import SharedStateRegistry
from streamsnap.checkpoint.storage import CheckpointStorageLocation
from streamsnap.graph.ids import ExecutionAttemptId
from streamsnap.runtime.events import CheckpointOptions

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperatorInfo:
    """An operator of the job as the checkpoint sees it: the vertex (task) it is chained into."""

    vertex_id: str
    parallelism: int
    max_parallelism: int


@dataclass(frozen=True)
class SubtaskAcknowledgement:
    attempt: ExecutionAttemptId
    ack_timestamp: float
    state_size: int
    metrics: CheckpointMetrics
    checkpointed_size: int = 0   # bytes this checkpoint wrote (state_size minus reused shared files)


class PendingStatus(enum.Enum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    ABORTED = "aborted"


def discard_subtask_state(state: OperatorSubtaskState, base_url: str, *,
                          registry: SharedStateRegistry | None = None,
                          keep: Callable[[str], bool] | None = None,
                          delete: Callable[[str], None] = filesystem.delete) -> list[str]:
    """Delete the files of a snapshot that will never be part of a completed checkpoint.

    Exclusive files go (unless `keep` protects them). Shared files go only when the registry
    proves no retained checkpoint references them: an incremental snapshot re-reports files
    uploaded for earlier checkpoints. Without a registry, shared files are left alone.
    `delete` may only schedule the deletion (the coordinator's I/O thread).
    """
    exclusive, shared = state_file_urls(state, base_url)
    doomed = list(exclusive)
    if registry is not None:
        doomed += [u for u in shared if not registry.is_registered(u) and registry.owns(u)]
    deleted = []
    for url in doomed:
        if keep is not None and keep(url):
            continue
        try:
            delete(url)
            deleted.append(url)
        except OSError as exc:
            logger.warning("could not delete discarded state file %s: %s", url, exc)
    return deleted


class PendingCheckpoint:
    def __init__(self, job_id: str, checkpoint_id: int, trigger_timestamp: float,
                 properties: CheckpointProperties, options: CheckpointOptions,
                 location: CheckpointStorageLocation, tasks_to_ack: Iterable[ExecutionAttemptId],
                 operators: Mapping[str, OperatorInfo],
                 shared_registry: SharedStateRegistry | None = None,
                 delete: Callable[..., None] = filesystem.delete, job_graph: Mapping | None = None):
        self.job_id = job_id
        self.job_graph = job_graph   # recorded in _metadata (CheckpointMetadata.job_graph)
        self._delete = delete
        self.checkpoint_id = checkpoint_id
        self.trigger_timestamp = trigger_timestamp
        self.properties = properties
        self.options = options
        self.location = location
        self.operators = dict(operators)
        self._registry = shared_registry
        self._not_yet_acknowledged: set[ExecutionAttemptId] = set(tasks_to_ack)
        if not self._not_yet_acknowledged:
            raise ValueError(f"checkpoint {checkpoint_id} has no task to acknowledge it")
        self._acknowledged: set[ExecutionAttemptId] = set()
        self._uids_by_vertex: dict[str, list[str]] = {}
        for uid, info in sorted(self.operators.items()):
            self._uids_by_vertex.setdefault(info.vertex_id, []).append(uid)
        self._subtask_states: dict[str, dict[int, OperatorSubtaskState]] = {uid: {} for uid in self.operators}
        self.acknowledgements: dict[ExecutionAttemptId, SubtaskAcknowledgement] = {}
        self.status = PendingStatus.IN_PROGRESS
        self.failure_reason: CheckpointFailureReason | None = None
        # Reused shared files that were no longer registered when acknowledged (see _register_shared).
        self.missing_shared_state: list[str] = []

    def __repr__(self) -> str:
        return (f"PendingCheckpoint({self.checkpoint_id}, {self.properties.checkpoint_type.value}, "
                f"{len(self._acknowledged)}/{self.num_tasks} acknowledged, {self.status.value})")

    @property
    def is_disposed(self) -> bool:
        return self.status is not PendingStatus.IN_PROGRESS

    @property
    def is_fully_acknowledged(self) -> bool:
        return not self._not_yet_acknowledged and not self.is_disposed

    @property
    def not_yet_acknowledged(self) -> frozenset[ExecutionAttemptId]:
        return frozenset(self._not_yet_acknowledged)

    @property
    def acknowledged(self) -> frozenset[ExecutionAttemptId]:
        return frozenset(self._acknowledged)

    @property
    def num_tasks(self) -> int:
        return len(self._not_yet_acknowledged) + len(self._acknowledged)

    def waits_for(self, attempt: ExecutionAttemptId) -> bool:
        return attempt in self._not_yet_acknowledged

    def involves(self, attempt: ExecutionAttemptId) -> bool:
        return attempt in self._not_yet_acknowledged or attempt in self._acknowledged

    @property
    def state_size(self) -> int:
        return sum(a.state_size for a in self.acknowledgements.values())

    def acknowledge_task(self, ack: AcknowledgeCheckpoint, ack_timestamp: float = 0.0) -> AcknowledgeResult:
        """Take one task's acknowledgement.

        SUCCESS: the first ack of an attempt we wait for; its state becomes part of the checkpoint.
        DUPLICATE: that attempt had already acknowledged (its state is already recorded).
        UNKNOWN: not an attempt of this checkpoint, e.g. of a deployment that was replaced.
        DISCARDED: this checkpoint already completed or was aborted.
        For UNKNOWN and DISCARDED the caller owns the ack's files and should delete them.
        """
        if self.is_disposed:
            return AcknowledgeResult.DISCARDED
        attempt = ack.attempt
        if attempt not in self._not_yet_acknowledged:
            return AcknowledgeResult.DUPLICATE if attempt in self._acknowledged else AcknowledgeResult.UNKNOWN
        self._not_yet_acknowledged.remove(attempt)
        self._acknowledged.add(attempt)

        states = self._relativize(ack.subtask_state)
        uids = self._uids_by_vertex.get(attempt.vertex_id, [])
        size = written = 0
        for uid in uids:
            state = states.get(uid, OperatorSubtaskState())
            self._subtask_states[uid][attempt.index] = state
            size += state.state_size
            written += state.incremental_size
        self._register_shared(states, uids)
        strays = sorted(set(states) - set(uids))
        if strays:
            logger.warning("checkpoint %d: %s acknowledged state for operator(s) %s that are not "
                           "chained into vertex %s; that state is dropped", self.checkpoint_id,
                           attempt, strays, attempt.vertex_id)
            for uid in strays:
                discard_subtask_state(states[uid], self.location.url, registry=self._registry, delete=self._delete)
        self.acknowledgements[attempt] = SubtaskAcknowledgement(attempt, ack_timestamp, size, ack.metrics, written)
        return AcknowledgeResult.SUCCESS

    def _register_shared(self, states: TaskStateSnapshot, uids: list[str]) -> None:
        """Reference the shared files of an acknowledged snapshot in the registry at once, so
        that a checkpoint completing meanwhile cannot delete a file this one reuses; a reused
        file nobody references any more (its last holder was subsumed between the task's
        snapshot and this acknowledgement) makes this checkpoint unusable."""
        if self._registry is None:
            return
        base = self.location.url
        urls = []
        for uid in uids:
            state = states.get(uid)
            if state is None:
                continue
            urls += state_file_urls(state, base)[1]
            for handle in state.keyed:
                if not isinstance(handle, SHARED_STATE_HANDLES):
                    continue
                for f in handle.reused_files():
                    url = filesystem.join(base, f.path)
                    if not self._registry.is_registered(url):
                        self.missing_shared_state.append(url)
        if urls:
            self._registry.register(self.checkpoint_id, urls)

    def _relativize(self, snapshot: TaskStateSnapshot) -> TaskStateSnapshot:
        """Make handle paths that point into this checkpoint's directory relative to it, so
        `_metadata` stays valid when a savepoint directory is moved."""
        base = self.location.url

        def rel(f: FileHandle) -> FileHandle:
            if "://" not in f.path and not f.path.startswith("/"):
                return f
            relative = filesystem.relative_to(f.path, base)
            return replace(f, path=relative) if "://" not in relative else f

        def rel_keyed(h):
            if isinstance(h, ChangelogStateHandle):    # its shared files are relative already
                return replace(h, file=rel(h.file))
            return replace(h, file=rel(h.file), shared_files=tuple(rel(s) for s in h.shared_files))

        return {uid: OperatorSubtaskState(
                    tuple(rel_keyed(h) for h in state.keyed),
                    tuple(replace(h, file=rel(h.file)) for h in state.operator),
                    tuple(rel(f) for f in state.channel))
                for uid, state in snapshot.items()}

    def operator_states(self) -> dict[str, OperatorState]:
        return {uid: OperatorState(uid, info.parallelism, info.max_parallelism, self._subtask_states[uid])
                for uid, info in sorted(self.operators.items())}

    def finalize(self, completion_timestamp: float) -> CompletedCheckpoint:
        """Write `_metadata` (atomically) and turn this into a CompletedCheckpoint.

        Raises if not fully acknowledged or already disposed; an I/O error leaves the
        checkpoint pending so the caller can abort it (which deletes its files).
        """
        metadata = self.prepare_metadata(completion_timestamp)
        write_metadata(self.location.url, metadata)
        return self.mark_completed(metadata)

    def prepare_metadata(self, completion_timestamp: float) -> CheckpointMetadata:
        """The `_metadata` to write: the first half of `finalize`, without I/O."""
        if self.is_disposed:
            raise RuntimeError(f"checkpoint {self.checkpoint_id} cannot be finalized: it is already "
                               f"{self.status.value}")
        if not self.is_fully_acknowledged:
            raise RuntimeError(f"checkpoint {self.checkpoint_id} cannot be finalized: still waiting for "
                               f"{sorted(map(str, self._not_yet_acknowledged))}")
        acks = self.acknowledgements.values()
        in_flight = ({f"{a.attempt.vertex_id}#{a.attempt.index}": (
                         a.metrics.unaligned, a.metrics.bytes_persisted_of_in_flight_data,
                         a.metrics.bytes_processed_during_alignment) for a in acks}
                     if any(a.metrics.unaligned for a in acks) else {})
        return CheckpointMetadata(self.job_id, self.checkpoint_id, self.properties.checkpoint_type,
                                  self.trigger_timestamp, completion_timestamp, self.operator_states(), in_flight,
                                  {f"{a.attempt.vertex_id}#{a.attempt.index}": (
                                      a.attempt.attempt, a.ack_timestamp, tuple(a.metrics.to_wire())) for a in acks},
                                  self.job_graph)

    def mark_completed(self, metadata: CheckpointMetadata) -> CompletedCheckpoint:
        """`metadata` is durably written: the second half of `finalize`."""
        if self.is_disposed:
            raise RuntimeError(f"checkpoint {self.checkpoint_id} cannot complete: it is already {self.status.value}")
        self.status = PendingStatus.COMPLETED
        return CompletedCheckpoint(metadata, self.location, self.properties)

    def abort(self, reason: CheckpointFailureReason, keep: Callable[[str], bool] | None = None) -> list[str]:
        """Give up on this checkpoint: delete the state of tasks that acknowledged and its directory.

        `keep` protects files that must survive (e.g. ones a retained checkpoint references).
        Returns the files deleted. Aborting twice, or after finalize, does nothing.
        """
        if self.is_disposed:
            return []
        self.status = PendingStatus.ABORTED
        self.failure_reason = reason
        deleted = []
        if self._registry is not None:
            # Drop the references taken on acknowledgement: shared files only this checkpoint
            # held (its own uploads) are deleted, those a retained checkpoint holds stay.
            deleted += self._registry.unregister(self.checkpoint_id)
        for states in self._subtask_states.values():
            for state in states.values():
                deleted += discard_subtask_state(state, self.location.url, registry=self._registry, keep=keep,
                                                 delete=self._delete)
        try:
            self._delete(self.location.url, recursive=True)
        except OSError as exc:
            logger.warning("could not delete the directory %s of aborted checkpoint %d: %s",
                           self.location.url, self.checkpoint_id, exc)
        return deleted


__all__ = ["PendingCheckpoint", "PendingStatus", "OperatorInfo", "SubtaskAcknowledgement",
           "discard_subtask_state"]
