"""The job's record of how it ended and what became of its checkpoints.

When a job finishes or is cancelled, its retention policy may delete its checkpoints; the job
directory then holds nothing that says why, and reading its state (`ss.state.read`,
`restore_from=`) could only answer "not a completed checkpoint". So the coordinator writes
`<job dir>/_job_end` as the job ends: the final status, the retention policy, and the
checkpoint it kept (None: it deleted them all). Readers name the reason and the setting
that keeps them.

It also tells a new run of the job what the retained final checkpoint of a FINISHED run is:
state to read, not a failover point — the job had finished, so a new run starts fresh instead
of resuming from it (`restore_from=` still can, by choice).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from streamsnap.checkpoint import filesystem
from streamsnap.errors import RestoreError

JOB_END_FILE = "_job_end"
_VERSION = 1


@dataclass(frozen=True)
class JobEnd:
    status: str                      # "FINISHED" or "CANCELED"
    retention: str                   # CheckpointConfig.retention of that run
    kept_checkpoint: int | None      # the checkpoint it kept (FINISHED: its final one); None: none
    ended_at: float                  # wall-clock seconds

    @property
    def finished_with_state(self) -> bool:
        """A FINISHED run that kept its final checkpoint (not to be resumed by a new run)."""
        return self.status == "FINISHED" and self.kept_checkpoint is not None

    def to_json(self) -> bytes:
        return json.dumps({"version": _VERSION, "status": self.status, "retention": self.retention,
                           "kept_checkpoint": self.kept_checkpoint, "ended_at": self.ended_at},
                          sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, url: str) -> "JobEnd":
        try:
            raw = json.loads(data)
            if raw.get("version") != _VERSION:
                raise ValueError(f"unknown version {raw.get('version')!r}")
            kept = raw["kept_checkpoint"]
            return cls(str(raw["status"]), str(raw["retention"]), None if kept is None else int(kept),
                       float(raw["ended_at"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise RestoreError(f"the job's end record {url} is damaged ({exc}); it only says how the job's last "
                               f"run ended: delete it and run the job again") from None

    def why_no_checkpoint(self) -> str:
        """Why the job directory holds no checkpoint to read, and the setting that keeps one."""
        if self.status == "CANCELED":
            return ("the job was cancelled and deleted its checkpoints: set "
                    "CheckpointConfig(retention='retain_on_cancellation') to keep them")
        return ("the job finished and deleted its checkpoints: set CheckpointConfig(retention='retain_on_finish') "
                "to keep its final checkpoint")


def job_end_url(job_directory: str) -> str:
    return filesystem.join(job_directory, JOB_END_FILE)


def write_job_end(job_directory: str, end: JobEnd) -> None:
    filesystem.write_atomic(job_end_url(job_directory), end.to_json())


def read_job_end(job_directory: str) -> JobEnd | None:
    """The record of the job's last finished or cancelled run, or None if it has none."""
    url = job_end_url(job_directory)
    data = filesystem.read_if_exists(url)
    return None if data is None else JobEnd.from_json(data, url)


__all__ = ["JobEnd", "JOB_END_FILE", "job_end_url", "write_job_end", "read_job_end"]
