"""Watermarks and statuses in band on the input side: valve per input, order with batches."""

from __future__ import annotations

import pyarrow as pa

import streamsnap.time as time_api
from streamsnap.clock import ManualScheduler
from streamsnap.network.channels import ChannelId, InputChannel
from streamsnap.network.frames import FrameKind, encode_batches
from streamsnap.runtime.events import (
    CheckpointBarrier,
    EndOfPartition,
    Watermark,
    WatermarkStatus,
    decode_event,
    encode_event,
)
from streamsnap.runtime.input import CheckpointedInput


class Network:
    """The two calls the input makes on its task's network."""

    def return_credit(self, channel):
        channel.credits += 1

    def close_input(self, channel):
        channel.closed = True


class Task:
    def __init__(self):
        self.triggered = []

    def trigger_checkpoint_on_barrier(self, barrier, metrics):
        self.triggered.append(barrier.checkpoint_id)

    def abort_checkpoint_on_barrier(self, checkpoint_id, reason):
        raise AssertionError("no abort expected")


def make_input(n=2, input_of=None):
    channels = [InputChannel(i, ChannelId(0, "up", i, "down", 0), 4) for i in range(n)]
    task = Task()
    gate = CheckpointedInput(channels, Network(), task, True, ManualScheduler(), "down (1/1)", input_of)
    return gate, channels, task


def event(channel, e):
    channel.on_frame(FrameKind.EVENT, encode_event(e))


def data(channel, values):
    channel.on_frame(FrameKind.DATA, encode_batches([pa.RecordBatch.from_pydict({"v": values})]))


def drain(gate):
    out = []
    while (item := gate.poll_next()) is not None:
        out.append(item if not isinstance(item, pa.RecordBatch) else item.column("v").to_pylist())
    return out


def test_watermark_status_is_one_type_on_the_wire_and_in_time():
    assert time_api.WatermarkStatus is WatermarkStatus
    for e in (WatermarkStatus.IDLE, WatermarkStatus.ACTIVE, Watermark(-(2 ** 63)), Watermark(2 ** 63 - 1)):
        assert decode_event(encode_event(e)) == e


def test_the_minimum_over_channels_is_handed_out_in_order_with_the_batches():
    gate, (a, b), _ = make_input()
    data(a, [1])
    event(a, Watermark(100))
    data(a, [2])
    event(b, Watermark(50))
    event(b, Watermark(150))
    # a's watermark sits between its batches; b alone (150) does not move the minimum
    assert drain(gate) == [[1], Watermark(100), [2]]
    event(a, Watermark(300))
    assert drain(gate) == [Watermark(150)]


def test_an_idle_channel_does_not_hold_back_and_end_of_partition_releases_it():
    gate, (a, b), _ = make_input()
    event(a, Watermark(10))
    event(b, WatermarkStatus.IDLE)
    assert drain(gate) == [Watermark(10)]
    event(a, WatermarkStatus.IDLE)
    assert drain(gate) == [WatermarkStatus.IDLE]
    event(a, WatermarkStatus.ACTIVE)
    event(a, Watermark(20))
    assert drain(gate) == [WatermarkStatus.ACTIVE, Watermark(20)]
    gate2, (c, d), _ = make_input()
    event(c, Watermark(500))
    event(d, Watermark(7))
    event(d, EndOfPartition())
    assert drain(gate2) == [Watermark(7), Watermark(500)]   # d ended: c alone sets it


def test_a_channel_blocked_by_alignment_holds_its_watermark_back_with_its_data():
    gate, (a, b), task = make_input()
    event(a, CheckpointBarrier(1, 0.0))
    data(a, [9])
    event(a, Watermark(1000))
    event(b, Watermark(5))
    assert drain(gate) == []              # a is blocked; b alone cannot set the minimum
    event(b, CheckpointBarrier(1, 0.0))
    assert drain(gate) == [[9], Watermark(5)]
    assert task.triggered == [1]


def test_two_logical_inputs_combine_their_valves():
    gate, (a, b, c), _ = make_input(3, input_of=[0, 0, 1])
    event(a, Watermark(10))
    event(b, Watermark(30))
    assert drain(gate) == []              # input 1 (channel c) still at the minimum
    event(c, Watermark(20))
    assert drain(gate) == [Watermark(10)]
    event(a, Watermark(40))
    assert drain(gate) == [Watermark(20)]


# ---------------------------------------------------------------- queued data frames merged
def test_queued_data_frames_of_unblocked_channels_are_merged_into_one_batch():
    gate, (a, b, c), _ = make_input(3)
    data(a, [1])
    data(a, [2])
    data(b, [3])
    data(c, [4])
    # one batch; per channel in order (a: 1 before 2), channels round robin after the first
    out = drain(gate)
    assert len(out) == 1 and sorted(out[0]) == [1, 2, 3, 4]
    assert out[0].index(1) < out[0].index(2)
    assert all(ch.credits == 4 + n for ch, n in ((a, 2), (b, 1), (c, 1)))   # every frame's credit back


def test_merging_stops_at_a_channel_s_event_so_its_data_stays_behind_its_watermark():
    gate, (a, b), _ = make_input()
    data(a, [1])
    event(a, Watermark(100))
    data(a, [2])
    data(b, [3])
    data(b, [4])
    # a's 2 is behind a's watermark: not merged with 1; b's frames are
    assert drain(gate) == [[1, 3, 4], [2]]
    event(b, Watermark(70))
    assert drain(gate) == [Watermark(70)]


def test_merging_skips_blocked_channels_other_inputs_and_stops_at_max_rows():
    gate, (a, b, c), _ = make_input(3, input_of=[0, 0, 1])
    event(a, CheckpointBarrier(1, 0.0))   # a blocked until b's barrier
    data(a, [1])
    data(b, [2])
    data(c, [3])                          # input 1: never merged with input 0
    assert drain(gate) == [[2], [3]]
    gate, (a, b), _ = make_input()
    gate.max_rows = 3
    for values in ([1, 2], [3], [4], [5]):
        data(a, values)
    assert drain(gate) == [[1, 2, 3], [4, 5]]


def test_a_per_row_head_gets_chunks_in_order_before_the_channel_s_next_event():
    gate, (a, b), _ = make_input()
    gate.chunk_for_rows(3)
    data(a, [1, 2, 3, 4, 5, 6, 7])        # one frame: sliced, nothing merged behind it
    event(a, Watermark(100))
    data(b, [8])
    data(b, [9])                          # small frames: merged up to the chunk
    event(b, Watermark(90))
    assert drain(gate) == [[1, 2, 3], [4, 5, 6], [7], [8, 9], Watermark(90)]


def test_frames_of_different_schemas_stay_separate_batches_in_order():
    gate, (a, b), _ = make_input()
    data(a, [1])
    b.on_frame(FrameKind.DATA, encode_batches([pa.RecordBatch.from_pydict({"w": ["x"]})]))
    data(a, [2])
    batches = []
    while (item := gate.poll_next()) is not None:
        batches.append(item.to_pydict())
    assert batches == [{"v": [1]}, {"w": ["x"]}, {"v": [2]}]   # merged frames, each schema its own batch
