"""Retrying checkpoint-storage calls that an object store answered with "slow down" or a 5xx.

Object stores throttle (S3's 503 SlowDown) and fail transiently (500 InternalError, a reset
connection); the client library (botocore under s3fs) retries a few times, and what still
escapes would fail the checkpoint — and, past `tolerable_failures`, the job — for a condition
that clears within seconds. So calls on an object store go through `call`: a transient error is
retried with exponential backoff and jitter, and every retry is counted, per process and per
thread (a task's asynchronous checkpoint part reports the retries of its own thread).

Which errors are transient is decided here only (`is_transient`): throttling and server
errors are; a full disk (ENOSPC), a denied access or a missing file are not — retrying them
would only make the checkpoint fail later.
"""

from __future__ import annotations

import errno
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# errno values s3fs gives throttling and server errors after its own retries (s3fs/errors.py:
# SlowDown/503/ServiceUnavailable -> EBUSY, InternalError/500 -> EREMOTEIO), and those of
# connections that broke or timed out.
TRANSIENT_ERRNOS = frozenset({errno.EBUSY, errno.EREMOTEIO, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET,
                              errno.ECONNABORTED, errno.EPIPE})
THROTTLING_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                              "TooManyRequests", "RequestTimeout", "InternalError", "ServiceUnavailable"})


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` tries in all; the n-th retry waits first_backoff * multiplier**(n-1) seconds,
    at most max_backoff, each wait shortened by up to `jitter` of it (so retrying writers spread)."""

    attempts: int = 6
    first_backoff: float = 0.1
    max_backoff: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.25

    def backoff(self, retry: int, rng: random.Random) -> float:
        wait = min(self.max_backoff, self.first_backoff * self.multiplier ** (retry - 1))
        return wait * (1.0 - self.jitter * rng.random())


DEFAULT_POLICY = RetryPolicy()


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` is throttling or a server/connection error worth retrying."""
    response = getattr(exc, "response", None)     # botocore's ClientError, untranslated
    if isinstance(response, dict):
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0
        code = (response.get("Error") or {}).get("Code", "")
        return code in THROTTLING_CODES or int(status) >= 500 or int(status) == 429
    if isinstance(exc, (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
                        NotADirectoryError)):
        return False
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS


class RetryCounter:
    """Retries made in this process: in all, and by the calling thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._total = 0
        self._local = threading.local()

    def add(self) -> None:
        with self._lock:
            self._total += 1
        self._local.count = getattr(self._local, "count", 0) + 1

    @property
    def total(self) -> int:
        return self._total

    def of_this_thread(self) -> int:
        return getattr(self._local, "count", 0)


COUNTER = RetryCounter()


def call(work: Callable[[], T], what: str, policy: RetryPolicy | None = None,
         counter: RetryCounter | None = None, sleep: Callable[[float], None] = time.sleep,
         rng: random.Random | None = None) -> T:
    """`work()`, retried on transient errors; the last error is raised once `policy.attempts`
    tries failed (and at once for an error that is not transient). Defaults: DEFAULT_POLICY,
    COUNTER."""
    policy, counter, rng = policy or DEFAULT_POLICY, counter or COUNTER, rng or random.Random()
    for attempt in range(1, policy.attempts + 1):
        try:
            return work()
        except Exception as exc:
            if attempt == policy.attempts or not is_transient(exc):
                raise
            wait = policy.backoff(attempt, rng)
            counter.add()
            log.info("checkpoint storage: %s failed transiently (%s: %s); retry %d of %d in %.2f s",
                     what, type(exc).__name__, exc, attempt, policy.attempts - 1, wait)
            sleep(wait)
    raise AssertionError("unreachable: the last attempt returns or raises")


__all__ = ["RetryPolicy", "DEFAULT_POLICY", "RetryCounter", "COUNTER", "call", "is_transient"]
