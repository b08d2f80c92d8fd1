"""Task-local recovery: the local store on its own (real files in tmp dirs), then the keyed
state backends (heap, RocksDB incremental, RocksDB changelog) keeping local copies and restoring
from them — or from checkpoint storage when a copy is missing or corrupt — and retention of the
copies; then what only the changelog mode has (materializations, subsumed segments)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.handles import keyed_handle_from_wire
from streamsnap.errors import ConfigurationError
from streamsnap.state import KeyGroupRange
from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamsnap.state.backends.rocksdb.config import RocksDBConfig
from streamsnap.state.local_recovery import (LocalRecoveryStore, check_directory_option,
                                             default_root)

from .conftest import BACKEND_KINDS, CHANGELOG, CHANGELOG_KIND
from .test_rocksdb_backend import KEYS, dump, fill

JOB = "job-1"
MAX_P = 128
FULL = KeyGroupRange(0, MAX_P - 1)


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    """A job directory of the checkpoint storage layout (chk-<n>/ beside shared/)."""
    job = tmp_path / "ckpt" / JOB
    (job / "shared").mkdir(parents=True)
    return job


@pytest.fixture
def store(tmp_path: Path) -> LocalRecoveryStore:
    return LocalRecoveryStore(str(tmp_path / "local"), JOB)


def url_in(storage: Path, relative: str) -> str:
    return filesystem.normalize(str(storage / relative))


def local_files(store: LocalRecoveryStore) -> list[str]:
    root = Path(store.job_directory)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) \
        if root.exists() else []


# ---------------------------------------------------------------------------------------------
# the store


def test_a_checkpoint_file_has_a_local_place_a_savepoint_file_has_none(store, storage):
    assert store.local_path(url_in(storage, "chk-3/op-keyed-ab12")) == \
        os.path.join(store.job_directory, "chk-3", "op-keyed-ab12")
    assert store.local_path(url_in(storage, "shared/op-000012-cd34.sst")) == \
        os.path.join(store.job_directory, "shared", "op-000012-cd34.sst")
    other_job = filesystem.normalize(str(storage.parent / "job-2" / "chk-3" / "f"))
    savepoint = filesystem.normalize(str(storage.parent / "savepoint-job-1-3-abc" / "f"))
    assert store.local_path(other_job) is None
    assert store.local_path(savepoint) is None


def test_the_writer_keeps_a_byte_identical_copy_under_its_final_name_only_when_closed(store, storage):
    url = url_in(storage, "chk-1/file-a")
    local = Path(store.local_path(url))
    with store.open_write(url) as out:
        out.write(b"hello ")
        out.write(b"world")
        assert not local.exists()                  # a partial copy never has the final name
    assert local.read_bytes() == (storage / "chk-1" / "file-a").read_bytes() == b"hello world"
    assert (store.written_files, store.written_bytes, store.write_failures) == (1, 11, 0)
    assert local_files(store) == ["chk-1/file-a"]


def test_a_failed_snapshot_write_leaves_no_local_copy(store, storage):
    url = url_in(storage, "chk-1/file-a")
    with pytest.raises(RuntimeError, match="encoder broke"):
        with store.open_write(url) as out:
            out.write(b"half")
            raise RuntimeError("encoder broke")
    assert local_files(store) == []


def test_a_local_disk_failure_does_not_fail_the_remote_write(store, storage, caplog):
    Path(store.job_directory).mkdir(parents=True)
    Path(store.job_directory, "chk-1").write_text("a file where the directory should be")
    url = url_in(storage, "chk-1/file-a")
    with store.open_write(url) as out:
        out.write(b"state")
    assert (storage / "chk-1" / "file-a").read_bytes() == b"state"
    assert store.write_failures == 1 and store.written_files == 0
    assert "could not keep a local copy" in caplog.text


def test_find_counts_missing_and_wrong_size_copies(store, storage):
    url = url_in(storage, "chk-1/file-a")
    assert store.find(url, 5) is None
    with store.open_write(url) as out:
        out.write(b"state")
    assert store.find(url, 5) == store.local_path(url)
    assert store.find(url, 6) is None
    assert (store.restored.local_missing, store.restored.local_rejected) == (1, 1)


def test_retention_keeps_the_latest_checkpoint_and_the_shared_files_it_references(store, storage, tmp_path):
    sst = tmp_path / "000012.sst"
    sst.write_bytes(b"sst bytes")
    for checkpoint_id in (1, 2, 3):
        with store.open_write(url_in(storage, f"chk-{checkpoint_id}/file")) as out:
            out.write(b"x")
    kept = store.keep_file(str(sst), url_in(storage, "shared/a.sst"), referenced_by=1)
    store.keep_file(str(sst), url_in(storage, "shared/a.sst"), referenced_by=2)
    store.keep_file(str(sst), url_in(storage, "shared/b.sst"), referenced_by=1)
    assert os.path.samefile(kept, sst)             # a hard link, not a copy
    store.checkpoint_complete(2)
    assert local_files(store) == ["chk-2/file", "chk-3/file", "shared/a.sst"]
    store.checkpoint_complete(1)                   # late and lower: nothing changes
    assert local_files(store) == ["chk-2/file", "chk-3/file", "shared/a.sst"]
    store.checkpoint_complete(3)
    assert local_files(store) == ["chk-3/file"]
    store.release_job()
    assert not Path(store.job_directory).exists()


def test_pinned_files_outlive_completions_until_released(store, storage, tmp_path):
    sst = tmp_path / "000012.sst"
    sst.write_bytes(b"sst bytes")
    store.keep_file(str(sst), url_in(storage, "shared/m.sst"), pinned_by="materialization 1")
    store.keep_file(str(sst), url_in(storage, "shared/both.sst"), pinned_by="materialization 1",
                    referenced_by=3)
    store.checkpoint_complete(2)
    assert local_files(store) == ["shared/both.sst", "shared/m.sst"]
    store.release(["materialization 1"])
    store.checkpoint_complete(3)                    # released: gone unless 3 references it
    assert local_files(store) == ["shared/both.sst"]


def test_read_returns_a_verified_copy_and_deletes_a_rejected_one(store, storage):
    url = url_in(storage, "shared/segment")
    assert store.keep_bytes(b"segment", url) == store.local_path(url)
    assert store.read(url, 7, lambda data: data == b"segment") == b"segment"
    assert store.read(url, 7, lambda data: False) is None
    assert not os.path.exists(store.local_path(url))
    assert store.read(url, 7, lambda data: True) is None
    counts = store.restored
    assert (counts.local_files, counts.local_rejected, counts.local_missing) == (1, 1, 1)


def test_the_directory_option_is_checked_and_the_default_is_spark_scratch_space(monkeypatch, tmp_path):
    assert check_directory_option(None) is None
    assert check_directory_option(str(tmp_path)) == str(tmp_path)
    for bad in ("", 3, "s3://bucket/local"):
        with pytest.raises(ConfigurationError, match="local_recovery_dir"):
            check_directory_option(bad)
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path}/blockmgr-1,{tmp_path}/blockmgr-2")
    assert default_root() == f"{tmp_path}/blockmgr-1/streamsnap-local-state"
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    assert default_root().endswith("/streamsnap-local-state")


# ---------------------------------------------------------------------------------------------
# every backend


@pytest.fixture(params=[*BACKEND_KINDS, CHANGELOG_KIND])
def backend_kind(request) -> str:
    """Heap, RocksDB (incremental) and RocksDB in changelog mode."""
    return request.param


@pytest.fixture
def backends(new_backend):
    """Factory of backends of the test's kind with a local store (or none)."""
    def new(store: LocalRecoveryStore | None):
        backend = new_backend(FULL, MAX_P)
        backend.local_store = store
        return backend
    return new


def checkpoint(backend, storage: Path, checkpoint_id: int):
    (storage / f"chk-{checkpoint_id}").mkdir(exist_ok=True)
    location = url_in(storage, f"chk-{checkpoint_id}")
    handle = backend.snapshot(checkpoint_id, location).run()
    backend.notify_checkpoint_complete(checkpoint_id)
    return keyed_handle_from_wire(handle.to_wire()), location


def restored(new, store, handle, location) -> dict:
    backend = new(store)
    backend.restore([handle], location)
    return dump(backend)


@pytest.fixture
def taken(backends, storage, store):
    """A backend with state, checkpointed once with a local copy: (expected dump, handle,
    location)."""
    source = backends(store)
    fill(source, KEYS, timers=False)
    handle, location = checkpoint(source, storage, 1)
    return dump(source), handle, location


def stale_copies(store: LocalRecoveryStore, storage: Path) -> list[str]:
    """Local copies whose bytes differ from their file in checkpoint storage."""
    return [name for name in local_files(store)
            if Path(store.job_directory, name).read_bytes() != (storage / name).read_bytes()]


def fresh(store: LocalRecoveryStore) -> LocalRecoveryStore:
    """The store a restarted task has: same directory, zero counters."""
    return LocalRecoveryStore(store.root, store.job_id)


def test_a_restore_reads_only_local_copies(backends, store, taken):
    expected, handle, location = taken
    assert store.written_files >= 1 and store.write_failures == 0
    again = fresh(store)
    assert restored(backends, again, handle, location) == expected
    counts = again.restored
    assert counts.local_files >= 1 and counts.local_bytes > 0
    assert (counts.remote_files, counts.local_missing, counts.local_rejected) == (0, 0, 0)


def test_a_deleted_local_copy_is_read_from_checkpoint_storage(backends, store, taken):
    expected, handle, location = taken
    store.release_job()
    again = fresh(store)
    assert restored(backends, again, handle, location) == expected
    counts = again.restored
    assert counts.local_files == 0 and counts.remote_files >= 1 and counts.local_missing >= 1


def test_a_corrupted_local_copy_is_read_from_checkpoint_storage_and_replaced(backends, store, storage, taken):
    expected, handle, location = taken
    for relative in local_files(store):
        path = Path(store.job_directory, relative)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF                # same size, different bytes
        path.unlink()                               # (an SST copy is a hard link)
        path.write_bytes(bytes(data))
    again = fresh(store)
    backend = backends(again)
    backend.restore([handle], location)
    assert dump(backend) == expected
    counts = again.restored
    assert counts.local_rejected >= 1 and counts.remote_files >= 1
    # Rejected copies are deleted (a restored database or log keeps good ones of what it read) ...
    assert stale_copies(again, storage) == []
    second, _ = checkpoint(backend, storage, 2)     # ... and the next checkpoint copies again
    third = fresh(store)
    assert restored(backends, third, second, url_in(storage, "chk-2")) == expected
    assert third.restored.remote_files == 0 and third.restored.local_rejected == 0


def test_a_truncated_local_copy_is_read_from_checkpoint_storage(backends, store, taken):
    expected, handle, location = taken
    for relative in local_files(store):
        path = Path(store.job_directory, relative)
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data[:-3])
    again = fresh(store)
    assert restored(backends, again, handle, location) == expected
    assert again.restored.local_rejected >= 1 and again.restored.local_files == 0


def test_a_restored_backend_keeps_local_copies_and_old_checkpoints_go(backends, store, storage, taken):
    expected, handle, location = taken
    again = fresh(store)
    backend = backends(again)
    backend.restore([handle], location)
    fill(backend, KEYS[:10], timers=False)
    second, _ = checkpoint(backend, storage, 2)
    names = local_files(again)
    assert not any(n.startswith("chk-1/") for n in names)
    assert any(n.startswith("chk-2/") for n in names)
    # The shared files left are exactly those checkpoint 2 references (incremental RocksDB).
    referenced = {f"shared/{f.path.rsplit('/', 1)[-1]}" for f in getattr(second, "shared_files", ())}
    assert {n for n in names if n.startswith("shared/")} == referenced
    third = fresh(store)
    assert restored(backends, third, second, url_in(storage, "chk-2")) == dump(backend)
    assert third.restored.remote_files == 0 and third.restored.local_files >= 1


def test_a_discarded_snapshot_deletes_its_local_copy(backends, store, storage):
    backend = backends(store)
    fill(backend, KEYS, timers=False)
    (storage / "chk-1").mkdir()
    snapshot = backend.snapshot(1, url_in(storage, "chk-1"))
    snapshot.run()
    assert any(n.startswith("chk-1/") for n in local_files(store))
    snapshot.discard()
    assert not any(n.startswith("chk-1/") for n in local_files(store))
    assert list((storage / "chk-1").iterdir()) == []


def test_savepoints_keep_no_local_copy(backends, store, tmp_path):
    backend = backends(store)
    fill(backend, KEYS, timers=False)
    savepoint = tmp_path / "savepoints" / "savepoint-job-1-1-abc"
    savepoint.mkdir(parents=True)
    backend.snapshot(1, filesystem.normalize(str(savepoint))).run()
    assert local_files(store) == [] and store.written_files == 0


def test_the_cli_says_where_a_recovery_read_its_state():
    from streamsnap.cli import _restore_sources

    restore = {"local_files": 3, "local_bytes": 3 << 20, "remote_files": 1, "remote_bytes": 2048,
               "local_missing": 0, "local_rejected": 1, "subtasks": {}}
    assert _restore_sources(restore) == (
        "keyed state from local copies 3 file(s), 3.0 MiB; from checkpoint storage 1 file(s), "
        "2.0 KiB (0 local copies missing, 1 rejected as corrupt)")


# ---------------------------------------------------------------------------------------------
# the changelog mode: materializations, segments, retention


@pytest.fixture
def changelogs(tmp_path):
    """Factory of RocksDB backends in changelog mode with a local store, disposed after the test."""
    created = []

    def new(store: LocalRecoveryStore, kg_range: KeyGroupRange = FULL):
        config = RocksDBConfig(local_dir=str(tmp_path / "rocksdb"), changelog=CHANGELOG)
        backend = RocksDBKeyedStateBackend("op", MAX_P, kg_range, config, local_store=store)
        created.append(backend)
        return backend

    yield new
    for backend in created:
        backend.dispose()


def materialize(backend, storage: Path, checkpoint_id: int):
    """A checkpoint whose cut starts a materialization (due now); waits for its upload."""
    backend.changelog.book.materialization_interval = 0.0
    try:
        result = checkpoint(backend, storage, checkpoint_id)
    finally:
        backend.changelog.book.materialization_interval = CHANGELOG.materialization_interval
    backend.changelog.wait_for_materializations()
    return result


@pytest.fixture
def history(changelogs, store, storage):
    """A changelog backend after checkpoint 1 (a segment), 2 (a segment; materializes) and 3
    (the materialization and a segment after it), all completed: (backend, handle 3, location)."""
    backend = changelogs(store)
    fill(backend, KEYS[:150], timers=False)
    checkpoint(backend, storage, 1)
    fill(backend, KEYS[100:250], timers=False)
    materialize(backend, storage, 2)
    fill(backend, KEYS[200:], timers=False)
    handle, location = checkpoint(backend, storage, 3)
    assert handle.materialization is not None and [s.seq for s in handle.segments] == [2]
    return backend, handle, location


def shared_names(handle) -> set[str]:
    return {f"shared/{f.path.rsplit('/', 1)[-1]}" for f in handle.shared_files}


def spoiled_file(handle, what: str) -> str:
    """The local copy (relative to the job directory) of one file of a changelog handle."""
    m = handle.materialization
    name = {"manifest": handle.file.path, "segment": handle.segments[-1].file.path,
            "bundle": m.file.path, "sst": m.shared_files[0].path}[what]
    return f"chk-{handle.checkpoint_id}/{name}" if what == "manifest" else f"shared/{name.rsplit('/', 1)[-1]}"


def test_a_changelog_restore_reads_the_materialization_and_the_segments_locally(changelogs, store, history):
    backend, handle, location = history
    again = fresh(store)
    restored = changelogs(again)
    restored.restore([handle], location)
    assert dump(restored) == dump(backend)
    counts = again.restored
    # the manifest, the materialization's bundle and SST files, the segment
    assert counts.local_files == 2 + len(handle.materialization.shared_files) + len(handle.segments)
    assert (counts.remote_files, counts.local_missing, counts.local_rejected) == (0, 0, 0)
    assert again.written_files == 0                 # nothing to copy again


@pytest.mark.parametrize("how", ["deleted", "corrupted"])
@pytest.mark.parametrize("what", ["manifest", "segment", "bundle", "sst"])
def test_a_spoiled_changelog_copy_is_read_from_storage_and_kept_again(changelogs, store, storage, history,
                                                                        what, how):
    backend, handle, location = history
    path = Path(store.job_directory, spoiled_file(handle, what))
    data = bytearray(path.read_bytes())
    path.unlink()                                   # (an SST copy is a hard link)
    if how == "corrupted":
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    again = fresh(store)
    restored = changelogs(again)
    restored.restore([handle], location)
    assert dump(restored) == dump(backend)          # exactly the state of the failure-free run
    counts = again.restored
    assert counts.remote_files == 1 and counts.local_files == len(handle.shared_files)
    assert (counts.local_missing, counts.local_rejected) == ((1, 0) if how == "deleted" else (0, 1))
    assert stale_copies(again, storage) == []
    # The restored log continues: what it read from storage is kept locally again.
    assert path.exists() == (what != "manifest")
    fill(restored, KEYS[:5], timers=False)
    fourth, fourth_location = checkpoint(restored, storage, 4)
    third = fresh(store)
    assert restored_dump(changelogs, third, fourth, fourth_location) == dump(restored)
    assert third.restored.remote_files == 0


def restored_dump(changelogs, store, handle, location, kg_range: KeyGroupRange = FULL) -> dict:
    backend = changelogs(store, kg_range)
    backend.restore([handle], location)
    return dump(backend)


def test_retention_keeps_exactly_what_the_latest_changelog_checkpoint_and_its_successors_need(
        changelogs, store, storage, history):
    backend, third, _ = history
    # Checkpoint 3 made materialization 2 the base: segments 0 and 1, which it holds, are gone.
    assert {n for n in local_files(store) if n.startswith("shared/")} == shared_names(third)
    assert [n for n in local_files(store) if n.startswith("chk-")] == [f"chk-3/{third.file.path}"]
    fill(backend, KEYS[:50], timers=False)
    fourth, _ = materialize(backend, storage, 4)     # completes; materialization 4 is a candidate
    candidate = backend.changelog.book.candidate.handle
    assert fourth.materialization == third.materialization
    assert {n for n in local_files(store) if n.startswith("shared/")} == \
        shared_names(fourth) | {f"shared/{f.path.rsplit('/', 1)[-1]}" for f in (candidate.file, *candidate.shared_files)}
    fifth, location = checkpoint(backend, storage, 5)   # builds on materialization 4
    assert fifth.materialization == candidate and [s.seq for s in fifth.segments] == [4]
    assert {n for n in local_files(store) if n.startswith("shared/")} == shared_names(fifth)
    assert stale_copies(store, storage) == []
    again = fresh(store)
    assert restored_dump(changelogs, again, fifth, location) == dump(backend)
    assert again.restored.remote_files == 0


def test_a_materialization_finishing_after_a_later_checkpoint_completed_keeps_its_local_copies(
        changelogs, store, storage):
    backend = changelogs(store)
    fill(backend, KEYS, timers=False)
    checkpoint(backend, storage, 1)
    uploads = []
    backend.changelog._run_in_background = lambda upload, name: uploads.append(upload)
    backend.changelog.book.materialization_interval = 0.0
    checkpoint(backend, storage, 2)                 # starts materialization 2 (held back)
    backend.changelog.book.materialization_interval = CHANGELOG.materialization_interval
    (storage / "chk-3").mkdir()
    url = url_in(storage, "chk-3")
    backend.snapshot(3, url).run()                  # cut while it still runs: not referenced
    uploads.pop()()                                 # its upload keeps local copies ...
    backend.notify_checkpoint_complete(3)           # ... that this completion must not delete
    fourth, location = checkpoint(backend, storage, 4)
    assert fourth.materialization is not None and fourth.materialization_id == 2
    again = fresh(store)
    assert restored_dump(changelogs, again, fourth, location) == dump(backend)
    assert again.restored.remote_files == 0 and again.restored.local_files >= 3


def test_a_rescaled_changelog_restore_reads_local_copies_and_keeps_no_new_ones(changelogs, store, history):
    backend, handle, location = history
    halves = [KeyGroupRange(0, MAX_P // 2 - 1), KeyGroupRange(MAX_P // 2, MAX_P - 1)]
    got = {}
    for kg_range in halves:
        again = fresh(store)
        got.update(restored_dump(changelogs, again, handle, location, kg_range))
        assert again.restored.local_files >= 3 and again.restored.remote_files == 0
        assert again.written_files == 0              # a log that is not continued: no copies
    assert got == dump(backend)
