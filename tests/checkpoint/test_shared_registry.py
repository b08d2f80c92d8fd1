"""Reference counting of shared (incremental) state files."""

from __future__ import annotations

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.shared_registry import SharedStateRegistry


def make_file(tmp_path, name):
    path = tmp_path / "job" / "shared" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"sst")
    return filesystem.normalize(str(path))


def test_file_deleted_when_the_last_reference_goes(tmp_path):
    registry = SharedStateRegistry()
    a, b = make_file(tmp_path, "a"), make_file(tmp_path, "b")
    registry.register(1, [a])
    registry.register(2, [a, b])
    assert registry.reference_count(a) == 2
    assert registry.unregister(1) == []
    assert filesystem.exists(a)
    assert registry.unregister(2) == sorted([a, b])
    assert not filesystem.exists(a) and not filesystem.exists(b)
    assert len(registry) == 0


def test_registration_is_idempotent_per_checkpoint(tmp_path):
    registry = SharedStateRegistry()
    a = make_file(tmp_path, "a")
    registry.register(1, [a])
    registry.register(1, [a])
    assert registry.reference_count(a) == 1
    assert registry.is_registered(a)
    registry.unregister(1)
    assert not registry.is_registered(a)
    assert registry.unregister(1) == []  # unknown checkpoint: nothing happens


def test_paths_are_normalized(tmp_path):
    registry = SharedStateRegistry()
    a = make_file(tmp_path, "a")
    registry.register(1, [a[len("file://"):]])
    assert registry.is_registered(a)


def test_files_outside_the_owned_directory_are_never_deleted(tmp_path):
    registry = SharedStateRegistry(owned_directory=str(tmp_path / "job"))
    mine = make_file(tmp_path, "mine")
    foreign = filesystem.normalize(str(tmp_path / "other-job" / "shared" / "x"))
    filesystem.write_atomic(foreign, b"sst")
    registry.register(1, [mine, foreign])
    assert registry.unregister(1) == [mine]
    assert filesystem.exists(foreign)


def test_delete_failure_is_logged_not_raised(tmp_path, caplog):
    def broken(url):
        raise OSError("read-only")

    registry = SharedStateRegistry(delete=broken)
    registry.register(1, [make_file(tmp_path, "a")])
    assert registry.unregister(1) == []
    assert "could not delete" in caplog.text
