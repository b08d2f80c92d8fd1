"""The `_metadata` file: round trip, atomic write, and every way it can be damaged."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.handles import (FileHandle, KeyGroupsStateHandle, OperatorStateHandle,
                                           OperatorSubtaskState)
from streamsnap.checkpoint.metadata import (CheckpointMetadata, OperatorState, encode_metadata, read_metadata,
                                            write_metadata)
from streamsnap.errors import RestoreError
from streamsnap.runtime.events import CheckpointType


def sample() -> CheckpointMetadata:
    keyed = KeyGroupsStateHandle(FileHandle("sum-0", 40), 0, 63, {1: (0, 20), 5: (20, 20)},
                                 (FileHandle("../shared/sst-1", 100),))
    operator = OperatorStateHandle(FileHandle("source-0", 12), {"offsets": ("split", ((0, 6), (6, 6)))})
    return CheckpointMetadata(
        "job", 9, CheckpointType.CHECKPOINT, 1700000000.25, 1700000001.5,
        {"sum": OperatorState("sum", 2, 128, {0: OperatorSubtaskState(keyed=(keyed,)), 1: OperatorSubtaskState()}),
         "source": OperatorState("source", 1, 1, {0: OperatorSubtaskState(operator=(operator,))}),
         "sink": OperatorState("sink", 2, 128, {0: OperatorSubtaskState(), 1: OperatorSubtaskState()})})


@pytest.fixture
def location(tmp_path) -> str:
    url = filesystem.normalize(str(tmp_path / "chk-9"))
    filesystem.makedirs(url)
    return url


def test_round_trip_lists_every_operator(location):
    metadata = sample()
    url = write_metadata(location, metadata)
    assert url == location + "/_metadata"
    back = read_metadata(url)
    assert back == metadata
    assert set(back.operators) == {"sum", "source", "sink"}
    assert back.operators["sink"].state_size == 0
    assert back.state_size == 40 + 12
    assert back.operators["sum"].subtask_states[0].keyed[0].offsets == {1: (0, 20), 5: (20, 20)}


def test_values_are_immutable():
    metadata = sample()
    with pytest.raises(TypeError):
        metadata.operators["x"] = None
    with pytest.raises(TypeError):
        metadata.operators["sum"].subtask_states[3] = OperatorSubtaskState()


def test_header_carries_version_and_checksum(location):
    write_metadata(location, sample())
    data = filesystem.read_bytes(location + "/_metadata")
    header, body = data.split(b"\n", 1)
    assert header == b"streamsnap-checkpoint v1 sha256=" + hashlib.sha256(body).hexdigest().encode()
    assert encode_metadata(sample()) == data  # canonical: same metadata, same bytes


def test_write_is_atomic(location, monkeypatch, tmp_path):
    def crash(*args, **kwargs):
        raise OSError("driver died before the rename")

    monkeypatch.setattr(filesystem.os, "replace", crash)  # local files: fsync, then os.replace
    with pytest.raises(OSError):
        write_metadata(location, sample())
    monkeypatch.undo()
    # Readers see no _metadata at all, never a partial one.
    with pytest.raises(RestoreError, match="is missing"):
        read_metadata(location + "/_metadata")


def test_no_temporary_files_left(location, tmp_path):
    write_metadata(location, sample())
    assert sorted(p.name for p in (tmp_path / "chk-9").iterdir()) == ["_metadata"]


def damage(location, transform):
    url = location + "/_metadata"
    filesystem.write_atomic(url, transform(filesystem.read_bytes(url)))
    return url


@pytest.mark.parametrize("offset", [60, 100, -2])
def test_flipped_byte_is_detected(location, offset):
    write_metadata(location, sample())

    def flip(data):
        data = bytearray(data)
        data[offset] ^= 0x20
        return bytes(data)

    url = damage(location, flip)
    with pytest.raises(RestoreError) as info:
        read_metadata(url)
    assert url in str(info.value)
    assert "checksum mismatch" in str(info.value) or "malformed" in str(info.value)


@pytest.mark.parametrize("keep", [0, 10, 80, 200, -1])
def test_truncated_file_is_detected(location, keep):
    write_metadata(location, sample())
    url = damage(location, lambda data: data[:keep])
    with pytest.raises(RestoreError, match="truncated|checksum mismatch") as info:
        read_metadata(url)
    assert url in str(info.value)


def test_missing_file_is_detected(location):
    with pytest.raises(RestoreError, match=r"_metadata is missing"):
        read_metadata(location + "/_metadata")


def test_unsupported_version(location):
    write_metadata(location, sample())
    url = damage(location, lambda data: data.replace(b" v1 ", b" v7 ", 1))
    with pytest.raises(RestoreError, match="format v7 is not supported; this streamsnap reads v1"):
        read_metadata(url)


def test_foreign_file(location):
    url = location + "/_metadata"
    filesystem.write_atomic(url, b"PK\x03\x04 some zip file\n...")
    with pytest.raises(RestoreError, match="not a streamsnap checkpoint metadata file"):
        read_metadata(url)


def test_valid_checksum_over_invalid_content(location):
    body = b'{"job_id": "x"}'
    url = location + "/_metadata"
    filesystem.write_atomic(url, b"streamsnap-checkpoint v1 sha256=" + hashlib.sha256(body).hexdigest().encode()
                            + b"\n" + body)
    with pytest.raises(RestoreError, match="malformed content"):
        read_metadata(url)


def test_relative_paths_make_a_savepoint_relocatable(location, tmp_path):
    filesystem.write_atomic(location + "/sum-0", b"x" * 40)
    write_metadata(location, sample())
    moved = tmp_path / "moved" / "savepoint-x"
    shutil.move(str(tmp_path / "chk-9"), str(moved))
    metadata = read_metadata(str(moved / "_metadata"))
    handle = metadata.operators["sum"].subtask_states[0].keyed[0]
    assert filesystem.read_bytes(filesystem.join(str(moved), handle.file.path)) == b"x" * 40


def test_job_graph_and_subtask_figures_round_trip_and_are_optional(location):
    import dataclasses

    from streamsnap.checkpoint.messages import CheckpointMetrics

    graph = {"name": "my job", "vertices": [{"id": "sum", "name": "sum -> sink", "parallelism": 2, "inputs": ["source"],
                                             "operators": [{"uid": "sum", "name": "sum"}, {"uid": "sink", "name": "out"}]}]}
    metrics = tuple(CheckpointMetrics(0.01, 0.2, 0.03, 0.004, 100, 0).to_wire())
    full = dataclasses.replace(sample(), job_graph=graph, subtask_metrics={"sum#1": (2, 1700000001.25, metrics)})
    back = read_metadata(write_metadata(location, full))
    assert back == full and back.job_graph == graph
    assert CheckpointMetrics.from_wire(list(back.subtask_metrics["sum#1"][2])).async_duration == 0.2
    # Files without them (earlier versions) read as before.
    assert "job_graph" not in sample().to_wire() and "subtask_metrics" not in sample().to_wire()
    assert CheckpointMetadata.from_wire(sample().to_wire()).job_graph is None
