"""Incremental RocksDB checkpoints through the coordinator: shared files are reference counted
by the SharedStateRegistry (registered on acknowledgement and completion, released on abort and
subsumption, rebuilt after a driver restart), and a checkpoint with a missing shared file is
unreadable under the same fallback rules as a damaged `_metadata`.

The "sum" subtasks are real RocksDB backends writing real files; the coordinator runs with the
test harness's manual scheduler and inline I/O."""

from __future__ import annotations

import logging
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.properties import examples

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.completed import CompletedCheckpoint, CompletedCheckpointStore
from streamsnap.checkpoint.handles import (FileHandle, IncrementalKeyGroupsStateHandle,
                                           OperatorSubtaskState, keyed_handle_from_wire)
from streamsnap.checkpoint.messages import AcknowledgeCheckpoint
from streamsnap.checkpoint.metadata import CheckpointMetadata, OperatorState, read_metadata
from streamsnap.checkpoint.reasons import CheckpointFailureReason as R
from streamsnap.checkpoint.shared_registry import SharedStateRegistry
from streamsnap.checkpoint.storage import CheckpointStorageLocation
from streamsnap.errors import RestoreError
from streamsnap.runtime.events import CheckpointType
from streamsnap.state import ValueStateDescriptor, assign_to_key_group, key_group_range_for_subtask
from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamsnap.state.backends.rocksdb.config import RocksDBConfig

from .conftest import Harness

MAX_P = 128
COUNT = ValueStateDescriptor("count", default=0)
KEYS = range(4000)


class RocksDBJob:
    """The harness's job with its two "sum" subtasks backed by RocksDB backends."""

    def __init__(self, harness: Harness, local_dir: str):
        self.h = harness
        self.local_dir = local_dir
        self.backends = [self._backend(i) for i in range(2)]
        self.notified = 0            # how many of the gateway's completion notices were delivered
        self.hold_notifications = False

    def _backend(self, index: int) -> RocksDBKeyedStateBackend:
        return RocksDBKeyedStateBackend("sum", MAX_P, key_group_range_for_subtask(MAX_P, 2, index),
                                        RocksDBConfig(local_dir=self.local_dir))

    def update(self, keys, value_of) -> None:
        for backend in self.backends:
            state = backend.get_state(COUNT)
            for k in keys:
                kg = assign_to_key_group(k, MAX_P)
                if kg in backend.key_group_range:
                    backend.set_current_key(k, kg)
                    state.update(value_of(k))

    def values(self, backends=None) -> dict:
        out = {}
        for backend in backends or self.backends:
            state = backend.get_state(COUNT)
            for k in KEYS:
                kg = assign_to_key_group(k, MAX_P)
                if kg in backend.key_group_range:
                    backend.set_current_key(k, kg)
                    out[k] = state.value()
        return out

    def deliver_notifications(self) -> None:
        completed = [cid for attempt, cid, _ in self.h.gateway.completed if attempt.vertex_id == "sum"]
        for cid in sorted(set(completed[self.notified:])):
            for backend in self.backends:
                backend.notify_checkpoint_complete(cid)
        self.notified = len(completed)

    def checkpoint(self):
        """Trigger, snapshot every subtask, acknowledge; returns (id, future, sum handles)."""
        future = self.h.coordinator.trigger_checkpoint()
        checkpoint_id = self.h.gateway.triggered_ids()[-1]
        location = self.h.location(checkpoint_id)
        handles = []
        for attempt in self.h.tasks:
            if attempt.vertex_id == "src":
                state = {}
            else:
                handle = self.backends[attempt.index].snapshot(checkpoint_id, location).run()
                handles.append(handle)
                state = {"sum": OperatorSubtaskState(keyed=(handle,))}
            self.h.coordinator.receive_acknowledge(AcknowledgeCheckpoint(attempt, checkpoint_id, state))
        if not self.hold_notifications:
            self.deliver_notifications()
        return checkpoint_id, future, handles

    def shared_on_disk(self) -> set[str]:
        directory = Path(self.h.storage.shared_directory.removeprefix("file://"))
        return {filesystem.normalize(str(p)) for p in directory.iterdir()}

    def referenced(self) -> set[str]:
        return {url for c in self.h.coordinator.completed_store.all() for url in c.shared_files()}

    def restore_latest(self, local_dir: str) -> list[RocksDBKeyedStateBackend]:
        latest = self.h.coordinator.restore_latest_checkpoint()
        restored = []
        for index, state in latest.metadata.operators["sum"].subtask_states.items():
            backend = RocksDBKeyedStateBackend("sum", MAX_P, key_group_range_for_subtask(MAX_P, 2, index),
                                               RocksDBConfig(local_dir=local_dir))
            backend.restore(list(state.keyed), latest.location.url)
            restored.append(backend)
        return restored

    def dispose(self) -> None:
        for backend in self.backends:
            backend.dispose()


@pytest.fixture
def rocksdb_job(make_harness, tmp_path):
    jobs = []

    def make(job_class=None, **config) -> RocksDBJob:
        h = make_harness(**config)
        h.start()
        job = (job_class or RocksDBJob)(h, str(tmp_path / "rocksdb"))
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.dispose()


def test_subsumption_deletes_exactly_the_files_no_retained_checkpoint_references(rocksdb_job, tmp_path):
    job = rocksdb_job(num_retained=2)
    job.update(KEYS, lambda k: k)
    rng = random.Random(3)
    for round_ in range(6):
        if round_:
            job.update(rng.sample(KEYS, 40), lambda k: -k - round_)
        checkpoint_id, future, handles = job.checkpoint()
        assert future.result(timeout=0).checkpoint_id == checkpoint_id
        if round_ == 1:   # (later rounds may follow a background compaction, which rewrites files)
            assert not all(new for h in handles for new in h.new_shared)   # incremental
        # Every file a retained checkpoint references exists; nothing else is left in shared/.
        assert job.shared_on_disk() == job.referenced()
        assert job.h.coordinator.completed_store.registry.registered_files() == job.referenced()
    metadata = read_metadata(job.h.coordinator.completed_store.latest().location.metadata_url)
    assert metadata.incremental_size < metadata.state_size / 2
    expected = job.values()
    restored = job.restore_latest(str(tmp_path / "restored"))
    try:
        assert job.values(restored) == expected
    finally:
        for backend in restored:
            backend.dispose()


def test_a_checkpoint_reusing_files_of_a_subsumed_checkpoint_is_aborted(rocksdb_job):
    job = rocksdb_job(num_retained=1)
    job.update(KEYS, lambda k: k)
    job.hold_notifications = True                     # the tasks hear of completions late
    job.checkpoint()                                  # 1 completes
    job.update(KEYS[:10], lambda k: 5)
    _, future2, handles2 = job.checkpoint()           # 2: before notice 1, so it uploads all again;
    assert all(new for h in handles2 for new in h.new_shared)   # it completes and subsumes 1
    assert future2.result(timeout=0).checkpoint_id == 2
    for backend in job.backends:                      # notice 1 arrives late, notice 2 not yet
        backend.notify_checkpoint_complete(1)
    _, future3, handles3 = job.checkpoint()           # 3 reuses files of 1, gone now
    assert future3.exception(timeout=0).reason is R.SHARED_STATE_DISCARDED
    assert job.shared_on_disk() == job.referenced()   # 3's own uploads were deleted
    job.deliver_notifications()
    job.hold_notifications = False
    _, future4, _ = job.checkpoint()
    assert future4.result(timeout=0).checkpoint_id == 4
    assert job.shared_on_disk() == job.referenced()


def test_an_aborted_checkpoint_deletes_its_new_shared_files_only(rocksdb_job):
    job = rocksdb_job(num_retained=1)
    job.update(KEYS, lambda k: k)
    job.checkpoint()
    job.update(KEYS[:30], lambda k: 0)
    future = job.h.coordinator.trigger_checkpoint()
    checkpoint_id = job.h.gateway.triggered_ids()[-1]
    handle = job.backends[0].snapshot(checkpoint_id, job.h.location(checkpoint_id)).run()
    job.h.coordinator.receive_acknowledge(AcknowledgeCheckpoint(
        job.h.tasks[2], checkpoint_id, {"sum": OperatorSubtaskState(keyed=(handle,))}))
    assert any(handle.new_shared) and not all(handle.new_shared)
    job.h.scheduler.advance(job.h.coordinator.config.timeout + 1)      # expires
    assert future.exception(timeout=0).reason is R.CHECKPOINT_EXPIRED
    assert job.shared_on_disk() == job.referenced()
    # The files it reused from checkpoint 1 (retained) are still there.
    assert all(filesystem.exists(filesystem.join(job.h.storage.checkpoint_directory(1), f.path))
               for f in handle.reused_files())


def test_registry_is_rebuilt_after_a_driver_restart(rocksdb_job, make_harness, tmp_path):
    job = rocksdb_job(num_retained=2)
    job.update(KEYS, lambda k: k)
    for _ in range(3):
        job.checkpoint()
        job.update(KEYS[:25], lambda k: 1)
    before = job.referenced()
    # A new driver: a fresh coordinator over the same directory.
    fresh = make_harness(num_retained=2)
    fresh.start()
    assert fresh.coordinator.recover_completed_checkpoints() == [2, 3]
    assert fresh.coordinator.completed_store.registry.registered_files() == before
    job2 = RocksDBJob(fresh, str(tmp_path / "rocksdb2"))
    job2.backends = job.restore_latest(str(tmp_path / "rocksdb2"))
    job2.h = fresh
    try:
        assert job2.values() == job.values()
        for round_ in range(3):
            job2.update(KEYS[100:120], lambda k: 2)
            _, future, handles = job2.checkpoint()
            assert future.result(timeout=0)
            if round_ == 0:
                assert not all(new for h in handles for new in h.new_shared)  # reuses restored files
            assert job2.shared_on_disk() == job2.referenced()
    finally:
        job2.dispose()


@pytest.mark.parametrize("mode", ["exactly_once", "at_least_once"])
def test_a_missing_shared_file_makes_the_checkpoint_unreadable(rocksdb_job, mode, caplog):
    job = rocksdb_job(num_retained=2, mode=mode)
    job.update(KEYS, lambda k: k)
    job.checkpoint()
    job.update(KEYS[:10], lambda k: 3)
    _, _, handles = job.checkpoint()
    newest = job.h.coordinator.completed_store.latest()
    new_file = next(f for h in handles for f, new in zip(h.shared_files, h.new_shared) if new)
    victim = filesystem.join(newest.location.url, new_file.path)
    filesystem.delete(victim)
    assert_newest_unreadable(job, mode, victim, "missing", caplog)


def assert_newest_unreadable(job: RocksDBJob, mode: str, victim: str, problem: str, caplog) -> None:
    """The damaged newest checkpoint 2 cannot be restored: exactly-once refuses naming the file,
    at-least-once falls back to checkpoint 1 with a warning naming it."""
    if mode == "exactly_once":
        with pytest.raises(RestoreError, match="checkpoint 2") as info:
            job.h.coordinator.restore_latest_checkpoint()
        assert victim in str(info.value) and problem in str(info.value)
    else:
        with caplog.at_level(logging.WARNING):
            assert job.h.coordinator.restore_latest_checkpoint().checkpoint_id == 1
        assert victim in caplog.text


# ---------------------------------------------------------------- property: random retain/subsume


def _completed(job_dir: str, checkpoint_id: int, shared: list[str], registry_owner: str) -> CompletedCheckpoint:
    location = filesystem.join(job_dir, f"chk-{checkpoint_id}")
    private = filesystem.join(location, "bundle")
    filesystem.write_atomic(private, b"private")
    handle = IncrementalKeyGroupsStateHandle(
        FileHandle("bundle", 7), 0, MAX_P - 1, checkpoint_id,
        tuple(FileHandle(f"../shared/{name}", 3) for name in shared), tuple(shared),
        tuple(False for _ in shared), tuple("0" for _ in shared))
    handle = keyed_handle_from_wire(handle.to_wire())
    metadata = CheckpointMetadata("job", checkpoint_id, CheckpointType.CHECKPOINT, 0.0, 1.0,
                                  {"sum": OperatorState("sum", 1, MAX_P, {0: OperatorSubtaskState(keyed=(handle,))})})
    return CompletedCheckpoint(metadata, CheckpointStorageLocation(location, checkpoint_id))


@settings(max_examples=examples(60), deadline=None)
@given(num_retained=st.integers(1, 4),
       steps=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3), st.booleans()), min_size=1, max_size=25))
def test_registry_never_deletes_a_referenced_file_and_deletes_all_unreferenced(num_retained, steps):
    """Each step completes a checkpoint that reuses some files of retained checkpoints (as an
    incremental snapshot reuses the last completed one's) and uploads some new ones; a step
    may instead abort a pending checkpoint that had registered its files on acknowledgement."""
    with tempfile.TemporaryDirectory() as tmp:
        job_dir = filesystem.normalize(str(Path(tmp) / "job"))
        shared_dir = filesystem.join(job_dir, "shared")
        registry = SharedStateRegistry(owned_directory=job_dir)
        store = CompletedCheckpointStore(num_retained, registry)
        rng = random.Random(len(steps) * 31 + num_retained)
        counter = 0
        for checkpoint_id, (reuse, new, abort) in enumerate(steps, start=1):
            live = sorted({u.rsplit("/", 1)[-1] for c in store.all() for u in c.shared_files()})
            names = rng.sample(live, min(reuse, len(live)))
            for _ in range(new):
                counter += 1
                name = f"sst-{counter}"
                filesystem.write_atomic(filesystem.join(shared_dir, name), b"sst")
                names.append(name)
            checkpoint = _completed(job_dir, checkpoint_id, names, job_dir)
            registry.register(checkpoint_id, checkpoint.shared_files())    # on acknowledgement
            if abort:
                registry.unregister(checkpoint_id)                          # the pending one aborted
                filesystem.delete(checkpoint.location.url, recursive=True)
            else:
                store.add_checkpoint(checkpoint)
            referenced = {u for c in store.all() for u in c.shared_files()}
            on_disk = {filesystem.join(shared_dir, p.name)
                       for p in Path(shared_dir.removeprefix("file://")).iterdir()} \
                if filesystem.exists(shared_dir) else set()
            assert referenced <= on_disk, f"deleted while referenced: {sorted(referenced - on_disk)}"
            assert on_disk <= referenced, f"left unreferenced: {sorted(on_disk - referenced)}"
            assert registry.registered_files() == referenced


def test_listing_stats_rest_and_metrics_tell_checkpointed_from_full_size(rocksdb_job, monkeypatch):
    from rich.console import Console
    from typer.testing import CliRunner

    from streamsnap import cli
    from streamsnap.checkpoint.listing import list_checkpoints

    job = rocksdb_job(num_retained=2)
    job.update(KEYS, lambda k: k)
    job.checkpoint()
    job.update(KEYS[:20], lambda k: 0)
    job.checkpoint()
    first, second = list_checkpoints(job.h.storage.job_directory)
    assert first.incremental_size == first.state_size > 0
    assert 0 < second.incremental_size < second.state_size / 2
    assert second.state_size >= first.state_size
    monkeypatch.setattr(cli, "console", Console(width=250))
    out = CliRunner().invoke(cli.app, ["checkpoints", job.h.storage.job_directory])
    assert out.exit_code == 0, out.output
    assert "state size" in out.output and "checkpointed" in out.output
    assert cli._size(second.incremental_size) in out.output and cli._size(second.state_size) in out.output

    # The coordinator's stats carry both sizes on to REST and /metrics (lastCheckpointSize is
    # what the checkpoint wrote, lastCheckpointFullSize what it references).
    from prometheus_client import CollectorRegistry, generate_latest

    from streamsnap.web import metrics, views

    snapshot = job.h.coordinator.stats.snapshot()
    latest = snapshot.latest_completed
    assert (latest.checkpointed_size, latest.state_size) == (second.incremental_size, second.state_size)
    assert sum(s.checkpointed_size for s in latest.subtasks) == latest.checkpointed_size
    overview = views.checkpoints_overview(snapshot)
    assert overview["latest"]["completed"]["checkpointed_size"] == second.incremental_size
    assert overview["summary"]["checkpointed_size"]["min"] == second.incremental_size
    assert overview["summary"]["state_size"]["max"] == second.state_size
    details = views.checkpoint_details(latest, [(s.vertex_id, s.vertex_id, 1) for s in latest.subtasks])
    assert sum(t["checkpointed_size"] for t in details["tasks"].values()) == second.incremental_size

    class Families:
        def collect(self):
            return iter(metrics.checkpoint_families(snapshot, ["j", "id"]))
    registry = CollectorRegistry()
    registry.register(Families())
    text = generate_latest(registry).decode()
    assert f'lastCheckpointSize{{job="j",job_id="id"}} {float(second.incremental_size)}' in text
    assert f'lastCheckpointFullSize{{job="j",job_id="id"}} {float(second.state_size)}' in text
