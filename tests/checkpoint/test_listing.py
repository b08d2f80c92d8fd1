"""`streamsnap checkpoints PATH`: completed checkpoints, and torn ones flagged, never completed."""

from __future__ import annotations

import pytest

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.listing import CheckpointCondition, list_checkpoints
from streamsnap.checkpoint.metadata import CheckpointMetadata, OperatorState, write_metadata
from streamsnap.checkpoint.storage import CheckpointStorage
from streamsnap.runtime.events import CheckpointType


def completed(storage, checkpoint_id):
    location = storage.initialize_location(checkpoint_id)
    metadata = CheckpointMetadata(storage.job_id, checkpoint_id, CheckpointType.CHECKPOINT, 10.0, 11.0,
                                  {"a": OperatorState("a", 1, 1, {}), "b": OperatorState("b", 1, 1, {})})
    write_metadata(location.url, metadata)
    return location


@pytest.fixture
def job(tmp_path):
    storage = CheckpointStorage(str(tmp_path / "ckpt"), "jobA")
    completed(storage, 1)
    storage.initialize_location(2)  # in flight when the job died
    torn = completed(storage, 3)
    data = filesystem.read_bytes(torn.metadata_url)
    filesystem.write_atomic(torn.metadata_url, data[: len(data) // 2])
    completed(storage, 4)
    wrong = completed(storage, 5)
    filesystem.write_atomic(wrong.metadata_url, filesystem.read_bytes(completed(storage, 6).metadata_url))
    filesystem.write_atomic(storage.id_counter_url, b"{}")
    return storage


def test_job_directory(job):
    found = list_checkpoints(job.job_directory)
    assert [(s.checkpoint_id, s.status) for s in found] == [
        (1, CheckpointCondition.COMPLETED), (2, CheckpointCondition.INCOMPLETE), (3, CheckpointCondition.CORRUPT),
        (4, CheckpointCondition.COMPLETED), (5, CheckpointCondition.CORRUPT), (6, CheckpointCondition.COMPLETED)]
    assert [s.checkpoint_id for s in found if s.is_completed] == [1, 4, 6]
    first = found[0]
    assert (first.job_id, first.num_operators, first.state_size, first.completed_at) == ("jobA", 2, 0, 11.0)
    assert first.triggered_at == 10.0
    assert first.status == "COMPLETED" and found[1].status == "INCOMPLETE" and f"{found[2].status}" == "CORRUPT"
    assert first.checkpoint_type is CheckpointType.CHECKPOINT and first.problem is None
    assert "never completed" in found[1].problem
    assert "truncated" in found[2].problem or "checksum" in found[2].problem
    assert "describes checkpoint 6" in found[4].problem
    assert all(s.num_operators is None for s in found if not s.is_completed)


def test_root_directory_with_several_jobs(job, tmp_path):
    other = CheckpointStorage(str(tmp_path / "ckpt"), "jobB")
    completed(other, 9)
    found = list_checkpoints(str(tmp_path / "ckpt"))
    assert [(s.job_id, s.checkpoint_id) for s in found if s.is_completed] == [
        ("jobA", 1), ("jobA", 4), ("jobA", 6), ("jobB", 9)]


def test_single_checkpoint_directory(job):
    [summary] = list_checkpoints(job.checkpoint_directory(4))
    assert summary.is_completed and summary.job_id == "jobA" and summary.checkpoint_id == 4
    [torn] = list_checkpoints(job.checkpoint_directory(3))
    assert not torn.is_completed


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        list_checkpoints(str(tmp_path / "nothing"))


def test_empty_directory(tmp_path):
    assert list_checkpoints(str(tmp_path)) == []


def test_cli_lists_completed_and_flags_unusable(job):
    """The contract `streamsnap checkpoints PATH` relies on (status, completed_at, ...)."""
    typer_testing = pytest.importorskip("typer.testing")
    from streamsnap.cli import app

    result = typer_testing.CliRunner().invoke(app, ["checkpoints", job.job_directory], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert result.output.count("COMPLETED") == 3
    assert "INCOMPLETE" in result.output and "CORRUPT" in result.output
    assert "3 incomplete or corrupt checkpoint(s) are not usable for restore" in result.output


def test_an_unaligned_checkpoint_lists_its_in_flight_data(tmp_path):
    from streamsnap.checkpoint.handles import FileHandle, OperatorSubtaskState

    storage = CheckpointStorage(str(tmp_path / "ckpt"), "jobU")
    location = storage.initialize_location(2)
    state = {0: OperatorSubtaskState(channel=(FileHandle("sum-channels-a", 1500),)),
             1: OperatorSubtaskState(channel=(FileHandle("sum-channels-b", 500),))}
    write_metadata(location.url, CheckpointMetadata("jobU", 2, CheckpointType.CHECKPOINT, 1.0, 2.0,
                                                    {"sum": OperatorState("sum", 2, 8, state)},
                                                    {"sum#0": (True, 1500, 0), "sum#1": (True, 500, 0),
                                                     "events#0": (False, 0, 0), "events#1": (True, 0, 700)}))
    aligned = completed(storage, 3)
    [unaligned, plain] = list_checkpoints(storage.job_directory)
    assert (unaligned.checkpoint_id, unaligned.in_flight_size, unaligned.state_size) == (2, 2000, 2000)
    assert plain.in_flight_size == 0 and aligned is not None
    assert (unaligned.unaligned_subtasks, unaligned.num_subtasks, unaligned.in_flight_processed) == (3, 4, 700)
    assert plain.num_subtasks == 0
    typer_testing = pytest.importorskip("typer.testing")
    from streamsnap.cli import _size, app

    out = typer_testing.CliRunner().invoke(app, ["checkpoints", storage.job_directory], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "in flight" in out.output and _size(2000) in out.output
    assert "3/4 subtasks unaligned" in out.output


def test_cli_into_a_pipe_prints_every_value_in_full(job):
    """Without a terminal (a pipe, a file, CI) nothing is cut to "chec…": tab-separated rows."""
    typer_testing = pytest.importorskip("typer.testing")
    from streamsnap.cli import app

    result = typer_testing.CliRunner().invoke(app, ["checkpoints", job.job_directory], env={"COLUMNS": "40"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    lines = result.output.splitlines()
    assert lines[0].split("\t") == ["job", "checkpoint", "type", "status", "completed at", "state size",
                                    "checkpointed", "in flight", "operators", "path"]
    rows = [line.split("\t") for line in lines[1:] if "\t" in line]
    assert [(r[0], r[1], r[3]) for r in rows][:3] == [("jobA", "1", "COMPLETED"), ("jobA", "2", "INCOMPLETE"),
                                                     ("jobA", "3", "CORRUPT")]
    assert all(r[-1].startswith(job.job_directory) and len(r) == 10 for r in rows)
