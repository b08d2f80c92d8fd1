"""The lifecycle of a state snapshot's asynchronous part, shared by the state backends.

A backend's `snapshot()` returns one of these after the synchronous part. `run()` may execute
on another thread and writes the file; `discard()` may be called from any thread when the
checkpoint is abandoned (declined, expired, subsumed, task cancelled) — before, during or after
`run()` — and must leave nothing behind. A lock orders the two so each case is handled once.
"""

from __future__ import annotations

import re
import threading
from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from streamsnap.checkpoint import filesystem
from streamsnap.state.errors import StateError

H = TypeVar("H")

CREATED, RUNNING, DONE, FAILED, DISCARDED = "created", "running", "done", "failed", "discarded"


def safe_file_prefix(operator_uid: str) -> str:
    """A file-name-safe prefix derived from an operator uid (for humans browsing storage)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", operator_uid)[:80] or "operator"


class SnapshotDiscardedError(StateError):
    """`run()` was called on, or interrupted by, a discarded snapshot."""


class StateSnapshot(ABC, Generic[H]):
    """Asynchronous part of a snapshot: `run()` once, `discard()` any time."""

    def __init__(self, checkpoint_id: int, location: str, what: str):
        self.checkpoint_id = checkpoint_id
        self.location = location
        self._what = what
        self._lock = threading.Lock()
        self._status = CREATED
        self._discard_requested = False
        self._url: str | None = None   # set by `_write` before it creates the file
        # Task-local recovery: where the local copies of the written files are (deleted with them).
        self._local_store = None

    @property
    def status(self) -> str:
        return self._status

    @abstractmethod
    def _write(self) -> H | None:
        """Serialize and write; set `self._url` before creating the file."""

    def _release(self) -> None:
        """Drop references to captured state (called once, after run or on discard)."""

    def _written_urls(self) -> list[str]:
        """Files this snapshot created and must delete when discarded or failed: `_url` by
        default; a snapshot writing several files (incremental) overrides this."""
        return [self._url] if self._url is not None else []

    def _urls_to_delete(self) -> list[str]:
        """The written files and their task-local copies (`streamsnap.state.local_recovery`)."""
        urls = self._written_urls()
        if self._local_store is None:
            return urls
        local = (self._local_store.local_path(url) for url in urls)
        return [*urls, *(filesystem.normalize(path) for path in local if path is not None)]

    def _delete_written(self) -> None:
        for url in self._urls_to_delete():
            filesystem.delete(url)

    def _check_not_discarded(self) -> None:
        if self._discard_requested:
            raise SnapshotDiscardedError(
                f"{self._what} of checkpoint {self.checkpoint_id} was discarded while it was "
                f"being written")

    def run(self) -> H | None:
        """Write the snapshot; returns its handle, or None when there was no state."""
        with self._lock:
            if self._status == DISCARDED:
                raise SnapshotDiscardedError(
                    f"{self._what} of checkpoint {self.checkpoint_id} cannot run: it was "
                    f"discarded")
            if self._status != CREATED:
                raise StateError(f"{self._what} of checkpoint {self.checkpoint_id} cannot run "
                                 f"twice (it is {self._status})")
            self._status = RUNNING
        try:
            handle = self._write()
        except BaseException as error:
            self._delete_after_failure(error)
            with self._lock:
                self._status = DISCARDED if self._discard_requested else FAILED
            raise
        finally:
            self._release()
        with self._lock:
            if not self._discard_requested:
                self._status = DONE
                return handle
            self._status = DISCARDED
        self._delete_written()
        raise SnapshotDiscardedError(f"{self._what} of checkpoint {self.checkpoint_id} was "
                                     f"discarded while it was being written")

    def discard(self) -> None:
        """Abandon the snapshot and delete its file (now, or when a running `run()` ends)."""
        with self._lock:
            previous = self._status
            self._discard_requested = True
            if previous != RUNNING:
                self._status = DISCARDED
        if previous == CREATED:
            self._release()
        elif previous == DONE:
            self._delete_written()

    def _delete_after_failure(self, error: BaseException) -> None:
        for url in self._urls_to_delete():
            try:
                filesystem.delete(url)
            except Exception as cleanup_error:
                error.add_note(f"also failed to delete the partial snapshot file {url}: "
                               f"{cleanup_error!r}")
