"""Changelog checkpoints through the coordinator: the "sum" subtasks are real RocksDB backends
in changelog mode writing real files; the SharedStateRegistry reference-counts their segments
and materializations. Random checkpoints, materializations, expiries and late notifications
never delete a file a retained checkpoint references, and every retained checkpoint restores
the state it was taken at; a damaged segment makes a checkpoint unreadable like a damaged
`_metadata`."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.properties import examples

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.handles import ChangelogStateHandle, OperatorSubtaskState
from streamsnap.checkpoint.messages import AcknowledgeCheckpoint
from streamsnap.checkpoint.reasons import CheckpointFailureReason as R
from streamsnap.state import key_group_range_for_subtask
from streamsnap.state.backends.changelog import ChangelogConfig
from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamsnap.state.backends.rocksdb.config import RocksDBConfig

from streamsnap.api.config import CheckpointConfig
from streamsnap.checkpoint.coordinator import CheckpointCoordinator
from streamsnap.checkpoint.storage import CheckpointStorage
from streamsnap.clock import ManualScheduler

from .conftest import JOB_ID, Harness, RecordingGateway
from .test_incremental_checkpoints import (KEYS, MAX_P, RocksDBJob, assert_newest_unreadable,  # noqa: F401
                                           rocksdb_job)


class ChangelogJob(RocksDBJob):
    """RocksDBJob with changelog backends; delivers abort notices too."""

    def __init__(self, harness: Harness, local_dir: str):
        super().__init__(harness, local_dir)
        self.aborted_notified = 0
        self.expected: dict[int, dict] = {}      # checkpoint -> the state it was taken at

    def _backend(self, index: int) -> RocksDBKeyedStateBackend:
        return RocksDBKeyedStateBackend("sum", MAX_P, key_group_range_for_subtask(MAX_P, 2, index),
                                        RocksDBConfig(local_dir=self.local_dir, changelog=ChangelogConfig(3600.0)))

    def restore_latest(self, local_dir: str) -> list[RocksDBKeyedStateBackend]:
        latest = self.h.coordinator.restore_latest_checkpoint()
        restored = []
        for index, state in latest.metadata.operators["sum"].subtask_states.items():
            backend = self._backend(index)
            backend.restore(list(state.keyed), latest.location.url)
            restored.append(backend)
        return restored

    def deliver_notifications(self) -> None:
        super().deliver_notifications()
        aborted = [cid for attempt, cid in self.h.gateway.aborted if attempt.vertex_id == "sum"]
        for cid in sorted(set(aborted[self.aborted_notified:])):
            for backend in self.backends:
                backend.notify_checkpoint_aborted(cid)
        self.aborted_notified = len(aborted)

    def checkpoint(self, materialize: bool = False):
        for backend in self.backends:
            backend.changelog.book.materialization_interval = 0.0 if materialize else 3600.0
        expected = self.values()
        result = super().checkpoint()
        self.expected[result[0]] = expected
        for backend in self.backends:
            backend.changelog.wait_for_materializations()
        return result

    def expire_one(self) -> int:
        """A checkpoint one subtask acknowledges (uploading its log) and that then expires."""
        future = self.h.coordinator.trigger_checkpoint()
        checkpoint_id = self.h.gateway.triggered_ids()[-1]
        location = self.h.location(checkpoint_id)
        handle = self.backends[0].snapshot(checkpoint_id, location).run()
        attempt = next(a for a in self.h.tasks if a.vertex_id == "sum" and a.index == 0)
        self.h.coordinator.receive_acknowledge(AcknowledgeCheckpoint(
            attempt, checkpoint_id, {"sum": OperatorSubtaskState(keyed=(handle,))}))
        self.h.scheduler.advance(self.h.coordinator.config.timeout + 1)
        # It expired (or aborted at once: it reused a materialization an earlier abort deleted, whose
        # notice the task has not heard yet)
        assert future.exception(timeout=0).reason in (R.CHECKPOINT_EXPIRED, R.SHARED_STATE_DISCARDED)
        # The other subtask cut its log too (its barrier came), then heard of the abort.
        self.backends[1].snapshot(checkpoint_id, location).discard()
        if not self.hold_notifications:
            self.deliver_notifications()
        return checkpoint_id

    def check_files(self) -> None:
        on_disk = self.shared_on_disk() if filesystem.exists(self.h.storage.shared_directory) else set()
        missing = self.referenced() - on_disk
        assert not missing, f"deleted while a retained checkpoint references them: {sorted(missing)}"


@pytest.fixture
def changelog_job(rocksdb_job):
    return lambda **config: rocksdb_job(job_class=ChangelogJob, **config)


def check_restores(job: ChangelogJob, local_dir: str) -> None:
    latest = job.h.coordinator.completed_store.latest()
    restored = job.restore_latest(local_dir)
    try:
        assert job.values(restored) == job.expected[latest.checkpoint_id]
    finally:
        for backend in restored:
            backend.dispose()


def test_subsumption_keeps_what_retained_checkpoints_need_and_restore_equals_the_state(changelog_job, tmp_path):
    job = changelog_job(num_retained=2)
    job.update(KEYS, lambda k: k)
    rng = random.Random(5)
    for round_ in range(7):
        if round_:
            job.update(rng.sample(KEYS, 40), lambda k: -k - round_)
        checkpoint_id, future, handles = job.checkpoint(materialize=round_ in (1, 4))
        assert future.result(timeout=0).checkpoint_id == checkpoint_id
        assert all(isinstance(h, ChangelogStateHandle) for h in handles)
        job.check_files()
        assert job.h.coordinator.completed_store.registry.registered_files() == job.referenced()
    latest = job.h.coordinator.completed_store.latest().metadata
    assert latest.incremental_size < latest.state_size / 10
    # Segments before the last materialization's cut are no longer referenced: deleted.
    assert not any("changelog-0-" in url for url in job.shared_on_disk())
    check_restores(job, str(tmp_path / "restored"))


def fresh_harness(directory: str, **config) -> Harness:
    """A started harness over its own checkpoint directory (one per hypothesis example)."""
    scheduler, gateway, failures = ManualScheduler(), RecordingGateway(), []
    coordinator = CheckpointCoordinator(JOB_ID, CheckpointConfig(interval=None, directory=directory, **config),
                                        CheckpointStorage(directory, JOB_ID), scheduler, gateway,
                                        failures.append, rng=random.Random(7))
    h = Harness(coordinator, scheduler, gateway, coordinator.storage, failures)
    h.start()
    return h


@settings(max_examples=examples(12), deadline=None)
@given(steps=st.lists(st.sampled_from(["update", "checkpoint", "materialize", "expire", "hold", "deliver"]),
                      min_size=1, max_size=14),
       num_retained=st.integers(1, 2))
def test_random_checkpoints_materializations_and_aborts_never_lose_state(tmp_path_factory, steps, num_retained):
    tmp = tmp_path_factory.mktemp("changelog")
    h = fresh_harness(str(tmp / "checkpoints"), num_retained=num_retained, tolerable_failures=1000)
    job = ChangelogJob(h, str(tmp / "rocksdb"))
    rng = random.Random(len(steps))
    try:
        job.update(KEYS, lambda k: k)
        for i, step in enumerate(steps):
            if step == "update":
                job.update(rng.sample(KEYS, 50), lambda k: k * 10 + i)
            elif step in ("checkpoint", "materialize"):
                job.checkpoint(materialize=step == "materialize")
            elif step == "expire":
                job.expire_one()
            elif step == "hold":
                job.hold_notifications = True
            else:
                job.hold_notifications = False
                job.deliver_notifications()
            job.check_files()
        job.hold_notifications = False
        job.deliver_notifications()
        for _ in range(2):      # after a quiet period checkpoints complete again
            checkpoint_id, future, _ = job.checkpoint()
            job.check_files()
        assert future.result(timeout=0).checkpoint_id == checkpoint_id
        check_restores(job, str(tmp / "restored"))
    finally:
        job.dispose()


@pytest.mark.parametrize("mode", ["exactly_once", "at_least_once"])
def test_a_damaged_segment_makes_the_checkpoint_unreadable(changelog_job, mode, caplog):
    job = changelog_job(num_retained=2, mode=mode)
    job.update(KEYS, lambda k: k)
    job.checkpoint()
    job.update(KEYS[:10], lambda k: 3)
    _, _, handles = job.checkpoint()
    newest = job.h.coordinator.completed_store.latest()
    segment = handles[0].segments[-1]
    assert handles[0].new_segments[-1]
    victim = filesystem.join(newest.location.url, segment.file.path)
    path = victim.removeprefix("file://")
    with open(path, "r+b") as f:          # same size, one byte flipped
        f.seek(20)
        byte = f.read(1)
        f.seek(20)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert_newest_unreadable(job, mode, victim, "corrupt", caplog)
