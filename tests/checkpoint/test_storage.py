"""Checkpoint storage layout and restore path resolution."""

from __future__ import annotations

import random

import pytest

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.storage import CheckpointStorage, resolve_restore_path
from streamsnap.errors import RestoreError


@pytest.fixture
def storage(tmp_path):
    return CheckpointStorage(str(tmp_path / "ckpt"), "a1b2c3d4e5")


def test_layout(storage, tmp_path):
    location = storage.initialize_location(3)
    root = tmp_path / "ckpt" / "a1b2c3d4e5"
    assert location.url == filesystem.normalize(str(root / "chk-3"))
    assert location.checkpoint_id == 3 and not location.is_savepoint
    assert location.metadata_url == location.url + "/_metadata"
    for name in ("chk-3", "shared", "taskowned"):
        assert (root / name).is_dir()
    assert storage.shared_directory.endswith("/a1b2c3d4e5/shared")
    assert storage.existing_checkpoint_ids() == [3]


def test_construction_does_no_io(tmp_path):
    CheckpointStorage(str(tmp_path / "ckpt"), "job")
    assert not (tmp_path / "ckpt").exists()


def test_job_id_must_be_a_plain_name(tmp_path):
    with pytest.raises(ValueError, match="job_id"):
        CheckpointStorage(str(tmp_path), "a/b")


def test_completed_checkpoint_directory_is_never_reused(storage):
    location = storage.initialize_location(1)
    filesystem.write_atomic(location.metadata_url, b"x")
    with pytest.raises(FileExistsError, match="already holds a completed checkpoint"):
        storage.initialize_location(1)


def test_savepoint_location(storage, tmp_path):
    location = storage.initialize_savepoint_location(str(tmp_path / "sp"), 7, random.Random(1))
    name = location.url.rsplit("/", 1)[-1]
    assert location.url.startswith(filesystem.normalize(str(tmp_path / "sp")) + "/")
    assert name.startswith("savepoint-a1b2c3d4e5-7-") and len(name.split("-")[-1]) == 12
    assert location.is_savepoint and filesystem.exists(location.url)
    other = storage.initialize_savepoint_location(str(tmp_path / "sp"), 7, random.Random(2))
    assert other.url != location.url


def test_savepoint_names_keep_jobs_with_similar_names_apart(tmp_path):
    """The whole job id names a savepoint: two jobs whose ids share a long prefix (as ids made
    from similar job names do) never get look-alike savepoints, and the name splits back."""
    first = CheckpointStorage(str(tmp_path / "ckpt"), "word-count-eu-1a2b3c4d")
    second = CheckpointStorage(str(tmp_path / "ckpt"), "word-count-us-5e6f7a8b")
    a = first.initialize_savepoint_location(str(tmp_path / "sp"), 3).url.rsplit("/", 1)[-1]
    b = second.initialize_savepoint_location(str(tmp_path / "sp"), 3).url.rsplit("/", 1)[-1]
    assert a.startswith("savepoint-word-count-eu-1a2b3c4d-3-") and b.startswith("savepoint-word-count-us-5e6f7a8b-3-")
    assert a.removeprefix("savepoint-").rsplit("-", 2)[:2] == ["word-count-eu-1a2b3c4d", "3"]
    assert first.is_location_of(str(tmp_path / "sp" / a), 3) and not second.is_location_of(str(tmp_path / "sp" / a), 3)


def test_discard_location(storage):
    location = storage.initialize_location(2)
    filesystem.write_atomic(filesystem.join(location.url, "f"), b"data")
    storage.discard_location(location)
    assert not filesystem.exists(location.url)
    assert storage.existing_checkpoint_ids() == []


def completed(storage, checkpoint_id):
    location = storage.initialize_location(checkpoint_id)
    filesystem.write_atomic(location.metadata_url, b"metadata")
    return location


@pytest.mark.parametrize("suffix", ["", "/", "/_metadata"])
def test_resolve_restore_path_of_a_checkpoint(storage, suffix):
    location = completed(storage, 4)
    path = location.url[len("file://"):] + suffix
    assert resolve_restore_path(path) == (location.metadata_url, location.url)
    assert storage.resolve_restore_path(location.url + suffix) == (location.metadata_url, location.url)


def test_resolve_restore_path_of_a_savepoint(storage, tmp_path):
    location = storage.initialize_savepoint_location(str(tmp_path / "sp"), 1)
    filesystem.write_atomic(location.metadata_url, b"metadata")
    assert resolve_restore_path(location.url) == (location.metadata_url, location.url)


def test_resolve_restore_path_without_metadata(storage):
    location = storage.initialize_location(5)
    with pytest.raises(RestoreError) as info:
        resolve_restore_path(location.url)
    message = str(info.value)
    assert f"no _metadata in {location.url}: not a completed checkpoint or savepoint" in message
    assert "pass the chk-<n> or savepoint-... directory" in message


def test_resolve_restore_path_of_a_job_directory_is_its_latest_restore_point(storage, tmp_path):
    from streamsnap.checkpoint.restore_point import RestorePoint, write_restore_point
    from streamsnap.runtime.events import CheckpointType

    completed(storage, 2)
    completed(storage, 10)
    storage.initialize_location(11)  # incomplete: never chosen
    metadata_url, base = resolve_restore_path(storage.job_directory)
    assert base == storage.checkpoint_directory(10) and metadata_url == base + "/_metadata"
    # A stop-with-savepoint recorded as the restore point is chosen while no chk-<n> is newer.
    savepoint = storage.initialize_savepoint_location(str(tmp_path / "sp"), 12)
    write_restore_point(storage.job_directory, RestorePoint(12, savepoint.url, CheckpointType.TERMINATING_SAVEPOINT))
    assert resolve_restore_path(storage.job_directory)[1] == savepoint.url
    completed(storage, 13)
    assert resolve_restore_path(storage.job_directory)[1] == storage.checkpoint_directory(13)


def test_resolve_restore_path_of_an_empty_job_directory(storage):
    storage.initialize_location(1)   # never completed
    with pytest.raises(RestoreError, match="not a completed checkpoint or savepoint"):
        resolve_restore_path(storage.job_directory)


def test_resolve_restore_path_missing_or_wrong_file(storage, tmp_path):
    with pytest.raises(RestoreError, match="does not exist"):
        resolve_restore_path(str(tmp_path / "nope"))
    other = tmp_path / "file.txt"
    other.write_text("x")
    with pytest.raises(RestoreError, match="not a _metadata file"):
        resolve_restore_path(str(other))


def test_unreferenced_old_shared_files_are_listed_for_the_sweep(storage):
    import os
    import time

    from streamsnap.checkpoint import filesystem

    storage.initialize_location(1)
    shared = storage.shared_directory
    names = ("referenced.sst", "orphan.sst", "young.sst")
    for name in names:
        with filesystem.open_write(filesystem.join(shared, name)) as out:
            out.write(b"sst")
    local = filesystem.user_path(shared)
    old = time.time() - 60
    for name in ("referenced.sst", "orphan.sst"):
        os.utime(os.path.join(local, name), (old, old))
    referenced = frozenset({filesystem.normalize(filesystem.join(shared, "referenced.sst"))})
    # An upload never acknowledged is swept; a referenced one and one written after the call stay.
    stray = storage.unreferenced_shared_files(referenced, time.time() - 30)
    assert [u.rsplit("/", 1)[-1] for u in stray] == ["orphan.sst"]
