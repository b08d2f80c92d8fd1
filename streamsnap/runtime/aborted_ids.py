"""Checkpoint ids the coordinator aborted before they reached this task, kept bounded.

An abort can overtake the checkpoint's own trigger or barriers, which must then not start a
doomed snapshot. The ids only ever need to be known until the task moves past them: a task
snapshots checkpoints in increasing id order (triggers come in order, barrier handlers never go
back), so once it started or saw checkpoint *n*, no id below *n* can start here again and is
forgotten. What remains are ids ahead of the task, capped at `limit` (the oldest go first) for
a task that sees no checkpoint at all for a long time; forgetting one costs at most a snapshot
that the coordinator deletes as a late acknowledgement.
"""

from __future__ import annotations

__all__ = ["AbortedIds"]

DEFAULT_LIMIT = 1024


class AbortedIds:
    def __init__(self, limit: int = DEFAULT_LIMIT):
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        self._limit = limit
        self._ids: set[int] = set()
        self._floor = -1     # ids below this can no longer start here

    def add(self, checkpoint_id: int) -> None:
        if checkpoint_id < self._floor:
            return
        self._ids.add(checkpoint_id)
        if len(self._ids) > self._limit:
            self._ids.discard(min(self._ids))

    def discard(self, checkpoint_id: int) -> None:
        self._ids.discard(checkpoint_id)

    def forget_below(self, checkpoint_id: int) -> None:
        """The task reached `checkpoint_id`: older ids can no longer start here."""
        if checkpoint_id <= self._floor:
            return
        self._floor = checkpoint_id
        if self._ids:
            self._ids = {i for i in self._ids if i >= checkpoint_id}

    def __contains__(self, checkpoint_id: int) -> bool:
        return checkpoint_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def __bool__(self) -> bool:
        return bool(self._ids)
