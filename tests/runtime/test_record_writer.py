"""A record writer over several channels holds small batches and routes them together, without
delaying them past their buffer timeout or reordering them against larger batches and events."""

from __future__ import annotations

import time

import pyarrow as pa

from streamsnap.graph.keys import KeySelector
from streamsnap.graph.partitioners import KeyGroupPartitioner
from streamsnap.network.frames import FrameKind, decode_batches
from streamsnap.runtime.events import Watermark, decode_event
from streamsnap.runtime.output import RecordWriter
from streamsnap.runtime.schemas import RowSchema
from streamsnap.state.key_groups import assign_key_groups, subtasks_for_key_groups


class _Channel:
    frame_rows = None       # no buffer-debloating ask from the receiver

    def __init__(self):
        self.frames = []

    def enqueue(self, kind, payload):
        self.frames.append((kind, payload))

    def is_available(self):
        return True

    def rows(self):
        return [r for kind, p in self.frames if kind is FrameKind.DATA for b in decode_batches(p) for r in b.to_pylist()]


class _CountingPartitioner(KeyGroupPartitioner):
    """Key-group partitioning that counts the route calls of its selectors."""

    def create_selector(self, num_channels, subtask_index):
        selector = super().create_selector(num_channels, subtask_index)
        route, counter = selector.route, self.calls

        def counted(batch):
            counter.append(len(batch) if isinstance(batch, list) else batch.num_rows)
            return route(batch)
        selector.route = counted
        return selector


class _Gate:
    def __init__(self):
        self.partitioner = _CountingPartitioner(KeySelector.of("k"), 128)
        object.__setattr__(self.partitioner, "calls", [])
        self.tag = None
        self.source_node = 0


def _writer(channels, batch_size=1000, timeout=0.005):
    gate = _Gate()
    outs = [_Channel() for _ in range(channels)]
    writer = RecordWriter(gate, outs, 0, batch_size=batch_size, buffer_timeout=timeout,
                          schema=RowSchema(None, "op", "op (1/1)"))
    return writer, outs, gate.partitioner.calls


def _expected(rows, channels):
    owner = subtasks_for_key_groups(assign_key_groups([r["k"] for r in rows], 128), 128, channels).tolist()
    return [[r for r, o in zip(rows, owner) if o == c] for c in range(channels)]


def _rows(start, n):
    return [{"k": i % 17, "i": i} for i in range(start, start + n)]


def test_small_batches_are_routed_once_at_the_deadline_of_their_first_row():
    writer, outs, calls = _writer(2)
    started = time.monotonic()
    rows = _rows(0, 30)
    writer.process(pa.RecordBatch.from_pylist(rows[:10]))
    writer.process(pa.RecordBatch.from_pylist(rows[10:20]))
    writer.process(rows[20:])                       # a per-row operator's list
    assert calls == [] and all(not c.frames for c in outs)
    deadline = writer.flush_due(started)
    assert deadline is not None and started + 0.005 <= deadline <= time.monotonic() + 0.005
    assert all(not c.frames for c in outs)
    assert writer.flush_due(deadline) is None       # due: routed and flushed in the same call
    assert calls == [20, 10]                        # one route per run of Arrow batches / of lists
    assert [c.rows() for c in outs] == _expected(rows, 2)


def test_held_rows_are_routed_when_they_fill_a_network_batch():
    writer, outs, calls = _writer(2, batch_size=100)
    for start in range(0, 100, 25):
        writer.process(_rows(start, 25))
    assert calls == [100]


def test_order_holds_across_held_batches_larger_ones_and_events():
    writer, outs, calls = _writer(3, batch_size=50, timeout=10.0)
    rows = _rows(0, 200)
    writer.process(rows[:5])
    writer.process(pa.RecordBatch.from_pylist(rows[5:12]))
    writer.process(pa.RecordBatch.from_pylist(rows[12:112]))   # a full network batch: not held
    writer.process(rows[112:120])
    writer.broadcast_event(Watermark(7))
    writer.process(rows[120:200])
    writer.flush_all()
    assert [c.rows() for c in outs] == _expected(rows, 3)
    for channel in outs:
        kinds = [kind for kind, _ in channel.frames]
        event = kinds.index(FrameKind.EVENT)
        assert decode_event(channel.frames[event][1]) == Watermark(7)
        before = [r for kind, p in channel.frames[:event] if kind is FrameKind.DATA
                  for b in decode_batches(p) for r in b.to_pylist()]
        assert before == [r for r in channel.rows() if r["i"] < 120]


def test_a_single_channel_and_a_zero_timeout_hold_nothing():
    for channels, timeout in ((1, 0.005), (2, 0.0)):
        writer, outs, calls = _writer(channels, timeout=timeout)
        writer.process(_rows(0, 10))
        assert calls == [10]


def test_a_receivers_frame_size_ask_cuts_frames_and_flushes_sooner():
    """Buffer debloating: with the receiver asking for 100-row frames, a 1000-row network batch
    size no longer decides; rows and their order are kept."""
    writer, [out], _ = _writer(1, batch_size=1000, timeout=10.0)
    out.frame_rows = 100
    writer.process([{"k": i} for i in range(150)])          # flushed at 100 rows, not 1000
    sizes = [sum(b.num_rows for b in decode_batches(p)) for k, p in out.frames if k is FrameKind.DATA]
    assert sizes == [100, 50]
    assert [r["k"] for r in out.rows()] == list(range(150))
