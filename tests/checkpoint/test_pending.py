"""PendingCheckpoint: acknowledgement results, operator state, finalize, abort."""

from __future__ import annotations

import pytest

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.completed import CheckpointProperties
from streamsnap.checkpoint.handles import FileHandle, KeyGroupsStateHandle, OperatorSubtaskState
from streamsnap.checkpoint.messages import AcknowledgeCheckpoint, CheckpointMetrics
from streamsnap.checkpoint.metadata import read_metadata
from streamsnap.checkpoint.pending import OperatorInfo, PendingCheckpoint, PendingStatus
from streamsnap.checkpoint.reasons import AcknowledgeResult, CheckpointFailureReason as R
from streamsnap.checkpoint.shared_registry import SharedStateRegistry
from streamsnap.checkpoint.storage import CheckpointStorage
from streamsnap.graph.ids import ExecutionAttemptId
from streamsnap.runtime.events import CheckpointOptions

from .conftest import OPERATORS, attempts, file_exists, keyed_state, write_file


@pytest.fixture
def storage(tmp_path):
    return CheckpointStorage(str(tmp_path / "ckpt"), "job")


def make_pending(storage, registry=None, operators=OPERATORS):
    location = storage.initialize_location(1)
    _, tasks = attempts()
    return PendingCheckpoint("job", 1, 1700000000.0, CheckpointProperties.for_checkpoint(),
                             CheckpointOptions(target_location=location.url), location, tasks, operators, registry)


def ack(pending, attempt, **state):
    state = state or {("source" if attempt.vertex_id == "src" else "sum"):
                      keyed_state(pending.location.url, f"{attempt.vertex_id}-{attempt.index}")}
    return pending.acknowledge_task(AcknowledgeCheckpoint(attempt, 1, state, CheckpointMetrics(sync_duration=0.5)),
                                    ack_timestamp=1700000001.0)


def test_acknowledgement_results(storage):
    pending = make_pending(storage)
    _, tasks = attempts()
    assert ack(pending, tasks[0]) is AcknowledgeResult.SUCCESS
    assert ack(pending, tasks[0]) is AcknowledgeResult.DUPLICATE
    assert ack(pending, ExecutionAttemptId("src", 0, 1)) is AcknowledgeResult.UNKNOWN
    assert not pending.is_fully_acknowledged
    for attempt in tasks[1:]:
        assert ack(pending, attempt) is AcknowledgeResult.SUCCESS
    assert pending.is_fully_acknowledged
    assert pending.acknowledged == frozenset(tasks) and pending.not_yet_acknowledged == frozenset()
    assert pending.acknowledgements[tasks[0]].metrics.sync_duration == 0.5
    pending.abort(R.CHECKPOINT_EXPIRED)
    assert ack(pending, tasks[0]) is AcknowledgeResult.DISCARDED
    assert not pending.is_fully_acknowledged


def test_needs_tasks_to_acknowledge(storage):
    with pytest.raises(ValueError):
        PendingCheckpoint("job", 1, 0.0, CheckpointProperties(), CheckpointOptions(),
                          storage.initialize_location(1), [], OPERATORS)


def test_finalize_writes_metadata_with_every_operator(storage):
    pending = make_pending(storage)
    for attempt in attempts()[1]:
        ack(pending, attempt)
    completed = pending.finalize(1700000002.0)
    assert pending.status is PendingStatus.COMPLETED and pending.is_disposed
    metadata = read_metadata(pending.location.metadata_url)
    assert metadata == completed.metadata
    assert set(metadata.operators) == {"source", "sum", "out"}
    assert set(metadata.operators["out"].subtask_states) == {0, 1}
    assert metadata.operators["out"].state_size == 0
    assert metadata.operators["sum"].subtask_states[1].keyed[0].file.path == "sum-1"
    assert completed.duration == 2.0
    assert pending.abort(R.CHECKPOINT_EXPIRED) == []  # completed: abort does nothing
    assert filesystem.exists(pending.location.metadata_url)


def test_finalize_refuses_incomplete_or_aborted(storage):
    pending = make_pending(storage)
    ack(pending, attempts()[1][0])
    with pytest.raises(RuntimeError, match="still waiting"):
        pending.finalize(0.0)
    pending.abort(R.CHECKPOINT_DECLINED)
    with pytest.raises(RuntimeError, match="already aborted"):
        pending.finalize(0.0)
    assert pending.failure_reason is R.CHECKPOINT_DECLINED


def test_absolute_paths_inside_the_location_become_relative(storage):
    pending = make_pending(storage)
    src = attempts()[1][0]
    handle = write_file(pending.location.url, "abs")
    absolute = KeyGroupsStateHandle(FileHandle(filesystem.join(pending.location.url, "abs"), handle.size), 0, 63)
    assert pending.acknowledge_task(AcknowledgeCheckpoint(src, 1, {"source": OperatorSubtaskState(keyed=(absolute,))}))
    state = pending.operator_states()["source"].subtask_states[0]
    assert state.keyed[0].file.path == "abs"


def test_state_for_operators_of_another_vertex_is_dropped(storage, caplog):
    pending = make_pending(storage)
    src = attempts()[1][0]
    stray = keyed_state(pending.location.url, "stray")
    result = ack(pending, src, source=keyed_state(pending.location.url, "ok"), sum=stray)
    assert result is AcknowledgeResult.SUCCESS
    assert "not chained into vertex src" in caplog.text
    assert not file_exists(pending.location.url, "stray")
    assert pending.operator_states()["sum"].subtask_states == {}


def test_abort_deletes_acknowledged_state_and_directory(storage):
    registry = SharedStateRegistry(storage.job_directory)
    old_shared = write_file(storage.shared_directory, "old")
    new_shared = write_file(storage.shared_directory, "new")
    registry.register(0, [filesystem.join(storage.shared_directory, "old")])  # a retained checkpoint's file
    pending = make_pending(storage, registry)
    src = attempts()[1][0]
    handle = KeyGroupsStateHandle(write_file(pending.location.url, "own"), 0, 63, {},
                                  (FileHandle("../shared/old", old_shared.size), FileHandle("../shared/new", new_shared.size)))
    pending.acknowledge_task(AcknowledgeCheckpoint(src, 1, {"source": OperatorSubtaskState(keyed=(handle,))}))
    deleted = pending.abort(R.CHECKPOINT_EXPIRED)
    assert pending.status is PendingStatus.ABORTED
    assert filesystem.join(pending.location.url, "own") in deleted
    assert not filesystem.exists(pending.location.url)
    assert file_exists(storage.shared_directory, "old")      # still referenced
    assert not file_exists(storage.shared_directory, "new")  # uploaded for this checkpoint only


def test_abort_without_registry_keeps_shared_files(storage):
    write_file(storage.shared_directory, "s")
    pending = make_pending(storage)
    src = attempts()[1][0]
    handle = KeyGroupsStateHandle(write_file(pending.location.url, "own"), 0, 63, {}, (FileHandle("../shared/s", 11),))
    pending.acknowledge_task(AcknowledgeCheckpoint(src, 1, {"source": OperatorSubtaskState(keyed=(handle,))}))
    pending.abort(R.CHECKPOINT_EXPIRED)
    assert file_exists(storage.shared_directory, "s")


def test_abort_respects_keep(storage):
    pending = make_pending(storage)
    outside = write_file(storage.task_owned_directory, "t")
    handle = KeyGroupsStateHandle(FileHandle("../taskowned/t", outside.size), 0, 63)
    pending.acknowledge_task(AcknowledgeCheckpoint(attempts()[1][0], 1, {"source": OperatorSubtaskState(keyed=(handle,))}))
    pending.abort(R.CHECKPOINT_EXPIRED, keep=lambda url: "/taskowned/" in url)
    assert file_exists(storage.task_owned_directory, "t")


def test_operator_info_groups_chained_operators(storage):
    pending = make_pending(storage, operators={"a": OperatorInfo("src", 2, 8), "b": OperatorInfo("src", 2, 8),
                                               "c": OperatorInfo("sum", 2, 8)})
    src = attempts()[1][1]
    pending.acknowledge_task(AcknowledgeCheckpoint(src, 1, {"a": keyed_state(pending.location.url, "a")}))
    states = pending.operator_states()
    assert states["a"].subtask_states[1].state_size > 0
    assert states["b"].subtask_states[1] == OperatorSubtaskState()
    assert states["c"].subtask_states == {}
    assert pending.state_size == states["a"].state_size
