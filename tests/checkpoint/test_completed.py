"""Completed checkpoints: retention, subsumption, shared files, shutdown policy."""

from __future__ import annotations

import pytest

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.completed import (CheckpointProperties, CompletedCheckpoint, CompletedCheckpointStore,
                                             discard_on_shutdown)
from streamsnap.checkpoint.handles import FileHandle, KeyGroupsStateHandle, OperatorSubtaskState
from streamsnap.checkpoint.metadata import CheckpointMetadata, OperatorState, write_metadata
from streamsnap.checkpoint.shared_registry import SharedStateRegistry
from streamsnap.checkpoint.storage import CheckpointStorage
from streamsnap.cluster.status import JobStatus
from streamsnap.runtime.events import CheckpointType

from .conftest import write_file


@pytest.fixture
def storage(tmp_path):
    return CheckpointStorage(str(tmp_path / "ckpt"), "job")


def make_checkpoint(storage, checkpoint_id, shared=(), properties=CheckpointProperties()):
    """A completed checkpoint with one exclusive file and the given shared files (names in shared/)."""
    location = storage.initialize_location(checkpoint_id)
    own = write_file(location.url, "own")
    shared_handles = tuple(FileHandle(f"../shared/{name}", 3) for name in shared)
    for name in shared:
        if not filesystem.exists(filesystem.join(storage.shared_directory, name)):
            write_file(storage.shared_directory, name, b"sst")
    state = OperatorSubtaskState(keyed=(KeyGroupsStateHandle(own, 0, 127, {}, shared_handles),))
    metadata = CheckpointMetadata("job", checkpoint_id, properties.checkpoint_type, 1.0, 2.0,
                                  {"op": OperatorState("op", 1, 128, {0: state})})
    write_metadata(location.url, metadata)
    return CompletedCheckpoint(metadata, location, properties)


def shared_exists(storage, name):
    return filesystem.exists(filesystem.join(storage.shared_directory, name))


def test_keeps_num_retained_and_deletes_subsumed(storage):
    store = CompletedCheckpointStore(num_retained=2)
    checkpoints = [make_checkpoint(storage, i) for i in (1, 2, 3)]
    assert store.add_checkpoint(checkpoints[0]) == []
    assert store.add_checkpoint(checkpoints[1]) == []
    assert store.add_checkpoint(checkpoints[2]) == [checkpoints[0]]
    assert [c.checkpoint_id for c in store.all()] == [2, 3]
    assert store.latest() is checkpoints[2]
    assert not filesystem.exists(checkpoints[0].external_pointer)
    assert all(filesystem.exists(u) for c in checkpoints[1:] for u in c.exclusive_files())


def test_shared_files_live_as_long_as_a_retained_checkpoint_references_them(storage):
    store = CompletedCheckpointStore(num_retained=1, registry=SharedStateRegistry(storage.job_directory))
    store.add_checkpoint(make_checkpoint(storage, 1, shared=("a", "b")))
    store.add_checkpoint(make_checkpoint(storage, 2, shared=("b", "c")))  # incremental: reuses b
    assert not shared_exists(storage, "a")
    assert shared_exists(storage, "b") and shared_exists(storage, "c")
    store.add_checkpoint(make_checkpoint(storage, 3, shared=()))
    assert not shared_exists(storage, "b") and not shared_exists(storage, "c")


def test_savepoints_are_not_retained(storage):
    store = CompletedCheckpointStore()
    savepoint = make_checkpoint(storage, 1, properties=CheckpointProperties.for_savepoint())
    with pytest.raises(ValueError, match="savepoints are not used for failover"):
        store.add_checkpoint(savepoint)


def test_duplicate_id_refused(storage):
    store = CompletedCheckpointStore(num_retained=3)
    checkpoint = make_checkpoint(storage, 1)
    store.add_checkpoint(checkpoint)
    with pytest.raises(ValueError, match="already in the store"):
        store.add_checkpoint(checkpoint)


def test_restored_snapshot_is_used_but_never_deleted(storage):
    restored = make_checkpoint(storage, 7, shared=("old",),
                               properties=CheckpointProperties.for_restored(CheckpointType.SAVEPOINT))
    store = CompletedCheckpointStore(num_retained=1, registry=SharedStateRegistry(storage.job_directory))
    store.add_checkpoint(restored)
    assert store.latest() is restored
    store.add_checkpoint(make_checkpoint(storage, 8, shared=("old",)))  # builds on the restored file
    store.add_checkpoint(make_checkpoint(storage, 9))
    assert filesystem.exists(restored.location.metadata_url)
    assert shared_exists(storage, "old")
    restored.discard(store.registry)
    assert filesystem.exists(restored.location.metadata_url)


def test_properties():
    checkpoint = CheckpointProperties.for_checkpoint(is_periodic=True)
    assert checkpoint.is_periodic and checkpoint.discard_subsumed and not checkpoint.forced
    savepoint = CheckpointProperties.for_savepoint()
    assert savepoint.is_savepoint and savepoint.forced and not savepoint.discard_subsumed
    assert not savepoint.is_terminating
    assert CheckpointProperties.for_savepoint(terminate=True).checkpoint_type is CheckpointType.TERMINATING_SAVEPOINT
    assert not CheckpointProperties.for_restored(CheckpointType.CHECKPOINT).owned


def test_completed_checkpoint_accessors(storage):
    checkpoint = make_checkpoint(storage, 4, shared=("s",))
    assert checkpoint.checkpoint_id == 4 and checkpoint.job_id == "job"
    assert checkpoint.duration == 1.0 and checkpoint.state_size == len(b"state-bytes")
    assert checkpoint.exclusive_files() == [filesystem.join(checkpoint.external_pointer, "own")]
    assert checkpoint.shared_files() == [filesystem.join(storage.shared_directory, "s")]


@pytest.mark.parametrize("status,retention,discard", [
    (JobStatus.CANCELED, "delete_on_cancellation", True),
    (JobStatus.CANCELED, "retain_on_cancellation", False),
    (JobStatus.FINISHED, "delete_on_cancellation", True),
    (JobStatus.FINISHED, "retain_on_cancellation", True),
    (JobStatus.CANCELED, "retain_on_finish", False),
    (JobStatus.FAILED, "retain_on_finish", False),
    (JobStatus.FAILED, "delete_on_cancellation", False),
    (JobStatus.FAILED, "retain_on_cancellation", False),
    (JobStatus.RESTARTING, "delete_on_cancellation", False),
])
def test_shutdown_policy(storage, status, retention, discard):
    assert discard_on_shutdown(status, retention) is discard
    store = CompletedCheckpointStore(num_retained=2)
    checkpoints = [make_checkpoint(storage, i) for i in (1, 2)]
    for checkpoint in checkpoints:
        store.add_checkpoint(checkpoint)
    deleted = store.shutdown(status, retention)
    assert (deleted == checkpoints) is discard
    assert all(filesystem.exists(c.external_pointer) is not discard for c in checkpoints)
    assert store.all() == []


def test_a_finished_job_with_retain_on_finish_keeps_only_its_final_checkpoint(storage):
    assert not discard_on_shutdown(JobStatus.FINISHED, "retain_on_finish")
    store = CompletedCheckpointStore(num_retained=3)
    checkpoints = [make_checkpoint(storage, i) for i in (1, 2, 3)]
    for checkpoint in checkpoints:
        store.add_checkpoint(checkpoint)
    assert store.shutdown(JobStatus.FINISHED, "retain_on_finish") == checkpoints[:2]
    assert [filesystem.exists(c.external_pointer) for c in checkpoints] == [False, False, True]
    assert store.all() == []


def test_unknown_retention_policy():
    with pytest.raises(ValueError, match="retention must be one of"):
        discard_on_shutdown(JobStatus.CANCELED, "keep")
