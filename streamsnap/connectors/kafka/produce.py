"""Columns to Kafka record batches and transactional Produce requests: the sink's columnar path, sans I/O.

Why it exists: through librdkafka every message is one Python `produce` call (~0.8 µs of CPU, the
bound of the exactly-once sink once the source reads columns). The Kafka protocol takes whole
record batches: this module encodes a partition's rows — keys and values as Arrow binary arrays —
into one record batch (v2, with the producer id, epoch and base sequence of an idempotent,
transactional producer, and its CRC-32C) with a compiled loop, and encodes and decodes the
requests a transactional producer needs: InitProducerId (v1), AddPartitionsToTxn (v1) and
Produce (v3). Rows are dealt to partitions as librdkafka's default partitioner does (CRC-32 of
the key modulo the partition count; rows without a key in turn), so both producers put a key in
the same partition. The socket shell is `producer.py`.
"""

from __future__ import annotations

import struct

import numpy as np

from streamsnap.connectors.kafka.fetch import _body, _I16, _jit
from streamsnap.connectors.kafka.protocol import _string, encode_request

PRODUCE, INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN = 0, 22, 24

# Errors after which the request is sent again (the coordinator or leader is busy or moved).
RETRIABLE = {5: "LEADER_NOT_AVAILABLE", 6: "NOT_LEADER_OR_FOLLOWER", 7: "REQUEST_TIMED_OUT",
             13: "NETWORK_EXCEPTION", 14: "COORDINATOR_LOAD_IN_PROGRESS", 15: "COORDINATOR_NOT_AVAILABLE",
             16: "NOT_COORDINATOR", 51: "CONCURRENT_TRANSACTIONS"}
ERROR_NAMES = {3: "UNKNOWN_TOPIC_OR_PARTITION", 10: "MESSAGE_TOO_LARGE", 45: "OUT_OF_ORDER_SEQUENCE_NUMBER",
               46: "DUPLICATE_SEQUENCE_NUMBER", 47: "INVALID_PRODUCER_EPOCH", 48: "INVALID_TXN_STATE",
               49: "INVALID_PRODUCER_ID_MAPPING", 53: "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
               90: "PRODUCER_FENCED", **RETRIABLE}


def error_name(code: int) -> str:
    return ERROR_NAMES.get(code, f"Kafka error {code}")


# ===================================================================== requests
def encode_init_producer_id(transactional_id: str, timeout_ms: int, correlation_id: int) -> bytes:
    """InitProducerId v3 (a flexible version: tansu 0.6 refuses v0/v1, which lack the producer
    id and epoch fields): a producer id and a new epoch for `transactional_id`, fencing the old."""
    raw = transactional_id.encode("utf-8")
    header = struct.pack(">hhi", INIT_PRODUCER_ID, 3, correlation_id) + _string("streamsnap") + b"\x00"
    body = _uvarint(len(raw) + 1) + raw + struct.pack(">iqh", timeout_ms, -1, -1) + b"\x00"
    return struct.pack(">i", len(header) + len(body)) + header + body


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def decode_init_producer_id(frame, correlation_id: int) -> tuple[int, int, int]:
    """(error code, producer id, epoch) of an InitProducerId v3 response (header v1: tagged fields
    after the correlation id)."""
    c = _body(frame, correlation_id)
    while frame[c.pos] & 0x80:                                     # the header's tagged-field count
        c.pos += 1
    _throttle, error, producer_id, epoch = struct.unpack_from(">ihqh", frame, c.pos + 1)
    return error, producer_id, epoch


def encode_add_partitions(transactional_id: str, producer_id: int, epoch: int, topic: str, partitions: list[int],
                          correlation_id: int) -> bytes:
    """AddPartitionsToTxn v1: the transaction will write to these partitions."""
    body = (_string(transactional_id) + struct.pack(">qh", producer_id, epoch) + struct.pack(">i", 1) +
            _string(topic) + struct.pack(">i", len(partitions)) + b"".join(struct.pack(">i", p) for p in partitions))
    return encode_request(ADD_PARTITIONS_TO_TXN, 1, correlation_id, body)


def _partition_errors(c, skip: int) -> dict[int, int]:
    """partition -> error code of a response's [topic, [partition, error, `skip` more bytes]]."""
    out = {}
    for _ in range(c.int()):
        c.string()
        for _ in range(c.int()):
            partition = c.int()
            (out[partition],) = c.take(_I16)
            c.pos += skip
    return out


def decode_add_partitions(frame, correlation_id: int) -> dict[int, int]:
    """partition -> error code."""
    c = _body(frame, correlation_id)
    c.int()                                                        # throttle time
    return _partition_errors(c, 0)


def encode_produce(transactional_id: str | None, topic: str, batches: dict[int, bytes], timeout_ms: int,
                   correlation_id: int) -> bytes:
    """Produce v3 with acks=all of one record batch per partition."""
    tid = struct.pack(">h", -1) if transactional_id is None else _string(transactional_id)
    parts = [struct.pack(">ii", p, len(b)) + b for p, b in batches.items()]
    body = tid + struct.pack(">hi", -1, timeout_ms) + struct.pack(">i", 1) + _string(topic) + \
        struct.pack(">i", len(parts)) + b"".join(parts)
    return encode_request(PRODUCE, 3, correlation_id, body)


def decode_produce(frame, correlation_id: int) -> dict[int, int]:
    """partition -> error code of a Produce v3 response."""
    return _partition_errors(_body(frame, correlation_id), 16)   # 16: base offset, log append time


# ===================================================================== record batches
def _put_varint(out, at, value):
    z = (value << 1) ^ (value >> 63)
    while z >= 0x80:
        out[at] = (z & 0x7F) | 0x80
        at += 1
        z >>= 7
    out[at] = z
    return at + 1


_put_varint = _jit(_put_varint)


def _varint_size(value):
    z = (value << 1) ^ (value >> 63)
    n = 1
    while z >= 0x80:
        z >>= 7
        n += 1
    return n


_varint_size = _jit(_varint_size)


def _encode_records(vdata, voff, kdata, koff, kvalid, has_keys, rows, out, at):
    """Records of `rows` (indices into the value/key arrays) written from out[at]; returns the end.
    kvalid[r] false: row r has a null key."""
    for i in range(len(rows)):
        r = rows[i]
        vl = voff[r + 1] - voff[r]
        kl = koff[r + 1] - koff[r] if has_keys and kvalid[r] else -1
        body = 1 + 1 + _varint_size(i) + _varint_size(kl) + max(kl, 0) + _varint_size(vl) + vl + 1
        at = _put_varint(out, at, body)
        out[at] = 0                                                # attributes
        out[at + 1] = 0                                            # timestamp delta 0
        at = _put_varint(out, at + 2, i)                           # offset delta
        at = _put_varint(out, at, kl)
        for j in range(max(kl, 0)):
            out[at + j] = kdata[koff[r] + j]
        at += max(kl, 0)
        at = _put_varint(out, at, vl)
        for j in range(vl):
            out[at + j] = vdata[voff[r] + j]
        at += vl
        out[at] = 0                                                # no headers
        at += 1
    return at


_encode_records = _jit(_encode_records)

_BATCH_TAIL = struct.Struct(">hiqqqhii")


def record_batch(values, keys, rows: np.ndarray, *, producer_id: int, epoch: int, base_sequence: int,
                 transactional: bool, timestamp_ms: int) -> bytes:
    """One record batch of the rows `rows` of `values` / `keys` (binary_columns() of each)."""
    import google_crc32c

    vdata, voff, _ = values
    kdata, koff, kvalid = keys if keys is not None else (np.zeros(1, np.uint8), np.zeros(1, np.int64), None)
    if kvalid is None:
        kvalid = np.ones(1 if keys is None else len(koff) - 1, np.bool_)
    n = len(rows)
    size = 61 + int((voff[rows + 1] - voff[rows]).sum()) + n * 20
    if keys is not None:
        size += int((koff[rows + 1] - koff[rows]).sum())
    out = np.empty(size, np.uint8)
    end = _encode_records(vdata, voff, kdata, koff, kvalid, keys is not None, rows, out, 61)
    out[21:61] = np.frombuffer(_BATCH_TAIL.pack(0x10 if transactional else 0, n - 1, timestamp_ms, timestamp_ms,
                                                producer_id, epoch, base_sequence, n), np.uint8)
    crc = google_crc32c.value(out[21:end].tobytes())
    out[:21] = np.frombuffer(struct.pack(">qiibI", 0, end - 12, -1, 2, crc), np.uint8)
    return out[:end].tobytes()


def binary_columns(array) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(data bytes, int64 offsets, validity: bool per row or None without nulls) of a pyarrow
    binary/string array (a null's offsets span no bytes)."""
    import pyarrow as pa

    valid = None
    if array.null_count:
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        array = array.fill_null(b"" if pa.types.is_binary(array.type) else "")
    array = array.cast(pa.large_binary())
    _, offsets, data = array.buffers()
    offsets = np.frombuffer(offsets, np.int64)[array.offset:array.offset + len(array) + 1]
    return (np.frombuffer(data, np.uint8) if data is not None else np.zeros(1, np.uint8)), offsets, valid


def _crc32_keys(kdata, koff, table, out):
    for i in range(len(koff) - 1):
        c = np.uint32(0xFFFFFFFF)
        for j in range(koff[i], koff[i + 1]):
            c = table[(c ^ kdata[j]) & 0xFF] ^ (c >> np.uint32(8))
        out[i] = c ^ np.uint32(0xFFFFFFFF)


_crc32_keys = _jit(_crc32_keys)


def _crc_table() -> np.ndarray:
    table = np.zeros(256, np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (0xEDB88320 ^ (c >> 1)) if c & 1 else c >> 1
        table[i] = c
    return table


_TABLE = _crc_table()


def partitions_of(keys, n_rows: int, partition_count: int, start: int = 0) -> np.ndarray:
    """The partition of each row: CRC-32 of its key modulo the partition count (librdkafka's
    default, consistent_random); rows without a key (keys None, a null or an empty key — an
    empty key counts as none there too) in turn from `start`."""
    turns = (np.arange(n_rows, dtype=np.int64) + start) % partition_count
    if keys is None:
        return turns
    kdata, koff, valid = keys
    crc = np.empty(len(koff) - 1, np.uint32)
    _crc32_keys(kdata, koff, _TABLE, crc)
    partitions = (crc % np.uint32(partition_count)).astype(np.int64)
    keyed = np.diff(koff) > 0
    if valid is not None:
        keyed &= valid
    return np.where(keyed, partitions, turns)


__all__ = ["encode_init_producer_id", "decode_init_producer_id", "encode_add_partitions", "decode_add_partitions",
           "encode_produce", "decode_produce", "record_batch", "binary_columns", "partitions_of", "RETRIABLE",
           "error_name"]
