"""Where a job's checkpoints and savepoints live (Flink's checkpoint storage, file-system flavour).

Layout of one job::

    <directory>/<job id>/
        chk-<n>/              one directory per checkpoint; `_metadata` is written into it last
        shared/               files of incremental snapshots, referenced by several checkpoints
        taskowned/            files owned by the tasks; the coordinator never deletes them
        _checkpoint_id        the persisted id counter (ids never go backwards across restarts)
        _restore_point        the completed stop-with-savepoint the job last committed on, if no
                              chk-<n> is newer (checkpoint/restore_point.py)
    <target>/savepoint-<job id>-<n>-<random>/   self-contained, relocatable; the whole job id,
                                                so the name says which job took it

The presence of `chk-<n>/_metadata` is what makes a checkpoint *completed*; a directory without
it is a checkpoint that was in flight or torn when the job stopped.
"""

from __future__ import annotations

import logging
import posixpath
import random
import re
from dataclasses import dataclass

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.job_end import read_job_end
from streamsnap.checkpoint.restore_point import read_restore_point
from streamsnap.errors import RestoreError

logger = logging.getLogger(__name__)

METADATA_FILE_NAME = "_metadata"
SHARED_DIR = "shared"
TASK_OWNED_DIR = "taskowned"
ID_COUNTER_FILE = "_checkpoint_id"
CHECKPOINT_DIR_PREFIX = "chk-"
SAVEPOINT_DIR_PREFIX = "savepoint-"

_CHECKPOINT_DIR = re.compile(r"^chk-(\d+)$")


def checkpoint_id_of(name: str) -> int | None:
    """The id in a `chk-<n>` directory name, or None for any other name."""
    match = _CHECKPOINT_DIR.match(name)
    return int(match.group(1)) if match else None


def is_directory(url: str) -> bool:
    return filesystem.isdir(url)


def subdirectories(url: str) -> list[tuple[str, str]]:
    """(name, url) of the directories directly inside `url`; empty when it is not a directory."""
    if not filesystem.isdir(url):
        return []
    children = []
    for entry in filesystem.ls(url):
        if entry.get("type") == "directory":
            name = posixpath.basename(str(entry["name"]).rstrip("/"))
            children.append((name, filesystem.join(url, name)))
    return sorted(children)


def _modified_at(info: dict) -> float | None:
    """When a listed file was last written (epoch seconds): local `mtime`/`created`, an object
    store's `LastModified`; None when the listing does not say (the file counts as young)."""
    value = info.get("mtime") or info.get("created") or info.get("LastModified") or info.get("last_modified")
    if value is None:
        return None
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


@dataclass(frozen=True)
class CheckpointStorageLocation:
    """The directory one checkpoint or savepoint is written into.

    Tasks receive `url` in their CheckpointOptions and write their state files below it; the
    coordinator writes `_metadata` into it when the checkpoint completes.
    """

    url: str
    checkpoint_id: int
    is_savepoint: bool = False

    @property
    def metadata_url(self) -> str:
        return filesystem.join(self.url, METADATA_FILE_NAME)


class CheckpointStorage:
    """Creates, names and deletes checkpoint locations of one job under `directory`.

    Construction does no I/O; directories are created when the first location is requested.
    """

    def __init__(self, directory: str, job_id: str):
        if not job_id or "/" in job_id:
            raise ValueError(f"job_id must be a non-empty name without '/', got {job_id!r}")
        self.directory = filesystem.normalize(directory)
        self.job_id = job_id
        self.job_directory = filesystem.join(self.directory, job_id)
        self.shared_directory = filesystem.join(self.job_directory, SHARED_DIR)
        self.task_owned_directory = filesystem.join(self.job_directory, TASK_OWNED_DIR)
        self.id_counter_url = filesystem.join(self.job_directory, ID_COUNTER_FILE)
        self._base_created = False

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.job_directory!r})"

    def checkpoint_directory(self, checkpoint_id: int) -> str:
        return filesystem.join(self.job_directory, f"{CHECKPOINT_DIR_PREFIX}{checkpoint_id}")

    def _create_base(self) -> None:
        if not self._base_created:
            for url in (self.job_directory, self.shared_directory, self.task_owned_directory):
                filesystem.makedirs(url)
            self._base_created = True

    def initialize_location(self, checkpoint_id: int) -> CheckpointStorageLocation:
        """Create `chk-<checkpoint_id>/`.

        Refuses a directory that already holds a completed checkpoint: ids are never reused, so
        finding one means two jobs share a job id or the id counter was lost.
        """
        self._create_base()
        url = self.checkpoint_directory(checkpoint_id)
        if self.is_completed(checkpoint_id):
            raise FileExistsError(
                f"{url} already holds a completed checkpoint; checkpoint ids must not be reused. "
                f"Is another job writing to {self.job_directory} with the same job id?")
        filesystem.makedirs(url)
        return CheckpointStorageLocation(url, checkpoint_id)

    def initialize_savepoint_location(self, target_directory: str, checkpoint_id: int,
                                      rng: random.Random | None = None) -> CheckpointStorageLocation:
        """Create a fresh `savepoint-<job id>-<n>-<random>/` under `target_directory`.

        The whole job id (not a prefix: "word-count-1a2b3c4d", not "word-c") says which job
        took it, so savepoints of jobs with similar names never look alike; `<n>` is the
        checkpoint id and the random suffix keeps two savepoints of the same id (e.g. of two
        runs) apart. Job ids contain no "/", so `name.rsplit("-", 2)` splits it back.
        """
        rng = rng or random.Random()
        name = f"{SAVEPOINT_DIR_PREFIX}{self.job_id}-{checkpoint_id}-{rng.getrandbits(48):012x}"
        url = filesystem.join(filesystem.normalize(target_directory), name)
        filesystem.makedirs(url)
        return CheckpointStorageLocation(url, checkpoint_id, is_savepoint=True)

    def discard_location(self, location: CheckpointStorageLocation) -> None:
        """Delete a location and everything in it (an aborted or subsumed checkpoint)."""
        filesystem.delete(location.url, recursive=True)

    def is_location_of(self, url: str, checkpoint_id: int) -> bool:
        """Whether `url` is where this job puts checkpoint or savepoint `checkpoint_id` — the
        only directories the coordinator deletes on a task's word."""
        url = filesystem.normalize(url).rstrip("/")
        if url == filesystem.normalize(self.checkpoint_directory(checkpoint_id)).rstrip("/"):
            return True
        name = url.rsplit("/", 1)[-1]
        return re.fullmatch(rf"{SAVEPOINT_DIR_PREFIX}{re.escape(self.job_id)}-{checkpoint_id}-[0-9a-f]{{12}}",
                            name) is not None

    def abandoned_locations(self, keep_ids: set[int]) -> list[str]:
        """`chk-<n>` directories without `_metadata` whose id is not in `keep_ids` (the pending
        ones): what aborted, expired or cancelled attempts left behind."""
        abandoned = []
        for name, url in subdirectories(self.job_directory):
            checkpoint_id = checkpoint_id_of(name)
            if checkpoint_id is None or checkpoint_id in keep_ids:
                continue
            if not self.is_completed(checkpoint_id):
                abandoned.append(url)
        return abandoned

    def unreferenced_shared_files(self, referenced: frozenset[str], older_than: float) -> list[str]:
        """Files in `shared/` that are not in `referenced` and were written before `older_than`
        (epoch seconds): uploads of incremental snapshots whose checkpoint was never acknowledged
        (a task killed between upload and ack). Younger files may belong to a running upload."""
        if not filesystem.exists(self.shared_directory):
            return []
        stray = []
        for info in filesystem.ls(self.shared_directory):
            if info.get("type") != "file":
                continue
            url = filesystem.join(self.shared_directory, info["name"].rsplit("/", 1)[-1])
            mtime = _modified_at(info)
            if filesystem.normalize(url) not in referenced and mtime is not None and mtime < older_than:
                stray.append(url)
        return stray

    def newest_completed_location(self) -> CheckpointStorageLocation | None:
        """The newest `chk-<n>` with a `_metadata` (what a new run of this job resumes from)."""
        for checkpoint_id in reversed(self.existing_checkpoint_ids()):
            if self.is_completed(checkpoint_id):
                return CheckpointStorageLocation(self.checkpoint_directory(checkpoint_id), checkpoint_id)
        return None

    def is_completed(self, checkpoint_id: int) -> bool:
        """Whether `chk-<n>` has its `_metadata`: written last, it marks a completed checkpoint."""
        return filesystem.exists(filesystem.join(self.checkpoint_directory(checkpoint_id), METADATA_FILE_NAME))

    def completed_ids(self) -> list[int]:
        """Ids of this job's completed checkpoints on storage, ascending."""
        return [i for i in self.existing_checkpoint_ids() if self.is_completed(i)]

    def existing_checkpoint_ids(self) -> list[int]:
        """Ids of every `chk-<n>` directory of this job, completed or not, ascending."""
        ids = (checkpoint_id_of(name) for name, _ in subdirectories(self.job_directory))
        return sorted(i for i in ids if i is not None)

    def resolve_restore_path(self, path: str) -> tuple[str, str]:
        return resolve_restore_path(path)


def resolve_restore_path(path: str) -> tuple[str, str]:
    """(metadata URL, base directory URL) of a checkpoint or savepoint named by the user.

    Accepts a `chk-<n>` directory, a savepoint directory, or their `_metadata` file, or a job's
    directory: its latest restore point (the newest completed `chk-<n>`, or the savepoint its
    `_restore_point` records if that is newer). Handle paths in `_metadata` are relative to the
    base directory, which is why it is returned too.
    """
    url = filesystem.normalize(path)
    if not filesystem.exists(url):
        end = read_job_end(url.rstrip("/").rsplit("/", 1)[0]) if checkpoint_id_of(posixpath.basename(url.rstrip("/"))) \
            is not None else None
        reason = f": {end.why_no_checkpoint()}" if end is not None and end.kept_checkpoint is None else ""
        raise RestoreError(f"cannot restore from {url}: it does not exist{reason}; pass the chk-<n> or "
                           f"savepoint-... directory of a completed checkpoint or savepoint")
    if not is_directory(url):
        if posixpath.basename(url) == METADATA_FILE_NAME:
            return url, url.rsplit("/", 1)[0]
        raise RestoreError(f"cannot restore from {url}: it is a file but not a {METADATA_FILE_NAME} "
                           f"file; pass the chk-<n> or savepoint-... directory")
    metadata_url = filesystem.join(url, METADATA_FILE_NAME)
    if filesystem.exists(metadata_url):
        return metadata_url, url
    latest = latest_restore_point(url, finished_runs=True)
    if latest is not None:
        logger.info("%s is a job's checkpoint directory: using its latest restore point %s", url, latest)
        return filesystem.join(latest, METADATA_FILE_NAME), latest
    end = read_job_end(url)
    if end is not None:
        raise RestoreError(f"{url} is a job's checkpoint directory without a completed checkpoint: "
                           f"{end.why_no_checkpoint()}")
    raise RestoreError(f"no {METADATA_FILE_NAME} in {url}: not a completed checkpoint or savepoint; "
                       f"pass the chk-<n> or savepoint-... directory")


def latest_restore_point(job_directory: str, finished_runs: bool = False) -> str | None:
    """The directory a new run of the job in `job_directory` resumes from: the savepoint its
    `_restore_point` records if no completed `chk-<n>` is newer, else the newest `chk-<n>`;
    None if it has neither. The final checkpoint a FINISHED run kept (`_job_end`) is not
    resumed from, so it counts only with `finished_runs` (to read or restore it by choice)."""
    url = filesystem.normalize(job_directory)
    end = None if finished_runs else read_job_end(url)
    floor = end.kept_checkpoint if end is not None and end.finished_with_state else -1
    completed = [(checkpoint_id_of(name), child) for name, child in subdirectories(url)
                 if checkpoint_id_of(name) is not None and checkpoint_id_of(name) > floor
                 and filesystem.exists(filesystem.join(child, METADATA_FILE_NAME))]
    newest = max(completed, default=None)
    point = read_restore_point(url)
    if point is not None and point.checkpoint_id <= floor:
        point = None
    if point is not None and (newest is None or point.checkpoint_id > newest[0]):
        return filesystem.normalize(point.path)
    return newest[1] if newest is not None else None


__all__ = ["CheckpointStorage", "CheckpointStorageLocation", "resolve_restore_path", "latest_restore_point",
           "checkpoint_id_of", "subdirectories", "is_directory", "METADATA_FILE_NAME",
           "SHARED_DIR", "TASK_OWNED_DIR", "ID_COUNTER_FILE"]
