"""Changelog checkpoints of the RocksDB backend on real RocksDB databases and real files: a
checkpoint uploads the log since the last one, materializations take over the log, restore
(same range, rescaled, from other handle kinds) replays it, bad files are named, savepoints
stay full."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamsnap.checkpoint.handles import ChangelogStateHandle, KeyGroupsStateHandle
from streamsnap.errors import ConfigurationError, RestoreError
from streamsnap.state import HashMapKeyedStateBackend, MapStateDescriptor, key_group_range_for_subtask
from streamsnap.state.assignment import assign_operator_state
from streamsnap.checkpoint.handles import OperatorSubtaskState
from streamsnap.state.backends.changelog import ChangelogConfig
from streamsnap.state.backends.rocksdb.config import RocksDBConfig
from streamsnap.state.local_recovery import LocalRecoveryStore
from streamsnap.state.snapshot import SnapshotDiscardedError

from .test_rocksdb_backend import KEYS, dump, fill, use_key
from .test_rocksdb_incremental import (COUNT, FULL, MAX_P, backends, checkpoint, counts, job,  # noqa: F401
                                       location, put_counts)


# Materializations only when a test asks for one (`materialize`).
CHANGELOG = ChangelogConfig(materialization_interval=3600.0)


def materialize(backend, job: Path, checkpoint_id: int):
    """A checkpoint whose cut starts a materialization (due now); waits for its upload."""
    backend.changelog.book.materialization_interval = 0.0
    result = checkpoint(backend, job, checkpoint_id)
    backend.changelog.book.materialization_interval = 3600.0
    backend.changelog.wait_for_materializations()
    assert backend.changelog.book.candidate is not None
    return result


def shared(job: Path) -> set[str]:
    return {p.name for p in (job / "shared").iterdir()}


def test_a_checkpoint_uploads_only_the_log_since_the_last_one(backends, job):
    n = 50_000
    backend = backends(write_buffer_size=8 << 20, changelog=CHANGELOG)
    put_counts(backend, range(n), lambda k: k * 3)
    first, h1 = materialize(backend, job, 1)              # the load: one segment, then materialized
    assert isinstance(h1, ChangelogStateHandle) and h1.materialization is None and h1.new_segments == (True,)
    _, h2 = checkpoint(backend, job, 2)                   # references the materialization (new)
    assert h2.materialization is not None and h2.materialization_new and h2.segments == h1.segments[:0] + h2.segments
    assert [s.seq for s in h2.segments] == [1]            # the empty segment cut at 2
    put_counts(backend, range(0, n, 100), lambda k: -k)   # 1 % of the keys
    third, h3 = checkpoint(backend, job, 3)
    print(f"full {h3.size} bytes, the checkpoint after touching 1 % wrote {third.uploaded_bytes} "
          f"({third.uploaded_bytes / h3.size:.1%})")
    assert not h3.materialization_new and h3.materialization == h2.materialization
    assert h3.new_segments == (False, True) and third.uploaded_bytes == h3.incremental_size
    assert third.uploaded_bytes < 0.05 * h3.size
    assert not any(name.endswith(".sst") for name in shared(job) - {f.path.rsplit("/", 1)[-1]
                                                                    for f in h2.shared_files})
    assert backend.changelog.book.segments_in_memory() == []     # confirmed uploads: memory freed


def test_restore_equals_the_state_with_every_kind_of_state(backends, job):
    backend = backends(changelog=CHANGELOG)
    fill(backend, KEYS[:150])
    checkpoint(backend, job, 1)
    fill(backend, KEYS[100:250])
    materialize(backend, job, 2)
    fill(backend, KEYS[200:])
    mapping = backend.get_state(MapStateDescriptor("m2"))
    for k in KEYS[:30]:                              # deletes are logged too
        use_key(backend, k)
        mapping.put("x", 1)
        mapping.put("y", 2)
        mapping.remove("x")
        backend.get_state(COUNT).update(1)
        backend.get_state(COUNT).clear()
    _, handle = checkpoint(backend, job, 3)
    assert handle.materialization is not None and [s.seq for s in handle.segments] == [2]
    expected = dump(backend)
    restored = backends(changelog=CHANGELOG)
    restored.restore([handle], location(job, 3))
    assert dump(restored) == expected
    assert restored.changelog.book.base.id == 2               # continues the restored log
    use_key(restored, KEYS[0])
    assert dict(restored.get_state(MapStateDescriptor("m2")).items()) == {"y": 2}
    put_counts(restored, range(10), lambda k: 7)
    _, again = checkpoint(restored, job, 4)
    assert again.segments[:1] == handle.segments and again.new_segments == (False, True)


def test_an_entry_rewritten_and_deleted_across_segments_restores_to_its_last_write(backends, job):
    backend = backends(changelog=CHANGELOG)
    put_counts(backend, range(10), lambda k: 1)
    checkpoint(backend, job, 1)
    put_counts(backend, range(5, 10), lambda k: 2)
    for k in range(5):                       # deleted in segment 1 ...
        use_key(backend, k)
        backend.get_state(COUNT).clear()
    checkpoint(backend, job, 2)
    put_counts(backend, range(3), lambda k: 3)   # ... and two of them written again in segment 2
    _, handle = checkpoint(backend, job, 3)
    assert handle.materialization is None and [s.seq for s in handle.segments] == [0, 1, 2]
    restored = backends(changelog=CHANGELOG)
    restored.restore([handle], location(job, 3))
    assert counts(restored, range(10)) == counts(backend, range(10)) == {
        **{k: 3 for k in range(3)}, 3: COUNT.default, 4: COUNT.default, **{k: 2 for k in range(5, 10)}}
    assert dump(restored) == dump(backend)


@pytest.mark.parametrize("local", [False, True], ids=["remote", "local-recovery"])
@pytest.mark.parametrize("old, new", [(2, 3), (3, 1)])
def test_rescale_replays_only_the_owned_key_groups(backends, job, old, new, local):
    """With task-local recovery (all subtasks on one host) every file is read from its local copy."""
    keys = range(3000)
    store = LocalRecoveryStore(str(job.parent / "local"), job.name) if local else None
    olds = [backends(key_group_range_for_subtask(MAX_P, old, i), changelog=CHANGELOG) for i in range(old)]
    for backend in olds:
        backend.local_store = store
    states = {}
    for i, backend in enumerate(olds):
        mine = [k for k in keys if _owns(backend, k)]
        put_counts(backend, mine, lambda k: k)
        if i == 0:      # one subtask's handle has a materialization, the others only segments
            materialize(backend, job, 1)
        else:
            checkpoint(backend, job, 1)
        put_counts(backend, mine[::7], lambda k: -k)
        _, states[i] = checkpoint(backend, job, 2)
    expected = {}
    for backend in olds:
        expected.update(counts(backend, [k for k in keys if _owns(backend, k)]))
    assigned = assign_operator_state({i: OperatorSubtaskState(keyed=(h,)) for i, h in states.items()}, MAX_P, new)
    got, news = {}, []
    for restore in assigned:
        backend = backends(restore.key_group_range, changelog=CHANGELOG)
        if local:
            backend.local_store = LocalRecoveryStore(store.root, store.job_id)
        backend.restore(restore, location(job, 2))
        got.update(counts(backend, [k for k in keys if _owns(backend, k)]))
        if local:
            read = backend.local_store.restored
            assert read.local_files >= 2 and (read.remote_files, read.local_missing, read.local_rejected) == (0, 0, 0)
        news.append(backend)
    for backend in news:
        assert backend.changelog.book.base is None              # rescaled: materializes inline
        put_counts(backend, [k for k in keys if _owns(backend, k)][:5], lambda k: 0)
        _, handle = checkpoint(backend, job, 3)
        assert handle.materialization_new and handle.segments == ()
    assert got == expected


def _owns(backend, key) -> bool:
    from streamsnap.state import assign_to_key_group
    return assign_to_key_group(key, MAX_P) in backend.key_group_range


def test_savepoints_stay_full_and_a_savepoint_restores_into_the_changelog_mode(backends, job, tmp_path):
    backend = backends(changelog=CHANGELOG)
    fill(backend, KEYS)
    savepoint = tmp_path / "savepoint-1"
    savepoint.mkdir()
    handle = backend.snapshot(1, "file://" + str(savepoint)).run()
    assert isinstance(handle, KeyGroupsStateHandle)
    heap = HashMapKeyedStateBackend("op", MAX_P, FULL)
    heap.restore([handle], "file://" + str(savepoint))
    restored = backends(changelog=CHANGELOG)
    restored.restore([handle], "file://" + str(savepoint))
    assert dump(restored) == dump(backend)
    assert restored.changelog.book.base is None
    _, first = checkpoint(restored, job, 2)                     # materializes inline
    assert first.materialization is not None and first.materialization_new and first.segments == ()
    again = backends(changelog=CHANGELOG)
    again.restore([first], location(job, 2))
    assert dump(again) == dump(backend)


@pytest.mark.parametrize("damage", ["delete", "truncate", "flip"])
def test_a_damaged_segment_names_the_checkpoint_and_the_file(backends, job, damage):
    backend = backends(changelog=CHANGELOG)
    put_counts(backend, range(500), lambda k: k)
    _, handle = checkpoint(backend, job, 1)
    path = job / "shared" / handle.segments[0].file.path.rsplit("/", 1)[-1]
    data = path.read_bytes()
    if damage == "delete":
        path.unlink()
    elif damage == "truncate":
        path.write_bytes(data[:-5])
    else:
        path.write_bytes(data[:40] + bytes([data[40] ^ 0xFF]) + data[41:])
    with pytest.raises(RestoreError, match=r"checkpoint 1: the changelog segment .*changelog-0") as info:
        backends(changelog=CHANGELOG).restore([handle], location(job, 1))
    assert {"delete": "missing", "truncate": "truncated", "flip": "corrupt"}[damage] in str(info.value)


def test_a_missing_manifest_is_named(backends, job):
    backend = backends(changelog=CHANGELOG)
    put_counts(backend, range(50), lambda k: k)
    _, handle = checkpoint(backend, job, 1)
    (job / "chk-1" / handle.file.path).unlink()
    with pytest.raises(RestoreError, match="checkpoint 1: the changelog manifest .* is missing"):
        backends(changelog=CHANGELOG).restore([handle], location(job, 1))


def test_discarding_a_snapshot_deletes_only_its_own_uploads(backends, job):
    backend = backends(changelog=CHANGELOG)
    put_counts(backend, range(200), lambda k: k)
    checkpoint(backend, job, 1)
    before = shared(job)
    put_counts(backend, range(20), lambda k: 0)
    snapshot = backend.snapshot(2, location(job, 2))
    handle = snapshot.run()
    assert handle.new_segments == (False, True)
    snapshot.discard()
    assert shared(job) == before
    backend.notify_checkpoint_aborted(2)
    with pytest.raises(SnapshotDiscardedError):
        snapshot.run()
    _, h3 = checkpoint(backend, job, 3)              # segment 1 again: the aborted upload is gone
    assert h3.new_segments == (False, True, True) and h3.segments[1].file != handle.segments[1].file


def test_changelog_needs_incremental_and_works_with_local_recovery(tmp_path):
    import streamsnap as ss

    env = ss.StreamEnvironment(parallelism=1, checkpointing=ss.CheckpointConfig(directory=str(tmp_path)),
                               state_backend=RocksDBConfig(changelog=True), local_recovery=True)
    assert env.local_recovery and env.state_backend.changelog == ChangelogConfig()
    with pytest.raises(ConfigurationError, match="local_recovery=True needs checkpointing"):
        ss.StreamEnvironment(state_backend=RocksDBConfig(changelog=True), local_recovery=True)
    with pytest.raises(ConfigurationError, match="changelog needs incremental=True"):
        RocksDBConfig(changelog=True, incremental=False)
    with pytest.raises(ConfigurationError, match="must be True, False or a ChangelogConfig"):
        RocksDBConfig(changelog="on")
    with pytest.raises(ConfigurationError, match="max_log_bytes must be an integer >= 1"):
        ChangelogConfig(max_log_bytes=0)
