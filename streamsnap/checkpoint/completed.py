"""Completed checkpoints and the store that retains the newest few for failover.

A checkpoint is completed once every task acknowledged it and its `_metadata` is written. The
store keeps the newest `num_retained` of them; older ones are *subsumed*: deleted with their
exclusive files, while shared (incremental) files go through the reference-counting registry.
Savepoints taken by the job belong to the user: a plain one is never put into the store; a
terminating one (stop-with-savepoint) is, as a failover point the store never deletes, because
the sinks committed on it. What happens to the retained checkpoints when the job ends is decided by
the retention policy (Flink's externalized-checkpoint cleanup).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from streamsnap.api.config import RETENTION_POLICIES
from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.metadata import CheckpointMetadata, state_file_urls
from streamsnap.checkpoint.shared_registry import SharedStateRegistry
from streamsnap.checkpoint.storage import CheckpointStorageLocation
from streamsnap.cluster.status import JobStatus
from streamsnap.runtime.events import CheckpointType

logger = logging.getLogger(__name__)

DELETE_ON_CANCELLATION, RETAIN_ON_CANCELLATION, RETAIN_ON_FINISH = RETENTION_POLICIES


@dataclass(frozen=True)
class CheckpointProperties:
    """What kind of snapshot a checkpoint is and who may delete it.

    discard_subsumed: delete it when a newer retained checkpoint pushes it out of the store.
    owned: False for a snapshot the job was restored from (a savepoint or another job's retained
      checkpoint): the job may use it for failover but must never delete it.
    drain: a stop-with-savepoint that ends event time before its barrier (every timer fires into
      it); a job that fails over to it must finish, never run past its drain.
    """

    checkpoint_type: CheckpointType = CheckpointType.CHECKPOINT
    is_periodic: bool = False
    discard_subsumed: bool = True
    owned: bool = True
    drain: bool = False

    @property
    def is_savepoint(self) -> bool:
        return self.checkpoint_type.is_savepoint

    @property
    def is_terminating(self) -> bool:
        return self.checkpoint_type is CheckpointType.TERMINATING_SAVEPOINT

    @property
    def forced(self) -> bool:
        """Savepoints are user requests: they bypass max_concurrent and min_pause."""
        return self.is_savepoint

    @classmethod
    def for_checkpoint(cls, is_periodic: bool = False) -> "CheckpointProperties":
        return cls(CheckpointType.CHECKPOINT, is_periodic)

    @classmethod
    def for_savepoint(cls, terminate: bool = False, drain: bool = False) -> "CheckpointProperties":
        if drain and not terminate:
            raise ValueError("only a stop-with-savepoint (terminate=True) can drain")
        kind = CheckpointType.TERMINATING_SAVEPOINT if terminate else CheckpointType.SAVEPOINT
        return cls(kind, is_periodic=False, discard_subsumed=False, drain=drain)

    def as_failover_point(self) -> "CheckpointProperties":
        """A savepoint the job may restore from but never deletes (a stop-with-savepoint)."""
        return CheckpointProperties(self.checkpoint_type, self.is_periodic, discard_subsumed=False, owned=False,
                                    drain=self.drain)

    @classmethod
    def for_restored(cls, checkpoint_type: CheckpointType, drain: bool = False) -> "CheckpointProperties":
        return cls(checkpoint_type, is_periodic=False, discard_subsumed=False, owned=False, drain=drain)


@dataclass(frozen=True)
class CompletedCheckpoint:
    metadata: CheckpointMetadata
    location: CheckpointStorageLocation
    properties: CheckpointProperties = CheckpointProperties()

    @property
    def checkpoint_id(self) -> int:
        return self.metadata.checkpoint_id

    @property
    def job_id(self) -> str:
        return self.metadata.job_id

    @property
    def checkpoint_type(self) -> CheckpointType:
        return self.metadata.checkpoint_type

    @property
    def timestamp(self) -> float:
        """Wall-clock time the checkpoint was triggered."""
        return self.metadata.trigger_timestamp

    @property
    def completion_timestamp(self) -> float:
        return self.metadata.completion_timestamp

    @property
    def duration(self) -> float:
        return self.metadata.completion_timestamp - self.metadata.trigger_timestamp

    @property
    def state_size(self) -> int:
        return self.metadata.state_size

    @property
    def checkpointed_size(self) -> int:
        """Bytes this checkpoint wrote (its incremental snapshots' new files only)."""
        return self.metadata.incremental_size

    @property
    def external_pointer(self) -> str:
        """The directory to pass to `restore_from` / `streamsnap run --from`."""
        return self.location.url

    def exclusive_files(self) -> list[str]:
        return [url for op in self.metadata.operators.values()
                for state in op.subtask_states.values()
                for url in state_file_urls(state, self.location.url)[0]]

    def shared_files(self) -> list[str]:
        return sorted({url for op in self.metadata.operators.values()
                       for state in op.subtask_states.values()
                       for url in state_file_urls(state, self.location.url)[1]})

    def discard(self, registry: SharedStateRegistry | None = None,
                delete: Callable[..., None] = filesystem.delete) -> None:
        """Delete this checkpoint: its directory (with its exclusive files) and, through the
        registry, shared files no other retained checkpoint references.

        Exclusive files live inside the checkpoint directory; files a task reported outside it
        (task-owned) are not the coordinator's to delete. Snapshots the job does not own are
        never deleted.
        """
        if not self.properties.owned:
            logger.debug("not deleting %s: the job was restored from it and does not own it",
                         self.location.url)
            return
        if registry is not None:
            registry.unregister(self.checkpoint_id)
        delete(self.location.url, recursive=True)
        logger.debug("deleted checkpoint %d at %s", self.checkpoint_id, self.location.url)


def retained_on_shutdown(job_status: JobStatus, retention: str) -> str:
    """Which retained checkpoints survive the job reaching `job_status`: "all", "latest" or "none".

    As Flink: a FAILED job keeps them so it can be resumed from the latest one; CANCELED deletes
    them unless the policy retains them on cancellation; a FINISHED job needs no failover point,
    so its checkpoints go — unless "retain_on_finish" asks for its final one, the state it
    finished with. Non-terminal states keep them.
    """
    if retention not in RETENTION_POLICIES:
        raise ValueError(f"retention must be one of {RETENTION_POLICIES}, got {retention!r}")
    if job_status is JobStatus.FINISHED:
        return "latest" if retention == RETAIN_ON_FINISH else "none"
    if job_status is JobStatus.CANCELED:
        return "none" if retention == DELETE_ON_CANCELLATION else "all"
    return "all"


def discard_on_shutdown(job_status: JobStatus, retention: str) -> bool:
    """Whether every retained checkpoint is deleted when the job reaches `job_status`."""
    return retained_on_shutdown(job_status, retention) == "none"


class CompletedCheckpointStore:
    """The newest `num_retained` completed checkpoints, oldest first."""

    def __init__(self, num_retained: int = 1, registry: SharedStateRegistry | None = None,
                 delete: Callable[..., None] = filesystem.delete):
        if num_retained < 1:
            raise ValueError(f"num_retained must be >= 1, got {num_retained}")
        self.num_retained = num_retained
        self._delete = delete
        self.registry = registry if registry is not None else SharedStateRegistry()
        self._checkpoints: list[CompletedCheckpoint] = []

    def add_checkpoint(self, checkpoint: CompletedCheckpoint) -> list[CompletedCheckpoint]:
        """Retain `checkpoint`; returns the checkpoints it subsumed (already deleted if discardable).

        Its shared files are registered before anything is subsumed, so a file both the new
        and an old checkpoint reference survives the old one's deletion.
        """
        if checkpoint.properties.is_savepoint and checkpoint.properties.owned:
            raise ValueError(f"savepoint {checkpoint.checkpoint_id} cannot be added to the completed "
                             f"checkpoint store: savepoints are not used for failover")
        if any(c.checkpoint_id == checkpoint.checkpoint_id for c in self._checkpoints):
            raise ValueError(f"checkpoint {checkpoint.checkpoint_id} is already in the store")
        # A snapshot the job does not own stays registered for good (discard() never
        # unregisters it), so its shared files are never deleted on behalf of newer checkpoints.
        self.registry.register(checkpoint.checkpoint_id, checkpoint.shared_files())
        self._checkpoints.append(checkpoint)
        self._checkpoints.sort(key=lambda c: c.checkpoint_id)
        subsumed = []
        while len(self._checkpoints) > self.num_retained:
            old = self._checkpoints.pop(0)
            subsumed.append(old)
            if old.properties.discard_subsumed:
                self._discard(old)
        return subsumed

    def _discard(self, checkpoint: CompletedCheckpoint) -> None:
        try:
            checkpoint.discard(self.registry, self._delete)
        except OSError as exc:
            logger.warning("could not delete checkpoint %d at %s: %s; delete it by hand",
                           checkpoint.checkpoint_id, checkpoint.location.url, exc)

    def latest(self) -> CompletedCheckpoint | None:
        return self._checkpoints[-1] if self._checkpoints else None

    def all(self) -> list[CompletedCheckpoint]:
        return list(self._checkpoints)

    def __len__(self) -> int:
        return len(self._checkpoints)

    def referenced_files(self) -> frozenset[str]:
        """Every file a retained checkpoint needs: such a file must never be deleted."""
        return frozenset(url for c in self._checkpoints
                         for url in (*c.exclusive_files(), *c.shared_files()))

    def shutdown(self, job_status: JobStatus, retention: str) -> list[CompletedCheckpoint]:
        """Apply the retention policy for a job ending in `job_status`; returns what was deleted."""
        kept = retained_on_shutdown(job_status, retention)
        if kept == "all" or (kept == "latest" and len(self._checkpoints) <= 1):
            if self._checkpoints:
                logger.info("job %s: retaining checkpoint(s) %s (%s)", job_status.value,
                            [c.checkpoint_id for c in self._checkpoints], retention)
            self._checkpoints = []
            return []
        discarded, self._checkpoints = self._checkpoints, []
        if kept == "latest":
            logger.info("job %s: retaining its final checkpoint %d (%s)", job_status.value,
                        discarded[-1].checkpoint_id, retention)
            discarded = discarded[:-1]
        for checkpoint in discarded:
            self._discard(checkpoint)
        return [c for c in discarded if c.properties.owned]


__all__ = ["CheckpointProperties", "CompletedCheckpoint", "CompletedCheckpointStore",
           "discard_on_shutdown", "retained_on_shutdown", "DELETE_ON_CANCELLATION", "RETAIN_ON_CANCELLATION",
           "RETAIN_ON_FINISH"]
