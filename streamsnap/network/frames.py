"""Frames on an authenticated connection, and record batches as Arrow IPC inside them.

A frame is `length:u32 | kind:u8 | payload`. Record batches travel as an Arrow IPC stream
(schema + batches) so they cross the wire without per-row work; events and control messages are
msgpack. Nothing here pickles. `FrameDecoder` is a pure incremental parser (sans-I/O): the
network poller feeds it bytes, it hands back complete frames.
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


def encode_batches(batches: list[pa.RecordBatch]) -> pa.Buffer:
    """Serialize batches that share one schema as an Arrow IPC stream."""
    if not batches:
        raise ValueError("encode_batches needs at least one batch")
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
    """Turns a byte stream into (kind, payload) frames; keeps partial frames between feeds."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data) -> Iterator[tuple[FrameKind, bytes]]:
        self._buffer += data
        buf = self._buffer
        offset = 0
        end = len(buf)
        try:
            while end - offset >= HEADER.size:
                size, kind = HEADER.unpack_from(buf, offset)
                if size > MAX_FRAME_BYTES:
                    raise FrameError(f"peer announced a {size} byte frame (limit {MAX_FRAME_BYTES})")
                if end - offset - HEADER.size < size:
                    break
                start = offset + HEADER.size
                try:
                    frame_kind = FrameKind(kind)
                except ValueError:
                    raise FrameError(f"unknown frame kind {kind}") from None
                yield frame_kind, bytes(buf[start:start + size])
                offset = start + size
        finally:
            if offset:
                del buf[:offset]

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)
