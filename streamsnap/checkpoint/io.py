"""Where the checkpoint coordinator's file I/O runs (Flink's ioExecutor).

Writing `_metadata`, deleting aborted or subsumed checkpoints and sweeping abandoned
directories may take seconds on object storage; done on the JobMaster's event loop, every
acknowledgement would wait behind them. The coordinator stays sans-I/O about *when* these run:
it hands work to a `CheckpointIO` and, for a write whose outcome matters, gets a continuation
back on its own thread.

`ThreadedIO` runs the work on one I/O thread in submission order, so the order of effects is
the coordinator's: a checkpoint's directory deleted by an abort is deleted after its
`_metadata` write that was already under way, never before. `InlineIO` runs everything at once
on the caller's thread: the deterministic choice for tests and for one-shot tools.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Callable, Protocol, TypeVar

from streamsnap.checkpoint import filesystem

logger = logging.getLogger(__name__)

T = TypeVar("T")
Continuation = Callable[[object, BaseException | None], None]


class CheckpointIO(Protocol):
    def run(self, work: Callable[[], T], then: Continuation) -> None:
        """Run `work` on the I/O side, then `then(result, error)` on the coordinator's thread."""

    def delete(self, url: str, recursive: bool = False) -> None:
        """Delete a file or directory on the I/O side; a failure is logged, not raised."""


def _delete_logged(url: str, recursive: bool) -> None:
    try:
        filesystem.delete(url, recursive=recursive)
    except Exception as exc:  # storage backends raise more than OSError; nothing waits on this
        logger.warning("could not delete %s: %r; delete it by hand", url, exc)


class InlineIO:
    """Runs work and continuation at once, on the calling thread."""

    def run(self, work: Callable[[], T], then: Continuation) -> None:
        try:
            result = work()
        except Exception as exc:  # handed to the continuation, which decides
            then(None, exc)
            return
        then(result, None)

    def delete(self, url: str, recursive: bool = False) -> None:
        _delete_logged(url, recursive)


class ThreadedIO:
    """One I/O thread, FIFO; continuations are posted to the owner's event loop."""

    def __init__(self, post: Callable[[Callable[[], None]], None], name: str = "checkpoint-io"):
        self._post = post
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def run(self, work: Callable[[], T], then: Continuation) -> None:
        def done(future: concurrent.futures.Future) -> None:
            error = future.exception()
            result = None if error is not None else future.result()
            self._post(lambda: then(result, error))
        self._pool.submit(work).add_done_callback(done)

    def delete(self, url: str, recursive: bool = False) -> None:
        self._pool.submit(_delete_logged, url, recursive)

    def shutdown(self, wait: bool = True) -> None:
        """Finish what was submitted (deletions included) and stop the thread."""
        self._pool.shutdown(wait=wait)


__all__ = ["CheckpointIO", "InlineIO", "ThreadedIO"]
