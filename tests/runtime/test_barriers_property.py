"""Property tests: the barrier handlers under random channel contents and read orders.

An input gate is modelled as N FIFO channels whose contents are generated up front: records
interleaved with barriers / cancel markers of strictly increasing checkpoint ids, ending with
end of partition. A consumer loop reads one item at a time from a hypothesis-chosen channel
(never a blocked one, as the real input does) and sometimes lets the "coordinator" abort a
checkpoint. The checks are the guarantees the handlers exist for, observed from outside.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.properties import examples

from streamsnap.checkpoint.reasons import CheckpointFailureReason
from streamsnap.clock import ManualScheduler
from streamsnap.runtime.barriers import (
    AlignmentMetrics,
    CheckpointBarrierAligner,
    CheckpointBarrierHandler,
    CheckpointBarrierTracker,
)
from streamsnap.runtime.events import CancelCheckpointMarker, CheckpointBarrier, EndOfPartition

PROPERTY_SETTINGS = settings(max_examples=examples(300), deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Record:
    channel: int
    seq: int
    # Last barrier/cancel before this record on its channel, as ("barrier"|"cancel", id).
    last_event: tuple[str, int] | None
    # Every checkpoint whose barrier precedes this record on its channel.
    barriers_before: frozenset[int]
    size: int


Item = Record | CheckpointBarrier | CancelCheckpointMarker | EndOfPartition


@dataclass(frozen=True)
class Scenario:
    ids: list[int]
    channels: list[list[Item]]
    # Drives the consumer: each entry picks the next channel to read among the readable ones
    # (value modulo their count), or, for values >= ABORT_THRESHOLD, lets the coordinator
    # abort a checkpoint. Drawn as one list: per-step `data.draw` calls are far slower.
    schedule: list[int]


ABORT_THRESHOLD = 60


@st.composite
def scenarios(draw, *, complete: bool = False) -> Scenario:
    """Channel contents: per checkpoint id (shared increasing sequence) a barrier, a cancel
    marker or nothing; records in between; end of partition last (sometimes early).

    `complete`: every channel delivers every barrier (no cancel, no skip, no early end).
    """
    num_channels = draw(st.integers(2, 5))
    num_checkpoints = draw(st.integers(0, 6))
    gaps = draw(st.lists(st.integers(1, 3), min_size=num_checkpoints, max_size=num_checkpoints))
    ids = list(itertools.accumulate(gaps))
    seq = itertools.count()
    channels: list[list[Item]] = []
    for ch in range(num_channels):
        # Most channels see every checkpoint; some finish early.
        stop = num_checkpoints if complete else draw(
            st.one_of(st.just(num_checkpoints), st.integers(0, num_checkpoints)))
        counts = draw(st.lists(st.integers(0, 3), min_size=stop + 1, max_size=stop + 1))
        kinds = ["barrier"] * stop if complete else draw(st.lists(
            st.sampled_from(["barrier", "barrier", "barrier", "cancel", "none"]),
            min_size=stop, max_size=stop))
        items: list[Item] = []
        last_event: tuple[str, int] | None = None
        barriers: frozenset[int] = frozenset()
        for i in range(stop + 1):
            for _ in range(counts[i]):
                s = next(seq)
                items.append(Record(ch, s, last_event, barriers, 1 + s % 50))
            if i == stop:
                break
            cid = ids[i]
            if kinds[i] == "barrier":
                items.append(CheckpointBarrier(cid, timestamp=0.0))
                last_event, barriers = ("barrier", cid), barriers | {cid}
            elif kinds[i] == "cancel":
                items.append(CancelCheckpointMarker(cid))
                last_event = ("cancel", cid)
        items.append(EndOfPartition())
        channels.append(items)
    total = sum(len(items) for items in channels)
    top = 63 if ids and not complete else ABORT_THRESHOLD - 1
    schedule = draw(st.lists(st.integers(0, top), min_size=total, max_size=total + 8))
    return Scenario(ids, channels, schedule)


class GateModel:
    """Drives a handler from the generated channels and checks the guarantees as it goes."""

    def __init__(self, ids: list[int], channels: list[list[Item]], exactly_once: bool):
        self.ids = ids
        self.queues = [list(reversed(items)) for items in channels]  # pop() = next item
        self.n = len(channels)
        self.exactly_once = exactly_once
        self.clock = ManualScheduler()
        cls = CheckpointBarrierAligner if exactly_once else CheckpointBarrierTracker
        self.handler: CheckpointBarrierHandler = cls(self.n, self, self.clock, "op (1/1)")
        self.blocked: set[int] = set()
        self.fed_barriers: list[set[int]] = [set() for _ in range(self.n)]
        self.closed: set[int] = set()
        # Per channel: checkpoints n such that a record after barrier n was processed.
        self.processed_after: list[set[int]] = [set() for _ in range(self.n)]
        self.triggered: list[int] = []
        self.aborted: dict[int, CheckpointFailureReason] = {}
        self.coordinator_aborted: set[int] = set()
        self.max_fed_id = -1
        # (channel, id) of barriers read when a newer checkpoint had already been read on some
        # channel: the handler has moved past that id, so the barrier holds nothing back.
        self.obsolete_barriers: set[tuple[int, int]] = set()
        # Checkpoints whose first in-band event here was newer than everything fed before:
        # the handler took it on, so it must end up triggered or aborted.
        self.must_resolve: dict[int, str] = {}
        self.block_calls = 0

    # -- the actions the handler calls ---------------------------------------------------------

    def block_channel(self, channel: int) -> None:
        assert self.exactly_once, "the tracker must never block"
        assert channel not in self.blocked, f"channel {channel} blocked twice"
        assert channel not in self.closed, f"closed channel {channel} blocked"
        self.blocked.add(channel)
        self.block_calls += 1

    def resume_channel(self, channel: int) -> None:
        assert channel in self.blocked, f"channel {channel} resumed while not blocked"
        self.blocked.discard(channel)

    def trigger_checkpoint(self, barrier: CheckpointBarrier, metrics: AlignmentMetrics) -> None:
        cid = barrier.checkpoint_id
        # (3) strictly increasing, each id resolved at most once.
        assert not self.triggered or cid > self.triggered[-1], (cid, self.triggered)
        assert cid not in self.aborted, f"checkpoint {cid} triggered after being aborted"
        assert cid not in self.coordinator_aborted, f"{cid} triggered after coordinator abort"
        # Only when every channel delivered its barrier or is closed.
        for ch in range(self.n):
            assert cid in self.fed_barriers[ch] or ch in self.closed, (cid, ch)
        if self.exactly_once:
            # (2) no channel that delivered barrier n has had a later record processed, and
            # channels are released before the snapshot.
            for ch in range(self.n):
                assert cid not in self.processed_after[ch], (
                    f"record after barrier {cid} on channel {ch} processed before the snapshot")
            assert not self.blocked, "checkpoint triggered while channels are still blocked"
        else:
            assert metrics.alignment_duration == 0.0
        assert metrics.alignment_duration >= 0.0 and metrics.start_delay >= 0.0
        assert metrics.bytes_processed_during_alignment >= 0
        self.triggered.append(cid)

    def abort_checkpoint(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        assert checkpoint_id not in self.aborted, f"checkpoint {checkpoint_id} aborted twice"
        assert checkpoint_id not in self.triggered, f"{checkpoint_id} aborted after trigger"
        assert checkpoint_id not in self.coordinator_aborted, (
            f"checkpoint {checkpoint_id} declined again after the coordinator aborted it")
        assert reason in (CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED,
                          CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER)
        self.aborted[checkpoint_id] = reason

    # -- the consumer ----------------------------------------------------------------------------

    def may_pass(self, channel: int, cid: int) -> bool:
        """Whether a record behind barrier `cid` on `channel` may be processed now: the
        checkpoint was triggered or given up (declined, subsumed, or aborted by the
        coordinator), or that barrier was already obsolete when it was read."""
        return (cid in self.triggered or cid in self.aborted or cid in self.coordinator_aborted
                or (channel, cid) in self.obsolete_barriers)

    def note_event_id(self, kind: str, cid: int) -> None:
        if cid > self.max_fed_id:
            if cid not in self.coordinator_aborted:
                self.must_resolve.setdefault(cid, kind)
            self.max_fed_id = cid

    def process(self, record: Record) -> None:
        if self.exactly_once:
            # (1) nothing after barrier n is processed before n is snapshotted (or given up).
            for cid in record.barriers_before:
                assert self.may_pass(record.channel, cid), (
                    f"record {record} processed before checkpoint {cid} was triggered or aborted")
        self.processed_after[record.channel] |= record.barriers_before
        self.handler.add_processed_bytes(record.size)

    def step(self, channel: int) -> None:
        assert not self.handler.is_blocked(channel)
        item = self.queues[channel].pop()
        self.clock.advance(0.001)
        if isinstance(item, Record):
            self.process(item)
        elif isinstance(item, CheckpointBarrier):
            self.fed_barriers[channel].add(item.checkpoint_id)
            if item.checkpoint_id < self.max_fed_id:
                self.obsolete_barriers.add((channel, item.checkpoint_id))
            self.note_event_id("barrier", item.checkpoint_id)
            self.handler.process_barrier(
                CheckpointBarrier(item.checkpoint_id, self.clock.wall() - 0.01), channel)
        elif isinstance(item, CancelCheckpointMarker):
            self.note_event_id("cancel", item.checkpoint_id)
            self.handler.process_cancellation_barrier(item, channel)
        else:
            self.closed.add(channel)
            self.handler.process_end_of_partition(channel)
        self.check_blocking_consistent()

    def coordinator_abort(self, cid: int) -> None:
        if cid in self.triggered or cid in self.aborted:
            return  # the coordinator learns of those; an abort would then be a no-op anyway
        self.coordinator_aborted.add(cid)
        self.handler.on_checkpoint_aborted(cid)
        self.check_blocking_consistent()

    def check_blocking_consistent(self) -> None:
        for ch in range(self.n):
            assert self.handler.is_blocked(ch) == (ch in self.blocked), ch
        if not self.exactly_once:
            assert not self.blocked

    def readable(self) -> list[int]:
        return [ch for ch in range(self.n) if self.queues[ch] and ch not in self.blocked]

    def run(self, schedule: list[int]) -> None:
        steps = iter(schedule)
        while any(self.queues):
            choices = self.readable()
            # (4) no deadlock.
            assert choices, f"deadlock: non-empty channels all blocked ({sorted(self.blocked)})"
            pick = next(steps, 0)  # schedule exhausted: read the first readable channel
            if pick >= ABORT_THRESHOLD:
                self.coordinator_abort(self.ids[pick % len(self.ids)])
            else:
                self.step(choices[pick % len(choices)])
        self.check_end()

    def check_end(self) -> None:
        # (5) nothing blocked at the end, every channel closed.
        assert not self.blocked
        assert not any(self.handler.is_blocked(ch) for ch in range(self.n))
        assert self.handler.all_channels_closed
        # Every checkpoint the handler took on was triggered, declined or aborted: nothing is
        # left waiting for a timeout at the coordinator.
        for cid, first_event in self.must_resolve.items():
            assert (cid in self.triggered or cid in self.aborted
                    or cid in self.coordinator_aborted), (cid, first_event)
            if first_event == "cancel":
                assert cid in self.coordinator_aborted or self.aborted[cid] is (
                    CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER)
        # Liveness in the simplest case: a single checkpoint whose barrier came on every
        # channel, never aborted by the coordinator, must have been triggered (the
        # `complete=True` test covers several checkpoints).
        if len(self.ids) == 1 and not self.coordinator_aborted:
            cid = self.ids[0]
            if all(cid in fed for fed in self.fed_barriers):
                assert self.triggered == [cid]


@PROPERTY_SETTINGS
@given(scenario=scenarios())
def test_aligner_keeps_exactly_once_under_any_read_order(scenario: Scenario):
    GateModel(scenario.ids, scenario.channels, exactly_once=True).run(scenario.schedule)


@PROPERTY_SETTINGS
@given(scenario=scenarios())
def test_tracker_never_blocks_and_triggers_in_order(scenario: Scenario):
    model = GateModel(scenario.ids, scenario.channels, exactly_once=False)
    model.run(scenario.schedule)
    assert model.block_calls == 0


@PROPERTY_SETTINGS
@given(scenario=scenarios(complete=True))
def test_aligner_loses_no_checkpoint_when_every_channel_delivers_every_barrier(scenario):
    """Without cancels, skips or aborts, alignment must trigger every checkpoint, whatever
    the read order (a newer barrier can only be read once the older one completed)."""
    model = GateModel(scenario.ids, scenario.channels, exactly_once=True)
    model.run(scenario.schedule)
    assert model.triggered == scenario.ids
    assert model.aborted == {}
    assert model.block_calls > 0 or not scenario.ids
