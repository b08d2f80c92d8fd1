"""Deterministic tests of the barrier handlers, event by event, on a manual clock."""

from __future__ import annotations

import logging

import pytest

from streamsnap.checkpoint.reasons import CheckpointFailureReason
from streamsnap.clock import ManualScheduler
from streamsnap.runtime.barriers import (
    AlignmentMetrics,
    BarrierProtocolError,
    CheckpointBarrierAligner,
    CheckpointBarrierHandler,
    CheckpointBarrierTracker,
    create_barrier_handler,
)
from streamsnap.runtime.events import CancelCheckpointMarker, CheckpointBarrier

SUBSUMED = CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED
CANCELLED = CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER


class RecordingActions:
    """Records every call in order, and checks block/resume calls are balanced."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.blocked: set[int] = set()
        self.metrics: dict[int, AlignmentMetrics] = {}

    def block_channel(self, channel: int) -> None:
        assert channel not in self.blocked, f"channel {channel} blocked twice"
        self.blocked.add(channel)
        self.calls.append(("block", channel))

    def resume_channel(self, channel: int) -> None:
        assert channel in self.blocked, f"channel {channel} resumed but not blocked"
        self.blocked.discard(channel)
        self.calls.append(("resume", channel))

    def trigger_checkpoint(self, barrier: CheckpointBarrier, metrics: AlignmentMetrics) -> None:
        self.metrics[barrier.checkpoint_id] = metrics
        self.calls.append(("trigger", barrier.checkpoint_id))

    def abort_checkpoint(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        self.calls.append(("abort", checkpoint_id, reason))

    def take(self) -> list[tuple]:
        calls, self.calls = self.calls, []
        return calls


@pytest.fixture
def clock() -> ManualScheduler:
    return ManualScheduler()


@pytest.fixture
def actions() -> RecordingActions:
    return RecordingActions()


def barrier(clock: ManualScheduler, checkpoint_id: int, age: float = 0.0) -> CheckpointBarrier:
    """A barrier the coordinator triggered `age` seconds ago (wall clock)."""
    return CheckpointBarrier(checkpoint_id, clock.wall() - age)


def cancel(checkpoint_id: int) -> CancelCheckpointMarker:
    return CancelCheckpointMarker(checkpoint_id)


def aligner(n, actions, clock) -> CheckpointBarrierAligner:
    return CheckpointBarrierAligner(n, actions, clock, "map (1/2)")


def tracker(n, actions, clock, **kw) -> CheckpointBarrierTracker:
    return CheckpointBarrierTracker(n, actions, clock, "map (1/2)", **kw)


def assert_consistent(handler: CheckpointBarrierHandler, actions: RecordingActions) -> None:
    for ch in range(handler.num_channels):
        assert handler.is_blocked(ch) == (ch in actions.blocked)


# ------------------------------------------------------------------------------------------
# Aligner: single channel
# ------------------------------------------------------------------------------------------


class TestAlignerSingleChannel:
    def test_triggers_immediately_without_blocking(self, actions, clock):
        h = aligner(1, actions, clock)
        h.process_barrier(barrier(clock, 1, age=0.25), 0)
        assert actions.take() == [("trigger", 1)]
        m = actions.metrics[1]
        assert m.alignment_duration == 0.0
        assert m.bytes_processed_during_alignment == 0
        assert m.start_delay == pytest.approx(0.25)
        assert not h.is_blocked(0)
        assert h.latest_checkpoint_id == 1

    def test_older_or_equal_barrier_ignored(self, actions, clock):
        h = aligner(1, actions, clock)
        h.process_barrier(barrier(clock, 5), 0)
        actions.take()
        h.process_barrier(barrier(clock, 5), 0)
        h.process_barrier(barrier(clock, 3), 0)
        assert actions.take() == []
        h.process_barrier(barrier(clock, 6), 0)
        assert actions.take() == [("trigger", 6)]

    def test_cancel_newer_aborts_once_and_its_barrier_is_ignored(self, actions, clock):
        h = aligner(1, actions, clock)
        h.process_cancellation_barrier(cancel(2), 0)
        assert actions.take() == [("abort", 2, CANCELLED)]
        assert h.latest_checkpoint_id == 2
        h.process_barrier(barrier(clock, 2), 0)
        h.process_cancellation_barrier(cancel(2), 0)
        h.process_cancellation_barrier(cancel(1), 0)
        assert actions.take() == []
        h.process_barrier(barrier(clock, 3), 0)
        assert actions.take() == [("trigger", 3)]


# ------------------------------------------------------------------------------------------
# Aligner: several channels
# ------------------------------------------------------------------------------------------


class TestAlignerAlignment:
    def test_blocks_each_channel_then_releases_all_and_triggers(self, actions, clock):
        h = aligner(3, actions, clock)
        h.process_barrier(barrier(clock, 1, age=0.5), 0)
        assert actions.take() == [("block", 0)]
        assert h.is_blocked(0) and not h.is_blocked(1)
        assert h.aligning_checkpoint_id == 1
        clock.advance(1.0)
        h.process_barrier(barrier(clock, 1), 2)
        assert actions.take() == [("block", 2)]
        clock.advance(0.5)
        h.process_barrier(barrier(clock, 1), 1)
        # Release strictly before the snapshot is taken; the last channel is never blocked.
        assert actions.take() == [("resume", 0), ("resume", 2), ("trigger", 1)]
        assert_consistent(h, actions)
        assert not any(h.is_blocked(c) for c in range(3))
        assert h.aligning_checkpoint_id is None
        m = actions.metrics[1]
        assert m.alignment_duration == pytest.approx(1.5)
        assert m.start_delay == pytest.approx(0.5)

    def test_bytes_counted_only_between_first_barrier_and_trigger(self, actions, clock):
        h = aligner(2, actions, clock)
        h.add_processed_bytes(1000)          # before the alignment: not counted
        h.process_barrier(barrier(clock, 1), 0)
        h.add_processed_bytes(10)
        h.add_processed_bytes(32)
        h.process_barrier(barrier(clock, 1), 1)
        h.add_processed_bytes(7)             # after the trigger: not counted
        assert actions.metrics[1].bytes_processed_during_alignment == 42
        h.process_barrier(barrier(clock, 2), 1)
        h.add_processed_bytes(5)
        h.process_barrier(barrier(clock, 2), 0)
        assert actions.metrics[2].bytes_processed_during_alignment == 5

    def test_start_delay_clamped_at_zero(self, actions, clock):
        h = aligner(2, actions, clock)
        h.process_barrier(barrier(clock, 1, age=-3.0), 0)   # coordinator clock ahead of ours
        h.process_barrier(barrier(clock, 1), 1)
        assert actions.metrics[1].start_delay == 0.0

    def test_start_delay_measured_at_first_barrier(self, actions, clock):
        h = aligner(2, actions, clock)
        b = barrier(clock, 1)
        clock.advance(0.2)
        h.process_barrier(b, 1)
        clock.advance(5.0)
        h.process_barrier(b, 0)
        assert actions.metrics[1].start_delay == pytest.approx(0.2)
        assert actions.metrics[1].alignment_duration == pytest.approx(5.0)

    def test_duplicate_barrier_on_blocked_channel_is_an_error(self, actions, clock):
        h = aligner(2, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        expected = "duplicate barrier for checkpoint 1 on input channel 0"
        with pytest.raises(BarrierProtocolError, match=expected):
            h.process_barrier(barrier(clock, 1), 0)

    def test_reading_a_blocked_channel_is_an_error(self, actions, clock):
        h = aligner(2, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        with pytest.raises(BarrierProtocolError, match="blocked"):
            h.process_barrier(barrier(clock, 2), 0)
        with pytest.raises(BarrierProtocolError, match="blocked"):
            h.process_cancellation_barrier(cancel(2), 0)

    def test_newer_barrier_subsumes_current_alignment(self, actions, clock, caplog):
        h = aligner(3, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.add_processed_bytes(100)
        h.process_barrier(barrier(clock, 1), 1)
        actions.take()
        clock.advance(2.0)
        with caplog.at_level(logging.WARNING, logger="streamsnap.runtime.barriers"):
            h.process_barrier(barrier(clock, 2), 2)
        assert "subsumed" in caplog.text and "checkpoint 1" in caplog.text
        assert actions.take() == [("abort", 1, SUBSUMED), ("resume", 0), ("resume", 1),
                                  ("block", 2)]
        assert h.aligning_checkpoint_id == 2
        assert h.latest_checkpoint_id == 2
        assert_consistent(h, actions)
        # The new alignment is timed and counted from its own first barrier.
        h.add_processed_bytes(3)
        clock.advance(1.0)
        h.process_barrier(barrier(clock, 2), 0)
        h.process_barrier(barrier(clock, 2), 1)
        assert actions.take() == [("block", 0), ("resume", 0), ("resume", 2), ("trigger", 2)]
        assert actions.metrics[2].alignment_duration == pytest.approx(1.0)
        assert actions.metrics[2].bytes_processed_during_alignment == 3

    def test_late_barrier_of_subsumed_checkpoint_ignored_not_reported(self, actions, clock):
        h = aligner(3, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.process_barrier(barrier(clock, 2), 1)
        actions.take()
        h.process_barrier(barrier(clock, 1), 2)
        h.process_cancellation_barrier(cancel(1), 2)
        assert actions.take() == []
        assert not h.is_blocked(2)

    def test_older_barrier_during_alignment_is_ignored(self, actions, clock):
        h = aligner(3, actions, clock)
        h.process_barrier(barrier(clock, 5), 0)
        actions.take()
        h.process_barrier(barrier(clock, 4), 1)
        assert actions.take() == []
        assert not h.is_blocked(1)
        assert h.aligning_checkpoint_id == 5

    def test_barrier_of_completed_checkpoint_ignored_when_idle(self, actions, clock):
        h = aligner(2, actions, clock)
        h.process_barrier(barrier(clock, 3), 0)
        h.process_barrier(barrier(clock, 3), 1)
        actions.take()
        h.process_barrier(barrier(clock, 3), 0)
        h.process_barrier(barrier(clock, 2), 1)
        assert actions.take() == []
        assert h.aligning_checkpoint_id is None
        assert_consistent(h, actions)

    def test_latest_checkpoint_id(self, actions, clock):
        h = aligner(2, actions, clock)
        assert h.latest_checkpoint_id == -1
        h.process_barrier(barrier(clock, 4), 1)
        assert h.latest_checkpoint_id == 4
        h.process_barrier(barrier(clock, 2), 0)
        assert h.latest_checkpoint_id == 4


def test_actions_see_the_handlers_final_state(clock):
    """Actions may query the handler; it must already reflect the decision being announced."""
    seen = []

    class Inspecting(RecordingActions):
        def trigger_checkpoint(self, barrier, metrics):
            seen.append(("trigger", h.aligning_checkpoint_id, [h.is_blocked(c) for c in range(3)]))
            super().trigger_checkpoint(barrier, metrics)

        def abort_checkpoint(self, checkpoint_id, reason):
            seen.append(("abort", h.aligning_checkpoint_id, [h.is_blocked(c) for c in range(3)],
                         h.latest_checkpoint_id))
            super().abort_checkpoint(checkpoint_id, reason)

    h = aligner(3, Inspecting(), clock)
    h.process_barrier(barrier(clock, 1), 0)
    h.process_barrier(barrier(clock, 1), 1)
    h.process_barrier(barrier(clock, 1), 2)
    h.process_barrier(barrier(clock, 2), 0)
    h.process_barrier(barrier(clock, 3), 1)
    assert seen == [("trigger", None, [False, False, False]),
                    ("abort", None, [False, False, False], 3)]


class TestAlignerCancellation:
    def test_cancel_of_current_alignment_releases_and_aborts(self, actions, clock):
        h = aligner(3, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.process_barrier(barrier(clock, 1), 1)
        actions.take()
        h.process_cancellation_barrier(cancel(1), 2)
        assert actions.take() == [("abort", 1, CANCELLED), ("resume", 0), ("resume", 1)]
        assert h.aligning_checkpoint_id is None
        assert_consistent(h, actions)
        # Its barriers arriving afterwards do not start a new alignment.
        h.process_cancellation_barrier(cancel(1), 2)
        assert actions.take() == []

    def test_cancel_of_current_then_late_barrier_ignored(self, actions, clock):
        h = aligner(2, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.process_cancellation_barrier(cancel(1), 1)
        actions.take()
        h.process_barrier(barrier(clock, 1), 0)
        assert actions.take() == []
        assert not h.is_blocked(0)

    def test_cancel_newer_than_anything_while_idle(self, actions, clock):
        h = aligner(3, actions, clock)
        h.process_cancellation_barrier(cancel(7), 1)
        assert actions.take() == [("abort", 7, CANCELLED)]
        assert h.latest_checkpoint_id == 7
        h.process_barrier(barrier(clock, 7), 0)          # must not block
        h.process_cancellation_barrier(cancel(7), 2)     # must not report again
        h.process_barrier(barrier(clock, 7), 2)
        assert actions.take() == []
        assert not any(h.is_blocked(c) for c in range(3))
        # The next checkpoint aligns normally.
        for ch in range(3):
            h.process_barrier(barrier(clock, 8), ch)
        assert actions.take() == [("block", 0), ("block", 1), ("resume", 0), ("resume", 1),
                                  ("trigger", 8)]

    def test_cancel_newer_than_current_alignment(self, actions, clock, caplog):
        h = aligner(3, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        actions.take()
        with caplog.at_level(logging.WARNING, logger="streamsnap.runtime.barriers"):
            h.process_cancellation_barrier(cancel(2), 1)
        assert "cancel marker of checkpoint 2" in caplog.text
        # Channel 1 skipped checkpoint 1, so 1 cannot complete either.
        assert actions.take() == [("abort", 1, SUBSUMED), ("resume", 0), ("abort", 2, CANCELLED)]
        assert h.latest_checkpoint_id == 2
        h.process_barrier(barrier(clock, 2), 2)
        assert actions.take() == []

    def test_older_cancel_ignored(self, actions, clock):
        h = aligner(2, actions, clock)
        h.process_barrier(barrier(clock, 5), 0)
        actions.take()
        h.process_cancellation_barrier(cancel(4), 1)
        assert actions.take() == []
        assert h.is_blocked(0) and h.aligning_checkpoint_id == 5

    def test_never_reports_the_same_checkpoint_aborted_twice(self, actions, clock):
        h = aligner(3, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.process_cancellation_barrier(cancel(1), 1)
        h.process_cancellation_barrier(cancel(1), 2)
        h.process_barrier(barrier(clock, 2), 1)
        h.process_barrier(barrier(clock, 3), 2)          # subsumes 2
        h.process_cancellation_barrier(cancel(2), 0)
        h.process_cancellation_barrier(cancel(3), 0)     # cancels 3
        h.process_cancellation_barrier(cancel(3), 1)
        aborted = [c[1] for c in actions.calls if c[0] == "abort"]
        assert aborted == [1, 2, 3]
        assert len(set(aborted)) == len(aborted)


class TestAlignerEndOfPartition:
    def test_closed_channel_completes_alignment(self, actions, clock):
        h = aligner(3, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.process_barrier(barrier(clock, 1), 1)
        actions.take()
        h.process_end_of_partition(2)
        assert actions.take() == [("resume", 0), ("resume", 1), ("trigger", 1)]
        assert h.num_closed_channels == 1 and h.is_closed(2)

    def test_closed_channel_counts_for_future_checkpoints(self, actions, clock):
        h = aligner(3, actions, clock)
        h.process_end_of_partition(1)
        assert actions.take() == []
        h.process_barrier(barrier(clock, 1), 0)
        h.process_barrier(barrier(clock, 1), 2)
        assert actions.take() == [("block", 0), ("resume", 0), ("trigger", 1)]

    def test_last_open_channel_triggers_without_blocking(self, actions, clock):
        h = aligner(3, actions, clock)
        h.process_end_of_partition(0)
        h.process_end_of_partition(2)
        h.process_barrier(barrier(clock, 1), 1)
        assert actions.take() == [("trigger", 1)]
        assert actions.metrics[1].alignment_duration == 0.0

    def test_end_of_partition_on_blocked_channel_releases_it(self, actions, clock):
        h = aligner(3, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        actions.take()
        h.process_end_of_partition(0)
        assert actions.take() == [("resume", 0)]
        assert not h.is_blocked(0)
        assert_consistent(h, actions)
        h.process_barrier(barrier(clock, 1), 1)          # 0 counted once: barrier + closed
        assert actions.take() == [("block", 1)]
        h.process_barrier(barrier(clock, 1), 2)
        assert actions.take() == [("resume", 1), ("trigger", 1)]

    def test_end_of_partition_without_alignment_does_nothing(self, actions, clock):
        h = aligner(2, actions, clock)
        h.process_end_of_partition(0)
        h.process_end_of_partition(1)
        assert actions.take() == []
        assert h.all_channels_closed

    def test_nothing_may_follow_end_of_partition(self, actions, clock):
        h = aligner(2, actions, clock)
        h.process_end_of_partition(0)
        with pytest.raises(BarrierProtocolError, match="after its end of partition"):
            h.process_barrier(barrier(clock, 1), 0)
        with pytest.raises(BarrierProtocolError, match="after its end of partition"):
            h.process_cancellation_barrier(cancel(1), 0)

    def test_repeated_end_of_partition_is_harmless(self, actions, clock):
        h = aligner(2, actions, clock)
        h.process_end_of_partition(0)
        h.process_end_of_partition(0)
        assert h.num_closed_channels == 1
        h.process_barrier(barrier(clock, 1), 1)
        assert actions.take() == [("trigger", 1)]


class TestAlignerCoordinatorAbort:
    def test_abort_during_alignment_releases_without_declining(self, actions, clock):
        h = aligner(3, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.process_barrier(barrier(clock, 1), 2)
        actions.take()
        h.on_checkpoint_aborted(1)
        assert actions.take() == [("resume", 0), ("resume", 2)]
        assert h.aligning_checkpoint_id is None
        h.process_barrier(barrier(clock, 1), 1)          # late barrier: ignored
        h.process_cancellation_barrier(cancel(1), 1)
        assert actions.take() == []
        h.process_barrier(barrier(clock, 2), 1)
        assert actions.take() == [("block", 1)]

    def test_abort_of_unseen_checkpoint_ignores_its_barriers(self, actions, clock):
        h = aligner(2, actions, clock)
        h.on_checkpoint_aborted(3)
        assert h.latest_checkpoint_id == -1
        h.process_barrier(barrier(clock, 3), 0)
        h.process_barrier(barrier(clock, 3), 1)
        h.process_cancellation_barrier(cancel(3), 1)
        assert actions.take() == []
        h.process_barrier(barrier(clock, 4), 0)
        h.process_barrier(barrier(clock, 4), 1)
        assert actions.take() == [("block", 0), ("resume", 0), ("trigger", 4)]

    def test_abort_of_unseen_checkpoint_does_not_disturb_current_alignment(self, actions, clock):
        h = aligner(2, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.on_checkpoint_aborted(2)
        h.process_barrier(barrier(clock, 1), 1)
        assert actions.take() == [("block", 0), ("resume", 0), ("trigger", 1)]

    def test_barrier_of_aborted_checkpoint_still_subsumes_older_alignment(self, actions, clock):
        h = aligner(2, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.on_checkpoint_aborted(2)
        h.process_barrier(barrier(clock, 2), 1)          # channel 1 skipped 1: 1 is dead too
        assert actions.take() == [("block", 0), ("abort", 1, SUBSUMED), ("resume", 0)]
        assert h.aligning_checkpoint_id is None

    def test_cancel_marker_of_aborted_checkpoint_not_reported(self, actions, clock):
        h = aligner(2, actions, clock)
        h.on_checkpoint_aborted(5)
        h.process_cancellation_barrier(cancel(5), 0)
        assert actions.take() == []
        assert h.latest_checkpoint_id == 5

    def test_abort_of_old_checkpoint_is_a_no_op(self, actions, clock):
        h = aligner(2, actions, clock)
        h.process_barrier(barrier(clock, 2), 0)
        actions.take()
        h.on_checkpoint_aborted(1)
        assert actions.take() == []
        assert h.is_blocked(0)


# ------------------------------------------------------------------------------------------
# Bad input, construction, factory
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [aligner, tracker], ids=["aligner", "tracker"])
class TestBadInput:
    @pytest.mark.parametrize("channel", [-1, 3, 100])
    def test_channel_out_of_range(self, make, actions, clock, channel):
        h = make(3, actions, clock)
        for call in (lambda: h.process_barrier(barrier(clock, 1), channel),
                     lambda: h.process_cancellation_barrier(cancel(1), channel),
                     lambda: h.process_end_of_partition(channel),
                     lambda: h.is_blocked(channel)):
            with pytest.raises(ValueError, match=rf"channel {channel} is out of range.*0\.\.2"):
                call()
        assert actions.take() == []

    def test_channel_must_be_an_int(self, make, actions, clock):
        h = make(2, actions, clock)
        with pytest.raises(TypeError, match="channel index must be an int"):
            h.process_barrier(barrier(clock, 1), "0")
        with pytest.raises(TypeError, match="channel index must be an int"):
            h.process_end_of_partition(True)

    @pytest.mark.parametrize("n", [0, -2, 1.5])
    def test_num_channels_must_be_positive(self, make, actions, clock, n):
        with pytest.raises(ValueError, match="num_channels must be a positive integer"):
            make(n, actions, clock)

    def test_processed_bytes_must_be_non_negative(self, make, actions, clock):
        h = make(2, actions, clock)
        with pytest.raises(ValueError, match="processed bytes"):
            h.add_processed_bytes(-1)


def test_factory_picks_the_strategy(actions, clock):
    a = create_barrier_handler(True, 2, actions, clock, "t")
    t = create_barrier_handler(False, 2, actions, clock, "t")
    assert type(a) is CheckpointBarrierAligner
    assert type(t) is CheckpointBarrierTracker
    assert a.num_channels == t.num_channels == 2 and a.task_name == "t"


def test_metrics_are_frozen():
    m = AlignmentMetrics(1.0, 2, 3.0)
    with pytest.raises(AttributeError):
        m.alignment_duration = 0.0  # type: ignore[misc]


# ------------------------------------------------------------------------------------------
# Tracker
# ------------------------------------------------------------------------------------------


class TestTracker:
    def test_never_blocks_and_triggers_when_all_barriers_seen(self, actions, clock):
        h = tracker(3, actions, clock)
        h.process_barrier(barrier(clock, 1, age=0.3), 0)
        clock.advance(2.0)
        h.add_processed_bytes(100)
        h.process_barrier(barrier(clock, 1), 2)
        assert actions.take() == []
        assert not any(h.is_blocked(c) for c in range(3))
        assert h.pending_checkpoint_ids == (1,)
        h.process_barrier(barrier(clock, 1), 1)
        assert actions.take() == [("trigger", 1)]
        m = actions.metrics[1]
        assert m.alignment_duration == 0.0
        assert m.bytes_processed_during_alignment == 0
        assert m.start_delay == pytest.approx(0.3)
        assert h.pending_checkpoint_ids == ()
        assert h.last_triggered_checkpoint_id == 1

    def test_single_channel_triggers_every_newer_barrier(self, actions, clock):
        h = tracker(1, actions, clock)
        for cid in (1, 2, 2, 1, 5):
            h.process_barrier(barrier(clock, cid), 0)
        assert actions.take() == [("trigger", 1), ("trigger", 2), ("trigger", 5)]

    def test_several_checkpoints_in_flight(self, actions, clock):
        h = tracker(2, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.process_barrier(barrier(clock, 2), 0)
        h.process_barrier(barrier(clock, 3), 0)
        assert h.pending_checkpoint_ids == (1, 2, 3)
        h.process_barrier(barrier(clock, 1), 1)
        h.process_barrier(barrier(clock, 2), 1)
        assert actions.take() == [("trigger", 1), ("trigger", 2)]
        assert h.pending_checkpoint_ids == (3,)

    def test_channel_skipping_a_checkpoint_aborts_it_before_newer_triggers(self, actions, clock):
        h = tracker(2, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.process_barrier(barrier(clock, 2), 0)
        h.process_barrier(barrier(clock, 2), 1)      # channel 1 never delivered barrier 1
        assert actions.take() == [("abort", 1, SUBSUMED), ("trigger", 2)]
        h.process_barrier(barrier(clock, 1), 1)      # (out-of-protocol late barrier) ignored
        assert actions.take() == []

    def test_older_incomplete_checkpoint_aborted_when_newer_triggers(self, actions, clock):
        h = tracker(3, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.process_barrier(barrier(clock, 1), 1)
        h.process_barrier(barrier(clock, 2), 0)
        h.process_barrier(barrier(clock, 2), 1)
        h.process_barrier(barrier(clock, 2), 2)      # channel 2 skipped 1
        assert actions.take() == [("abort", 1, SUBSUMED), ("trigger", 2)]
        assert h.pending_checkpoint_ids == ()

    def test_barrier_older_than_latest_and_unknown_ignored(self, actions, clock):
        h = tracker(2, actions, clock)
        h.process_barrier(barrier(clock, 5), 0)
        h.process_barrier(barrier(clock, 4), 1)
        assert h.pending_checkpoint_ids == (5,)
        assert actions.take() == []

    def test_duplicate_barrier_is_an_error(self, actions, clock):
        h = tracker(2, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        with pytest.raises(BarrierProtocolError, match="duplicate barrier for checkpoint 1"):
            h.process_barrier(barrier(clock, 1), 0)

    def test_cancel_pending_aborts_once_and_ignores_later_barriers(self, actions, clock):
        h = tracker(3, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.process_cancellation_barrier(cancel(1), 1)
        assert actions.take() == [("abort", 1, CANCELLED)]
        h.process_barrier(barrier(clock, 1), 2)
        h.process_cancellation_barrier(cancel(1), 2)
        assert actions.take() == []
        assert h.pending_checkpoint_ids == ()

    def test_cancel_newer_than_anything(self, actions, clock):
        h = tracker(2, actions, clock)
        h.process_cancellation_barrier(cancel(4), 0)
        assert actions.take() == [("abort", 4, CANCELLED)]
        assert h.latest_checkpoint_id == 4
        h.process_barrier(barrier(clock, 4), 1)
        h.process_cancellation_barrier(cancel(4), 1)
        h.process_cancellation_barrier(cancel(2), 1)
        assert actions.take() == []

    def test_cancel_newer_aborts_older_pending_skipped_by_that_channel(self, actions, clock):
        h = tracker(2, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.process_cancellation_barrier(cancel(2), 1)
        assert actions.take() == [("abort", 1, SUBSUMED), ("abort", 2, CANCELLED)]

    def test_end_of_partition_completes_pending_checkpoints_in_order(self, actions, clock):
        h = tracker(3, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.process_barrier(barrier(clock, 2), 0)
        h.process_barrier(barrier(clock, 1), 1)
        h.process_barrier(barrier(clock, 2), 1)
        assert actions.take() == []
        h.process_end_of_partition(2)
        assert actions.take() == [("trigger", 1), ("trigger", 2)]
        h.process_barrier(barrier(clock, 3), 0)      # closed channel counts from now on
        h.process_barrier(barrier(clock, 3), 1)
        assert actions.take() == [("trigger", 3)]
        with pytest.raises(BarrierProtocolError, match="after its end of partition"):
            h.process_barrier(barrier(clock, 4), 2)

    def test_pending_is_bounded(self, actions, clock):
        h = tracker(2, actions, clock, max_pending_checkpoints=50)
        for cid in range(1, 51):
            h.process_barrier(barrier(clock, cid), 0)
        assert actions.take() == []
        h.process_barrier(barrier(clock, 51), 0)
        assert actions.take() == [("abort", 1, SUBSUMED)]
        assert h.pending_checkpoint_ids == tuple(range(2, 52))
        h.process_barrier(barrier(clock, 1), 1)       # forgotten: ignored
        assert actions.take() == []

    def test_coordinator_abort_forgets_pending_and_ignores_late_barriers(self, actions, clock):
        h = tracker(2, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.on_checkpoint_aborted(1)
        h.process_barrier(barrier(clock, 1), 1)
        assert actions.take() == []
        h.on_checkpoint_aborted(2)                    # not seen yet
        h.process_barrier(barrier(clock, 2), 0)
        h.process_barrier(barrier(clock, 2), 1)
        h.process_cancellation_barrier(cancel(2), 1)
        assert actions.take() == []
        h.process_barrier(barrier(clock, 3), 0)
        h.process_barrier(barrier(clock, 3), 1)
        assert actions.take() == [("trigger", 3)]

    def test_coordinator_abort_of_future_id_keeps_older_pending(self, actions, clock):
        h = tracker(2, actions, clock)
        h.process_barrier(barrier(clock, 1), 0)
        h.on_checkpoint_aborted(2)
        h.process_barrier(barrier(clock, 1), 1)
        assert actions.take() == [("trigger", 1)]
