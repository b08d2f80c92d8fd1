"""Incremental checkpoints of the RocksDB backend, on real RocksDB databases and real files:
upload only new SST files, restore (same range and rescaled), bad files, savepoints stay full."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.handles import (IncrementalKeyGroupsStateHandle, KeyGroupsStateHandle,
                                           OperatorSubtaskState, keyed_handle_from_wire)
from streamsnap.errors import ConfigurationError, RestoreError
from streamsnap.state import (HashMapKeyedStateBackend, KeyGroupRange, ValueStateDescriptor,
                              assign_to_key_group, key_group_range_for_subtask)
from streamsnap.state.assignment import SubtaskRestoreState, assign_operator_state
from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamsnap.state.backends.rocksdb.config import RocksDBConfig
from streamsnap.state.snapshot import SnapshotDiscardedError

from .test_rocksdb_backend import KEYS, dump, fill, use_key

MAX_P = 128
FULL = KeyGroupRange(0, MAX_P - 1)
COUNT = ValueStateDescriptor("count", default=0)


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """A job directory of the checkpoint storage layout (chk-<n>/ beside shared/)."""
    (tmp_path / "job" / "shared").mkdir(parents=True)
    return tmp_path / "job"


@pytest.fixture
def backends(tmp_path):
    created = []

    def new(kg_range=FULL, uid="op", **config):
        config.setdefault("local_dir", str(tmp_path / "rocksdb"))
        backend = RocksDBKeyedStateBackend(uid, MAX_P, kg_range, RocksDBConfig(**config))
        created.append(backend)
        return backend

    yield new
    for backend in created:
        backend.dispose()


def location(job: Path, checkpoint_id: int) -> str:
    path = job / f"chk-{checkpoint_id}"
    path.mkdir(exist_ok=True)
    return "file://" + str(path)


def checkpoint(backend, job: Path, checkpoint_id: int, complete: bool = True):
    """Snapshot, run the async part, round-trip the handle through its wire form."""
    snapshot = backend.snapshot(checkpoint_id, location(job, checkpoint_id))
    handle = snapshot.run()
    if complete:
        backend.notify_checkpoint_complete(checkpoint_id)
    return snapshot, keyed_handle_from_wire(handle.to_wire())


def shared_files(job: Path) -> set[str]:
    return {p.name for p in (job / "shared").iterdir()}


def put_counts(backend, keys, value_of):
    state = backend.get_state(COUNT)
    for k in keys:
        use_key(backend, k)
        state.update(value_of(k))


def counts(backend, keys) -> dict:
    state = backend.get_state(COUNT)
    out = {}
    for k in keys:
        use_key(backend, k)
        out[k] = state.value()
    return out


def test_second_checkpoint_after_touching_one_percent_uploads_a_small_fraction(backends, job):
    n = 50_000
    backend = backends(write_buffer_size=8 << 20)
    put_counts(backend, range(n), lambda k: k * 3)
    first, h1 = checkpoint(backend, job, 1)
    assert isinstance(h1, IncrementalKeyGroupsStateHandle)
    assert all(h1.new_shared) and first.reused_bytes == 0
    assert first.uploaded_bytes == h1.incremental_size == h1.size
    assert first.uploaded_bytes > 300_000           # 50k keys are really in there
    assert {p.name for p in (job / "chk-1").iterdir()} == {h1.file.path}  # one private file

    put_counts(backend, range(0, n, 100), lambda k: -k)   # 1 % of the keys
    second, h2 = checkpoint(backend, job, 2)
    print(f"first checkpoint uploaded {first.uploaded_bytes} bytes, the incremental one "
          f"{second.uploaded_bytes} ({second.uploaded_bytes / first.uploaded_bytes:.1%})")
    assert second.uploaded_bytes < 0.10 * first.uploaded_bytes
    assert second.uploaded_bytes == h2.incremental_size
    # The first checkpoint's SST files are referenced again, not uploaded again.
    assert set(h1.shared_files) <= set(h2.reused_files())
    assert h2.size >= h1.size
    assert len(shared_files(job)) == len(set(h1.shared_files) | set(h2.shared_files))


def test_restore_from_an_incremental_chain_equals_the_state(backends, job):
    backend = backends()
    fill(backend, KEYS[:200])
    checkpoint(backend, job, 1)
    fill(backend, KEYS[150:])                       # overwrite some, add others
    value = backend.get_state(COUNT)
    for k in KEYS[:40]:
        use_key(backend, k)
        value.update(7)
    checkpoint(backend, job, 2)
    for k in KEYS[:20]:                              # deletions after the last full upload
        use_key(backend, k)
        value.clear()
    _, handle = checkpoint(backend, job, 3)
    assert not all(handle.new_shared)               # really incremental
    restored = backends()
    restored.restore([handle], location(job, 3))
    assert dump(restored) == dump(backend)
    assert counts(restored, KEYS) == counts(backend, KEYS)
    # The restored backend reuses the restored SST files: its next checkpoint uploads little.
    put_counts(restored, KEYS[:3], lambda k: 99)
    snapshot, h4 = checkpoint(restored, job, 4)
    assert set(handle.shared_files) <= set(h4.reused_files())
    assert snapshot.uploaded_bytes < handle.size / 2


@pytest.mark.parametrize("before, after", [("level", "universal"), ("universal", "level")])
def test_a_checkpoint_restores_under_the_other_compaction_style(backends, job, before, after):
    """Switching RocksDBConfig.compaction between runs: the checkpoint's database opens with
    the other style, keeps its entries and takes further incremental checkpoints."""
    keys = range(20_000)
    first = backends(compaction=before, write_buffer_size=256 << 10)
    for round_ in range(3):                      # several flushes: more than one SST file
        put_counts(first, keys, lambda k: k + round_)
        _, handle = checkpoint(first, job, round_ + 1)
    second = backends(compaction=after)
    second.restore([handle], "file://" + str(job / "chk-3"))
    assert counts(second, keys) == {k: k + 2 for k in keys}
    put_counts(second, range(0, 20_000, 100), lambda k: -k)
    _, next_handle = checkpoint(second, job, 4)
    assert not all(next_handle.new_shared)       # still incremental: the restored files are reused
    third = backends(compaction=before)
    third.restore([next_handle], "file://" + str(job / "chk-4"))
    assert counts(third, keys) == {k: (-k if k % 100 == 0 else k + 2) for k in keys}


def test_rescale_two_to_three_from_incremental_checkpoints(backends, job):
    keys = list(range(3000))
    model = HashMapKeyedStateBackend("op", MAX_P, FULL)
    put_counts(model, keys, lambda k: k + 1)
    subtask_states = {}
    for i in range(2):
        old = backends(key_group_range_for_subtask(MAX_P, 2, i))
        mine = [k for k in keys if assign_to_key_group(k, MAX_P) in old.key_group_range]
        # The second state is registered first on subtask 1: state ids differ between the DBs.
        if i == 1:
            old.get_state(ValueStateDescriptor("other", default=0))
        put_counts(old, mine, lambda k: k + 1)
        checkpoint(old, job, 1)
        put_counts(old, mine[::50], lambda k: k + 1)      # an incremental second checkpoint
        _, handle = checkpoint(old, job, 2)
        assert isinstance(handle, IncrementalKeyGroupsStateHandle)
        subtask_states[i] = OperatorSubtaskState(keyed=(handle,))
    base = location(job, 2)
    total = 0
    for assignment in assign_operator_state(subtask_states, MAX_P, 3):
        assignment = SubtaskRestoreState.from_wire(assignment.to_wire())
        new = backends(assignment.key_group_range)
        new.restore(assignment, base)
        mine = [k for k in keys if assign_to_key_group(k, MAX_P) in assignment.key_group_range]
        assert counts(new, mine) == counts(model, mine)
        # Key groups of other subtasks are gone from the database, not only hidden.
        raw = [key for key, _ in new._db.items()]
        assert {int.from_bytes(key[:2], "big") for key in raw} <= set(assignment.key_group_range)
        total += len(raw)
    assert total == len(keys)


def test_a_missing_shared_file_names_the_checkpoint_and_the_file(backends, job):
    backend = backends()
    put_counts(backend, range(500), lambda k: k)
    _, handle = checkpoint(backend, job, 5)
    victim = filesystem.join(location(job, 5), handle.shared_files[0].path)
    filesystem.delete(victim)
    with pytest.raises(RestoreError, match="checkpoint 5") as info:
        backends().restore([handle], location(job, 5))
    assert victim in str(info.value) and "missing" in str(info.value)


def test_a_corrupt_or_truncated_shared_file_or_bundle_is_refused(backends, job):
    backend = backends()
    put_counts(backend, range(500), lambda k: k)
    _, handle = checkpoint(backend, job, 3)
    sst = Path(filesystem.join(location(job, 3), handle.shared_files[0].path).removeprefix("file://"))
    original = sst.read_bytes()
    flipped = bytearray(original)
    flipped[len(flipped) // 2] ^= 0x01                    # same size, one bit differs
    sst.write_bytes(bytes(flipped))
    with pytest.raises(RestoreError, match=f"checkpoint 3.*{sst.name}.*corrupt"):
        backends().restore([handle], location(job, 3))
    sst.write_bytes(original[:-10])
    with pytest.raises(RestoreError, match="checkpoint 3.*truncated"):
        backends().restore([handle], location(job, 3))
    sst.write_bytes(original)
    bundle = Path(filesystem.join(location(job, 3), handle.file.path).removeprefix("file://"))
    data = bytearray(bundle.read_bytes())
    data[20] ^= 0xFF
    bundle.write_bytes(bytes(data))
    with pytest.raises(RestoreError, match="checkpoint 3.*corrupt"):
        backends().restore([handle], location(job, 3))


def test_savepoints_stay_full_and_canonical(backends, job, tmp_path):
    backend = backends()
    fill(backend, KEYS)
    savepoint = tmp_path / "savepoints" / "savepoint-abc-1-x"
    savepoint.mkdir(parents=True)
    handle = backend.snapshot(1, "file://" + str(savepoint)).run()
    assert type(handle) is KeyGroupsStateHandle and handle.shared_files == ()
    assert shared_files(job) == set()
    heap = HashMapKeyedStateBackend("op", MAX_P, FULL)
    heap.restore([handle], "file://" + str(savepoint))
    assert sorted(map(repr, heap.get_keys("value"))) == sorted(map(repr, backend.get_keys("value")))
    # full=True forces a full snapshot into a checkpoint location too
    forced = backend.snapshot(2, location(job, 2), full=True).run()
    assert type(forced) is KeyGroupsStateHandle


def test_incremental_off_writes_full_checkpoints(backends, job):
    backend = backends(incremental=False)
    put_counts(backend, range(100), lambda k: k)
    _, handle = checkpoint(backend, job, 1)
    assert type(handle) is KeyGroupsStateHandle
    with pytest.raises(ConfigurationError, match="incremental"):
        RocksDBConfig(incremental="yes")


def test_uploads_of_an_unconfirmed_checkpoint_are_not_reused(backends, job):
    backend = backends()
    put_counts(backend, range(1000), lambda k: k)
    _, h1 = checkpoint(backend, job, 1, complete=False)     # aborted: never confirmed
    _, h2 = checkpoint(backend, job, 2)
    assert all(h2.new_shared)
    assert not set(h1.shared_files) & set(h2.shared_files)
    _, h3 = checkpoint(backend, job, 3)
    assert set(h3.shared_files) == set(h2.shared_files) and not any(h3.new_shared)


def test_discarding_an_incremental_snapshot_deletes_only_its_own_uploads(backends, job):
    backend = backends()
    put_counts(backend, range(1000), lambda k: k)
    _, h1 = checkpoint(backend, job, 1)
    put_counts(backend, range(10), lambda k: -1)
    snapshot = backend.snapshot(2, location(job, 2))
    h2 = snapshot.run()
    before = shared_files(job)
    snapshot.discard()
    after = shared_files(job)
    new_names = {f.path.rsplit("/", 1)[-1] for f, new in zip(h2.shared_files, h2.new_shared) if new}
    assert new_names and after == before - new_names
    assert {f.path.rsplit("/", 1)[-1] for f in h1.shared_files} <= after
    assert not (job / "chk-2" / h2.file.path).exists()
    # A snapshot discarded before it ran uploads nothing and leaves no local checkpoint.
    pending = backend.snapshot(3, location(job, 3))
    pending.discard()
    with pytest.raises(SnapshotDiscardedError):
        pending.run()
    assert shared_files(job) == after
    assert not [n for n in os.listdir(backend.directory) if n.startswith("snapshot-")]


def test_incremental_only_into_checkpoint_locations_of_the_storage(tmp_path):
    from streamsnap.checkpoint.storage import CheckpointStorage
    from streamsnap.state.backends.rocksdb.incremental import shared_directory_of

    storage = CheckpointStorage(str(tmp_path / "ckpt"), "job1")
    checkpoint_location = storage.initialize_location(7)
    assert shared_directory_of(checkpoint_location.url) == storage.shared_directory
    savepoint = storage.initialize_savepoint_location(str(tmp_path / "ckpt" / "job1"), 8)
    assert shared_directory_of(savepoint.url) is None
    assert shared_directory_of("file://" + str(tmp_path / "elsewhere" / "chk-3")) is None  # no shared/


def test_the_heap_backend_refuses_an_incremental_handle(backends, job):
    backend = backends()
    put_counts(backend, range(50), lambda k: k)
    _, handle = checkpoint(backend, job, 1)
    with pytest.raises(RestoreError, match="IncrementalKeyGroupsStateHandle"):
        HashMapKeyedStateBackend("op", MAX_P, FULL).restore([handle], location(job, 1))
