"""Checkpoint ids: strictly increasing for the lifetime of a job, also across restarts.

An id names a directory (`chk-<n>`) and orders checkpoints (a newer one subsumes older ones,
a task's barrier handler aborts an older alignment on a newer barrier), so an id must never be
handed out twice. With a `path` the next id is persisted (atomically) *before* an id is
returned, so a driver that crashes right after cannot repeat it when it comes back.
"""

from __future__ import annotations

import json
import logging

from streamsnap.checkpoint import filesystem

logger = logging.getLogger(__name__)


class CheckpointIdCounter:
    """Hands out checkpoint ids; `current` is the next id that will be handed out."""

    def __init__(self, path: str | None = None, start: int = 1):
        if start < 1:
            raise ValueError(f"checkpoint ids start at 1 or later, got start={start}")
        self._path = filesystem.normalize(path) if path else None
        self._next = start
        if self._path is not None:
            self._next = max(start, self._load())

    @property
    def path(self) -> str | None:
        return self._path

    @property
    def current(self) -> int:
        return self._next

    def get_and_increment(self) -> int:
        checkpoint_id = self._next
        self._store(checkpoint_id + 1)
        self._next = checkpoint_id + 1
        return checkpoint_id

    def set_count(self, next_id: int) -> None:
        """Make `next_id` the next id handed out, unless that would move the counter backwards.

        Used on restore (continue after the restored checkpoint's id): ids already handed out
        may name directories of this job and must not be reused.
        """
        if next_id > self._next:
            self._store(next_id)
            self._next = next_id

    def _load(self) -> int:
        try:
            data = json.loads(filesystem.read_bytes(self._path).decode("utf-8"))
            value = int(data["next_checkpoint_id"])
        except FileNotFoundError:
            return 1
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("checkpoint id counter %s is unreadable (%s); continuing from the "
                           "checkpoint directories found instead", self._path, exc)
            return 1
        return value

    def _store(self, next_id: int) -> None:
        if self._path is not None:
            filesystem.write_atomic(self._path, json.dumps({"next_checkpoint_id": next_id}).encode())

    def __repr__(self) -> str:
        return f"CheckpointIdCounter(next={self._next}, path={self._path!r})"


__all__ = ["CheckpointIdCounter"]
