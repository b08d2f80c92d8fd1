"""Kafka Fetch responses to columns: the Kafka source's columnar data path, sans I/O.

Why it exists: through a client library every message becomes an object (librdkafka's op, then
a Python Message) before it can become a row of an Arrow batch — about 1.7 µs of CPU per message,
the bound of the Kafka source. Kafka stores messages in record batches whose records are
length-prefixed byte runs; this module turns a Fetch response into per-record columns (offset,
timestamp, key position/length, value position/length into the response buffer) with one
compiled scan per batch (numba when installed, else the same function as plain Python, slower),
and the values into Arrow without a Python object per message: newline-joined in place for
`pyarrow.json`, or gathered into a binary array.

Pure functions only (the socket shell is `fetcher.py`):
* requests: `encode_metadata` (v1), `encode_list_offsets` (v1), `encode_fetch` (v4, with the
  isolation level); responses: `decode_metadata`, `decode_list_offsets`, `decode_fetch`.
* `decode_records`: one partition's record batches (magic 2 only) → `Records`. CRC-32C of every
  batch is checked (a corrupt batch is a `CorruptBatchError`, never decoded); compressed batches
  are decompressed (gzip with zlib; snappy, lz4, zstd with cramjam); a trailing partial batch (a
  Fetch response may end inside one) is left for the next fetch. With read_committed, as Kafka
  clients do: nothing at or past the last stable offset, control batches dropped, and batches of
  the aborted transactions the response lists dropped (tansu 0.6 lists none, so there, as with
  librdkafka, rows of aborted transactions are read).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from streamsnap.connectors.kafka.protocol import _string, encode_request
from streamsnap.errors import StreamsnapError

METADATA, LIST_OFFSETS, FETCH = 3, 2, 1
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
EARLIEST_TIMESTAMP, LATEST_TIMESTAMP = -2, -1

OFFSET_OUT_OF_RANGE = 1
# Errors after which the partition's leader is looked up again and the fetch retried.
REFRESH = {3: "UNKNOWN_TOPIC_OR_PARTITION", 5: "LEADER_NOT_AVAILABLE", 6: "NOT_LEADER_OR_FOLLOWER",
           7: "REQUEST_TIMED_OUT", 13: "NETWORK_EXCEPTION", 74: "FENCED_LEADER_EPOCH", 75: "UNKNOWN_LEADER_EPOCH",
           56: "KAFKA_STORAGE_ERROR"}
ERROR_NAMES = {1: "OFFSET_OUT_OF_RANGE", 2: "CORRUPT_MESSAGE", 29: "TOPIC_AUTHORIZATION_FAILED", **REFRESH}

_HEADER = struct.Struct(">qiibIhiqqqhii")       # a record batch's 61-byte header
_CODECS = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


class KafkaFetchError(StreamsnapError):
    """A Fetch response cannot be read (unsupported format or codec, malformed records)."""


class CorruptBatchError(KafkaFetchError):
    """A record batch's CRC-32C does not match its bytes."""


# ===================================================================== requests
def _array(items: list[bytes]) -> bytes:
    return struct.pack(">i", len(items)) + b"".join(items)


def encode_metadata(topics: list[str] | None, correlation_id: int) -> bytes:
    """Metadata v1 for `topics` (None: every topic)."""
    body = struct.pack(">i", -1) if topics is None else _array([_string(t) for t in topics])
    return encode_request(METADATA, 1, correlation_id, body)


def encode_list_offsets(partitions: dict[str, list[int]], timestamp: int, correlation_id: int) -> bytes:
    """ListOffsets v1: the offset at `timestamp` (-2 earliest, -1 latest) of each partition."""
    body = struct.pack(">i", -1) + _array([
        _string(topic) + _array([struct.pack(">iq", p, timestamp) for p in parts])
        for topic, parts in partitions.items()])
    return encode_request(LIST_OFFSETS, 1, correlation_id, body)


def encode_fetch(positions: dict[tuple[str, int], int], correlation_id: int, *, isolation: int, max_wait_ms: int,
                 max_bytes: int, partition_max_bytes: int) -> bytes:
    """Fetch v4 of every (topic, partition) from its offset."""
    by_topic: dict[str, list[bytes]] = {}
    for (topic, partition), offset in positions.items():
        by_topic.setdefault(topic, []).append(struct.pack(">iqi", partition, offset, partition_max_bytes))
    body = struct.pack(">iiiib", -1, max_wait_ms, 1, max_bytes, isolation) + _array(
        [_string(topic) + _array(parts) for topic, parts in by_topic.items()])
    return encode_request(FETCH, 4, correlation_id, body)


# ===================================================================== responses
class _Cursor:
    __slots__ = ("data", "pos")

    def __init__(self, data, pos: int = 0):
        self.data, self.pos = data, pos

    def take(self, fmt: struct.Struct):
        values = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return values

    def int(self) -> int:
        return self.take(_I32)[0]

    def string(self) -> str | None:
        (n,) = self.take(_I16)
        if n < 0:
            return None
        text = bytes(self.data[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return text


_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")


def _body(frame, correlation_id: int) -> _Cursor:
    """A cursor after the response header, checking the correlation id."""
    (got,) = _I32.unpack_from(frame, 0)
    if got != correlation_id:
        raise KafkaFetchError(f"response correlation id {got} does not match the request's {correlation_id}")
    return _Cursor(frame, 4)


@dataclass(frozen=True)
class Metadata:
    brokers: dict[int, tuple[str, int]]                            # node id -> (host, port)
    leaders: dict[tuple[str, int], int]                            # (topic, partition) -> leader node id (-1: none)
    errors: dict[str, int] = field(default_factory=dict)           # topic -> error code (topics that failed)


def decode_metadata(frame, correlation_id: int) -> Metadata:
    c = _body(frame, correlation_id)
    brokers = {}
    for _ in range(c.int()):
        node = c.int()
        host = c.string()
        port = c.int()
        c.string()                                                 # rack
        brokers[node] = (host, port)
    c.int()                                                        # controller id
    leaders, errors = {}, {}
    for _ in range(c.int()):
        (error,) = c.take(_I16)
        topic = c.string()
        c.pos += 1                                                 # is_internal
        if error:
            errors[topic] = error
        for _ in range(c.int()):
            _perror, partition, leader = c.take(_PARTITION_META)
            for _list in ("replicas", "isr"):
                n = c.int()
                c.pos += 4 * n
            leaders[(topic, partition)] = leader
    return Metadata(brokers, leaders, errors)


_PARTITION_META = struct.Struct(">hii")
_LIST_OFFSET = struct.Struct(">ihqq")


def decode_list_offsets(frame, correlation_id: int) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> (error code, offset) of a ListOffsets v1 response."""
    c = _body(frame, correlation_id)
    out = {}
    for _ in range(c.int()):
        topic = c.string()
        for _ in range(c.int()):
            partition, error, _timestamp, offset = c.take(_LIST_OFFSET)
            out[(topic, partition)] = (error, offset)
    return out


@dataclass(frozen=True)
class PartitionData:
    """One partition of a Fetch response: its records are frame[start:end]."""
    topic: str
    partition: int
    error: int
    high_watermark: int
    last_stable_offset: int
    aborted: list[tuple[int, int]]                                 # (producer id, first offset)
    start: int
    end: int


_FETCH_PARTITION = struct.Struct(">ihqq")
_ABORTED = struct.Struct(">qq")


def decode_fetch(frame, correlation_id: int) -> list[PartitionData]:
    """The partitions of a Fetch v4 response frame (records left in place in `frame`)."""
    c = _body(frame, correlation_id)
    c.int()                                                        # throttle time
    out = []
    for _ in range(c.int()):
        topic = c.string()
        for _ in range(c.int()):
            partition, error, high, lso = c.take(_FETCH_PARTITION)
            n = c.int()
            aborted = [c.take(_ABORTED) for _ in range(max(n, 0))]
            size = max(c.int(), 0)
            out.append(PartitionData(topic, partition, error, high, lso, aborted, c.pos, c.pos + size))
            c.pos += size
    return out


# ===================================================================== record batches
@dataclass
class Records:
    """The data records of one partition's fetch, as columns. Keys and values are byte runs of
    `buffer` (key_length / value_length -1: null). `next_offset`: where the next fetch starts
    (after the last complete batch read, control and aborted ones included)."""
    buffer: np.ndarray                                             # uint8, writable
    offsets: np.ndarray
    timestamps: np.ndarray
    key_position: np.ndarray
    key_length: np.ndarray
    value_position: np.ndarray
    value_length: np.ndarray
    next_offset: int

    def __len__(self) -> int:
        return len(self.offsets)

    def slice(self, keep: np.ndarray | slice) -> "Records":
        return Records(self.buffer, self.offsets[keep], self.timestamps[keep], self.key_position[keep],
                       self.key_length[keep], self.value_position[keep], self.value_length[keep], self.next_offset)


def _jit(function):
    """numba's compiled version of `function` when numba is installed (cached on disk beside
    this module or in the user's cache; compiled anew in each process, ~1 s, where neither is
    writable), else the plain function (the same results, tens of times slower)."""
    try:
        import numba
    except ImportError:
        return function
    try:
        return numba.njit(cache=True, nogil=True)(function)
    except RuntimeError:                  # "cannot cache function ...: no locator available"
        return numba.njit(nogil=True)(function)


def _varint(buf, pos, end):
    """(zigzag-decoded value, next position) of the varint at pos; next position -1 if it runs
    past end or over 10 bytes."""
    value = 0
    shift = 0
    while True:
        if pos >= end or shift > 63:
            return 0, -1
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            break
    return (value >> 1) ^ -(value & 1), pos


_varint = _jit(_varint)


def _scan(buf, pos, end, count, out, row):
    """Walk `count` records from pos; out[row + i] = (offset delta, timestamp delta, key position,
    key length, value position, value length). Returns the end position, -1 if malformed."""
    for i in range(count):
        length, pos = _varint(buf, pos, end)
        if pos < 0 or length < 6 or pos + length > end:
            return -1
        stop = pos + length
        p = pos + 1                                                # attributes
        ts, p = _varint(buf, p, stop)
        if p < 0:
            return -1
        od, p = _varint(buf, p, stop)
        if p < 0:
            return -1
        kl, p = _varint(buf, p, stop)
        if p < 0 or p + max(kl, 0) > stop:
            return -1
        kp = p
        p += max(kl, 0)
        vl, p = _varint(buf, p, stop)
        if p < 0 or p + max(vl, 0) > stop:
            return -1
        o = out[row + i]
        o[0] = od
        o[1] = ts
        o[2] = kp
        o[3] = kl
        o[4] = p
        o[5] = vl
        pos = stop
    return pos


_scan = _jit(_scan)


def _join_lines(buf, position, length):
    """Turn the bytes between consecutive values into spaces ending in a newline, so the
    values buf[position[0]:position[-1] + length[-1]] read as newline-delimited JSON."""
    for i in range(1, len(position)):
        stop = position[i] - 1
        for j in range(position[i - 1] + length[i - 1], stop):
            buf[j] = 32
        buf[stop] = 10


join_lines = _jit(_join_lines)


def _gather(buf, position, length, offsets, data):
    """Copy the byte runs (position, length) back to back into data; offsets[i + 1] ends run i."""
    at = 0
    for i in range(len(position)):
        n = max(length[i], 0)
        p = position[i]
        for j in range(n):
            data[at + j] = buf[p + j]
        at += n
        offsets[i + 1] = at


gather = _jit(_gather)


def _decompress(codec: int, data: bytes, where: str) -> bytes:
    if codec == 1:
        return zlib.decompress(data, 47)
    name = _CODECS.get(codec)
    if name is None:
        raise KafkaFetchError(f"{where}: unknown compression codec {codec} in a record batch's attributes")
    try:
        import cramjam
    except ImportError:
        raise KafkaFetchError(f"{where}: a record batch is {name}-compressed and the columnar fetcher decompresses "
                              f"{name} with the cramjam package, which is not installed. Fix: pip install cramjam "
                              f"(part of streamsnap[kafka]), or use fetcher='librdkafka'") from None
    if codec == 2:
        if data[:8] == b"\x82SNAPPY\x00":                          # snappy-java's framing (Java producers)
            out, pos = [], 16
            while pos < len(data):
                (n,) = _I32.unpack_from(data, pos)
                out.append(bytes(cramjam.snappy.decompress_raw(data[pos + 4:pos + 4 + n])))
                pos += 4 + n
            return b"".join(out)
        return bytes(cramjam.snappy.decompress_raw(data))
    if codec == 3:
        return bytes(cramjam.lz4.decompress(data))
    return bytes(cramjam.zstd.decompress(data))


def _crc32c(data: memoryview, where: str) -> int:
    try:
        import google_crc32c
    except ImportError:
        raise KafkaFetchError(f"{where}: the columnar fetcher checks record batches' CRC-32C with the google-crc32c "
                              f"package, which is not installed. Fix: pip install google-crc32c (part of "
                              f"streamsnap[kafka]), or use fetcher='librdkafka'") from None
    return google_crc32c.value(bytes(data))     # it takes bytes only (a copy: ~1 % of decoding)


def decode_records(frame, start: int, end: int, *, fetch_offset: int, read_committed: bool,
                   last_stable_offset: int = -1, aborted: list[tuple[int, int]] = (), where: str = "") -> Records:
    """The data records at or after fetch_offset in frame[start:end] (one partition's records of
    a Fetch response; frame a bytearray, changed in place only by `join_lines` later)."""
    buf = np.frombuffer(frame, np.uint8)
    view = memoryview(frame).toreadonly()
    pending_aborts = sorted(aborted, key=lambda a: a[1])
    aborting: set[int] = set()
    pieces = []                                   # (buffer, records start, end, count, base offset, base ts, log-append ts)
    next_offset = fetch_offset
    pos = start
    while end - pos >= 17:
        base, length, _epoch, magic = struct.unpack_from(">qiib", frame, pos)
        if end - pos - 12 < length:
            break                                                  # a partial batch ends the response
        if magic != 2:
            raise KafkaFetchError(f"{where}: a message set of format v{magic} at offset {base}; the columnar fetcher "
                                  f"reads record batches (v2, Kafka >= 0.11) only. Fix: fetcher='librdkafka'")
        (_, _, _, _, crc, attributes, last_delta, base_ts, max_ts, producer_id, _pe, _seq,
         count) = _HEADER.unpack_from(frame, pos)
        batch_end = pos + 12 + length
        if _crc32c(view[pos + 21:batch_end], where) != crc:
            raise CorruptBatchError(f"{where}: the record batch at offset {base} ({length + 12} bytes) fails its "
                                    f"CRC-32C check (corrupt in the log or in transit); not decoded")
        last = base + last_delta
        pos_records, pos = pos + 61, batch_end
        if last < fetch_offset:
            continue
        if read_committed and 0 <= last_stable_offset <= base:
            break
        next_offset = last + 1
        control, transactional = attributes & 0x20, attributes & 0x10
        if read_committed and transactional:
            while pending_aborts and pending_aborts[0][1] <= last:
                aborting.add(pending_aborts.pop(0)[0])
            if control:
                if producer_id in aborting and _control_type(frame, pos_records, batch_end) == 0:
                    aborting.discard(producer_id)
                continue
            if producer_id in aborting:
                continue
        if control or count <= 0:
            continue
        codec = attributes & 0x07
        if codec:
            data = np.frombuffer(bytearray(_decompress(codec, bytes(frame[pos_records:batch_end]),
                                                       f"{where} batch at offset {base}")), np.uint8)
            pieces.append((data, 0, len(data), count, base, base_ts if not attributes & 0x08 else max_ts,
                           bool(attributes & 0x08), last))
        else:
            pieces.append((buf, pos_records, batch_end, count, base, base_ts if not attributes & 0x08 else max_ts,
                           bool(attributes & 0x08), last))
    return _columns(buf, pieces, fetch_offset, next_offset, where)


def _control_type(frame, pos: int, end: int) -> int:
    """The type of a control batch's marker (0 abort, 1 commit), from its first record's key."""
    out = np.zeros((1, 6), np.int64)
    if _scan(np.frombuffer(frame, np.uint8), pos, end, 1, out, 0) < 0 or out[0, 3] < 4:
        raise KafkaFetchError("a control batch's marker record is malformed")
    return struct.unpack_from(">hh", frame, int(out[0, 2]))[1]


def _columns(buf, pieces, fetch_offset: int, next_offset: int, where: str) -> Records:
    if any(piece[0] is not buf for piece in pieces):
        # A compressed batch: every piece's records are copied into one buffer, so a partition's
        # values stay one run of bytes.
        joined = np.concatenate([piece[0][piece[1]:piece[2]] for piece in pieces])
        rebased, at = [], 0
        for data, s, e, *rest in pieces:
            rebased.append((joined, at, at + e - s, *rest))
            at += e - s
        buf, pieces = joined, rebased
    total = sum(piece[3] for piece in pieces)
    out = np.empty((total, 6), np.int64)
    row = 0
    offsets = np.empty(total, np.int64)
    timestamps = np.empty(total, np.int64)
    for data, s, e, count, base, base_ts, log_append, last in pieces:
        if _scan(data, s, e, count, out, row) < 0:
            raise KafkaFetchError(f"{where}: the record batch at offset {base} has a malformed record (its CRC "
                                  f"matched: the producer wrote it so)")
        offsets[row:row + count] = out[row:row + count, 0] + base
        timestamps[row:row + count] = base_ts if log_append else out[row:row + count, 1] + base_ts
        row += count
    records = Records(buf, offsets, timestamps, out[:, 2], out[:, 3], out[:, 4], out[:, 5], next_offset)
    if total and offsets[0] < fetch_offset:
        records = records.slice(offsets >= fetch_offset)
    return records


def binary_array(records: Records, which: str):
    """The keys or values of `records` as a pyarrow binary array (nulls where length is -1)."""
    import pyarrow as pa

    position = records.key_position if which == "key" else records.value_position
    length = records.key_length if which == "key" else records.value_length
    n = len(position)
    offsets = np.zeros(n + 1, np.int32)
    data = np.empty(int(np.maximum(length, 0).sum()), np.uint8)
    gather(records.buffer, position, length, offsets, data)
    validity = None
    if n and length.min() < 0:
        validity = pa.py_buffer(np.packbits(length >= 0, bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)])


def json_lines(records: Records) -> memoryview:
    """The values as newline-delimited bytes, made in place in the records' buffer (the bytes
    between values are overwritten: keys are read before this if needed). Values must not be null."""
    join_lines(records.buffer, records.value_position, records.value_length)
    first = int(records.value_position[0])
    last = int(records.value_position[-1] + records.value_length[-1])
    return memoryview(records.buffer)[first:last]


__all__ = ["KafkaFetchError", "CorruptBatchError", "Metadata", "PartitionData", "Records", "encode_metadata",
           "encode_list_offsets", "encode_fetch", "decode_metadata", "decode_list_offsets", "decode_fetch",
           "decode_records", "binary_array", "json_lines", "REFRESH", "OFFSET_OUT_OF_RANGE", "ERROR_NAMES"]
