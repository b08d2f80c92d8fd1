"""Timeout-able aligned barriers on an output channel (sans-I/O, explicit times): sent in
stream order when credit allows, turned into a priority barrier when still queued at the
deadline, and what they overtook is the checkpoint's output channel state."""


from streamsnap.graph.keys import KeySelector
from streamsnap.graph.partitioners import KeyGroupPartitioner
from streamsnap.network.channels import ChannelId, InputChannel, OutputChannel
from streamsnap.network.frames import HEADER, FrameKind
from streamsnap.runtime.channel_state import queue_timeoutable_barrier, read_channel_state
from streamsnap.runtime.events import CheckpointBarrier, CheckpointOptions, decode_event, encode_event
from streamsnap.runtime.output import RecordWriter

CHANNEL = ChannelId(0, "up", 0, "down", 0)
TIMEOUT = CheckpointOptions(unaligned=True, aligned_timeout=0.1)
BARRIER = encode_event(CheckpointBarrier(3, 0.0, TIMEOUT))


def _sent(output: OutputChannel) -> list[tuple[FrameKind, bytes]]:
    """Everything the poller may send now, as the receiver would get it."""
    frames = []
    while (buffers := output.next_sendable()) is not None:
        frames.append((FrameKind(HEADER.unpack(bytes(buffers[0]))[1]), bytes(buffers[1])))
        output.sent_head()
    return frames


def _queued(output: OutputChannel, n: int = 3, credit: int = 0) -> OutputChannel:
    output.add_credit(credit)
    for i in range(n):
        output.enqueue(FrameKind.DATA, b"d%d" % i)
    return output


def test_a_barrier_sent_in_order_before_its_deadline_overtakes_nothing():
    output = _queued(OutputChannel(0, CHANNEL, 8), credit=3)
    pending = output.enqueue_timeoutable_barrier(BARRIER, 3, deadline=10.0)
    assert output.barrier_deadline() == 10.0
    assert [p for _, p in _sent(output)] == [b"d0", b"d1", b"d2", BARRIER]
    assert pending.done.is_set() and not pending.converted and pending.overtaken == []
    output.convert_due_barriers(11.0)   # nothing left to convert
    assert output.barrier_deadline() is None


def test_a_barrier_still_queued_at_its_deadline_overtakes_the_queued_data():
    output = _queued(OutputChannel(0, CHANNEL, 8), credit=1)   # credit for one frame only
    pending = output.enqueue_timeoutable_barrier(BARRIER, 3, deadline=10.0)
    output.enqueue(FrameKind.DATA, b"after")
    assert _sent(output) == [(FrameKind.DATA, b"d0")]
    output.convert_due_barriers(9.999)
    assert not pending.done.is_set()
    output.convert_due_barriers(10.0)
    assert pending.converted and pending.overtaken == [(FrameKind.DATA, b"d1"), (FrameKind.DATA, b"d2")]
    # The barrier goes out first, without credit; the overtaken data still follows, in order.
    assert _sent(output) == [(FrameKind.PRIORITY_EVENT, BARRIER)]
    output.add_credit(3)
    assert [p for _, p in _sent(output)] == [b"d1", b"d2", b"after"]
    assert output.queued_bytes == 0 and output.queued_data_frames == 0


def test_a_barrier_with_nothing_left_to_overtake_at_its_deadline_just_goes_out():
    output = OutputChannel(0, CHANNEL, 8)
    on_wire = output.enqueue_timeoutable_barrier(BARRIER, 3, deadline=10.0)
    output.next_sendable()              # the poller started writing it
    output.convert_due_barriers(10.0)
    assert not on_wire.done.is_set() and output.barrier_deadline() is None
    output.sent_head()
    assert on_wire.done.is_set() and not on_wire.converted
    _queued(output, n=1, credit=1)
    output.next_sendable()              # a data frame is being written, the barrier is next
    next_up = output.enqueue_timeoutable_barrier(BARRIER, 3, deadline=10.0)
    output.convert_due_barriers(10.0)
    assert [p for _, p in _sent(output)] == [b"d0", BARRIER] and not next_up.converted


def test_the_receiver_gets_the_converted_barrier_announced_ahead_of_the_data_it_overtook():
    output = _queued(OutputChannel(0, CHANNEL, 8), n=2)
    output.enqueue_timeoutable_barrier(BARRIER, 3, deadline=1.0)
    output.convert_due_barriers(1.0)
    receiver = InputChannel(0, CHANNEL, 4)
    receiver.announce_events = True
    for kind, payload in _sent(output):
        receiver.on_frame(kind, payload)
    assert [(decode_event(p).checkpoint_id, priority) for p, priority in receiver.announcements] == [(3, True)]


def test_the_snapshot_waits_for_the_barrier_and_persists_only_what_it_overtook(tmp_path):
    output = _queued(OutputChannel(0, CHANNEL, 8), n=2, credit=1)
    writer = _writer([output])
    snapshot = queue_timeoutable_barrier(3, str(tmp_path), "op", [writer],
                                         CheckpointBarrier(3, 0.0, TIMEOUT), deadline=5.0)
    _sent(output)                        # d0 goes out; the barrier waits behind d1
    assert writer.barrier_deadline() == 5.0
    writer.convert_due_barriers(5.0)
    handle = snapshot.run()
    assert snapshot.unaligned
    assert read_channel_state(handle, str(tmp_path), 3) == ({}, {CHANNEL: [(FrameKind.DATA, b"d1")]})


def test_a_snapshot_whose_barriers_went_in_order_writes_nothing_and_stays_aligned(tmp_path):
    output = _queued(OutputChannel(0, CHANNEL, 8), n=2, credit=2)
    writer = _writer([output])
    snapshot = queue_timeoutable_barrier(3, str(tmp_path), "op", [writer],
                                         CheckpointBarrier(3, 0.0, TIMEOUT), deadline=5.0)
    _sent(output)
    assert snapshot.run() is None and not snapshot.unaligned


class _Gate:
    partitioner = KeyGroupPartitioner(KeySelector.of("k"), 128)
    tag = None
    source_node = 0


def _writer(channels) -> RecordWriter:
    return RecordWriter(_Gate(), channels, 0, batch_size=100, buffer_timeout=0.0)
