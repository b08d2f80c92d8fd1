"""Fixtures of the checkpoint tests: a fake clock, a recording task gateway, real files in tmp_path."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from streamsnap.api.config import CheckpointConfig
from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.coordinator import CheckpointCoordinator, OperatorInfo
from streamsnap.checkpoint.handles import FileHandle, KeyGroupsStateHandle, OperatorSubtaskState
from streamsnap.checkpoint.messages import AcknowledgeCheckpoint, CheckpointMetrics, DeclineCheckpoint
from streamsnap.checkpoint.storage import CheckpointStorage
from streamsnap.clock import ManualScheduler
from streamsnap.cluster.status import ExecutionState, JobStatus
from streamsnap.graph.ids import ExecutionAttemptId

JOB_ID = "job0123456789"
# Two vertices of parallelism 2: the sources, and a keyed sum chained with a stateless sink.
OPERATORS = {
    "source": OperatorInfo("src", 2, 128),
    "sum": OperatorInfo("sum", 2, 128),
    "out": OperatorInfo("sum", 2, 128),
}


def attempts(number: int = 0) -> tuple[list[ExecutionAttemptId], list[ExecutionAttemptId]]:
    sources = [ExecutionAttemptId("src", i, number) for i in range(2)]
    sums = [ExecutionAttemptId("sum", i, number) for i in range(2)]
    return sources, sources + sums


def write_file(directory_url: str, name: str, payload: bytes = b"state-bytes") -> FileHandle:
    filesystem.write_atomic(filesystem.join(directory_url, name), payload)
    return FileHandle(name, len(payload))


def keyed_state(directory_url: str, name: str, shared: tuple[FileHandle, ...] = ()) -> OperatorSubtaskState:
    """A subtask snapshot with one real file written under `directory_url`."""
    return OperatorSubtaskState(keyed=(KeyGroupsStateHandle(write_file(directory_url, name), 0, 63,
                                                            {0: (0, 5)}, shared),))


def file_exists(base_url: str, relative: str) -> bool:
    return filesystem.exists(filesystem.join(base_url, relative))


class RecordingGateway:
    def __init__(self):
        self.triggered: list[tuple] = []
        self.completed: list[tuple] = []
        self.aborted: list[tuple] = []
        self.on_trigger = None
        self.fail_trigger: Exception | None = None

    def trigger_checkpoint(self, attempt, checkpoint_id, timestamp, options):
        if self.fail_trigger is not None:
            raise self.fail_trigger
        self.triggered.append((attempt, checkpoint_id, timestamp, options))
        if self.on_trigger is not None:
            self.on_trigger(attempt, checkpoint_id, options)

    def notify_checkpoint_complete(self, attempt, checkpoint_id, timestamp):
        self.completed.append((attempt, checkpoint_id, timestamp))

    def notify_checkpoint_aborted(self, attempt, checkpoint_id):
        self.aborted.append((attempt, checkpoint_id))

    def triggered_ids(self) -> list[int]:
        return sorted({cid for _, cid, _, _ in self.triggered})

    def completed_ids(self) -> list[int]:
        return sorted({cid for _, cid, _ in self.completed})

    def aborted_ids(self) -> list[int]:
        return sorted({cid for _, cid in self.aborted})


class RecordingListener:
    def __init__(self):
        self.completed = []
        self.aborted = []

    def notify_checkpoint_complete(self, checkpoint):
        self.completed.append(checkpoint.checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id):
        self.aborted.append(checkpoint_id)


@dataclass
class Harness:
    """A coordinator wired to fakes, plus the moves a test makes as the 'tasks'."""

    coordinator: CheckpointCoordinator
    scheduler: ManualScheduler
    gateway: RecordingGateway
    storage: CheckpointStorage
    failures: list = field(default_factory=list)
    attempt_number: int = 0

    @property
    def sources(self):
        return attempts(self.attempt_number)[0]

    @property
    def tasks(self):
        return attempts(self.attempt_number)[1]

    def deploy(self, number: int = 0, running: bool = True) -> None:
        self.attempt_number = number
        sources, tasks = attempts(number)
        self.coordinator.set_execution_attempts(sources, tasks, tasks, OPERATORS)
        if running:
            for attempt in tasks:
                self.coordinator.execution_state_changed(attempt, ExecutionState.RUNNING)

    def start(self) -> None:
        self.deploy()
        self.coordinator.job_status_changed(JobStatus.RUNNING)

    def location(self, checkpoint_id: int) -> str:
        pending = self.coordinator.pending_checkpoint(checkpoint_id)
        assert pending is not None, f"checkpoint {checkpoint_id} is not pending"
        return pending.location.url

    def ack_message(self, checkpoint_id: int, attempt: ExecutionAttemptId, base_url: str | None = None,
                    metrics: CheckpointMetrics = CheckpointMetrics()) -> AcknowledgeCheckpoint:
        """The ack a task would send, with its state files really written to storage."""
        base = base_url or self.location(checkpoint_id)
        tag = f"{attempt.vertex_id}-{attempt.index}-{attempt.attempt}"
        if attempt.vertex_id == "src":
            state = {"source": keyed_state(base, f"{tag}-source")}
        else:
            state = {"sum": keyed_state(base, f"{tag}-sum")}  # "out" is stateless: not reported
        return AcknowledgeCheckpoint(attempt, checkpoint_id, state, metrics)

    def ack(self, checkpoint_id: int, attempt: ExecutionAttemptId, **kwargs):
        return self.coordinator.receive_acknowledge(self.ack_message(checkpoint_id, attempt, **kwargs))

    def ack_all(self, checkpoint_id: int):
        results = [self.ack(checkpoint_id, attempt) for attempt in self.tasks]
        return results

    def decline(self, checkpoint_id: int, attempt: ExecutionAttemptId, reason) -> None:
        self.coordinator.receive_decline(DeclineCheckpoint(attempt, checkpoint_id, reason, "test"))


@pytest.fixture
def checkpoint_dir(tmp_path) -> str:
    return str(tmp_path / "checkpoints")


@pytest.fixture
def make_harness(checkpoint_dir):
    """make_harness(**CheckpointConfig fields) -> Harness; extra keywords `seed` for the initial
    delay, `fence` for the leadership check before `_metadata` is written."""
    def make(seed: int = 7, scheduler: ManualScheduler | None = None, fence=None, **config) -> Harness:
        config.setdefault("interval", None)
        config.setdefault("directory", checkpoint_dir)
        cfg = CheckpointConfig(**config)
        scheduler = scheduler or ManualScheduler()
        gateway = RecordingGateway()
        storage = CheckpointStorage(checkpoint_dir, JOB_ID)
        failures: list = []
        coordinator = CheckpointCoordinator(JOB_ID, cfg, storage, scheduler, gateway, failures.append,
                                            rng=random.Random(seed), fence=fence)
        return Harness(coordinator, scheduler, gateway, storage, failures)
    return make
