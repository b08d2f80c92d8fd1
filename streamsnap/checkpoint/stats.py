"""Checkpoint statistics (Flink's CheckpointStatsTracker), what the UI, the REST API and
`JobClient.checkpoint_stats()` show.

The tracker is fed by the coordinator (triggered, per-subtask acknowledgement, completed,
failed, restored) and hands out immutable snapshots, so readers in other threads never see
a half-updated checkpoint. All times are wall-clock seconds; sizes are bytes.
"""

from __future__ import annotations

import enum
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from streamsnap.checkpoint import storage_retry
from streamsnap.checkpoint.messages import CheckpointMetrics
from streamsnap.checkpoint.reasons import CheckpointFailureReason
from streamsnap.graph.ids import ExecutionAttemptId
from streamsnap.runtime.events import CheckpointType

DEFAULT_HISTORY_SIZE = 10


class CheckpointStatus(enum.Enum):
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


@dataclass(frozen=True)
class SubtaskCheckpointStats:
    vertex_id: str
    index: int
    attempt: int
    ack_timestamp: float
    end_to_end_duration: float      # trigger → this subtask's acknowledgement
    state_size: int
    sync_duration: float
    async_duration: float
    alignment_duration: float
    start_delay: float              # trigger → first barrier at this subtask
    bytes_processed_during_alignment: int
    bytes_persisted_of_in_flight_data: int
    unaligned: bool = False          # the barrier overtook in-flight data at this subtask
    checkpointed_size: int = 0       # bytes this subtask wrote for the checkpoint (<= state_size)
    storage_retries: int = 0         # storage calls its asynchronous part retried (throttling, 5xx)


@dataclass(frozen=True)
class CheckpointStats:
    checkpoint_id: int
    checkpoint_type: CheckpointType
    status: CheckpointStatus
    trigger_timestamp: float
    num_subtasks: int
    num_acknowledged: int
    state_size: int
    end_to_end_duration: float | None = None   # None while in progress
    external_path: str | None = None
    failure_reason: CheckpointFailureReason | None = None
    failure_message: str | None = None
    subtasks: tuple[SubtaskCheckpointStats, ...] = ()
    # Bytes written for this checkpoint; `state_size` is everything it references, shared
    # files of incremental (RocksDB) and changelog snapshots uploaded earlier included.
    checkpointed_size: int = 0

    @property
    def storage_retries(self) -> int:
        """Storage calls the subtasks retried for this checkpoint (throttling, 5xx answers)."""
        return sum(s.storage_retries for s in self.subtasks)

    @property
    def latest_ack_timestamp(self) -> float | None:
        """When the last subtask acknowledged (wall-clock epoch seconds), None before any did."""
        return max((s.ack_timestamp for s in self.subtasks), default=None)

    def __repr__(self) -> str:
        """One line (the per-subtask figures are in `.subtasks`)."""
        return f"<CheckpointStats {_describe(self)}>"


@dataclass(frozen=True)
class RestoredCheckpointStats:
    checkpoint_id: int
    checkpoint_type: CheckpointType
    restore_timestamp: float
    external_path: str


@dataclass(frozen=True)
class CheckpointCounts:
    triggered: int = 0
    in_progress: int = 0
    completed: int = 0
    failed: int = 0
    restored: int = 0


@dataclass(frozen=True)
class MinAvgMax:
    minimum: float = 0.0
    average: float = 0.0
    maximum: float = 0.0


@dataclass(frozen=True)
class CompletedCheckpointsSummary:
    """Over all checkpoints completed since the tracker was created."""

    end_to_end_duration: MinAvgMax = MinAvgMax()
    state_size: MinAvgMax = MinAvgMax()
    checkpointed_size: MinAvgMax = MinAvgMax()


@dataclass(frozen=True)
class CheckpointStatsSnapshot:
    counts: CheckpointCounts
    summary: CompletedCheckpointsSummary
    history: tuple[CheckpointStats, ...]              # newest first, bounded
    latest_completed: CheckpointStats | None = None   # latest completed checkpoint (not savepoint)
    latest_savepoint: CheckpointStats | None = None
    latest_failed: CheckpointStats | None = None
    latest_restored: RestoredCheckpointStats | None = None
    failures_by_reason: Mapping[CheckpointFailureReason, int] = field(default_factory=dict)
    # Calls on checkpoint storage retried after throttling or a 5xx answer (storage_retry): the
    # subtasks' and this process's (the `_metadata` writes, cleanup) since the tracker started.
    storage_retries: int = 0

    def __post_init__(self):
        object.__setattr__(self, "failures_by_reason", MappingProxyType(dict(self.failures_by_reason)))

    def __repr__(self) -> str:
        """One line of counts and the latest checkpoint; `describe()` (or `str()`) has more."""
        c = self.counts
        latest = self.latest_completed
        text = (f"<CheckpointStatsSnapshot {c.completed} completed, {c.failed} failed, "
                f"{c.in_progress} in progress, {c.restored} restored")
        if latest is not None:
            text += f"; latest completed: {latest.checkpoint_id}"
            if latest.end_to_end_duration is not None:
                text += f" in {latest.end_to_end_duration:.3f} s"
            text += f", {latest.state_size} bytes"
        return text + ">"

    def __str__(self) -> str:
        return self.describe()

    def describe(self) -> str:
        """A few human-readable lines (the CLI and logs print this)."""
        c = self.counts
        lines = [f"checkpoints: {c.triggered} triggered, {c.in_progress} in progress, "
                 f"{c.completed} completed, {c.failed} failed, {c.restored} restored"
                 + (f"; {self.storage_retries} storage calls retried" if self.storage_retries else "")]
        if c.completed:
            d, s = self.summary.end_to_end_duration, self.summary.state_size
            w = self.summary.checkpointed_size
            lines.append(f"  duration min/avg/max {d.minimum:.3f}/{d.average:.3f}/{d.maximum:.3f} s, "
                         f"size min/avg/max {s.minimum:.0f}/{s.average:.0f}/{s.maximum:.0f} bytes, "
                         f"written min/avg/max {w.minimum:.0f}/{w.average:.0f}/{w.maximum:.0f} bytes")
        for label, stats in (("latest completed", self.latest_completed),
                             ("latest savepoint", self.latest_savepoint),
                             ("latest failed", self.latest_failed)):
            if stats is not None:
                lines.append(f"  {label}: {_describe(stats)}")
        if self.latest_restored is not None:
            r = self.latest_restored
            lines.append(f"  restored from: {r.checkpoint_type.value} {r.checkpoint_id} at {r.external_path}")
        return "\n".join(lines)


def _describe(stats: CheckpointStats) -> str:
    text = f"{stats.checkpoint_type.value} {stats.checkpoint_id} {stats.status.value}"
    if stats.end_to_end_duration is not None:
        text += f" in {stats.end_to_end_duration:.3f} s"
    text += f", {stats.state_size} bytes ({stats.checkpointed_size} written), {stats.num_acknowledged}/{stats.num_subtasks} acknowledged"
    if stats.failure_reason is not None:
        text += f", {stats.failure_reason.name}"
        if stats.failure_message:
            text += f" ({stats.failure_message})"
    if stats.external_path:
        text += f", {stats.external_path}"
    return text


class _Running:
    """Running min/sum/max of a series."""

    def __init__(self):
        self.count, self.total, self.minimum, self.maximum = 0, 0.0, 0.0, 0.0

    def add(self, value: float) -> None:
        self.minimum = value if self.count == 0 else min(self.minimum, value)
        self.maximum = value if self.count == 0 else max(self.maximum, value)
        self.count += 1
        self.total += value

    def freeze(self) -> MinAvgMax:
        return MinAvgMax(self.minimum, self.total / self.count if self.count else 0.0, self.maximum)


class _Entry:
    """Mutable record of one checkpoint inside the tracker; frozen on the way out."""

    def __init__(self, checkpoint_id: int, checkpoint_type: CheckpointType, trigger_timestamp: float,
                 num_subtasks: int):
        self.checkpoint_id = checkpoint_id
        self.checkpoint_type = checkpoint_type
        self.trigger_timestamp = trigger_timestamp
        self.num_subtasks = num_subtasks
        self.status = CheckpointStatus.IN_PROGRESS
        self.subtasks: dict[ExecutionAttemptId, SubtaskCheckpointStats] = {}
        self.end_timestamp: float | None = None
        self.state_size: int | None = None
        self.checkpointed_size: int | None = None
        self.external_path: str | None = None
        self.failure_reason: CheckpointFailureReason | None = None
        self.failure_message: str | None = None

    def freeze(self) -> CheckpointStats:
        size = self.state_size if self.state_size is not None else sum(s.state_size for s in self.subtasks.values())
        written = (self.checkpointed_size if self.checkpointed_size is not None
                   else sum(s.checkpointed_size for s in self.subtasks.values()))
        duration = None if self.end_timestamp is None else self.end_timestamp - self.trigger_timestamp
        subtasks = tuple(sorted(self.subtasks.values(), key=lambda s: (s.vertex_id, s.index)))
        return CheckpointStats(self.checkpoint_id, self.checkpoint_type, self.status, self.trigger_timestamp,
                               self.num_subtasks, len(self.subtasks), size, duration, self.external_path,
                               self.failure_reason, self.failure_message, subtasks, written)


class CheckpointStatsTracker:
    def __init__(self, history_size: int = DEFAULT_HISTORY_SIZE):
        if history_size < 1:
            raise ValueError(f"history_size must be >= 1, got {history_size}")
        self.history_size = history_size
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._triggered = self._completed = self._failed = self._restored = 0
        self._latest: dict[str, CheckpointStats] = {}
        self._latest_restored: RestoredCheckpointStats | None = None
        self._durations, self._sizes, self._written = _Running(), _Running(), _Running()
        self._failures_by_reason: Counter[CheckpointFailureReason] = Counter()
        self._task_storage_retries = 0
        self._own_retries_at_start = storage_retry.COUNTER.total

    def report_pending(self, checkpoint_id: int, trigger_timestamp: float, checkpoint_type: CheckpointType,
                       num_subtasks: int) -> None:
        self._triggered += 1
        self._entries[checkpoint_id] = _Entry(checkpoint_id, checkpoint_type, trigger_timestamp, num_subtasks)
        self._evict()

    def report_subtask(self, checkpoint_id: int, attempt: ExecutionAttemptId, ack_timestamp: float,
                       state_size: int, metrics: CheckpointMetrics, checkpointed_size: int | None = None) -> None:
        """checkpointed_size: bytes the subtask wrote for this checkpoint (None: all of state_size)."""
        entry = self._entries.get(checkpoint_id)
        if entry is None or entry.status is not CheckpointStatus.IN_PROGRESS:
            return
        entry.subtasks[attempt] = SubtaskCheckpointStats(
            attempt.vertex_id, attempt.index, attempt.attempt, ack_timestamp,
            ack_timestamp - entry.trigger_timestamp, state_size, metrics.sync_duration,
            metrics.async_duration, metrics.alignment_duration, metrics.start_delay,
            metrics.bytes_processed_during_alignment, metrics.bytes_persisted_of_in_flight_data,
            metrics.unaligned, state_size if checkpointed_size is None else checkpointed_size,
            metrics.storage_retries)
        self._task_storage_retries += metrics.storage_retries

    def report_completed(self, checkpoint_id: int, completion_timestamp: float, state_size: int,
                         external_path: str | None = None, checkpointed_size: int | None = None) -> None:
        """state_size: every byte the checkpoint references; checkpointed_size: what it wrote
        itself (None: the same, no snapshot was incremental)."""
        entry = self._finish(checkpoint_id, completion_timestamp)
        if entry is None:
            return
        entry.status, entry.state_size, entry.external_path = CheckpointStatus.COMPLETED, state_size, external_path
        entry.checkpointed_size = state_size if checkpointed_size is None else checkpointed_size
        self._completed += 1
        frozen = entry.freeze()
        self._durations.add(frozen.end_to_end_duration or 0.0)
        self._sizes.add(float(state_size))
        self._written.add(float(entry.checkpointed_size))
        self._latest["savepoint" if entry.checkpoint_type.is_savepoint else "completed"] = frozen

    def report_failed(self, checkpoint_id: int, failure_timestamp: float, reason: CheckpointFailureReason,
                      message: str | None = None) -> None:
        entry = self._finish(checkpoint_id, failure_timestamp)
        if entry is None:
            return
        entry.status, entry.failure_reason, entry.failure_message = CheckpointStatus.FAILED, reason, message
        self._failed += 1
        self._failures_by_reason[reason] += 1
        self._latest["failed"] = entry.freeze()

    def report_failed_without_in_progress(self, reason: CheckpointFailureReason) -> None:
        """A checkpoint that failed before it was in progress (its location could not be made,
        e.g. a full disk): counted as failed, by reason, with no history entry (Flink's
        reportFailedCheckpointsWithoutInProgress)."""
        self._failed += 1
        self._failures_by_reason[reason] += 1

    def report_restored(self, checkpoint_id: int, restore_timestamp: float, external_path: str,
                        checkpoint_type: CheckpointType = CheckpointType.CHECKPOINT) -> None:
        self._restored += 1
        self._latest_restored = RestoredCheckpointStats(checkpoint_id, checkpoint_type, restore_timestamp,
                                                        external_path)

    def _finish(self, checkpoint_id: int, timestamp: float) -> _Entry | None:
        entry = self._entries.get(checkpoint_id)
        if entry is None or entry.status is not CheckpointStatus.IN_PROGRESS:
            return None
        entry.end_timestamp = timestamp
        self._evict()
        return entry

    def _evict(self) -> None:
        """Bound the history; checkpoints still in progress are never evicted."""
        excess = len(self._entries) - self.history_size
        for checkpoint_id in [i for i, e in self._entries.items() if e.status is not CheckpointStatus.IN_PROGRESS]:
            if excess <= 0:
                break
            del self._entries[checkpoint_id]
            excess -= 1

    def snapshot(self) -> CheckpointStatsSnapshot:
        in_progress = sum(1 for e in self._entries.values() if e.status is CheckpointStatus.IN_PROGRESS)
        history = tuple(e.freeze() for e in reversed(self._entries.values()))
        return CheckpointStatsSnapshot(
            CheckpointCounts(self._triggered, in_progress, self._completed, self._failed, self._restored),
            CompletedCheckpointsSummary(self._durations.freeze(), self._sizes.freeze(), self._written.freeze()),
            history, self._latest.get("completed"), self._latest.get("savepoint"), self._latest.get("failed"),
            self._latest_restored, self._failures_by_reason,
            self._task_storage_retries + storage_retry.COUNTER.total - self._own_retries_at_start)


__all__ = ["CheckpointStatsTracker", "CheckpointStatsSnapshot", "CheckpointStats", "CheckpointStatus",
           "SubtaskCheckpointStats", "RestoredCheckpointStats", "CheckpointCounts",
           "CompletedCheckpointsSummary", "MinAvgMax", "DEFAULT_HISTORY_SIZE"]
