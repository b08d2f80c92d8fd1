"""Task-local recovery (Flink's TaskLocalStateStore): a second copy of each keyed snapshot on
the task's own disk, so that a subtask restarting on the same host restores without fetching
from the checkpoint storage.

Why: after a failure every subtask restores the latest completed checkpoint; with remote
storage (S3, HDFS) that is a download of the whole state, which dominates recovery time. A
subtask that lands where it ran before finds its files on local disk and only verifies them.

Layout, one per host and job, mirroring the checkpoint storage below the job directory::

    <root>/<job id>/chk-<n>/<file name>     private files of checkpoint n (heap snapshots,
                                             RocksDB full snapshots and incremental bundles,
                                             changelog manifests)
    <root>/<job id>/shared/<file name>      SST files of incremental RocksDB checkpoints; the
                                             changelog's segments and materializations

`<root>` is `StreamEnvironment(local_recovery_dir=...)`, else `streamsnap-local-state` under the
executor's scratch directory (the first entry of `SPARK_LOCAL_DIRS`, which Spark deletes when
the application ends), else under the system temp directory. File names in checkpoint storage
are unique (random suffixes), so a remote file's local copy is found from its name and its
directory (`chk-<n>` or `shared`) alone, whoever wrote it.

A local copy is only a cache: it is written beside the remote file (never instead of it), a
failure to write it is logged and counted but does not fail the checkpoint, and on restore it
is used only when it has the size the checkpoint recorded and its checksums verify; otherwise
the remote file is read (and the fallback counted). Operator (non-keyed) state is small and
stays remote-only.

Retention: when checkpoint n completes, the local `chk-<m>` directories with m < n are deleted
(every subtask restores the latest completed checkpoint, so none is read again), and the local
shared files this task's snapshots referenced for older checkpoints but not for n (nor for a
newer one still pending, nor *pinned*: a changelog's materializations, which later checkpoints
build on although an older checkpoint's cut took them, stay pinned until the changelog releases
them). When a task
finishes with its job, the job's local directory goes; after a cancelled or failed job the
driver deletes it in local mode, and on a cluster Spark deletes its scratch directory when the
application ends (a `local_recovery_dir` of the user's keeps such leftovers until deleted).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.storage import SHARED_DIR, checkpoint_id_of
from streamsnap.errors import ConfigurationError

log = logging.getLogger(__name__)

ROOT_NAME = "streamsnap-local-state"
_TEMP_MARK = ".inprogress-"


def default_root() -> str:
    """`streamsnap-local-state` under the executor's scratch directory (Spark sets
    SPARK_LOCAL_DIRS for its Python workers), else under the system temp directory."""
    spark_dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    first = next((d for d in spark_dirs.split(",") if d.strip()), None)
    return os.path.join(first.strip() if first else tempfile.gettempdir(), ROOT_NAME)


def check_directory_option(value, owner: str = "StreamEnvironment.local_recovery_dir") -> str | None:
    """The validated local directory option: None or a non-empty local path (not a URL)."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ConfigurationError(f"{owner} must be a local directory path or None, got {value!r}")
    text = str(value)
    if "://" in text:
        raise ConfigurationError(f"{owner} must be a path on the task's local disk, not a URL "
                                 f"({text!r}); local copies are read with plain file I/O")
    return os.path.abspath(os.path.expanduser(text))


@dataclass
class RestoreCounters:
    """What restores read, per source: files and bytes from local copies and from remote
    storage, and local copies that were missing or rejected (size or checksum)."""

    local_files: int = 0
    local_bytes: int = 0
    remote_files: int = 0
    remote_bytes: int = 0
    local_missing: int = 0
    local_rejected: int = 0

    def to_wire(self) -> dict:
        return dict(vars(self))


def summarize_restores(per_subtask: dict[str, dict]) -> dict:
    """The restore counts the subtasks reported (name -> `RestoreCounters.to_wire()`), summed,
    with the per-subtask counts under "subtasks": what one recovery read, and from where."""
    total = RestoreCounters()
    for counts in per_subtask.values():
        for name, value in counts.items():
            setattr(total, name, getattr(total, name) + value)
    return {**total.to_wire(), "subtasks": {name: dict(c) for name, c in per_subtask.items()}}


def summarize_stores(store_metrics: list[dict], restores: dict) -> dict:
    """The job's local stores summed (copies written, failures to write one) beside what the
    last restore read (`summarize_restores` without the per-subtask part)."""
    totals = {"written_files": 0, "written_bytes": 0, "write_failures": 0}
    for store in store_metrics:
        for name in totals:
            totals[name] += store.get(name, 0)
    return {**totals, "restored": {k: v for k, v in restores.items() if k != "subtasks"}}


class LocalRecoveryStore:
    """The local copies of one task's keyed snapshots (one store per subtask; several
    subtasks of a host share the directory). Thread-safe: snapshots write on the asynchronous
    checkpoint thread, restores and notifications run on the task thread."""

    def __init__(self, root: str, job_id: str):
        if not job_id or "/" in job_id:
            raise ValueError(f"job_id must be a non-empty name without '/', got {job_id!r}")
        self.root = os.path.abspath(root)
        self.job_id = job_id
        self.job_directory = os.path.join(self.root, job_id)
        self._lock = threading.Lock()
        self.restored = RestoreCounters()
        self.written_files = 0
        self.written_bytes = 0
        self.write_failures = 0
        # Local shared files (paths) the snapshots of each checkpoint reference.
        self._shared_refs: dict[int, set[str]] = {}
        # Local shared files pinned under a name (a changelog's materialization) until released,
        # and the released ones (deleted at the next completion unless referenced).
        self._pinned: dict[str, set[str]] = {}
        self._released: set[str] = set()
        self._confirmed = -1

    def __repr__(self) -> str:
        return f"LocalRecoveryStore({self.job_directory!r})"

    # -- where ------------------------------------------------------------------------------

    def local_path(self, url: str) -> str | None:
        """Where the local copy of the checkpoint file `url` lives, or None when `url` is not a
        file of this job's checkpoint storage (savepoints, other jobs' checkpoints)."""
        parts = filesystem.normalize(url).rstrip("/").rsplit("/", 3)
        if len(parts) != 4:
            return None
        _, job, directory, name = parts
        if job != self.job_id or not name or name.startswith("."):
            return None
        if directory != SHARED_DIR and checkpoint_id_of(directory) is None:
            return None
        return os.path.join(self.job_directory, directory, name)

    # -- writing ----------------------------------------------------------------------------

    def open_write(self, url: str) -> "DuplicatingWriter":
        """A writer of the checkpoint file `url` that also keeps a local copy (when `url` has a
        local place); use it as a context manager."""
        return DuplicatingWriter(self, url, self.local_path(url))

    def keep_file(self, source: str, url: str, *, referenced_by: int | None = None,
                  pinned_by: str | None = None) -> str | None:
        """Keep the local file `source` (an immutable RocksDB SST file) as the local copy of
        `url`: a hard link, or a copy across file systems. An existing copy is kept. Returns the
        local path (None when `url` has no local place or keeping it failed, which is logged).
        `referenced_by` / `pinned_by`: see `reference` / `pin`."""
        target = self.local_path(url)
        if target is None:
            return None
        if not _same_size(target, source):
            temp = f"{target}{_TEMP_MARK}{uuid.uuid4().hex[:8]}"
            try:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                try:
                    os.link(source, temp)
                except OSError as e:
                    if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                        raise
                    shutil.copyfile(source, temp)
                os.replace(temp, target)
            except OSError as e:
                self._write_failed(target, e)
                _remove_file(temp)
                return None
            with self._lock:
                self.written_files += 1
                self.written_bytes += os.path.getsize(target)
        if referenced_by is not None:
            self.reference(referenced_by, [target])
        if pinned_by is not None:
            self.pin(pinned_by, [target])
        return target

    def keep_bytes(self, data: bytes, url: str) -> str | None:
        """Keep `data`, the verified content of the checkpoint file `url` read from storage
        during a restore, as its local copy (temp file, then rename). Returns the local path
        (None when `url` has no local place or writing failed, which is logged and counted)."""
        target = self.local_path(url)
        if target is None:
            return None
        temp = f"{target}{_TEMP_MARK}{uuid.uuid4().hex[:8]}"
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(temp, "wb") as f:
                f.write(data)
            os.replace(temp, target)
        except OSError as e:
            self._write_failed(target, e)
            _remove_file(temp)
            return None
        self._written(len(data))
        return target

    def _written(self, size: int) -> None:
        with self._lock:
            self.written_files += 1
            self.written_bytes += size

    def _write_failed(self, path: str, error: BaseException) -> None:
        with self._lock:
            self.write_failures += 1
        log.warning("could not keep a local copy at %s (%r); restores will read that file from "
                    "checkpoint storage", path, error)

    # -- restoring --------------------------------------------------------------------------

    def find(self, url: str, size: int) -> str | None:
        """The local copy of `url` when it exists with `size` bytes; None otherwise, counted as
        missing or rejected (the caller then reads `url` from checkpoint storage)."""
        path = self.local_path(url)
        if path is None:
            return None
        try:
            actual = os.path.getsize(path)
        except FileNotFoundError:
            self.count_missing()
            return None
        if actual != size:
            log.warning("local copy %s has %d bytes, the checkpoint recorded %d; reading %s",
                        path, actual, size, url)
            self.reject(path)
            return None
        return path

    def read(self, url: str, size: int, verify: Callable[[bytes], bool]) -> bytes | None:
        """The bytes of the local copy of `url` when it has `size` bytes and `verify` accepts
        them (counted as read locally); None otherwise — missing, or rejected and deleted —
        and the caller reads `url` from checkpoint storage (and counts that, `count_remote`)."""
        path = self.find(url, size)
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            log.warning("cannot read the local copy %s of %s (%r); reading the remote file", path, url, e)
            self.reject(path)
            return None
        if len(data) != size or not verify(data):
            log.warning("the local copy %s of %s is corrupt (checksum mismatch); reading the remote "
                        "file", path, url)
            self.reject(path)
            return None
        self.count_local(size)
        return data

    def count_missing(self) -> None:
        with self._lock:
            self.restored.local_missing += 1

    def reject(self, path: str) -> None:
        """A local copy failed verification: count it and delete it, so that the next snapshot
        referencing the file makes a good copy again."""
        with self._lock:
            self.restored.local_rejected += 1
        _remove_file(path)

    def count_local(self, size: int) -> None:
        with self._lock:
            self.restored.local_files += 1
            self.restored.local_bytes += size

    def count_remote(self, size: int) -> None:
        with self._lock:
            self.restored.remote_files += 1
            self.restored.remote_bytes += size

    def reference(self, checkpoint_id: int, paths: Iterable[str]) -> None:
        """Local shared files that the snapshot of `checkpoint_id` (or the checkpoint a backend
        restored and builds on) references: retention keeps them while it is the latest."""
        with self._lock:
            self._shared_refs.setdefault(checkpoint_id, set()).update(paths)

    def pin(self, name: str, paths: Iterable[str]) -> None:
        """Keep local shared files through retention until `release(name)`: a changelog's
        materialization, which checkpoints build on for as long as the changelog uses it,
        whichever checkpoint's cut took it (a background one may finish after later checkpoints
        completed)."""
        with self._lock:
            self._pinned.setdefault(name, set()).update(paths)

    def release(self, names: Iterable[str]) -> None:
        """Unpin: the files go at the next completion unless a retained checkpoint or another
        pin references them."""
        with self._lock:
            for name in names:
                self._released |= self._pinned.pop(name, set())

    # -- retention --------------------------------------------------------------------------

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint `checkpoint_id` completed: delete the local copies of older checkpoints,
        keeping the shared files it references. Idempotent (every backend of the task calls it)."""
        with self._lock:
            if checkpoint_id <= self._confirmed:
                return
            self._confirmed = checkpoint_id
            doomed, self._released = self._released, set()
            for older in [i for i in self._shared_refs if i < checkpoint_id]:
                doomed |= self._shared_refs.pop(older)
            doomed -= set().union(*self._shared_refs.values(), *self._pinned.values())  # n's, pending, pinned
        for path in sorted(doomed):
            _remove_file(path)
        try:
            names = os.listdir(self.job_directory)
        except FileNotFoundError:
            return
        for name in names:
            older = checkpoint_id_of(name)
            if older is not None and older < checkpoint_id:
                remove_tree(os.path.join(self.job_directory, name))

    def release_job(self) -> None:
        """The job ended: delete its local directory on this host."""
        remove_tree(self.job_directory)

    # -- metrics ----------------------------------------------------------------------------

    def metrics(self) -> dict:
        with self._lock:
            return {"root": self.root, "restored": self.restored.to_wire(),
                    "written_files": self.written_files, "written_bytes": self.written_bytes,
                    "write_failures": self.write_failures}


class DuplicatingWriter:
    """Writes a checkpoint file to storage and, byte for byte, to its local copy. The local copy
    is written under a temporary name and renamed when the remote file is closed, so a killed
    task never leaves a partial copy under the final name. A local write error drops the copy
    (logged and counted); a remote one propagates and removes the local copy too."""

    def __init__(self, store: LocalRecoveryStore, url: str, local_path: str | None):
        self._store = store
        self._url = url
        self._local_path = local_path
        self._remote = None
        self._local = None
        self._temp: str | None = None
        self._size = 0

    def __enter__(self) -> "DuplicatingWriter":
        self._remote = filesystem.open_write(self._url)
        if self._local_path is not None:
            self._temp = f"{self._local_path}{_TEMP_MARK}{uuid.uuid4().hex[:8]}"
            try:
                os.makedirs(os.path.dirname(self._local_path), exist_ok=True)
                self._local = open(self._temp, "wb")
            except OSError as e:
                self._drop_local(e)
        return self

    def write(self, data) -> None:
        self._remote.write(data)
        self._size += len(data)
        if self._local is not None:
            try:
                self._local.write(data)
            except OSError as e:
                self._drop_local(e)

    def _drop_local(self, error: BaseException) -> None:
        if self._local is not None:
            try:
                self._local.close()
            except OSError as close_error:
                error.add_note(f"closing the local copy also failed: {close_error!r}")
            self._local = None
        if self._temp is not None:
            _remove_file(self._temp)
            self._store._write_failed(self._local_path, error)
            self._temp = None

    def __exit__(self, kind, value, traceback) -> None:
        try:
            self._remote.close()
        except BaseException:
            self._discard_local()
            raise
        if kind is not None:
            self._discard_local()
            return
        if self._local is None:
            return
        try:
            self._local.close()
            os.replace(self._temp, self._local_path)
        except OSError as e:
            self._local = None
            self._drop_local(e)
            return
        self._local = None
        self._store._written(self._size)

    def _discard_local(self) -> None:
        if self._local is not None:
            self._local.close()
            self._local = None
        if self._temp is not None:
            _remove_file(self._temp)
            self._temp = None

    @property
    def local_url(self) -> str | None:
        """The local copy as a file URL (for deletion with the remote file), or None."""
        return None if self._local_path is None else filesystem.normalize(self._local_path)


def open_write(url: str, store: LocalRecoveryStore | None):
    """Open the checkpoint file `url` for writing, with a local copy when `store` is given."""
    return filesystem.open_write(url) if store is None else store.open_write(url)


def _same_size(path: str, source: str) -> bool:
    """Whether `path` exists with the size of `source` (an existing copy to keep)."""
    try:
        return os.path.getsize(path) == os.path.getsize(source)
    except FileNotFoundError:
        return False


def _remove_file(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as e:
        log.warning("could not delete the local state copy %s: %r", path, e)


def remove_tree(path: str) -> None:
    """Delete a directory tree; another task of the host deleting it at the same time is fine."""
    def on_error(function, failed, info):
        if not isinstance(info[1], FileNotFoundError):
            log.warning("could not delete the local state copy %s: %r", failed, info[1])
    shutil.rmtree(path, onerror=on_error)


__all__ = ["DuplicatingWriter", "LocalRecoveryStore", "RestoreCounters", "ROOT_NAME",
           "check_directory_option", "default_root", "open_write", "remove_tree"]
