"""The job's record of its newest restore point when it lives outside the job directory.

A completed stop-with-savepoint is the job's failover point (its sinks committed on it), but the
savepoint is written where the user asked, not as a `chk-<n>` in the job directory, and its
completion may subsume the job's last `chk-<n>`. Without a record, a new run of the job (its
driver died before the job finished) would find no checkpoint and start over, committing the
same output again. So the savepoint's completion writes `<job dir>/_restore_point` first:
a small JSON file, written atomically, naming the savepoint, its checkpoint id and whether it
drained (event time ended at it). It is part of the job's state, as Flink keeps the pointer to
its latest completed checkpoint in its HA store.

The record holds only while nothing newer exists: a `chk-<n>` with a larger id supersedes it
(ids grow across savepoints and checkpoints). It is deleted with the job's checkpoints when
the job ends FINISHED, or CANCELED without retention.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from streamsnap.checkpoint import filesystem
from streamsnap.errors import RestoreError
from streamsnap.runtime.events import CheckpointType

RESTORE_POINT_FILE = "_restore_point"
_VERSION = 1


@dataclass(frozen=True)
class RestorePoint:
    checkpoint_id: int
    path: str                        # the savepoint's directory (fsspec URL)
    checkpoint_type: CheckpointType
    drained: bool = False            # a stop-with-savepoint with drain: event time ended here
    written_at: float = 0.0          # wall-clock seconds

    def to_json(self) -> bytes:
        return json.dumps({"version": _VERSION, "checkpoint_id": self.checkpoint_id, "path": self.path,
                           "checkpoint_type": self.checkpoint_type.value, "drained": self.drained,
                           "written_at": self.written_at}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, url: str) -> "RestorePoint":
        try:
            raw = json.loads(data)
            if raw.get("version") != _VERSION:
                raise ValueError(f"unknown version {raw.get('version')!r}")
            return cls(int(raw["checkpoint_id"]), str(raw["path"]), CheckpointType(raw["checkpoint_type"]),
                       bool(raw["drained"]), float(raw["written_at"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise RestoreError(f"the job's restore-point record {url} is damaged ({exc}); it names the "
                               f"savepoint the job last committed on: find that savepoint and pass it as "
                               f"restore_from=..., then delete {url}") from None


def restore_point_url(job_directory: str) -> str:
    return filesystem.join(job_directory, RESTORE_POINT_FILE)


def write_restore_point(job_directory: str, point: RestorePoint) -> None:
    filesystem.write_atomic(restore_point_url(job_directory), point.to_json())


def read_restore_point(job_directory: str) -> RestorePoint | None:
    """The job's record, or None if it has none (it never completed a stop-with-savepoint)."""
    url = restore_point_url(job_directory)
    data = filesystem.read_if_exists(url)
    return None if data is None else RestorePoint.from_json(data, url)


def delete_restore_point(job_directory: str) -> None:
    filesystem.delete(restore_point_url(job_directory))


__all__ = ["RestorePoint", "RESTORE_POINT_FILE", "restore_point_url", "write_restore_point",
           "read_restore_point", "delete_restore_point"]
