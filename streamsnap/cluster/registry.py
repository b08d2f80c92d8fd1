"""The job registry: what a job says about itself in its checkpoint directory.

A job whose JobMaster runs inside the cluster (docs/architecture/deployment-decision.md) has no process a
client could ask where it is. Its directory in checkpoint storage is the one place every
party can read, so it holds:

* `job.json`: id, name, status, the leader's epoch, its control address and the task id of the
  Spark task hosting it, what the current attempt restores, restarts and the failure history
  (exception history and recoveries) — written only by the current leader, and by the
  submitter before any leader exists;
* `epochs/<k>`: one file per JobMaster that ever led the job, created exclusively — taking
  epoch k+1 is how a new JobMaster fences every older one (`JobRegistry.fence`);
* `job.secret`: the job's secret (0600), which authenticates control connections: whoever can
  read the checkpoint directory can control the job, nobody else.

Readers never trust a record's liveness on its own: a JobMaster killed with SIGKILL leaves
"RUNNING" behind; `live()` asks its control port.
"""

from __future__ import annotations

import json
import os
import time

from streamsnap.checkpoint import filesystem
from streamsnap.errors import StreamsnapError

JOB_FILE = "job.json"
SECRET_FILE = "job.secret"
EPOCH_DIR = "epochs"
# Statuses after which nothing of the job runs any more.
TERMINAL = ("FINISHED", "CANCELED", "FAILED")


class FencedError(StreamsnapError):
    """A newer JobMaster leads this job: this one must not finalize or commit anything."""


class JobRegistry:
    def __init__(self, directory: str, job_id: str):
        self.directory = filesystem.normalize(directory)
        self.job_id = job_id
        self.job_directory = filesystem.join(self.directory, job_id)
        self.job_file = filesystem.join(self.job_directory, JOB_FILE)
        self.secret_file = filesystem.join(self.job_directory, SECRET_FILE)
        self.epoch_directory = filesystem.join(self.job_directory, EPOCH_DIR)

    def __repr__(self) -> str:
        return f"JobRegistry({filesystem.user_path(self.job_directory)!r})"

    # ------------------------------------------------------------------ the record
    def read(self) -> dict | None:
        """The job's record, or None if it has none (never submitted here, or deleted)."""
        fs, path = filesystem.filesystem(self.job_file)
        try:
            data = fs.cat_file(path)
        except FileNotFoundError:
            return None
        try:
            record = json.loads(data)
        except ValueError as exc:
            raise StreamsnapError(f"{filesystem.user_path(self.job_file)} is not a job record ({exc}); "
                                  f"delete it if no job of that id runs") from None
        if not isinstance(record, dict) or record.get("job_id") != self.job_id:
            raise StreamsnapError(f"{filesystem.user_path(self.job_file)} is not the record of job {self.job_id}")
        return record

    def write(self, record: dict) -> None:
        record = dict(record, job_id=self.job_id, updated_at=time.time())
        filesystem.write_atomic(self.job_file, json.dumps(record, sort_keys=True).encode())

    def update(self, **changes) -> dict:
        """Read-modify-write by the one writer of the moment (the leader, or the submitter before one)."""
        record = self.read() or {}
        record.update(changes)
        self.write(record)
        return record

    # ------------------------------------------------------------------ the secret
    def write_secret(self, secret: bytes) -> None:
        fs, path = filesystem.filesystem(self.secret_file)
        if filesystem.is_local(self.secret_file):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(secret.hex().encode())
            os.chmod(path, 0o600)
            return
        filesystem.write_atomic(self.secret_file, secret.hex().encode())

    def read_secret(self) -> bytes:
        try:
            return bytes.fromhex(filesystem.read_bytes(self.secret_file).decode().strip())
        except FileNotFoundError:
            raise StreamsnapError(f"job {self.job_id} has no {SECRET_FILE} in {filesystem.user_path(self.job_directory)}: "
                                  f"it was not started detached or in the cluster, or its directory was cleaned") from None
        except PermissionError:
            raise StreamsnapError(f"cannot read {filesystem.user_path(self.secret_file)}: controlling a job needs "
                                  f"read access to its secret (run as the user who submitted it)") from None

    # ------------------------------------------------------------------ epochs
    def epochs(self) -> list[int]:
        return numbered(self.epoch_directory)

    def latest_epoch(self) -> int:
        return max(self.epochs(), default=-1)

    def take_epoch(self, owner: dict) -> int:
        """Become the job's leader: create `epochs/<k>` for the next free k, exclusively."""
        return take_next(self.epoch_directory, owner)

    def fence(self, epoch: int) -> None:
        """FencedError unless `epoch` is still the newest: called right before anything a newer
        leader must be able to rely on not happening (a checkpoint's `_metadata`, commits)."""
        latest = self.latest_epoch()
        if latest > epoch:
            raise FencedError(f"JobMaster epoch {epoch} of job {self.job_id} was superseded by epoch {latest}: "
                              f"it must not complete checkpoints or commit any more")


def numbered(directory: str) -> list[int]:
    """The numbers k of the files `<directory>/<k>` (epochs, submitter generations), ascending."""
    fs, path = filesystem.filesystem(directory)
    try:
        names = [os.path.basename(p.rstrip("/")) for p in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def take_next(directory: str, owner: dict) -> int:
    """Create `<directory>/<k>` for the next free k exclusively (holding `owner`); returns k.
    Whoever creates k+1 supersedes the holder of k: this is how leaders are fenced."""
    while True:
        k = max(numbered(directory), default=-1) + 1
        if filesystem.create_exclusive(filesystem.join(directory, str(k)), json.dumps(owner).encode()):
            return k


def list_jobs(directory: str) -> list[dict]:
    """The records of the jobs under `directory` that have one (any status), newest first."""
    base = filesystem.normalize(directory)
    fs, path = filesystem.filesystem(base)
    found = []
    for candidate in sorted(fs.glob(f"{path.rstrip('/')}/*/{JOB_FILE}")):
        job_id = os.path.basename(os.path.dirname(candidate))
        record = JobRegistry(directory, job_id).read()
        if record is not None:
            found.append(record)
    return sorted(found, key=lambda r: r.get("submitted_at", 0), reverse=True)


__all__ = ["JobRegistry", "FencedError", "list_jobs", "TERMINAL", "JOB_FILE", "SECRET_FILE"]
