"""The two ends of a data channel, with credit-based flow control.

One TCP connection per (upstream subtask, downstream subtask) pair. The receiver grants the
sender a fixed number of data-frame credits and returns one each time its task *consumes* a
frame; a sender without credit keeps frames queued, and a task whose output queue is full stops
producing. A channel that is not read — because barrier alignment blocked it, or because its
consumer is slow — therefore stops its producer without any unbounded buffer (Flink's
credit-based flow control). Events need no credit, but stay in order behind queued data —
except priority events (unaligned barriers): the sender puts them ahead of its queued frames,
and the receiver announces them on arrival while their stream position stays in the queue.
A *timeout-able* barrier (a checkpoint that starts aligned but may go unaligned) is queued in
order, and turned into a priority event if it is still queued at its deadline
(`convert_due_barriers`), so backpressure cannot hold it back for longer than the timeout.

Both ends are touched only by their task's own thread (see `network.poller`), so they need
no locks; `InputChannel.connected` is the one thing the acceptor thread sets.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass

from streamsnap.network.frames import FrameKind, frame_header


@dataclass(frozen=True)
class ChannelId:
    """Names a channel on the wire: which edge, from which subtask to which subtask."""

    edge: int
    source_vertex: str
    source_index: int
    target_vertex: str
    target_index: int

    def to_wire(self) -> list:
        return [self.edge, self.source_vertex, self.source_index, self.target_vertex, self.target_index]

    @classmethod
    def from_wire(cls, data) -> "ChannelId":
        edge, sv, si, tv, ti = data
        return cls(int(edge), str(sv), int(si), str(tv), int(ti))

    def __str__(self) -> str:
        return f"{self.source_vertex}#{self.source_index}->{self.target_vertex}#{self.target_index}"


class InputChannel:
    """Receiving end: frames read from the connection, waiting for the task to consume them."""

    def __init__(self, index: int, channel_id: ChannelId, credits: int):
        self.index = index
        self.channel_id = channel_id
        self.credits = credits
        self.frames: deque[tuple[FrameKind, bytes]] = deque()
        # Events to announce to the task on arrival, oldest first, as (payload, priority):
        # priority events always; with `announce_events` (unaligned checkpoints) every event,
        # so an in-stream barrier is known before the task works through the queue ahead of
        # it. Each also sits in `frames` as an ordinary event at its stream position.
        self.announcements: deque[tuple[bytes, bool]] = deque()
        self.announce_events = False
        # Set while an unaligned checkpoint copies this channel's in-flight frames as they
        # arrive (runtime.channel_state): called with (channel, kind, payload).
        self.on_arrival = None
        # Frames at the head of `frames` restored from a checkpoint's channel state: consumed
        # without returning credit (the sender never sent them). `popped_recovered` tells
        # whether the frame `pop` returned last was one of them.
        self.recovered = 0
        self.popped_recovered = False
        self.connected = threading.Event()
        self.buffered_bytes = 0
        self.peak_buffered_bytes = 0
        self.bytes_received = 0

    def on_frame(self, kind: FrameKind | None, payload: bytes) -> None:
        size = len(payload)
        self.buffered_bytes += size
        self.bytes_received += size
        if self.buffered_bytes > self.peak_buffered_bytes:
            self.peak_buffered_bytes = self.buffered_bytes
        if kind is FrameKind.PRIORITY_EVENT:
            self.announcements.append((payload, True))
            kind = FrameKind.EVENT
        elif kind is FrameKind.EVENT and self.announce_events:
            self.announcements.append((payload, False))
        self.frames.append((kind, payload))
        if self.on_arrival is not None:
            self.on_arrival(self, kind, payload)

    def prepend_recovered(self, frames: list[tuple[FrameKind, bytes]]) -> None:
        for kind, payload in reversed(frames):
            self.frames.appendleft((kind, payload))
            self.buffered_bytes += len(payload)
        self.recovered += len(frames)

    def pop(self) -> tuple[FrameKind | None, bytes]:
        kind, payload = self.frames.popleft()
        self.buffered_bytes -= len(payload)
        self.popped_recovered = self.recovered > 0
        if self.popped_recovered:
            self.recovered -= 1
        return kind, payload


_ON_THE_WIRE = float("inf")   # the deadline of a barrier next or being sent: nothing to overtake


class TimeoutableBarrier:
    """An aligned barrier queued on an output channel until it is sent in stream order or, at
    `deadline` (monotonic), put ahead of the frames still queued before it.

    `overtaken` (the frames it overtook, oldest first: this channel's part of the checkpoint's
    channel state; empty if it was sent in order) is set by the task thread before `done`, which
    the asynchronous snapshot thread waits on.
    """

    __slots__ = ("checkpoint_id", "deadline", "overtaken", "converted", "done")

    def __init__(self, checkpoint_id: int, deadline: float):
        self.checkpoint_id = checkpoint_id
        self.deadline = deadline
        self.overtaken: list[tuple[FrameKind, bytes]] = []
        self.converted = False    # it went out as a priority barrier
        self.done = threading.Event()

    def _resolve(self, overtaken: list[tuple[FrameKind, bytes]] | None) -> None:
        """None: sent in stream order."""
        self.converted = overtaken is not None
        self.overtaken = overtaken or []
        self.done.set()


class OutputChannel:
    """Sending end: frames queued by the task, sent as credit allows."""

    def __init__(self, index: int, channel_id: ChannelId, max_queued_frames: int):
        self.index = index
        self.channel_id = channel_id
        self.max_queued_frames = max_queued_frames
        self._queue: deque[tuple[FrameKind, list[memoryview]]] = deque()
        self.credit = 0
        self.queued_data_frames = 0
        self.queued_bytes = 0
        self.peak_queued_bytes = 0
        self.bytes_sent = 0
        self.max_frame_bytes = 0
        self.closed = False
        # Rows per data frame the receiver asked for (buffer debloating; None: the batch size).
        self.frame_rows: int | None = None
        # The head frame was handed to the poller and may be partly on the wire already.
        self._head_in_flight = False
        # Timeout-able barriers still queued, by the identity of their queue entry's buffers.
        self._timeoutable: dict[int, TimeoutableBarrier] = {}

    def enqueue(self, kind: FrameKind, payload) -> None:
        view = memoryview(payload).cast("B")
        size = view.nbytes
        self._queue.append((kind, [memoryview(frame_header(kind, size)), view]))
        if kind is FrameKind.DATA:
            self.queued_data_frames += 1
            if size > self.max_frame_bytes:
                self.max_frame_bytes = size
        self.queued_bytes += size
        if self.queued_bytes > self.peak_queued_bytes:
            self.peak_queued_bytes = self.queued_bytes

    def enqueue_priority(self, payload) -> list[tuple[FrameKind, bytes]]:
        """Put a priority event ahead of every queued frame not yet on the wire (a frame the
        poller is sending stays first); returns the frames it overtook, oldest first, which
        still go out after it."""
        view = memoryview(payload).cast("B")
        self.queued_bytes += view.nbytes
        if self.queued_bytes > self.peak_queued_bytes:
            self.peak_queued_bytes = self.queued_bytes
        return self._put_first(view, len(self._queue))

    def _put_first(self, view: memoryview, end: int) -> list[tuple[FrameKind, bytes]]:
        """Insert a priority event ahead of the queued frames not yet on the wire; returns
        those among the first `end` entries, which it overtakes."""
        at = 1 if self._head_in_flight and self._queue else 0
        overtaken = [(kind, bytes(buffers[1])) for kind, buffers in itertools.islice(self._queue, at, end)]
        self._queue.insert(at, (FrameKind.PRIORITY_EVENT,
                                [memoryview(frame_header(FrameKind.PRIORITY_EVENT, view.nbytes)), view]))
        return overtaken

    def enqueue_timeoutable_barrier(self, payload, checkpoint_id: int, deadline: float) -> TimeoutableBarrier:
        """Queue a barrier in stream order that must not wait in this queue past `deadline`."""
        self.enqueue(FrameKind.EVENT, payload)
        barrier = TimeoutableBarrier(checkpoint_id, deadline)
        self._timeoutable[id(self._queue[-1][1])] = barrier
        return barrier

    def barrier_deadline(self) -> float | None:
        """The earliest deadline of a timeout-able barrier still queued here."""
        return min((b.deadline for b in self._timeoutable.values() if b.deadline != _ON_THE_WIRE), default=None)

    def convert_due_barriers(self, now: float) -> None:
        """Put every timeout-able barrier whose deadline passed ahead of the frames still
        queued before it, as a priority event; those frames (which still go out after it) are
        its channel state. A barrier the poller is already sending just completes."""
        while any(b.deadline <= now for b in self._timeoutable.values()):
            for index, (_, buffers) in enumerate(self._queue):
                barrier = self._timeoutable.get(id(buffers))
                if barrier is not None and barrier.deadline <= now:
                    break
            if index <= int(self._head_in_flight):
                # Nothing to overtake: first in line (events need no credit), or being sent.
                barrier.deadline = _ON_THE_WIRE   # resolved by `sent_head`
                continue
            del self._timeoutable[id(buffers)]
            del self._queue[index]
            barrier._resolve(self._put_first(buffers[1], index))

    def is_available(self) -> bool:
        """False while the queue is full: the task must not produce more for this channel."""
        return self.queued_data_frames < self.max_queued_frames

    def has_queued(self) -> bool:
        return bool(self._queue)

    def is_drained(self) -> bool:
        return not self._queue

    def add_credit(self, credits: int) -> None:
        self.credit += credits

    def next_sendable(self) -> list[memoryview] | None:
        """Buffers of the head frame if it may be sent now (events always, data with credit)."""
        if not self._queue:
            return None
        kind, buffers = self._queue[0]
        if kind is FrameKind.DATA and self.credit <= 0:
            return None
        self._head_in_flight = True
        return buffers

    def sent_head(self) -> None:
        """The head frame went out completely."""
        kind, buffers = self._queue.popleft()
        self._head_in_flight = False
        if self._timeoutable:
            barrier = self._timeoutable.pop(id(buffers), None)
            if barrier is not None:
                barrier._resolve(None)
        size = buffers[1].nbytes
        self.queued_bytes -= size
        self.bytes_sent += size
        if kind is FrameKind.DATA:
            self.credit -= 1
            self.queued_data_frames -= 1
