"""What `streamsnap checkpoints PATH` shows: the checkpoints found in a directory.

A `chk-<n>` directory is reported as completed only if its `_metadata` reads back and verifies
(checksum, matching id). Directories without it (in flight or torn when the job stopped) and
with a damaged one are listed separately as not restorable, never as completed: restoring
from them would fail or, worse, lose state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.metadata import read_metadata
from streamsnap.checkpoint.restore_point import read_restore_point, restore_point_url
from streamsnap.checkpoint.storage import METADATA_FILE_NAME, checkpoint_id_of, is_directory, subdirectories
from streamsnap.errors import RestoreError
from streamsnap.runtime.events import CheckpointType


class CheckpointCondition(enum.StrEnum):
    """A string enum, so it prints and compares as "COMPLETED" etc. in tables and scripts."""

    COMPLETED = "COMPLETED"
    INCOMPLETE = "INCOMPLETE"   # no _metadata: in flight or abandoned
    CORRUPT = "CORRUPT"         # _metadata present but unreadable, torn or not matching


@dataclass(frozen=True)
class CheckpointSummary:
    """One `chk-<n>` directory; the metadata fields are None unless it is COMPLETED."""

    path: str
    job_id: str
    checkpoint_id: int
    status: CheckpointCondition
    checkpoint_type: CheckpointType | None = None
    triggered_at: float | None = None    # wall-clock seconds
    completed_at: float | None = None
    state_size: int | None = None        # full size (shared files of incremental snapshots included)
    num_operators: int | None = None
    problem: str | None = None          # why it is not COMPLETED
    incremental_size: int | None = None  # bytes written for this checkpoint itself (new files)
    in_flight_size: int | None = None    # in-flight data saved by an unaligned checkpoint
    unaligned_subtasks: int | None = None  # subtasks that snapshotted unaligned (of num_subtasks)
    num_subtasks: int | None = None
    in_flight_processed: int | None = None  # bytes processed during alignment, all subtasks

    @property
    def is_completed(self) -> bool:
        return self.status is CheckpointCondition.COMPLETED


def _summarize(job_id: str, checkpoint_id: int, url: str) -> CheckpointSummary:
    metadata_url = filesystem.join(url, METADATA_FILE_NAME)
    if not filesystem.exists(metadata_url):
        return CheckpointSummary(url, job_id, checkpoint_id, CheckpointCondition.INCOMPLETE,
                                 problem=f"no {METADATA_FILE_NAME}: the checkpoint never completed")
    try:
        metadata = read_metadata(metadata_url)
    except RestoreError as exc:
        return CheckpointSummary(url, job_id, checkpoint_id, CheckpointCondition.CORRUPT, problem=str(exc))
    if metadata.checkpoint_id != checkpoint_id:
        return CheckpointSummary(url, job_id, checkpoint_id, CheckpointCondition.CORRUPT,
                                 problem=f"{metadata_url} describes checkpoint {metadata.checkpoint_id}")
    return CheckpointSummary(url, job_id, checkpoint_id, CheckpointCondition.COMPLETED,
                             metadata.checkpoint_type, metadata.trigger_timestamp,
                             metadata.completion_timestamp, metadata.state_size, len(metadata.operators),
                             incremental_size=metadata.incremental_size,
                             in_flight_size=metadata.in_flight_size,
                             unaligned_subtasks=sum(u for u, _, _ in metadata.in_flight.values()),
                             num_subtasks=len(metadata.in_flight),
                             in_flight_processed=sum(b for _, _, b in metadata.in_flight.values()))


def _checkpoints_in(job_id: str, job_url: str) -> list[CheckpointSummary]:
    """The job's `chk-<n>` directories, and the stop-with-savepoint its `_restore_point`
    records when no `chk-<n>` is newer (what a new run of the job resumes from)."""
    found = [_summarize(job_id, checkpoint_id_of(name), url) for name, url in subdirectories(job_url)
             if checkpoint_id_of(name) is not None]
    try:
        point = read_restore_point(job_url)
    except RestoreError as exc:
        return found + [CheckpointSummary(restore_point_url(job_url), job_id, -1, CheckpointCondition.CORRUPT,
                                          problem=str(exc))]
    if point is not None and all(point.checkpoint_id > s.checkpoint_id for s in found):
        found.append(_summarize(job_id, point.checkpoint_id, filesystem.normalize(point.path)))
    return found


def list_checkpoints(directory: str) -> list[CheckpointSummary]:
    """Every `chk-<n>` found in `directory` (and a job's recorded restore point, see
    `_checkpoints_in`), sorted by job id then checkpoint id.

    `directory` may be a checkpoint directory (with one subdirectory per job id), one job's
    directory, or a single `chk-<n>` directory.
    """
    url = filesystem.normalize(directory)
    if not is_directory(url):
        raise FileNotFoundError(f"{url} is not a directory; pass the checkpoint directory "
                                f"(CheckpointConfig.directory) or a job directory inside it")
    name = url.rstrip("/").rsplit("/", 1)[-1]
    own_id = checkpoint_id_of(name)
    if own_id is not None:
        parent = url.rstrip("/").rsplit("/", 2)[-2]
        return [_summarize(parent, own_id, url)]
    found = _checkpoints_in(name, url)
    for child_name, child_url in subdirectories(url):
        if checkpoint_id_of(child_name) is None:
            found += _checkpoints_in(child_name, child_url)
    return sorted(found, key=lambda s: (s.job_id, s.checkpoint_id))


__all__ = ["list_checkpoints", "CheckpointSummary", "CheckpointCondition"]
