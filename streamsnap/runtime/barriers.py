"""Barrier handlers: decide, from the in-band events of a task's inputs, when to snapshot.

A non-source task learns that checkpoint *n* has reached it only through the barriers its
input channels deliver. The handler turns that event stream into decisions — block or resume a
channel, take the snapshot now, decline a checkpoint — and hands them to a
`BarrierHandlerActions` object. It is sans-I/O: no sockets, threads or timers, only a `Clock`
for the metrics, so every interleaving can be replayed deterministically in tests.

Two strategies exist, chosen by the checkpointing mode:

* `CheckpointBarrierAligner` (exactly-once). A channel that delivered barrier *n* is blocked —
  not read, so its sender backpressures — until barrier *n* arrived (or the channel closed) on
  every channel. Then the snapshot is taken, so the state covers exactly the records before
  the barriers. Nothing is buffered here: a blocked channel simply stays unread.
* `CheckpointBarrierTracker` (at-least-once). Never blocks; it only counts barriers, and
  snapshots once all of them arrived. Records after a barrier may already be in the state, so
  they are replayed after a restore (duplicates, but never losses).

Both rely on one protocol fact: on any single channel, checkpoint ids strictly increase. A
channel delivering (a barrier or a cancel marker for) id *m* has therefore passed every
checkpoint older than *m*; if it did not deliver that older barrier, that checkpoint can no
longer complete at this task, and is declined at once rather than left to time out.
"""

from __future__ import annotations

import abc
import enum
import logging
from dataclasses import dataclass, field
from typing import Protocol

from streamsnap.checkpoint.reasons import CheckpointFailureReason
from streamsnap.clock import Clock
from streamsnap.errors import StreamsnapError
from streamsnap.runtime.aborted_ids import AbortedIds
from streamsnap.runtime.events import CancelCheckpointMarker, CheckpointBarrier

__all__ = [
    "AlignmentMetrics",
    "BarrierHandlerActions",
    "BarrierProtocolError",
    "CheckpointBarrierAligner",
    "CheckpointBarrierHandler",
    "CheckpointBarrierTracker",
    "HandlerKind",
    "create_barrier_handler",
]

log = logging.getLogger(__name__)

_SUBSUMED = CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED
_CANCELLED = CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER

class BarrierProtocolError(StreamsnapError):
    """The event sequence of an input broke the barrier protocol.

    This is a bug in the sender or in the input reading the channels (for instance reading a
    channel the handler blocked), not a user error; continuing would silently break the
    checkpoint's consistency, so the task must fail.
    """


@dataclass(frozen=True)
class AlignmentMetrics:
    """What the task reports with its acknowledgement about reaching the snapshot point."""

    # Seconds from the first barrier of the checkpoint at this task to full alignment
    # (0 for a single channel and for the tracker, which never aligns).
    alignment_duration: float
    # Bytes of records consumed between the first barrier and the trigger.
    bytes_processed_during_alignment: int
    # Seconds from the coordinator's trigger (barrier timestamp, wall clock) to the arrival
    # of the first barrier here; clamped at 0 because wall clocks of hosts disagree.
    start_delay: float
    # True when the snapshot was taken before alignment (the barrier overtakes in-flight data,
    # which the input keeps as channel state; see `runtime/unaligned_barriers.py`).
    unaligned: bool = False


class BarrierHandlerActions(Protocol):
    """How a handler acts on the task; implemented by the task's input side."""

    def block_channel(self, channel: int) -> None: ...

    def resume_channel(self, channel: int) -> None: ...

    def trigger_checkpoint(self, barrier: CheckpointBarrier, metrics: AlignmentMetrics) -> None:
        """Take the snapshot for `barrier` now (before reading anything else)."""

    def abort_checkpoint(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        """Decline the checkpoint and broadcast a CancelCheckpointMarker downstream."""


class HandlerKind(enum.Enum):
    ALIGNER = "aligner"   # exactly-once
    TRACKER = "tracker"   # at-least-once


class CheckpointBarrierHandler(abc.ABC):
    """Common bookkeeping of both strategies: channels, closed channels, metrics inputs.

    Subclasses implement the reaction to barriers, cancel markers, end of partition and
    aborts announced by the coordinator. Handlers update their own state before calling out
    to `actions`, so an action that inspects the handler sees a consistent picture.
    """

    kind: HandlerKind

    def __init__(self, num_channels: int, actions: BarrierHandlerActions, clock: Clock,
                 task_name: str):
        if isinstance(num_channels, bool) or not isinstance(num_channels, int) or num_channels < 1:
            raise ValueError(
                f"{task_name}: num_channels must be a positive integer (the number of input "
                f"channels of the task), got {num_channels!r}")
        self._num_channels = num_channels
        self._actions = actions
        self._clock = clock
        self._task_name = task_name
        self._closed: set[int] = set()
        # Highest checkpoint id delivered in-band (barrier or cancel marker) on any channel.
        self._latest_id = -1
        # Channels the input must leave unread (only handlers that align block any).
        self._blocked: set[int] = set()
        # Ids newer than anything seen that the coordinator already aborted.
        self._aborted_ahead = AbortedIds()

    # -- public, shared -------------------------------------------------------------------

    @property
    def num_channels(self) -> int:
        return self._num_channels

    @property
    def task_name(self) -> str:
        return self._task_name

    @property
    def latest_checkpoint_id(self) -> int:
        """Highest checkpoint id this handler has started or seen (-1 before any)."""
        return self._latest_id

    @property
    def num_closed_channels(self) -> int:
        return len(self._closed)

    @property
    def all_channels_closed(self) -> bool:
        """True once every channel delivered end of partition: nothing more can arrive."""
        return len(self._closed) == self._num_channels

    def is_closed(self, channel: int) -> bool:
        self._check_channel(channel)
        return channel in self._closed

    def add_processed_bytes(self, n: int) -> None:
        """Called by the input for every data frame consumed (feeds the alignment metric)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{self._task_name}: processed bytes must be an int >= 0, got {n!r}")
        self._on_processed_bytes(n)

    # -- to implement -----------------------------------------------------------------------

    @abc.abstractmethod
    def is_blocked(self, channel: int) -> bool:
        """Whether the input must leave `channel` unread for now."""

    @abc.abstractmethod
    def process_barrier(self, barrier: CheckpointBarrier, channel: int) -> None: ...

    @abc.abstractmethod
    def process_cancellation_barrier(self, marker: CancelCheckpointMarker,
                                     channel: int) -> None: ...

    @abc.abstractmethod
    def process_end_of_partition(self, channel: int) -> None:
        """`channel` is closed for good; it counts as aligned for every checkpoint from now on."""

    @abc.abstractmethod
    def on_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """The coordinator aborted the checkpoint: stop waiting for it, ignore its barriers.

        The coordinator already knows, so this never calls `abort_checkpoint`.
        """

    def _on_processed_bytes(self, n: int) -> None:
        pass

    # -- helpers ------------------------------------------------------------------------------

    def _check_channel(self, channel: int) -> None:
        if isinstance(channel, bool) or not isinstance(channel, int):
            raise TypeError(f"{self._task_name}: channel index must be an int, got {channel!r}")
        if not 0 <= channel < self._num_channels:
            raise ValueError(
                f"{self._task_name}: input channel {channel} is out of range; this task has "
                f"{self._num_channels} input channel(s), valid indices are "
                f"0..{self._num_channels - 1}")

    def _check_open(self, channel: int, what: str) -> None:
        self._check_channel(channel)
        if channel in self._closed:
            raise BarrierProtocolError(
                f"{self._task_name}: received {what} on input channel {channel} after its end "
                f"of partition; nothing may follow end of partition on a channel")

    def _start_delay(self, barrier: CheckpointBarrier) -> float:
        return max(0.0, self._clock.wall() - barrier.timestamp)

    def _is_aligned(self, channels: set[int]) -> bool:
        """Barriers received + closed channels (each channel counted once) cover all inputs."""
        return len(channels | self._closed) == self._num_channels

    def _advance_latest(self, checkpoint_id: int) -> None:
        self._latest_id = checkpoint_id
        self._aborted_ahead.forget_below(checkpoint_id)

    def _remember_aborted_ahead(self, checkpoint_id: int) -> None:
        """The coordinator aborted an id not seen yet: its barriers must not start a doomed
        checkpoint. The latest id is not advanced: an older checkpoint may still be alive."""
        self._aborted_ahead.add(checkpoint_id)

    def _check_unblocked(self, channel: int, what: str, blocking_id: int | None) -> None:
        if channel in self._blocked:
            # Records behind the barrier could already have been processed: exactly-once is
            # broken, so the task must fail.
            raise BarrierProtocolError(
                f"{self._task_name}: {what} read from input channel {channel} while it is "
                f"blocked for checkpoint {blocking_id}; the input must not read a blocked "
                f"channel until it is resumed")

    def _unblock_all(self) -> list[int]:
        blocked = sorted(self._blocked)
        self._blocked.clear()
        return blocked

    def _resume(self, channels: list[int]) -> None:
        for channel in channels:
            self._actions.resume_channel(channel)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(task={self._task_name!r}, channels={self._num_channels}, "
                f"latest={self._latest_id}, closed={sorted(self._closed)})")


# ------------------------------------------------------------------------------------------
# Exactly-once
# ------------------------------------------------------------------------------------------


@dataclass
class _Alignment:
    """The one checkpoint the aligner currently waits for."""

    barrier: CheckpointBarrier          # the first barrier received for it
    started: float                      # clock.monotonic() at the first barrier
    start_delay: float
    channels: set[int] = field(default_factory=set)   # channels that delivered its barrier
    bytes_processed: int = 0

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id


class CheckpointBarrierAligner(CheckpointBarrierHandler):
    """Exactly-once: block each channel at its barrier until all channels are aligned.

    At most one checkpoint is aligned at a time. Once the handler has moved past an id
    (completed, declined, cancelled or subsumed it), every later event for that id or an older
    one is ignored: this is what guarantees a checkpoint is triggered or declined at most once.
    """

    kind = HandlerKind.ALIGNER

    def __init__(self, num_channels: int, actions: BarrierHandlerActions, clock: Clock,
                 task_name: str):
        super().__init__(num_channels, actions, clock, task_name)
        self._alignment: _Alignment | None = None

    @property
    def aligning_checkpoint_id(self) -> int | None:
        """The checkpoint whose alignment is in progress, if any."""
        return self._alignment.checkpoint_id if self._alignment else None

    def is_blocked(self, channel: int) -> bool:
        self._check_channel(channel)
        return channel in self._blocked

    def _on_processed_bytes(self, n: int) -> None:
        if self._alignment is not None:
            self._alignment.bytes_processed += n

    def process_barrier(self, barrier: CheckpointBarrier, channel: int) -> None:
        self._check_open(channel, f"barrier {barrier.checkpoint_id}")
        checkpoint_id = barrier.checkpoint_id
        current = self._alignment
        if channel in self._blocked:
            assert current is not None
            if checkpoint_id == current.checkpoint_id:
                raise BarrierProtocolError(
                    f"{self._task_name}: duplicate barrier for checkpoint {checkpoint_id} on "
                    f"input channel {channel}, which is blocked waiting for that checkpoint's "
                    f"alignment; a channel delivers each checkpoint's barrier at most once")
            self._check_unblocked(channel, f"barrier {checkpoint_id}", current.checkpoint_id)

        if current is not None and checkpoint_id == current.checkpoint_id:
            current.channels.add(channel)
            self._block_or_complete(channel)
            return

        if checkpoint_id <= self._latest_id:
            # Older than the alignment in progress, or of a checkpoint already completed,
            # declined or cancelled here: it can no longer matter. Keep reading the channel.
            log.debug("%s: ignoring obsolete barrier %d on channel %d (latest checkpoint %d)",
                      self._task_name, checkpoint_id, channel, self._latest_id)
            return

        # A barrier of a checkpoint newer than anything seen.
        self._advance_latest(checkpoint_id)
        if current is not None:
            log.warning(
                "%s: received barrier of checkpoint %d on channel %d before completing the "
                "alignment of checkpoint %d; declining checkpoint %d (subsumed)",
                self._task_name, checkpoint_id, channel, current.checkpoint_id,
                current.checkpoint_id)
            self._abort_alignment(_SUBSUMED)
        if checkpoint_id in self._aborted_ahead:
            self._aborted_ahead.discard(checkpoint_id)
            log.debug("%s: checkpoint %d was already aborted by the coordinator; not aligning",
                      self._task_name, checkpoint_id)
            return
        self._alignment = _Alignment(barrier=barrier, started=self._clock.monotonic(),
                                     start_delay=self._start_delay(barrier), channels={channel})
        self._block_or_complete(channel)

    def process_cancellation_barrier(self, marker: CancelCheckpointMarker, channel: int) -> None:
        self._check_open(channel, f"cancel marker {marker.checkpoint_id}")
        checkpoint_id = marker.checkpoint_id
        current = self._alignment
        self._check_unblocked(channel, f"cancel marker {checkpoint_id}", self.aligning_checkpoint_id)

        if current is not None and checkpoint_id == current.checkpoint_id:
            log.debug("%s: checkpoint %d cancelled by upstream on channel %d; stopping alignment",
                      self._task_name, checkpoint_id, channel)
            self._abort_alignment(_CANCELLED)
            return

        if checkpoint_id <= self._latest_id:
            log.debug("%s: ignoring obsolete cancel marker %d on channel %d (latest checkpoint %d)",
                      self._task_name, checkpoint_id, channel, self._latest_id)
            return

        # Cancellation of a checkpoint newer than anything seen: its barriers arriving later on
        # other channels must not start an alignment, hence it becomes the latest id.
        self._advance_latest(checkpoint_id)
        if current is not None:
            # This channel skipped the current checkpoint, which therefore cannot complete.
            log.warning(
                "%s: received cancel marker of checkpoint %d on channel %d before completing the "
                "alignment of checkpoint %d; declining checkpoint %d (subsumed)",
                self._task_name, checkpoint_id, channel, current.checkpoint_id,
                current.checkpoint_id)
            self._abort_alignment(_SUBSUMED)
        if checkpoint_id in self._aborted_ahead:
            self._aborted_ahead.discard(checkpoint_id)
            return
        log.debug("%s: checkpoint %d cancelled by upstream before any barrier; skipping it",
                  self._task_name, checkpoint_id)
        self._actions.abort_checkpoint(checkpoint_id, _CANCELLED)

    def process_end_of_partition(self, channel: int) -> None:
        self._check_channel(channel)
        if channel in self._closed:
            log.debug("%s: end of partition repeated on channel %d", self._task_name, channel)
            return
        self._closed.add(channel)
        if channel in self._blocked:
            # Already counted through its barrier; keep block/resume calls balanced.
            self._blocked.discard(channel)
            self._actions.resume_channel(channel)
        if self._alignment is not None and self._is_aligned(self._alignment.channels):
            self._complete_alignment()

    def on_checkpoint_aborted(self, checkpoint_id: int) -> None:
        current = self._alignment
        if current is not None and checkpoint_id == current.checkpoint_id:
            log.debug("%s: checkpoint %d aborted by the coordinator; releasing its alignment",
                      self._task_name, checkpoint_id)
            self._alignment = None
            self._release_all()
        elif checkpoint_id > self._latest_id:
            self._remember_aborted_ahead(checkpoint_id)

    # -- internals ----------------------------------------------------------------------------

    def _block_or_complete(self, channel: int) -> None:
        """After `channel` delivered the current barrier: trigger if aligned, else block it.

        The last channel is never blocked (a single input, or all others closed, never blocks).
        """
        assert self._alignment is not None
        if self._is_aligned(self._alignment.channels):
            self._complete_alignment()
        else:
            self._blocked.add(channel)
            self._actions.block_channel(channel)

    def _complete_alignment(self) -> None:
        alignment = self._alignment
        assert alignment is not None
        self._alignment = None
        metrics = AlignmentMetrics(
            alignment_duration=max(0.0, self._clock.monotonic() - alignment.started),
            bytes_processed_during_alignment=alignment.bytes_processed,
            start_delay=alignment.start_delay,
        )
        log.debug("%s: all barriers of checkpoint %d received; triggering (%s)",
                  self._task_name, alignment.checkpoint_id, metrics)
        # Release first: the snapshot point is here, and the task resumes reading after it.
        self._release_all()
        self._actions.trigger_checkpoint(alignment.barrier, metrics)

    def _abort_alignment(self, reason: CheckpointFailureReason) -> None:
        alignment = self._alignment
        assert alignment is not None
        self._alignment = None
        # Internal state is final before any call out (an action may query the handler);
        # the calls go out in Flink's order: decline, then release.
        released = self._unblock_all()
        self._actions.abort_checkpoint(alignment.checkpoint_id, reason)
        self._resume(released)

    def _release_all(self) -> None:
        self._resume(self._unblock_all())


# ------------------------------------------------------------------------------------------
# At-least-once
# ------------------------------------------------------------------------------------------


@dataclass
class _PendingCount:
    """Barriers seen so far for one checkpoint the tracker waits for."""

    barrier: CheckpointBarrier
    start_delay: float
    channels: set[int] = field(default_factory=set)


class CheckpointBarrierTracker(CheckpointBarrierHandler):
    """At-least-once: never block; snapshot once every channel delivered the barrier.

    Several checkpoints can be in flight (their barriers overtake nothing, but a channel may
    be far ahead of another), so up to `max_pending_checkpoints` are counted at once, oldest
    first. Checkpoints are triggered in increasing id order, each at most once.
    """

    kind = HandlerKind.TRACKER
    DEFAULT_MAX_PENDING = 50

    def __init__(self, num_channels: int, actions: BarrierHandlerActions, clock: Clock,
                 task_name: str, *, max_pending_checkpoints: int = DEFAULT_MAX_PENDING):
        super().__init__(num_channels, actions, clock, task_name)
        if max_pending_checkpoints < 1:
            raise ValueError(f"{task_name}: max_pending_checkpoints must be >= 1, "
                             f"got {max_pending_checkpoints!r}")
        self._max_pending = max_pending_checkpoints
        # Insertion order == increasing id: only ids above the latest one are ever added.
        self._pending: dict[int, _PendingCount] = {}
        self._last_triggered = -1

    @property
    def pending_checkpoint_ids(self) -> tuple[int, ...]:
        return tuple(self._pending)

    @property
    def last_triggered_checkpoint_id(self) -> int:
        return self._last_triggered

    def is_blocked(self, channel: int) -> bool:
        self._check_channel(channel)
        return False

    def process_barrier(self, barrier: CheckpointBarrier, channel: int) -> None:
        self._check_open(channel, f"barrier {barrier.checkpoint_id}")
        checkpoint_id = barrier.checkpoint_id
        pending = self._pending.get(checkpoint_id)
        if pending is not None and channel in pending.channels:
            raise BarrierProtocolError(
                f"{self._task_name}: duplicate barrier for checkpoint {checkpoint_id} on input "
                f"channel {channel}; a channel delivers each checkpoint's barrier at most once")
        self._abort_skipped_by(channel, checkpoint_id)

        if pending is None:
            if checkpoint_id <= self._latest_id:
                # Completed, declined, or skipped by a channel that is already further ahead.
                log.debug("%s: ignoring obsolete barrier %d on channel %d (latest checkpoint %d)",
                          self._task_name, checkpoint_id, channel, self._latest_id)
                return
            self._advance_latest(checkpoint_id)
            if checkpoint_id in self._aborted_ahead:
                self._aborted_ahead.discard(checkpoint_id)
                return
            pending = _PendingCount(barrier=barrier, start_delay=self._start_delay(barrier))
            self._pending[checkpoint_id] = pending
            if len(self._pending) > self._max_pending:
                oldest = next(iter(self._pending))
                del self._pending[oldest]
                log.warning("%s: more than %d checkpoints pending; declining the oldest, %d",
                            self._task_name, self._max_pending, oldest)
                self._actions.abort_checkpoint(oldest, _SUBSUMED)
        pending.channels.add(channel)
        if self._is_aligned(pending.channels):
            self._trigger(checkpoint_id)

    def process_cancellation_barrier(self, marker: CancelCheckpointMarker, channel: int) -> None:
        self._check_open(channel, f"cancel marker {marker.checkpoint_id}")
        checkpoint_id = marker.checkpoint_id
        self._abort_skipped_by(channel, checkpoint_id)
        if self._pending.pop(checkpoint_id, None) is not None:
            log.debug("%s: checkpoint %d cancelled by upstream on channel %d",
                      self._task_name, checkpoint_id, channel)
            self._actions.abort_checkpoint(checkpoint_id, _CANCELLED)
        elif checkpoint_id > self._latest_id:
            # Becoming the latest id makes its later barriers obsolete.
            self._advance_latest(checkpoint_id)
            if checkpoint_id in self._aborted_ahead:
                self._aborted_ahead.discard(checkpoint_id)
                return
            log.debug("%s: checkpoint %d cancelled by upstream before any barrier",
                      self._task_name, checkpoint_id)
            self._actions.abort_checkpoint(checkpoint_id, _CANCELLED)
        else:
            log.debug("%s: ignoring obsolete cancel marker %d on channel %d",
                      self._task_name, checkpoint_id, channel)

    def process_end_of_partition(self, channel: int) -> None:
        self._check_channel(channel)
        if channel in self._closed:
            log.debug("%s: end of partition repeated on channel %d", self._task_name, channel)
            return
        self._closed.add(channel)
        for checkpoint_id in list(self._pending):
            pending = self._pending.get(checkpoint_id)
            if pending is not None and self._is_aligned(pending.channels):
                self._trigger(checkpoint_id)

    def on_checkpoint_aborted(self, checkpoint_id: int) -> None:
        if self._pending.pop(checkpoint_id, None) is not None:
            log.debug("%s: checkpoint %d aborted by the coordinator; forgetting it",
                      self._task_name, checkpoint_id)
        elif checkpoint_id > self._latest_id:
            self._remember_aborted_ahead(checkpoint_id)

    # -- internals ----------------------------------------------------------------------------

    def _abort_skipped_by(self, channel: int, checkpoint_id: int) -> None:
        """`channel` reached `checkpoint_id`: older pending ones it did not deliver are dead."""
        dead = [i for i, p in self._pending.items()
                if i < checkpoint_id and channel not in p.channels]
        for old in dead:
            del self._pending[old]
            log.debug("%s: channel %d moved on to checkpoint %d without delivering barrier %d; "
                      "declining %d (subsumed)", self._task_name, channel, checkpoint_id, old, old)
            self._actions.abort_checkpoint(old, _SUBSUMED)

    def _trigger(self, checkpoint_id: int) -> None:
        pending = self._pending.pop(checkpoint_id)
        # Anything older still pending can never be triggered after this one: decline it.
        for old in [i for i in self._pending if i < checkpoint_id]:
            del self._pending[old]
            log.debug("%s: checkpoint %d subsumed by completed checkpoint %d",
                      self._task_name, old, checkpoint_id)
            self._actions.abort_checkpoint(old, _SUBSUMED)
        if checkpoint_id <= self._last_triggered:  # cannot happen: ids only grow
            log.warning("%s: not triggering checkpoint %d, older than triggered checkpoint %d",
                        self._task_name, checkpoint_id, self._last_triggered)
            return
        self._last_triggered = checkpoint_id
        metrics = AlignmentMetrics(alignment_duration=0.0, bytes_processed_during_alignment=0,
                                   start_delay=pending.start_delay)
        log.debug("%s: all barriers of checkpoint %d received; triggering",
                  self._task_name, checkpoint_id)
        self._actions.trigger_checkpoint(pending.barrier, metrics)


def create_barrier_handler(exactly_once: bool, num_channels: int, actions: BarrierHandlerActions,
                           clock: Clock, task_name: str) -> CheckpointBarrierHandler:
    """The aligner for exactly-once, the tracker for at-least-once."""
    if exactly_once:
        return CheckpointBarrierAligner(num_channels, actions, clock, task_name)
    return CheckpointBarrierTracker(num_channels, actions, clock, task_name)
