"""Property tests: the unaligned barrier handler under random channels, arrivals and timeouts.

Channels are FIFO lists generated up front: records, barriers of strictly increasing ids (some
sent with priority, i.e. announced on arrival before their stream position is consumed), cancel
markers, end of partition. Each checkpoint is aligned (a savepoint), unaligned at once, or
aligned with a timeout. A driver picks, step by step: consume the head of a readable channel,
let the next priority barrier of a channel arrive, advance the clock and check the alignment
timeout, or let the coordinator abort a checkpoint.

The central check is the one unaligned checkpoints exist for: when a checkpoint's channel
state is complete, the records processed before its snapshot plus the records recorded as
channel state are exactly the records before its barrier on every channel — what an aligned
snapshot would hold.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.properties import examples

from streamsnap.checkpoint.reasons import CheckpointFailureReason
from streamsnap.clock import ManualScheduler
from streamsnap.runtime.barriers import AlignmentMetrics, BarrierProtocolError
from streamsnap.runtime.events import (
    CancelCheckpointMarker, CheckpointBarrier, CheckpointOptions, CheckpointType, EndOfPartition,
)
from streamsnap.runtime.unaligned_barriers import CheckpointBarrierUnaligner

SETTINGS = settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
SUBSUMED = CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED
CANCELLED = CheckpointFailureReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER

MODES = {
    "aligned": CheckpointOptions(CheckpointType.SAVEPOINT, unaligned=False),
    "unaligned": CheckpointOptions(unaligned=True),
    "timeout": CheckpointOptions(unaligned=True, aligned_timeout=0.005),
}


@dataclass(frozen=True)
class Record:
    channel: int
    seq: int
    barriers_before: frozenset[int]   # checkpoints whose barrier precedes it on its channel


@dataclass(frozen=True)
class Barrier:
    barrier: CheckpointBarrier
    priority: bool   # forwarded with priority: announced when it arrives


Item = Record | Barrier | CancelCheckpointMarker | EndOfPartition

# Schedule values: below ARRIVE consume, then arrivals, clock ticks, coordinator aborts.
ARRIVE, TICK, ABORT, TOP = 40, 50, 58, 63


@dataclass(frozen=True)
class Scenario:
    ids: list[int]
    channels: list[list[Item]]
    schedule: list[int]


@st.composite
def scenarios(draw, *, complete: bool = False, priority: bool = True) -> Scenario:
    num_channels = draw(st.integers(1, 4))
    num_checkpoints = draw(st.integers(0, 5))
    ids = list(itertools.accumulate(draw(st.lists(st.integers(1, 3), min_size=num_checkpoints,
                                                  max_size=num_checkpoints))))
    modes = draw(st.lists(st.sampled_from(sorted(MODES)), min_size=num_checkpoints,
                          max_size=num_checkpoints))
    seq = itertools.count()
    channels: list[list[Item]] = []
    for ch in range(num_channels):
        stop = num_checkpoints if complete else draw(
            st.one_of(st.just(num_checkpoints), st.integers(0, num_checkpoints)))
        counts = draw(st.lists(st.integers(0, 3), min_size=stop + 1, max_size=stop + 1))
        kinds = ["barrier"] * stop if complete else draw(st.lists(
            st.sampled_from(["barrier", "barrier", "barrier", "cancel", "none"]),
            min_size=stop, max_size=stop))
        flags = draw(st.lists(st.booleans(), min_size=stop, max_size=stop))
        items: list[Item] = []
        before: frozenset[int] = frozenset()
        for i in range(stop + 1):
            items.extend(Record(ch, next(seq), before) for _ in range(counts[i]))
            if i == stop:
                break
            cid, options = ids[i], MODES[modes[i]]
            if kinds[i] == "barrier":
                items.append(Barrier(CheckpointBarrier(cid, 0.0, options),
                                     priority and flags[i] and options.unaligned))
                before = before | {cid}
            elif kinds[i] == "cancel":
                items.append(CancelCheckpointMarker(cid))
        items.append(EndOfPartition())
        channels.append(items)
    total = sum(len(items) for items in channels)
    schedule = draw(st.lists(st.integers(0, TOP if ids else ARRIVE - 1),
                             min_size=total, max_size=2 * total + 8))
    return Scenario(ids, channels, schedule)


class Driver:
    """Feeds a scenario to the handler, playing the input side, and checks as it goes."""

    def __init__(self, scenario: Scenario):
        self.ids = scenario.ids
        self.channels = scenario.channels
        self.n = len(self.channels)
        self.pos = [0] * self.n                      # next item to consume per channel
        self.announced: set[tuple[int, int]] = set()  # (channel, item index)
        # Barriers are stamped 0.0: every checkpoint started when the run did (wall clock 0), so
        # later ones are timed out when they arrive, earlier ones time out while aligning.
        self.clock = ManualScheduler(wall_offset=-ManualScheduler().monotonic())
        self.handler = CheckpointBarrierUnaligner(self.n, self, self.clock, "op (1/1)")
        self.blocked: set[int] = set()
        self.closed: set[int] = set()
        self.processed: set[Record] = set()
        self.triggered: dict[int, tuple[bool, frozenset[Record]]] = {}
        self.order: list[int] = []
        self.recording: dict[int, set[int]] = {}     # checkpoint -> channels recording
        self.channel_state: dict[int, set[Record]] = {}
        self.completed: set[int] = set()
        self.discarded: set[int] = set()
        self.aborted: dict[int, CheckpointFailureReason] = {}
        self.coordinator_aborted: set[int] = set()
        self.max_seen = -1
        self.obsolete: set[tuple[int, int]] = set()
        # Checkpoints whose first event here was newer than all seen: the handler took them on.
        # (A priority barrier can overtake an older barrier, which then is obsolete on arrival.)
        self.taken_on: set[int] = set()

    # -- actions -------------------------------------------------------------------------------

    def block_channel(self, channel: int) -> None:
        assert channel not in self.blocked and channel not in self.closed
        self.blocked.add(channel)

    def resume_channel(self, channel: int) -> None:
        assert channel in self.blocked
        self.blocked.discard(channel)

    def trigger_checkpoint(self, barrier: CheckpointBarrier, metrics: AlignmentMetrics) -> None:
        cid = barrier.checkpoint_id
        assert cid not in self.triggered and cid not in self.aborted
        assert cid not in self.coordinator_aborted
        assert not self.order or cid > self.order[-1], (cid, self.order)
        assert not self.blocked, "snapshot taken while channels are blocked"
        assert metrics.unaligned == (metrics.unaligned and barrier.options.unaligned)
        if not metrics.unaligned:
            # Aligned: every record before barrier n and none after it was processed.
            self.check_covers(cid, set(self.processed))
        for record in self.processed:
            assert cid not in record.barriers_before, f"record after barrier {cid} in its snapshot"
        self.triggered[cid] = (metrics.unaligned, frozenset(self.processed))
        self.order.append(cid)

    def start_channel_state(self, checkpoint_id: int, channels: tuple[int, ...]) -> None:
        assert self.triggered[checkpoint_id][0], "channel state for an aligned snapshot"
        assert checkpoint_id not in self.recording and channels
        assert not set(channels) & self.closed
        self.recording[checkpoint_id] = set(channels)
        self.channel_state[checkpoint_id] = set()

    def stop_channel_state(self, checkpoint_id: int, channel: int) -> None:
        assert channel in self.recording[checkpoint_id]
        self.recording[checkpoint_id].discard(channel)
        # Stopped on arrival: what is still queued ahead of the barrier belongs to the state.
        items = self.channels[channel]
        for index in range(self.pos[channel], len(items)):
            item = items[index]
            if isinstance(item, Barrier) and item.barrier.checkpoint_id == checkpoint_id:
                assert (channel, index) in self.announced, "stopped before the barrier arrived"
                self.channel_state[checkpoint_id].update(
                    r for r in items[self.pos[channel]:index] if isinstance(r, Record))
                break

    def complete_channel_state(self, checkpoint_id: int) -> None:
        assert self.triggered[checkpoint_id][0]
        assert checkpoint_id not in self.completed and checkpoint_id not in self.discarded
        assert not self.recording.pop(checkpoint_id, set()), "completed while recording"
        self.completed.add(checkpoint_id)
        snapshot = self.triggered[checkpoint_id][1]
        state = self.channel_state.get(checkpoint_id, set())
        assert not snapshot & state
        self.check_covers(checkpoint_id, set(snapshot) | state)

    def discard_channel_state(self, checkpoint_id: int) -> None:
        assert self.triggered[checkpoint_id][0]
        assert checkpoint_id not in self.completed and checkpoint_id not in self.discarded
        self.recording.pop(checkpoint_id, None)
        self.discarded.add(checkpoint_id)

    def abort_checkpoint(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        assert checkpoint_id not in self.aborted and checkpoint_id not in self.coordinator_aborted
        assert reason in (SUBSUMED, CANCELLED)
        if checkpoint_id in self.triggered:
            # Declining after an unaligned snapshot: only before its channel state completed.
            assert checkpoint_id in self.discarded and checkpoint_id not in self.completed
        self.aborted[checkpoint_id] = reason

    # -- checks --------------------------------------------------------------------------------

    def check_covers(self, cid: int, records: set[Record]) -> None:
        """`records` is exactly what precedes barrier `cid` on every channel."""
        expected = {item for items in self.channels for item in items
                    if isinstance(item, Record) and cid not in item.barriers_before}
        assert records == expected, (
            f"checkpoint {cid}: missing {sorted(r.seq for r in expected - records)}, "
            f"extra {sorted(r.seq for r in records - expected)}")

    def may_pass(self, record: Record) -> bool:
        return all(cid in self.triggered or cid in self.aborted or cid in self.coordinator_aborted
                   or (record.channel, cid) in self.obsolete for cid in record.barriers_before)

    # -- driving -------------------------------------------------------------------------------

    def note(self, channel: int, cid: int) -> None:
        if cid < self.max_seen:
            self.obsolete.add((channel, cid))
        elif cid > self.max_seen:
            self.taken_on.add(cid)
        self.max_seen = max(self.max_seen, cid)

    def arrive(self, channel: int) -> bool:
        """The next barrier of an unaligned-capable checkpoint not yet announced on `channel`
        arrives (the input announces those on arrival, priority or in-stream)."""
        items = self.channels[channel]
        for index in range(self.pos[channel], len(items)):
            item = items[index]
            if isinstance(item, Barrier) and item.barrier.options.unaligned \
                    and (channel, index) not in self.announced:
                self.announced.add((channel, index))
                self.note(channel, item.barrier.checkpoint_id)
                if item.priority:
                    self.handler.process_priority_barrier(item.barrier, channel)
                else:
                    self.handler.process_barrier_announcement(item.barrier, channel)
                return True
        return False

    def consume(self, channel: int) -> None:
        assert not self.handler.is_blocked(channel)
        index = self.pos[channel]
        item = self.channels[channel][index]
        self.pos[channel] += 1
        self.clock.advance(0.001)
        if isinstance(item, Record):
            assert self.may_pass(item), f"{item} processed before its checkpoint was taken"
            self.processed.add(item)
            for cid, channels in self.recording.items():
                if channel in channels:
                    self.channel_state[cid].add(item)
            self.handler.add_processed_bytes(1)
        elif isinstance(item, Barrier):
            if item.barrier.options.unaligned and (channel, index) not in self.announced:
                self.pos[channel] -= 1      # it arrived before its position is consumed
                self.arrive(channel)
                self.pos[channel] += 1
            elif not item.barrier.options.unaligned:
                self.note(channel, item.barrier.checkpoint_id)
            self.handler.process_barrier(item.barrier, channel)
        elif isinstance(item, CancelCheckpointMarker):
            self.note(channel, item.checkpoint_id)
            self.handler.process_cancellation_barrier(item, channel)
        else:
            self.closed.add(channel)
            self.handler.process_end_of_partition(channel)
        assert {ch for ch in range(self.n) if self.handler.is_blocked(ch)} == self.blocked

    def run(self, schedule: list[int]) -> None:
        steps = iter(schedule)
        while any(self.pos[ch] < len(self.channels[ch]) for ch in range(self.n)):
            readable = [ch for ch in range(self.n)
                        if self.pos[ch] < len(self.channels[ch]) and ch not in self.blocked]
            assert readable, f"deadlock: channels {sorted(self.blocked)} blocked"
            pick = next(steps, 0)
            if pick < ARRIVE:
                self.consume(readable[pick % len(readable)])
            elif pick < TICK:
                self.arrive(pick % self.n)
            elif pick < ABORT:
                self.clock.advance(0.002 * (pick - TICK + 1))
                deadline = self.handler.alignment_deadline()
                switched = self.handler.check_alignment_timeout()
                assert switched == (deadline is not None and self.clock.monotonic() >= deadline)
            else:
                cid = self.ids[pick % len(self.ids)]
                if cid not in self.triggered and cid not in self.aborted:
                    self.coordinator_aborted.add(cid)
                    self.handler.on_checkpoint_aborted(cid)
                elif cid in self.triggered and self.triggered[cid][0] and cid not in self.completed | self.discarded:
                    self.coordinator_aborted.add(cid)
                    self.handler.on_checkpoint_aborted(cid)
                    assert cid in self.discarded
        # At the end: nothing blocked, nothing recording, every unaligned snapshot resolved.
        assert not self.blocked and self.handler.all_channels_closed
        assert not self.recording and self.handler.current_checkpoint_id is None
        for cid, (unaligned, _) in self.triggered.items():
            if unaligned:
                assert (cid in self.completed) != (cid in self.discarded), cid


@SETTINGS
@given(scenario=scenarios())
def test_snapshot_plus_channel_state_is_what_precedes_the_barrier(scenario: Scenario):
    Driver(scenario).run(scenario.schedule)


@SETTINGS
@given(scenario=scenarios(complete=True))
def test_every_checkpoint_completes_or_is_subsumed_when_every_channel_delivers_it(scenario):
    driver = Driver(scenario)
    driver.schedule = [s for s in scenario.schedule if s < ABORT]
    driver.run(driver.schedule)
    for cid in sorted(driver.taken_on):
        done = cid in driver.completed or (cid in driver.triggered and not driver.triggered[cid][0])
        assert done or driver.aborted.get(cid) is SUBSUMED, (cid, driver.aborted)
    if scenario.ids:
        last = scenario.ids[-1]
        assert last in driver.triggered and last not in driver.aborted


# -- examples ---------------------------------------------------------------------------------


class Recorder:
    def __init__(self):
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *[_short(a) for a in args]))


def _short(value):
    if isinstance(value, CheckpointBarrier):
        return value.checkpoint_id
    if isinstance(value, AlignmentMetrics):
        return "unaligned" if value.unaligned else "aligned"
    return value


def _handler(n=3):
    actions, clock = Recorder(), ManualScheduler()
    return CheckpointBarrierUnaligner(n, actions, clock, "op (1/1)"), actions, clock


def test_first_priority_barrier_snapshots_at_once_and_records_every_channel_until_its_barrier():
    handler, actions, _ = _handler()
    barrier = CheckpointBarrier(1, 0.0, MODES["unaligned"])
    handler.process_priority_barrier(barrier, 0)
    # Channel 0's barrier arrived: its state is what is queued ahead of it, known already.
    assert actions.calls == [("trigger_checkpoint", 1, "unaligned"), ("start_channel_state", 1, (0, 1, 2)),
                             ("stop_channel_state", 1, 0)]
    handler.process_barrier(barrier, 2)
    handler.process_end_of_partition(1)
    assert actions.calls[3:] == [("stop_channel_state", 1, 2), ("stop_channel_state", 1, 1),
                                 ("complete_channel_state", 1)]
    assert handler.current_checkpoint_id is None
    handler.process_barrier(barrier, 0)     # its stream position, reached later: nothing to do
    assert len(actions.calls) == 6
    assert not any(handler.is_blocked(ch) for ch in range(3))


def test_aligned_timeout_counts_from_the_checkpoint_start_and_releases_blocked_channels():
    handler, actions, clock = _handler()
    # Triggered 3 ms before its first barrier got here: 2 ms of the 5 ms timeout are left.
    barrier = CheckpointBarrier(4, clock.wall() - 0.003, MODES["timeout"])
    handler.process_barrier(barrier, 1)
    assert actions.calls == [("block_channel", 1)]
    assert handler.alignment_deadline() == pytest.approx(clock.monotonic() + 0.002)
    clock.advance(0.0019)
    assert not handler.check_alignment_timeout()
    clock.advance(0.0002)
    assert handler.check_alignment_timeout()
    assert actions.calls[1:] == [("resume_channel", 1), ("trigger_checkpoint", 4, "unaligned"),
                                 ("start_channel_state", 4, (0, 2))]
    assert handler.alignment_deadline() is None


@pytest.mark.parametrize("arrival", ["in_order", "announced"])
def test_barrier_arriving_after_the_timeout_goes_unaligned_at_once(arrival):
    """A barrier held in backpressured queues for longer than the timeout never aligns here."""
    handler, actions, clock = _handler()
    barrier = CheckpointBarrier(5, clock.wall() - 0.005, MODES["timeout"])
    if arrival == "in_order":
        handler.process_barrier(barrier, 1)
        assert actions.calls == [("trigger_checkpoint", 5, "unaligned"), ("start_channel_state", 5, (0, 2))]
    else:
        handler.process_barrier_announcement(barrier, 1)
        assert actions.calls == [("trigger_checkpoint", 5, "unaligned"), ("start_channel_state", 5, (0, 1, 2)),
                                 ("stop_channel_state", 5, 1)]
    assert not any(handler.is_blocked(ch) for ch in range(3))


def test_timeout_is_fixed_by_the_start_not_by_later_barriers():
    """Barriers of one checkpoint share its start: a second channel's barrier moves nothing."""
    handler, actions, clock = _handler()
    barrier = CheckpointBarrier(6, clock.wall(), MODES["timeout"])
    handler.process_barrier(barrier, 0)
    deadline = handler.alignment_deadline()
    clock.advance(0.004)
    handler.process_barrier(barrier, 1)
    assert handler.alignment_deadline() == deadline
    clock.advance(0.0011)
    assert handler.check_alignment_timeout()
    assert actions.calls[-2:] == [("trigger_checkpoint", 6, "unaligned"), ("start_channel_state", 6, (2,))]


def test_savepoint_barriers_align_and_refuse_priority():
    handler, actions, _ = _handler(2)
    barrier = CheckpointBarrier(2, 0.0, MODES["aligned"])
    with pytest.raises(BarrierProtocolError, match="only unaligned barriers may overtake"):
        handler.process_priority_barrier(barrier, 0)
    handler.process_barrier(barrier, 0)
    handler.process_barrier(barrier, 1)
    assert actions.calls == [("block_channel", 0), ("resume_channel", 0), ("trigger_checkpoint", 2, "aligned")]


def test_newer_barrier_while_recording_discards_and_declines_the_older_checkpoint():
    handler, actions, _ = _handler(2)
    handler.process_priority_barrier(CheckpointBarrier(1, 0.0, MODES["unaligned"]), 0)
    handler.process_priority_barrier(CheckpointBarrier(2, 0.0, MODES["unaligned"]), 1)
    assert actions.calls[3:] == [("discard_channel_state", 1), ("abort_checkpoint", 1, SUBSUMED),
                                 ("trigger_checkpoint", 2, "unaligned"), ("start_channel_state", 2, (0, 1)),
                                 ("stop_channel_state", 2, 1)]


def test_coordinator_abort_while_recording_discards_without_declining():
    handler, actions, _ = _handler(2)
    handler.process_priority_barrier(CheckpointBarrier(3, 0.0, MODES["unaligned"]), 1)
    handler.on_checkpoint_aborted(3)
    assert actions.calls[-1] == ("discard_channel_state", 3)
    assert handler.recording_channels == frozenset()
    handler.process_barrier(CheckpointBarrier(3, 0.0, MODES["unaligned"]), 1)   # obsolete now
    assert actions.calls[-1] == ("discard_channel_state", 3)


def test_duplicate_announcement_is_a_protocol_error():
    handler, _, _ = _handler(2)
    barrier = CheckpointBarrier(1, 0.0, MODES["unaligned"])
    handler.process_priority_barrier(barrier, 0)
    with pytest.raises(BarrierProtocolError, match="announced twice on input channel 0"):
        handler.process_priority_barrier(barrier, 0)
