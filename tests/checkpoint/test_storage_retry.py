"""Retries of checkpoint-storage calls: which errors are transient, the backoff, the count — and,
at the fsspec layer, a store that answers "slow down" a few times before it works."""

from __future__ import annotations

import errno
import random

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from streamsnap.checkpoint import filesystem, storage_retry
from streamsnap.checkpoint.metadata import read_metadata, write_metadata
from streamsnap.checkpoint.storage import CheckpointStorage
from tests.checkpoint.test_metadata import sample


class ClientError(Exception):
    """botocore's ClientError as the retry logic sees it (duck-typed: `.response`)."""

    def __init__(self, code: str, status: int):
        super().__init__(code)
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


@pytest.mark.parametrize("error, transient", [
    (OSError(errno.EBUSY, "SlowDown"), True),                 # s3fs: 503 / SlowDown
    (OSError(errno.EREMOTEIO, "InternalError"), True),        # s3fs: 500
    (ConnectionResetError("reset by peer"), True),
    (TimeoutError("read timed out"), True),
    (ClientError("SlowDown", 503), True),
    (ClientError("InternalError", 500), True),
    (ClientError("Whatever", 502), True),
    (ClientError("TooManyRequests", 429), True),
    (ClientError("AccessDenied", 403), False),
    (OSError(errno.ENOSPC, "No space left on device"), False),
    (OSError(errno.EROFS, "Read-only file system"), False),
    (PermissionError("denied"), False),
    (FileNotFoundError("gone"), False),
    (ValueError("a bug"), False),
])
def test_only_throttling_server_and_connection_errors_are_transient(error, transient):
    assert storage_retry.is_transient(error) is transient


def test_transient_errors_are_retried_with_growing_backoff_and_counted():
    counter, waits, calls = storage_retry.RetryCounter(), [], []

    def work():
        calls.append(1)
        if len(calls) <= 3:
            raise OSError(errno.EBUSY, "Please reduce your request rate (SlowDown)")
        return "done"
    policy = storage_retry.RetryPolicy(attempts=5, first_backoff=0.1, max_backoff=0.3, jitter=0.0)
    assert storage_retry.call(work, "write x", policy, counter, waits.append) == "done"
    assert len(calls) == 4 and waits == [0.1, 0.2, 0.3]          # doubling, capped
    assert counter.total == 3 and counter.of_this_thread() == 3


def test_jitter_only_shortens_the_wait():
    policy = storage_retry.RetryPolicy(first_backoff=1.0, jitter=0.5)
    waits = [policy.backoff(1, random.Random(seed)) for seed in range(50)]
    assert all(0.5 <= w <= 1.0 for w in waits) and len(set(waits)) > 1


def test_the_last_error_is_raised_when_attempts_run_out():
    counter = storage_retry.RetryCounter()

    def work():
        raise OSError(errno.EREMOTEIO, "InternalError")
    with pytest.raises(OSError, match="InternalError"):
        storage_retry.call(work, "read y", storage_retry.RetryPolicy(attempts=3), counter, lambda _: None)
    assert counter.total == 2


def test_a_full_disk_fails_at_once():
    counter, calls = storage_retry.RetryCounter(), []

    def work():
        calls.append(1)
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError, match="No space"):
        storage_retry.call(work, "write z", counter=counter, sleep=lambda _: None)
    assert len(calls) == 1 and counter.total == 0


class FlakyStore(MemoryFileSystem):
    """An in-memory object store (no atomic rename) that answers the next `failures` calls of
    every data operation with a throttling error, as s3fs raises it after its own retries."""

    protocol = "flakystore"
    root_marker = "/"
    failures = 0
    answered: list = []

    def _maybe_fail(self, op):
        if FlakyStore.failures > 0:
            FlakyStore.failures -= 1
            FlakyStore.answered.append(op)
            raise OSError(errno.EBUSY, "Please reduce your request rate. (SlowDown)")

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        self._maybe_fail("put")
        return super().pipe_file(path, value, mode=mode, **kwargs)

    def cat_file(self, path, start=None, end=None, **kwargs):
        self._maybe_fail("get")
        return super().cat_file(path, start=start, end=end, **kwargs)

    def ls(self, path, detail=True, **kwargs):
        self._maybe_fail("list")
        return super().ls(path, detail=detail, **kwargs)


@pytest.fixture
def flaky(monkeypatch):
    fsspec.register_implementation("flakystore", FlakyStore, clobber=True)
    FlakyStore.store.clear()
    FlakyStore.pseudo_dirs.clear()
    FlakyStore.pseudo_dirs.append("")
    FlakyStore.answered = []
    # Short waits: the backoff's logic is tested above.
    monkeypatch.setattr(storage_retry, "DEFAULT_POLICY", storage_retry.RetryPolicy(first_backoff=0.001))
    yield FlakyStore
    FlakyStore.failures = 0


def test_metadata_on_a_throttling_store_is_written_once_and_read_after_retries(flaky):
    location = "flakystore://bucket/job/chk-9"
    before = storage_retry.COUNTER.total
    flaky.failures = 2
    write_metadata(location, sample())
    flaky.failures = 2
    assert read_metadata(location + "/_metadata") == sample()
    assert flaky.answered == ["put", "put", "get", "get"]
    assert storage_retry.COUNTER.total - before == 4
    # Written once: completed is "it exists", and nothing replaces it.
    with pytest.raises(FileExistsError, match="written only once"):
        write_metadata(location, sample())
    # No temp file + rename on a store without atomic rename.
    assert [p.rsplit("/", 1)[-1] for p in flaky.store if "chk-9" in p] == ["_metadata"]


def test_listing_completed_checkpoints_survives_throttling(flaky):
    storage = CheckpointStorage("flakystore://bucket/ckpt", "job")
    for checkpoint_id in (1, 2, 3):
        location = storage.initialize_location(checkpoint_id)
        if checkpoint_id != 2:
            write_metadata(location.url, sample())
    flaky.failures = 3
    assert storage.completed_ids() == [1, 3]
    assert "list" in flaky.answered


def test_a_lost_answer_to_a_conditional_create_is_told_apart_from_another_writer(flaky, monkeypatch):
    """The PUT landed but its answer was a 503: the retry finds the object with our bytes."""
    original = FlakyStore.pipe_file

    def lands_then_fails(self, path, value, mode="overwrite", **kwargs):
        original(self, path, value, mode=mode, **kwargs)
        if not flaky.answered:
            flaky.answered.append("put")
            raise OSError(errno.EBUSY, "SlowDown")
    monkeypatch.setattr(FlakyStore, "pipe_file", lands_then_fails)
    assert filesystem.create_exclusive("flakystore://bucket/owner", b"me") is True
    assert filesystem.create_exclusive("flakystore://bucket/owner", b"someone else") is False
