"""The unaligned barrier handler: snapshot on the first barrier, keep the overtaken data.

Aligned exactly-once checkpoints wait until the barrier has travelled behind every queued
record; under backpressure that wait is the checkpoint's duration. An *unaligned* checkpoint
takes the snapshot as soon as the first barrier of checkpoint *n* reaches the task and lets the
barrier overtake the data in flight. Consistency is then kept by persisting, as *channel
state*, exactly the data the barrier overtook:

* on each input channel, every frame that the task consumes after the snapshot and before it
  reaches that channel's barrier *n* in stream order (frames queued ahead of a barrier that
  announced itself on arrival, and frames of channels whose barrier is still to come);
* on each output channel, the frames queued when the barrier was put in front of them (done by
  the output side, outside this module).

After a restore, the channel state is replayed before any new input, so the snapshot plus the
replay equals "everything before barrier *n* on every channel", as in an aligned checkpoint.

A barrier reaches this handler up to twice. `process_priority_barrier` announces it as soon as
it arrives at the receiving end of a channel, ahead of the frames queued before it (its sender
forwarded it with priority). `process_barrier` reports its position in stream order, once
everything before it on that channel was consumed; every barrier has such a position, whether
it was announced early or not. Checkpoints whose options ask for alignment (savepoints,
`unaligned=False`) are aligned exactly as `CheckpointBarrierAligner` does; with an
`aligned_timeout` a checkpoint starts aligned and switches to unaligned once that long passed
since the checkpoint started — its barrier's timestamp, when the coordinator triggered it, as
Flink's aligned-checkpoint timeout counts — (`check_alignment_timeout`, driven by the task loop
from `alignment_deadline`), at once if its first barrier arrives here later than that (it
waited in backpressured queues), or as soon as an upstream task forwards its barrier unaligned
(an upstream output queue held it past the timeout: `network.channels.TimeoutableBarrier`).

Sans-I/O like the other handlers: decisions go to `UnalignedBarrierHandlerActions`; the clock is
injected, so every interleaving and timeout can be replayed deterministically.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from streamsnap.checkpoint.reasons import CheckpointFailureReason
from streamsnap.clock import Clock
from streamsnap.runtime.barriers import (
    AlignmentMetrics,
    BarrierHandlerActions,
    BarrierProtocolError,
    CheckpointBarrierHandler,
    HandlerKind,
)
from streamsnap.runtime.events import CancelCheckpointMarker, CheckpointBarrier

__all__ = ["CheckpointBarrierUnaligner", "UnalignedBarrierHandlerActions"]

log = logging.getLogger(__name__)

_SUBSUMED = CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED
_CANCELLED = CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER


class UnalignedBarrierHandlerActions(BarrierHandlerActions, Protocol):
    """The input side's part in unaligned checkpoints, beside blocking and triggering."""

    def start_channel_state(self, checkpoint_id: int, channels: tuple[int, ...]) -> None:
        """The snapshot was taken: every frame of `channels` not consumed before it, up to
        that channel's barrier of `checkpoint_id`, is the checkpoint's channel state."""

    def stop_channel_state(self, checkpoint_id: int, channel: int) -> None:
        """`channel`'s barrier arrived (or its end): its channel state is complete — what was
        consumed since the snapshot plus what is still queued ahead of that barrier."""

    def complete_channel_state(self, checkpoint_id: int) -> None:
        """Every channel's state of `checkpoint_id` is complete; it may be persisted."""

    def discard_channel_state(self, checkpoint_id: int) -> None:
        """`checkpoint_id` was given up after its snapshot: drop what was recorded for it."""


@dataclass
class _Checkpoint:
    """The one checkpoint this handler is working on."""

    barrier: CheckpointBarrier
    started: float                  # clock.monotonic() at its first barrier here
    start_delay: float
    # clock.monotonic() at which an aligning checkpoint goes unaligned (None: never).
    deadline: float | None
    # Channels whose barrier was consumed in stream order.
    passed: set[int] = field(default_factory=set)
    # Channels whose barrier announced itself on arrival (its stream position still ahead).
    announced: set[int] = field(default_factory=set)
    bytes_processed: int = 0
    # Set once the snapshot was taken unaligned; then `recording` lists the channels whose
    # in-flight frames are still being copied.
    unaligned: bool = False
    recording: set[int] = field(default_factory=set)

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id


class CheckpointBarrierUnaligner(CheckpointBarrierHandler):
    """Exactly-once with unaligned checkpoints (and the aligned-checkpoint timeout).

    One checkpoint at a time, as with the aligner: a newer barrier subsumes the one in
    progress, whether it is still aligning or already recording channel state. Once the handler
    moved past an id, later events for it or older ids are ignored, so each checkpoint is
    triggered or declined at most once, and a triggered one ends exactly once in
    `complete_channel_state` or in `discard_channel_state`.
    """

    kind = HandlerKind.ALIGNER

    def __init__(self, num_channels: int, actions: UnalignedBarrierHandlerActions, clock: Clock,
                 task_name: str):
        super().__init__(num_channels, actions, clock, task_name)
        self._actions: UnalignedBarrierHandlerActions = actions
        self._current: _Checkpoint | None = None

    # -- queries --------------------------------------------------------------------------------

    @property
    def current_checkpoint_id(self) -> int | None:
        """The checkpoint being aligned or whose channel state is being recorded."""
        return self._current.checkpoint_id if self._current else None

    @property
    def recording_channels(self) -> frozenset[int]:
        current = self._current
        return frozenset(current.recording) if current is not None and current.unaligned else frozenset()

    def is_blocked(self, channel: int) -> bool:
        self._check_channel(channel)
        return channel in self._blocked

    def alignment_deadline(self) -> float | None:
        """Monotonic time at which the aligning checkpoint switches to unaligned, if it can."""
        current = self._current
        if current is None or current.unaligned:
            return None
        return current.deadline

    def _on_processed_bytes(self, n: int) -> None:
        if self._current is not None and not self._current.unaligned:
            self._current.bytes_processed += n

    # -- events ---------------------------------------------------------------------------------

    def process_priority_barrier(self, barrier: CheckpointBarrier, channel: int) -> None:
        """`barrier` arrived on `channel` ahead of the frames queued before it (its sender
        forwarded it unaligned); its stream position (`process_barrier`) comes once those are
        consumed."""
        self._arrived(barrier, channel, priority=True)

    def process_barrier_announcement(self, barrier: CheckpointBarrier, channel: int) -> None:
        """An in-stream barrier arrived on `channel` behind frames still queued. For a
        checkpoint with an aligned timeout this starts it here (its deadline does not wait until
        the task has worked through the queue ahead of the barrier); once unaligned, the arrival
        fixes that channel's channel state. Aligned-only checkpoints ignore it."""
        self._arrived(barrier, channel, priority=False)

    def _arrived(self, barrier: CheckpointBarrier, channel: int, priority: bool) -> None:
        self._check_open(channel, f"barrier {barrier.checkpoint_id} arriving")
        checkpoint_id = barrier.checkpoint_id
        if not barrier.options.unaligned:
            if priority:
                raise BarrierProtocolError(
                    f"{self._task_name}: barrier {checkpoint_id} arrived with priority on input "
                    f"channel {channel}, but its checkpoint is aligned (a savepoint or "
                    f"unaligned=False); only unaligned barriers may overtake data")
            return
        switch = priority or _unaligned_at_once(barrier)
        current = self._current
        if current is not None and checkpoint_id == current.checkpoint_id:
            if channel in current.announced or channel in current.passed:
                raise BarrierProtocolError(
                    f"{self._task_name}: barrier {checkpoint_id} announced twice on input channel "
                    f"{channel}; a channel delivers each checkpoint's barrier once")
            current.announced.add(channel)
            if not current.unaligned and switch:
                log.debug("%s: checkpoint %d arrived unaligned on channel %d; switching from "
                          "alignment", self._task_name, checkpoint_id, channel)
                self._go_unaligned()
            else:
                self._on_announced(current, channel)
            return
        if checkpoint_id <= self._latest_id or not self._begin(barrier):
            return
        assert self._current is not None
        self._current.announced.add(channel)
        if switch or self._timed_out():
            self._go_unaligned()

    def process_barrier(self, barrier: CheckpointBarrier, channel: int) -> None:
        """`channel` reached `barrier` in stream order (everything before it was consumed)."""
        self._check_open(channel, f"barrier {barrier.checkpoint_id}")
        checkpoint_id = barrier.checkpoint_id
        current = self._current
        self._check_unblocked(channel, f"barrier {checkpoint_id}", self.current_checkpoint_id)
        if current is not None and checkpoint_id == current.checkpoint_id:
            if channel in current.passed:
                raise BarrierProtocolError(
                    f"{self._task_name}: duplicate barrier for checkpoint {checkpoint_id} on "
                    f"input channel {channel}; a channel delivers each checkpoint's barrier once")
            current.passed.add(channel)
            self._on_passed(channel)
            return
        if checkpoint_id <= self._latest_id:
            log.debug("%s: ignoring obsolete barrier %d on channel %d (latest checkpoint %d)",
                      self._task_name, checkpoint_id, channel, self._latest_id)
            return
        if not self._begin(barrier):
            return
        assert self._current is not None
        self._current.passed.add(channel)
        if _unaligned_at_once(barrier) or self._timed_out():
            self._go_unaligned()
        else:
            self._on_passed(channel)

    def process_cancellation_barrier(self, marker: CancelCheckpointMarker, channel: int) -> None:
        self._check_open(channel, f"cancel marker {marker.checkpoint_id}")
        checkpoint_id = marker.checkpoint_id
        current = self._current
        self._check_unblocked(channel, f"cancel marker {checkpoint_id}", self.current_checkpoint_id)
        if current is not None and checkpoint_id == current.checkpoint_id:
            self._give_up(_CANCELLED)
            return
        if checkpoint_id <= self._latest_id:
            return
        self._advance_latest(checkpoint_id)
        if current is not None:
            # This channel skipped the checkpoint in progress: it can never complete.
            self._give_up(_SUBSUMED)
        if checkpoint_id in self._aborted_ahead:
            self._aborted_ahead.discard(checkpoint_id)
            return
        self._actions.abort_checkpoint(checkpoint_id, _CANCELLED)

    def process_end_of_partition(self, channel: int) -> None:
        self._check_channel(channel)
        if channel in self._closed:
            return
        self._closed.add(channel)
        if channel in self._blocked:
            self._blocked.discard(channel)
            self._actions.resume_channel(channel)
        current = self._current
        if current is None:
            return
        if current.unaligned:
            if channel in current.recording:
                self._stop_recording(channel)
        elif self._is_aligned(current.passed):
            self._trigger_aligned()

    def on_checkpoint_aborted(self, checkpoint_id: int) -> None:
        current = self._current
        if current is not None and checkpoint_id == current.checkpoint_id:
            self._current = None
            released = self._unblock_all()
            if current.unaligned:
                self._actions.discard_channel_state(checkpoint_id)
            self._resume(released)
        elif checkpoint_id > self._latest_id:
            self._remember_aborted_ahead(checkpoint_id)

    def check_alignment_timeout(self) -> bool:
        """Switch the aligning checkpoint to unaligned if its deadline passed; True if it did."""
        if not self._timed_out():
            return False
        assert self._current is not None
        log.info("%s: checkpoint %d still aligning %.3f s after it started; continuing unaligned",
                 self._task_name, self._current.checkpoint_id, _timeout(self._current.barrier))
        self._go_unaligned()
        return True

    def _timed_out(self) -> bool:
        deadline = self.alignment_deadline()
        return deadline is not None and self._clock.monotonic() >= deadline

    # -- internals ------------------------------------------------------------------------------

    def _begin(self, barrier: CheckpointBarrier) -> bool:
        """A checkpoint newer than anything seen starts here; False if already aborted."""
        checkpoint_id = barrier.checkpoint_id
        self._advance_latest(checkpoint_id)
        if self._current is not None:
            log.warning("%s: checkpoint %d reached this task before checkpoint %d finished here; "
                        "declining %d (subsumed)", self._task_name, checkpoint_id,
                        self._current.checkpoint_id, self._current.checkpoint_id)
            self._give_up(_SUBSUMED)
        if checkpoint_id in self._aborted_ahead:
            self._aborted_ahead.discard(checkpoint_id)
            return False
        now = self._clock.monotonic()
        timeout = _timeout(barrier)
        # The barrier's timestamp is the checkpoint's start on the coordinator's wall clock.
        deadline = None if timeout is None else now + barrier.timestamp + timeout - self._clock.wall()
        self._current = _Checkpoint(barrier=barrier, started=now, start_delay=self._start_delay(barrier),
                                    deadline=deadline)
        return True

    def _on_announced(self, current: _Checkpoint, channel: int) -> None:
        """A channel's barrier arrived: the extent of its channel state is known (everything
        queued ahead of the barrier), so its recording ends here, not when the task has worked
        through that queue. The checkpoint is done here once every barrier arrived."""
        if self._current is current and channel in current.recording:
            self._stop_recording(channel)

    def _on_passed(self, channel: int) -> None:
        """After `channel` consumed the current barrier in stream order."""
        current = self._current
        assert current is not None
        if current.unaligned:
            if channel in current.recording:
                self._stop_recording(channel)
        elif self._is_aligned(current.passed):
            self._trigger_aligned()
        else:
            self._blocked.add(channel)
            self._actions.block_channel(channel)

    def _metrics(self, current: _Checkpoint, unaligned: bool) -> AlignmentMetrics:
        return AlignmentMetrics(
            alignment_duration=max(0.0, self._clock.monotonic() - current.started),
            bytes_processed_during_alignment=current.bytes_processed,
            start_delay=current.start_delay, unaligned=unaligned)

    def _trigger_aligned(self) -> None:
        current = self._current
        assert current is not None
        self._current = None
        self._resume(self._unblock_all())
        self._actions.trigger_checkpoint(current.barrier, self._metrics(current, unaligned=False))

    def _go_unaligned(self) -> None:
        """Take the snapshot now; record the channels that have not reached their barrier."""
        current = self._current
        assert current is not None and not current.unaligned
        if not current.barrier.options.unaligned:
            raise BarrierProtocolError(
                f"{self._task_name}: checkpoint {current.checkpoint_id} must be aligned (a "
                f"savepoint or unaligned=False) but was asked to continue unaligned")
        current.unaligned = True
        current.recording = {ch for ch in range(self._num_channels)
                             if ch not in current.passed and ch not in self._closed}
        released = self._unblock_all()
        self._resume(released)
        self._actions.trigger_checkpoint(current.barrier, self._metrics(current, unaligned=True))
        if self._current is not current:
            return  # the trigger gave the checkpoint up (its actions may do so)
        if not current.recording:
            self._finish_recording()
            return
        self._actions.start_channel_state(current.checkpoint_id, tuple(sorted(current.recording)))
        # Channels whose barrier already arrived: their state is known up to it.
        for channel in sorted(current.announced & current.recording):
            if self._current is not current:
                break
            self._stop_recording(channel)

    def _stop_recording(self, channel: int) -> None:
        current = self._current
        assert current is not None and current.unaligned
        current.recording.discard(channel)
        self._actions.stop_channel_state(current.checkpoint_id, channel)
        if not current.recording:
            self._finish_recording()

    def _finish_recording(self) -> None:
        current = self._current
        assert current is not None
        self._current = None
        self._actions.complete_channel_state(current.checkpoint_id)

    def _give_up(self, reason: CheckpointFailureReason) -> None:
        """Decline the checkpoint in progress (before or after its unaligned snapshot)."""
        current = self._current
        assert current is not None
        self._current = None
        released = self._unblock_all()
        if current.unaligned:
            self._actions.discard_channel_state(current.checkpoint_id)
        self._actions.abort_checkpoint(current.checkpoint_id, reason)
        self._resume(released)


def _timeout(barrier: CheckpointBarrier) -> float | None:
    """Seconds after its start at which an unaligned-capable checkpoint switches; None when it
    is aligned for good (savepoints, unaligned=False) or unaligned from its first barrier."""
    options = barrier.options
    return options.aligned_timeout if options.unaligned and options.aligned_timeout else None


def _unaligned_at_once(barrier: CheckpointBarrier) -> bool:
    return barrier.options.unaligned and not barrier.options.aligned_timeout
