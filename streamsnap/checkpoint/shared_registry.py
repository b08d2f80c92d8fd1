"""Reference counting of shared state files (Flink's SharedStateRegistry).

An incremental snapshot (RocksDB) uploads only new files; later checkpoints reference files
uploaded by earlier ones. Such a file may be deleted only when no retained checkpoint
references it any more. The completed-checkpoint store registers every checkpoint it retains
and unregisters the ones it drops; the registry deletes what becomes unreferenced.

A pending checkpoint registers the shared files of each acknowledgement as it arrives (so a
checkpoint completing meanwhile cannot delete a file it reuses) and unregisters them when it is
aborted; completing registers them again (idempotent). After a driver restart the registry is
rebuilt by the store re-adding the recovered checkpoints.

Files outside `owned_directory` (when given) are only counted, never deleted: they belong to
someone else, e.g. to a retained checkpoint of a previous job this one was restored from.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from streamsnap.checkpoint import filesystem

logger = logging.getLogger(__name__)


class SharedStateRegistry:
    def __init__(self, owned_directory: str | None = None,
                 delete: Callable[[str], None] = filesystem.delete):
        self._owned_prefix = (filesystem.normalize(owned_directory).rstrip("/") + "/"
                              if owned_directory else None)
        self._delete = delete
        self._references: dict[str, set[int]] = {}
        self._by_checkpoint: dict[int, set[str]] = {}

    def register(self, checkpoint_id: int, urls: Iterable[str]) -> None:
        """Record that `checkpoint_id` references `urls` (idempotent per checkpoint)."""
        urls = {filesystem.normalize(u) for u in urls}
        self._by_checkpoint.setdefault(checkpoint_id, set()).update(urls)
        for url in urls:
            self._references.setdefault(url, set()).add(checkpoint_id)

    def unregister(self, checkpoint_id: int) -> list[str]:
        """Drop the references of `checkpoint_id`; deletes and returns files nobody references."""
        deleted = []
        for url in sorted(self._by_checkpoint.pop(checkpoint_id, ())):
            holders = self._references.get(url)
            if holders is None:
                continue
            holders.discard(checkpoint_id)
            if holders:
                continue
            del self._references[url]
            if self.owns(url):
                try:
                    self._delete(url)
                    deleted.append(url)
                except OSError as exc:
                    logger.warning("could not delete unreferenced shared state file %s: %s", url, exc)
        return deleted

    def owns(self, url: str) -> bool:
        return self._owned_prefix is None or filesystem.normalize(url).startswith(self._owned_prefix)

    def is_registered(self, url: str) -> bool:
        return filesystem.normalize(url) in self._references

    def reference_count(self, url: str) -> int:
        return len(self._references.get(filesystem.normalize(url), ()))

    def registered_files(self) -> frozenset[str]:
        return frozenset(self._references)

    def __len__(self) -> int:
        return len(self._references)


__all__ = ["SharedStateRegistry"]
