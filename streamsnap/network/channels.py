"""The two ends of a data channel, with credit-based flow control.

One TCP connection per (upstream subtask, downstream subtask) pair. The receiver grants the
sender a fixed number of data-frame credits and returns one each time its task *consumes* a
frame; a sender without credit keeps frames queued, and a task whose output queue is full stops
producing. A channel that is not read — because barrier alignment blocked it, or because its
consumer is slow — therefore stops its producer without any unbounded buffer (Flink's
credit-based flow control). Events need no credit, but stay in order behind queued data.

Both classes are shared between the task's mailbox thread and the network loop thread; their
mutable counters are guarded by a lock, the deques are single-producer/single-consumer.
"""

from __future__ import annotations

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
    """Receiving end: frames the network loop read, waiting for the task to consume them."""

    def __init__(self, index: int, channel_id: ChannelId, credits: int):
        self.index = index
        self.channel_id = channel_id
        self.credits = credits
        self.frames: deque[tuple[FrameKind, bytes]] = deque()
        self.connected = threading.Event()
        self.end_of_partition = False
        self._lock = threading.Lock()
        self.buffered_bytes = 0
        self.peak_buffered_bytes = 0
        self.bytes_received = 0

    # -- network loop side
    def on_frame(self, kind: FrameKind, payload: bytes) -> None:
        with self._lock:
            self.buffered_bytes += len(payload)
            self.bytes_received += len(payload)
            if self.buffered_bytes > self.peak_buffered_bytes:
                self.peak_buffered_bytes = self.buffered_bytes
        self.frames.append((kind, payload))

    # -- task side
    def has_frames(self) -> bool:
        return bool(self.frames)

    def pop(self) -> tuple[FrameKind, bytes]:
        kind, payload = self.frames.popleft()
        with self._lock:
            self.buffered_bytes -= len(payload)
        return kind, payload


class OutputChannel:
    """Sending end: frames queued by the task, sent by the network loop as credit allows."""

    def __init__(self, index: int, channel_id: ChannelId, max_queued_frames: int):
        self.index = index
        self.channel_id = channel_id
        self.max_queued_frames = max_queued_frames
        self._queue: deque[tuple[FrameKind, list[memoryview]]] = deque()
        self._lock = threading.Lock()
        self.credit = 0
        self.queued_data_frames = 0
        self.queued_bytes = 0
        self.peak_queued_bytes = 0
        self.bytes_sent = 0
        self.max_frame_bytes = 0
        self.closed = False

    # -- task side
    def enqueue(self, kind: FrameKind, payload) -> None:
        view = memoryview(payload).cast("B")
        size = view.nbytes
        with self._lock:
            self._queue.append((kind, [memoryview(frame_header(kind, size)), view]))
            if kind is FrameKind.DATA:
                self.queued_data_frames += 1
                if size > self.max_frame_bytes:
                    self.max_frame_bytes = size
            self.queued_bytes += size
            if self.queued_bytes > self.peak_queued_bytes:
                self.peak_queued_bytes = self.queued_bytes

    def is_available(self) -> bool:
        """False while the queue is full: the task must not produce more for this channel."""
        return self.queued_data_frames < self.max_queued_frames

    def is_drained(self) -> bool:
        with self._lock:
            return not self._queue

    # -- network loop side
    def add_credit(self, credits: int) -> None:
        with self._lock:
            self.credit += credits

    def next_sendable(self) -> list[memoryview] | None:
        """Buffers of the head frame if it may be sent now (events always, data with credit)."""
        with self._lock:
            if not self._queue:
                return None
            kind, buffers = self._queue[0]
            if kind is FrameKind.DATA and self.credit <= 0:
                return None
            return buffers

    def sent_head(self) -> bool:
        """The head frame went out completely; returns True if that freed queue capacity."""
        with self._lock:
            kind, buffers = self._queue.popleft()
            size = buffers[1].nbytes
            self.queued_bytes -= size
            self.bytes_sent += size
            if kind is FrameKind.DATA:
                self.credit -= 1
                self.queued_data_frames -= 1
                return True
            return False
