"""Checkpoint storage on a real S3-compatible server (moto's, scripts/s3-server): storage options,
`_metadata` written once with no rename, listings, cleanup — and the configuration's errors."""

from __future__ import annotations

import json
import sys
import time

import fsspec
import pytest

import streamsnap as ss
from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.metadata import read_metadata, write_metadata
from streamsnap.checkpoint.storage import CheckpointStorage
from streamsnap.errors import ConfigurationError
from streamsnap.web import views
from tests.checkpoint.test_metadata import sample

pytestmark = pytest.mark.faults     # object stores: run alone with -m faults


@pytest.fixture
def s3_directory(s3_server):
    """s3://<fresh bucket>/ckpt, its storage options registered in this process."""
    directory = f"s3://{s3_server.new_bucket()}/ckpt"
    filesystem.configure(directory, s3_server.storage_options)
    yield directory
    filesystem.configure(directory, None)


def test_urls_open_with_the_options_of_their_longest_registered_prefix(monkeypatch):
    monkeypatch.setattr(filesystem, "_options", {})
    filesystem.configure("s3://b/ckpt", {"endpoint_url": "http://127.0.0.1:1", "key": "k"})
    filesystem.configure("s3://b/ckpt/special", {"endpoint_url": "http://127.0.0.1:2"})
    assert filesystem.options_for("s3://b/ckpt/job/chk-1/_metadata")["endpoint_url"] == "http://127.0.0.1:1"
    assert filesystem.options_for("s3://b/ckpt/special/x") == {"endpoint_url": "http://127.0.0.1:2"}
    assert filesystem.options_for("s3://b/ckptx")["endpoint_url"] == "http://127.0.0.1:2", \
        "no prefix matches: the protocol's last registration (a savepoint target on the same store)"
    assert filesystem.options_for("/tmp/local") == {}
    fs, _ = filesystem.filesystem("s3://b/ckpt/job")
    assert fs.endpoint_url == "http://127.0.0.1:1" and fs.key == "k"
    assert fs.dircache.use_listings_cache is False, "executors write what the driver lists"
    filesystem.configure("s3://b/ckpt/special", None)
    assert filesystem.options_for("s3://b/ckpt/special/x")["endpoint_url"] == "http://127.0.0.1:1"


def test_metadata_is_written_once_without_a_rename_and_completes_the_checkpoint(s3_directory):
    storage = CheckpointStorage(s3_directory, "job")
    location = storage.initialize_location(7)
    assert not storage.is_completed(7)
    write_metadata(location.url, sample())
    assert storage.is_completed(7) and storage.completed_ids() == [7]
    assert read_metadata(location.metadata_url) == sample()
    with pytest.raises(FileExistsError, match="written only once"):
        write_metadata(location.url, sample())
    fs, path = filesystem.filesystem(location.url)
    assert [p.rsplit("/", 1)[-1] for p in fs.find(path)] == ["_metadata"], "no temp file, no rename"
    with pytest.raises(FileExistsError, match="completed checkpoint"):
        storage.initialize_location(7)


def test_listings_cleanup_and_stray_shared_files_on_s3(s3_directory):
    storage = CheckpointStorage(s3_directory, "job")
    for checkpoint_id in (1, 2):
        location = storage.initialize_location(checkpoint_id)
        filesystem.write_atomic(filesystem.join(location.url, "state-a"), b"state")
        if checkpoint_id == 1:
            write_metadata(location.url, sample())
    kept = filesystem.join(storage.shared_directory, "kept.sst")
    stray = filesystem.join(storage.shared_directory, "stray.sst")
    for url in (kept, stray):
        filesystem.write_atomic(url, b"sst")
    # Another process's writes show at once: listings are not cached on object stores.
    assert storage.existing_checkpoint_ids() == [1, 2] and storage.completed_ids() == [1]
    assert storage.abandoned_locations(keep_ids=set()) == [storage.checkpoint_directory(2)]
    referenced = frozenset({filesystem.normalize(kept)})
    assert storage.unreferenced_shared_files(referenced, time.time() - 3600) == [], "young files are kept"
    assert storage.unreferenced_shared_files(referenced, time.time() + 60) == [stray]
    storage.discard_location(storage.initialize_location(3))
    filesystem.delete(storage.checkpoint_directory(2), recursive=True)
    assert storage.existing_checkpoint_ids() == [1]
    assert storage.newest_completed_location().checkpoint_id == 1


def test_a_savepoint_target_on_the_same_store_uses_the_directory_s_options(s3_server, s3_directory):
    other_bucket = s3_server.new_bucket("savepoints")
    assert filesystem.options_for(f"s3://{other_bucket}/sp")["endpoint_url"] == s3_server.endpoint
    storage = CheckpointStorage(s3_directory, "job")
    location = storage.initialize_savepoint_location(f"s3://{other_bucket}/sp", 4)
    write_metadata(location.url, sample())
    assert read_metadata(location.metadata_url) == sample()


# ============================================================================ configuration
def test_storage_options_must_be_a_dict_with_string_keys():
    with pytest.raises(ConfigurationError, match=r"CheckpointConfig.storage_options must be a dict .* got a list"):
        ss.CheckpointConfig(directory="s3://b/c", storage_options=[("key", "x")])
    with pytest.raises(ConfigurationError, match="storage_options must be a dict of fsspec options with string keys"):
        ss.CheckpointConfig(directory="s3://b/c", storage_options={1: "x"})


def test_an_s3_directory_without_s3fs_fails_at_the_environment_saying_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "s3fs", None)           # import s3fs -> ImportError
    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, "s3", raising=False)
    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, "s3a", raising=False)
    config = ss.CheckpointConfig(directory="s3://bucket/ckpt", storage_options={"anon": True})
    with pytest.raises(ConfigurationError, match=r"CheckpointConfig.directory 's3://bucket/ckpt' cannot be used: "
                                                 r"s3:// needs a package that is not installed .*pip install s3fs"):
        ss.StreamEnvironment(checkpointing=config)


def test_an_unknown_protocol_fails_at_the_environment():
    with pytest.raises(ConfigurationError, match="nosuchfs:// is not a protocol fsspec knows"):
        ss.StreamEnvironment(checkpointing=ss.CheckpointConfig(directory="nosuchfs://x/y"))


def test_credentials_are_neither_in_the_repr_nor_in_the_rest_document():
    config = ss.CheckpointConfig(directory="s3://b/c", storage_options={
        "key": "AKIA-VISIBLE-NOWHERE", "secret": "s3cr3t-visible-nowhere", "endpoint_url": "http://127.0.0.1:1"})
    assert "visible-nowhere" not in repr(config).lower()
    document = json.dumps(views.checkpoint_config(config, "rocksdb"))
    assert "visible-nowhere" not in document.lower()
    assert views.checkpoint_config(config, "rocksdb")["storage_options"] == ["endpoint_url", "key", "secret"]


# ============================================================================ keyed state on S3
@pytest.mark.parametrize("mode", ["incremental", "changelog"])
def test_rocksdb_incremental_and_changelog_snapshots_round_trip_through_s3(s3_directory, tmp_path, mode):
    """The second checkpoint uploads only what changed (SST files / a log segment in `shared/`,
    reusing the first's), and a fresh backend restores the state from S3."""
    from streamsnap.checkpoint.handles import ChangelogStateHandle, IncrementalKeyGroupsStateHandle
    from streamsnap.state.backends.changelog import ChangelogConfig
    from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
    from streamsnap.state.backends.rocksdb.config import RocksDBConfig
    from tests.state.test_rocksdb_incremental import FULL, MAX_P, counts, put_counts

    changelog = ChangelogConfig(materialization_interval=3600.0) if mode == "changelog" else None
    job = filesystem.join(s3_directory, "job")
    created = []

    def backend():
        created.append(RocksDBKeyedStateBackend("op", MAX_P, FULL, RocksDBConfig(
            local_dir=str(tmp_path / "rocksdb"), changelog=changelog)))
        return created[-1]

    def checkpoint(b, checkpoint_id):
        handle = b.snapshot(checkpoint_id, filesystem.join(job, f"chk-{checkpoint_id}")).run()
        b.notify_checkpoint_complete(checkpoint_id)
        return handle

    source = backend()
    try:
        put_counts(source, range(5_000), lambda k: k * 3)
        if mode == "changelog":          # the load is logged, then materialized
            source.changelog.book.materialization_interval = 0.0
            checkpoint(source, 1)
            source.changelog.book.materialization_interval = 3600.0
            source.changelog.wait_for_materializations()
        else:
            checkpoint(source, 1)
        checkpoint(source, 2)
        put_counts(source, range(0, 5_000, 100), lambda k: -k)
        third = checkpoint(source, 3)
        assert isinstance(third, ChangelogStateHandle if mode == "changelog" else IncrementalKeyGroupsStateHandle)
        assert third.incremental_size < third.size / 2, "the checkpoint reuses earlier uploads"
        fs, path = filesystem.filesystem(job)
        assert any("/shared/" in p for p in fs.find(path)), "uploads in shared/ on S3"
        restored = backend()
        restored.restore([third], filesystem.join(job, "chk-3"))
        assert counts(restored, range(0, 5_000, 7)) == counts(source, range(0, 5_000, 7))
    finally:
        for b in created:
            b.dispose()


def test_a_bucket_that_is_not_there_fails_before_the_job_runs_saying_what_to_check(s3_server):
    from streamsnap.api import preflight
    from streamsnap.errors import PreflightError

    directory = "s3://no-such-bucket-here/ckpt"
    filesystem.configure(directory, s3_server.storage_options)
    try:
        with pytest.raises(PreflightError, match=r"the checkpoint directory 's3://no-such-bucket-here/ckpt' is not "
                                                 r"usable: could not write a file into it .*the bucket exists, and "
                                                 r"CheckpointConfig.storage_options name its endpoint"):
            preflight.check_directory(directory, "the checkpoint directory", "CheckpointConfig(directory=...)")
    finally:
        filesystem.configure(directory, None)
