"""The local Kafka broker of the tests and benchmarks, and a read_committed reader for it.

Why it exists (and lives here, not in tests/): the Kafka tests and benchmarks/kafka.py share
it. The broker is the one `scripts/kafka-broker` starts (tansu, in memory, on 127.0.0.1);
`start_broker`/`stop_broker` run that script, `create_topic`/`produce_json` prepare input.

`read_committed` reads a partition as a read_committed consumer must see it: rows of committed
transactions and non-transactional rows, never rows of aborted or open transactions. It reads
the log itself (Fetch v4, record batches v2) and decides by the transaction markers, because
tansu (0.6) writes the markers but leaves the aborted-transactions list of its Fetch responses
empty — so librdkafka's own read_committed shows aborted rows there, while it does hide open
transactions (`consumer_read_committed` below uses librdkafka, for the checks it can make) — and
its last stable offset can stay behind a committed transaction for good (`CommittedTail`).
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys

from streamsnap.connectors.kafka.protocol import encode_request, parse_bootstrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "kafka-broker")


def start_broker(directory: str) -> str:
    out = subprocess.run([sys.executable, SCRIPT, "start", directory], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"scripts/kafka-broker start failed: {out.stderr or out.stdout}")
    return out.stdout.strip().splitlines()[-1]


def stop_broker(directory: str) -> None:
    subprocess.run([sys.executable, SCRIPT, "stop", directory], check=True, timeout=60)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    futures[topic].result(30)


def produce_json(bootstrap: str, topic: str, rows: list[dict], key: str | None = None,
                 partition: int | None = None) -> None:
    """Write rows as JSON messages (keyed by the `key` column's text; into `partition` if given)."""
    import json

    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for row in rows:
        producer.produce(topic, json.dumps(row).encode(), None if key is None else str(row[key]).encode(),
                         **({} if partition is None else {"partition": partition}))
        if len(producer) > 50_000:
            producer.poll(0.01)
    assert producer.flush(60) == 0


# ===================================================================== read_committed by markers
def _varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    return (result >> 1) ^ -(result & 1), pos


def _records(data: bytes, pos: int, count: int):
    for _ in range(count):
        length, pos = _varint(data, pos)
        end = pos + length
        p = pos + 1                        # attributes
        _, p = _varint(data, p)            # timestamp delta
        offset_delta, p = _varint(data, p)
        key_length, p = _varint(data, p)
        key = data[p:p + key_length] if key_length >= 0 else None
        p += max(key_length, 0)
        value_length, p = _varint(data, p)
        value = data[p:p + value_length] if value_length >= 0 else None
        yield offset_delta, key, value
        pos = end


def parse_batches(records: bytes):
    """(base offset, last offset, producer id, transactional, control, [(offset, key, value)]) per
    complete record batch (v2, uncompressed)."""
    pos = 0
    while len(records) - pos >= 12:
        base_offset, length = struct.unpack_from(">qi", records, pos)
        if len(records) - pos - 12 < length:
            break
        body = pos + 12
        attributes, last_delta = struct.unpack_from(">hi", records, body + 9)
        producer_id, = struct.unpack_from(">q", records, body + 31)
        count, = struct.unpack_from(">i", records, body + 45)
        if attributes & 0x07:
            raise ValueError("compressed record batches are not supported by this test reader")
        rows = [(base_offset + d, k, v) for d, k, v in _records(records, body + 49, count)]
        yield base_offset, base_offset + last_delta, producer_id, bool(attributes & 0x10), bool(attributes & 0x20), rows
        pos = body + length


def _fetch(address, topic: str, partition: int, offset: int, max_wait_ms: int = 100,
           conn: socket.socket | None = None) -> tuple[int | None, bytes]:
    """(high watermark, record bytes from `offset`): one Fetch v4, read_uncommitted (the markers
    decide); (None, b"") when the broker answered with no partition at all."""
    topic_raw = topic.encode()
    body = struct.pack(">iiiib", -1, max_wait_ms, 1, 16 << 20, 0) + struct.pack(">i", 1) + \
        struct.pack(">h", len(topic_raw)) + topic_raw + struct.pack(">iiqi", 1, partition, offset, 16 << 20)
    own = conn is None
    if own:
        conn = socket.create_connection(address, timeout=10)
    try:
        conn.sendall(encode_request(1, 4, 9, body))
        size, = struct.unpack(">i", _read(conn, 4))
        data = _read(conn, size)
    finally:
        if own:
            conn.close()
    pos = 4 + 4 + 4                       # correlation id, throttle, topics count
    if not struct.unpack_from(">i", data, pos - 4)[0]:
        return None, b""                  # tansu's answer when a short wait found nothing new
    name_length, = struct.unpack_from(">h", data, pos)
    pos += 2 + name_length + 4            # topic, partitions count
    _, error, high = struct.unpack_from(">ihq", data, pos)
    if error:
        raise RuntimeError(f"Fetch {topic}[{partition}]@{offset} failed with Kafka error {error}")
    pos += 4 + 2 + 8 + 8
    aborted, = struct.unpack_from(">i", data, pos)
    pos += 4 + max(aborted, 0) * 16
    length, = struct.unpack_from(">i", data, pos)
    return high, data[pos + 4:pos + 4 + max(length, 0)]


def _read(conn, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError("connection closed")
        data += chunk
    return bytes(data)


GAP_POLLS = 200     # polls a hole in the offsets is waited for before it is taken as a real gap


class CommittedTail:
    """A topic's rows as their transactions commit, read incrementally by the markers: what a
    read_committed consumer of a correct broker sees, and when.

    Why not librdkafka's read_committed consumer: tansu 0.6 marks a transaction committed only
    once every transaction overlapping it is prepared (`txn_end` in its dynostore); with two
    sink subtasks committing side by side one can stay "prepare-commit" for good, its commit
    marker written, and the partition's last stable offset never passes its first row — that
    consumer then stops short of rows whose commit marker is in the log (seen: 1,255 of 2,000).
    Read at the head of the log, tansu may also serve a batch while an earlier offset is not yet
    readable: a hole is read again rather than skipped.
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int, max_wait_ms: int = 100):
        self.topic, self.max_wait_ms = topic, max_wait_ms
        self._address = parse_bootstrap(bootstrap)[0]
        self._offsets = [0] * partitions
        self._pending: list[dict[int, list]] = [{} for _ in range(partitions)]
        self._conn: socket.socket | None = None
        self.stalled = 0     # polls in a row that found rows below the high watermark and read none
        self._gaps: dict[int, tuple[int, int]] = {}   # partition: (offset of a hole, polls that saw it)

    def poll(self) -> list[tuple[int, bytes | None, bytes]]:
        """(partition, key, value) of rows committed (or written without a transaction) since the last call."""
        if self._conn is None:
            self._conn = socket.create_connection(self._address, timeout=10)
        out = []
        for partition, offset in enumerate(self._offsets):
            high, records = _fetch(self._address, self.topic, partition, offset, self.max_wait_ms, self._conn)
            if high is None or offset >= high:
                continue
            pending, start, at_hole = self._pending[partition], offset, False
            for base, last, producer_id, transactional, control, rows in parse_batches(records):
                if last < offset:
                    continue
                if base > offset and self._gaps.get(partition, (offset, 0))[1] < GAP_POLLS:
                    # A hole below a later batch: tansu can serve a batch before an earlier
                    # offset's batch is readable; read again from the hole (for a while: a
                    # compacted log has holes for good).
                    hole = self._gaps.get(partition, (offset, 0))
                    self._gaps[partition] = (offset, hole[1] + 1 if hole[0] == offset else 1)
                    at_hole = True
                    break
                self._gaps.pop(partition, None)
                offset = last + 1
                if control:
                    committed = struct.unpack(">hh", rows[0][1])[1] == 1
                    kept = pending.pop(producer_id, [])
                    if committed:
                        out += [(partition, k, v) for _, k, v in kept]
                elif transactional:
                    pending.setdefault(producer_id, []).extend(rows)
                else:
                    out += [(partition, k, v) for _, k, v in rows]
            # No complete batch below the high watermark: the broker may count a batch before
            # it serves it; the next poll reads it (read_log gives up after a while). A hole
            # waited for is not a stall: it is skipped after GAP_POLLS.
            self.stalled = 0 if offset > start or at_hole else self.stalled + 1
            self._offsets[partition] = offset
        return out

    def caught_up(self) -> bool:
        """Whether the last poll reached every partition's high watermark."""
        for p, offset in enumerate(self._offsets):
            high = _fetch(self._address, self.topic, p, offset, 100, self._conn)[0]
            if high is None or offset < high:
                return False
        return True

    @property
    def offsets(self) -> list[int]:
        """Per partition, the next offset to read."""
        return list(self._offsets)

    def still_open(self) -> dict[tuple[int, int], int]:
        """{(partition, producer id): rows} of transactions without a marker yet."""
        return {(p, pid): len(rows) for p, pending in enumerate(self._pending) for pid, rows in pending.items()}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def read_log(bootstrap: str, topic: str, partitions: int):
    """(committed, still_open) of a topic, read by its transaction markers: committed is
    [(partition, key, value)] of every committed and non-transactional row in log order per
    partition; still_open is {(partition, producer id): rows} of transactions without a marker
    yet (open, or pre-committed and not yet committed)."""
    tail = CommittedTail(bootstrap, topic, partitions)
    try:
        out = []
        while True:
            rows = tail.poll()
            out += rows
            if not rows and tail.caught_up():
                break
            if tail.stalled > 100:
                raise RuntimeError(f"no progress reading {topic} at offsets {tail.offsets}")
        out.sort(key=lambda row: row[0])   # stable: log order within each partition
        return out, tail.still_open()
    finally:
        tail.close()


def read_committed(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, bytes | None, bytes]]:
    """(partition, key, value) of every committed row, in log order per partition."""
    return read_log(bootstrap, topic, partitions)[0]


def consumer_read_committed(bootstrap: str, topic: str, partitions: int, expect: int, timeout: float = 60.0,
                            settle: float = 2.0) -> list[bytes]:
    """Values a librdkafka read_committed consumer sees (it hides open transactions): consumed
    until `expect` of them arrived (or `timeout` passed), then for `settle` seconds more, in which
    any value beyond those would show. A slow start of the consumer is waited for, not taken for
    fewer values."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "streamsnap-tests-verify",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values = []
    deadline = time.monotonic() + timeout
    while len(values) < expect and time.monotonic() < deadline:
        values += [m.value() for m in consumer.consume(10_000, 0.5) if m.error() is None]
    deadline = time.monotonic() + settle
    while time.monotonic() < deadline:
        values += [m.value() for m in consumer.consume(10_000, 0.5) if m.error() is None]
    consumer.close()
    return values
