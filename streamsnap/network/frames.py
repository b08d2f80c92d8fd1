"""Frames on an authenticated connection, and record batches as Arrow IPC inside them.

A frame is `length:u32 | kind:u8 | payload`. Record batches travel as an Arrow IPC stream
(schema + batches) so they cross the wire without per-row work; events and control messages are
msgpack. Nothing here pickles. `FrameDecoder` is a pure incremental parser (sans-I/O): the
network poller receives bytes into memory the decoder hands out, the decoder hands back complete
frames.
"""

from __future__ import annotations

import enum
import struct
from typing import Iterator

import msgpack
import pyarrow as pa

HEADER = struct.Struct("!IB")
MAX_FRAME_BYTES = 1 << 30  # a peer that announces more is broken or hostile


class FrameKind(enum.IntEnum):
    DATA = 1      # Arrow IPC stream with one or more record batches
    EVENT = 2     # an in-band event (runtime.events)
    CREDIT = 3    # receiver grants the sender more data frames (u32)
    HELLO = 4     # first frame on a data connection: which channel this is (msgpack)
    MESSAGE = 5   # control RPC message (msgpack map)
    # An unaligned checkpoint barrier: it was put ahead of the sender's queued frames, and the
    # receiver announces it on arrival, ahead of the frames it holds (runtime.unaligned_barriers).
    PRIORITY_EVENT = 6
    # Receiver → sender: cut data frames at this many rows (u32; buffer debloating, network.debloat).
    FRAME_SIZE = 7


class FrameError(ValueError):
    """The byte stream does not follow the framing protocol."""


def frame_header(kind: FrameKind, payload_size: int) -> bytes:
    if payload_size > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {payload_size} bytes exceeds the {MAX_FRAME_BYTES} byte limit")
    return HEADER.pack(payload_size, int(kind))


def encode_frame(kind: FrameKind, payload: bytes) -> bytes:
    return frame_header(kind, len(payload)) + payload


def encode_message(message: dict) -> bytes:
    return encode_frame(FrameKind.MESSAGE, msgpack.packb(message, use_bin_type=True))


def decode_message(payload: bytes) -> dict:
    try:
        message = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise FrameError(f"malformed control message: {exc}") from exc
    if not isinstance(message, dict) or "type" not in message:
        raise FrameError("control message is not a map with a 'type'")
    return message


def encode_credit(credits: int) -> bytes:
    return encode_frame(FrameKind.CREDIT, struct.pack("!I", credits))


def decode_credit(payload: bytes) -> int:
    if len(payload) != 4:
        raise FrameError(f"credit frame must carry 4 bytes, got {len(payload)}")
    return struct.unpack("!I", payload)[0]


def encode_frame_size(rows: int) -> bytes:
    return encode_frame(FrameKind.FRAME_SIZE, struct.pack("!I", rows))


def decode_frame_size(payload: bytes) -> int:
    if len(payload) != 4:
        raise FrameError(f"frame-size frame must carry 4 bytes, got {len(payload)}")
    rows = struct.unpack("!I", payload)[0]
    if rows < 1:
        raise FrameError("frame-size frame announces 0 rows")
    return rows


def encode_batches(batches: list[pa.RecordBatch]) -> pa.Buffer:
    """Serialize batches that share one schema as an Arrow IPC stream of one batch.

    Small batches are concatenated first: a receiver pays its per-batch Python cost once per
    frame, not once per part a rate-limited or selective upstream happened to emit.
    """
    if not batches:
        raise ValueError("encode_batches needs at least one batch")
    if len(batches) > 1:
        combined = pa.Table.from_batches(batches).combine_chunks().to_batches()
        batches = combined or batches[:1]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue()


def decode_batches(payload) -> list[pa.RecordBatch]:
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(payload))
        return list(reader)
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        raise FrameError(f"malformed Arrow IPC data frame: {exc}") from exc


class FrameDecoder:
    """Turns a byte stream into (kind, payload) frames; keeps partial frames between feeds.

    Two ways in: `feed(data)` with bytes from anywhere, or `writable()` + `received(n)` to let
    the caller `recv_into` the decoder's own memory. The body of a large frame is then received
    straight into the buffer that becomes its payload — one copy out of the kernel, none after,
    which matters for megabyte-sized record batch frames.
    """

    def __init__(self, chunk_bytes: int = 1 << 20, direct_bytes: int = 1 << 16) -> None:
        self._buffer = bytearray()          # a partial header or a partial small frame
        self._chunk = chunk_bytes
        self._scratch: bytearray | None = None  # allocated on first `writable()`
        self._direct = direct_bytes         # frames at least this big are received in place
        self._body: bytearray | None = None
        self._body_kind: FrameKind | None = None
        self._filled = 0

    def writable(self) -> memoryview:
        """Where the next bytes from the peer should be received (then call `received`)."""
        if self._body is not None:
            return memoryview(self._body)[self._filled:]
        if self._scratch is None:
            self._scratch = bytearray(self._chunk)
        return memoryview(self._scratch)

    def received(self, n: int) -> Iterator[tuple[FrameKind, bytes | bytearray]]:
        """Frames completed by `n` bytes just received into `writable()`."""
        if self._body is not None:
            self._filled += n
            if self._filled == len(self._body):
                yield self._take_body()
            return
        yield from self.feed(memoryview(self._scratch)[:n])

    def feed(self, data) -> Iterator[tuple[FrameKind, bytes | bytearray]]:
        data = memoryview(data).cast("B")
        if self._body is not None:
            used = min(len(data), len(self._body) - self._filled)
            self._body[self._filled:self._filled + used] = data[:used]
            self._filled += used
            data = data[used:]
            if self._filled < len(self._body):
                return
            yield self._take_body()
        if not data:
            return
        if not self._buffer:  # parse the new bytes where they are; keep only an incomplete tail
            consumed = yield from self._parse(data)
            if consumed < len(data):
                self._buffer += data[consumed:]
            return
        self._buffer += data
        view = memoryview(self._buffer)
        consumed = 0
        try:
            consumed = yield from self._parse(view)
        finally:
            view.release()
            if consumed:
                del self._buffer[:consumed]

    def _parse(self, view: memoryview):
        """Yield the complete frames at the start of `view`; returns how many bytes it used
        (a large frame's available part moves into its in-place body)."""
        offset = 0
        end = len(view)
        while end - offset >= HEADER.size:
            size, kind = HEADER.unpack_from(view, offset)
            if size > MAX_FRAME_BYTES:
                raise FrameError(f"peer announced a {size} byte frame (limit {MAX_FRAME_BYTES})")
            try:
                frame_kind = FrameKind(kind)
            except ValueError:
                raise FrameError(f"unknown frame kind {kind}") from None
            start = offset + HEADER.size
            if end - start < size:
                if size >= self._direct:  # receive the rest in place, see writable()
                    self._body = bytearray(size)
                    self._body_kind = frame_kind
                    self._filled = end - start
                    self._body[:self._filled] = view[start:end]
                    return end
                return offset
            yield frame_kind, bytes(view[start:start + size])
            offset = start + size
        return offset

    def _take_body(self) -> tuple[FrameKind, bytearray]:
        frame = (self._body_kind, self._body)
        self._body, self._body_kind, self._filled = None, None, 0
        return frame

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer) + self._filled
