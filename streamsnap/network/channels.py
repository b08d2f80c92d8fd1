"""The two ends of a data channel, with credit-based flow control.

One TCP connection per (upstream subtask, downstream subtask) pair. The receiver grants the
sender a fixed number of data-frame credits and returns one each time its task *consumes* a
frame; a sender without credit keeps frames queued, and a task whose output queue is full stops
producing. A channel that is not read — because barrier alignment blocked it, or because its
consumer is slow — therefore stops its producer without any unbounded buffer (Flink's
credit-based flow control). Events need no credit, but stay in order behind queued data —
except priority events (unaligned barriers): the sender puts them ahead of its queued frames,
and the receiver announces them on arrival while their stream position stays in the queue.

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
        at = 1 if self._head_in_flight and self._queue else 0
        overtaken = [(kind, bytes(buffers[1])) for kind, buffers in itertools.islice(self._queue, at, None)]
        self._queue.insert(at, (FrameKind.PRIORITY_EVENT,
                                [memoryview(frame_header(FrameKind.PRIORITY_EVENT, view.nbytes)), view]))
        self.queued_bytes += view.nbytes
        if self.queued_bytes > self.peak_queued_bytes:
            self.peak_queued_bytes = self.queued_bytes
        return overtaken

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
        size = buffers[1].nbytes
        self.queued_bytes -= size
        self.bytes_sent += size
        if kind is FrameKind.DATA:
            self.credit -= 1
            self.queued_data_frames -= 1
