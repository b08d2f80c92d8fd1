"""The columnar Kafka fetcher: record batches and responses built by hand (sans I/O), then the
source reading compressed batches and failing clearly against the real broker."""

from __future__ import annotations

import socket
import struct
import time
import zlib

import cramjam
import google_crc32c
import numpy as np
import pytest

import streamsnap as ss
from streamsnap.connectors.kafka import fetch as kf
from streamsnap.connectors.kafka.protocol import _string


def varint(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        if n < 0x80:
            return bytes(out + bytes([n]))
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def record(offset_delta: int, key: bytes | None, value: bytes | None, ts_delta: int = 0) -> bytes:
    body = b"\x00" + varint(ts_delta) + varint(offset_delta)
    body += varint(-1) if key is None else varint(len(key)) + key
    body += varint(-1) if value is None else varint(len(value)) + value
    body += varint(0)                                                   # no headers
    return varint(len(body)) + body


def batch(base: int, rows: list[tuple[bytes | None, bytes | None]], *, producer_id: int = -1, transactional=False,
          control=False, codec: int = 0, base_ts: int = 1000, compress=None) -> bytes:
    records = b"".join(record(i, k, v, ts_delta=i) for i, (k, v) in enumerate(rows))
    if compress is not None:
        records = compress(records)
    attributes = codec | (0x10 if transactional else 0) | (0x20 if control else 0)
    after_crc = struct.pack(">hiqqqhii", attributes, len(rows) - 1, base_ts, base_ts + len(rows) - 1, producer_id, 0,
                            0, len(rows)) + records
    crc = google_crc32c.value(after_crc)
    return struct.pack(">qiibI", base, 4 + 1 + 4 + len(after_crc), 0, 2, crc) + after_crc


def marker(base: int, producer_id: int, commit: bool) -> bytes:
    return batch(base, [(struct.pack(">hh", 0, 1 if commit else 0), struct.pack(">hih", 0, 0, 0))],
                 producer_id=producer_id, transactional=True, control=True)


def decode(data: bytes, fetch_offset=0, **options) -> kf.Records:
    frame = bytearray(b"pad!" + data)
    options.setdefault("read_committed", False)
    return kf.decode_records(frame, 4, len(frame), fetch_offset=fetch_offset, where="t[0]", **options)


def values(records: kf.Records) -> list:
    return kf.binary_array(records, "value").to_pylist()


def test_a_batch_decodes_into_offsets_timestamps_keys_and_values():
    rows = [(b"k0", b'{"v": 0}'), (None, b'{"v": 1}'), (b"k2", None), (b"", b"x" * 300)]
    records = decode(batch(40, rows))
    assert records.offsets.tolist() == [40, 41, 42, 43] and records.timestamps.tolist() == [1000, 1001, 1002, 1003]
    assert kf.binary_array(records, "key").to_pylist() == [b"k0", None, b"k2", b""]
    assert values(records) == [b'{"v": 0}', b'{"v": 1}', None, b"x" * 300]
    assert records.next_offset == 44


def test_values_become_newline_delimited_json_in_place_across_batches():
    data = batch(0, [(b"a", b'{"v": 0}'), (b"bb", b'{"v": 1}')]) + batch(2, [(None, b'{"v": 2}')])
    lines = bytes(kf.json_lines(decode(data)))
    assert [line.strip() for line in lines.split(b"\n")] == [b'{"v": 0}', b'{"v": 1}', b'{"v": 2}']


def test_records_before_the_fetch_offset_and_a_trailing_partial_batch_are_left_out():
    data = batch(0, [(None, b"a"), (None, b"b"), (None, b"c")]) + batch(3, [(None, b"d")])
    records = decode(data + batch(4, [(None, b"e")])[:-3], fetch_offset=1)
    assert values(records) == [b"b", b"c", b"d"] and records.next_offset == 4      # e is fetched again


def test_a_corrupt_batch_fails_its_crc_check():
    data = bytearray(batch(0, [(None, b"hello"), (None, b"world")]))
    data[-3] ^= 0x01
    with pytest.raises(kf.CorruptBatchError, match=r"t\[0\]: the record batch at offset 0 .* CRC-32C"):
        decode(bytes(data))


def test_read_committed_drops_control_batches_aborted_transactions_and_rows_past_the_stable_offset():
    data = (batch(0, [(None, b"plain")])
            + batch(1, [(None, b"aborted-1"), (None, b"aborted-2")], producer_id=7, transactional=True)
            + batch(3, [(None, b"committed")], producer_id=8, transactional=True)
            + marker(4, 7, commit=False) + marker(5, 8, commit=True)
            + batch(6, [(None, b"later-7")], producer_id=7, transactional=True) + marker(7, 7, commit=True)
            + batch(8, [(None, b"open")], producer_id=9, transactional=True))
    committed = decode(data, read_committed=True, aborted=[(7, 1)], last_stable_offset=8)
    assert values(committed) == [b"plain", b"committed", b"later-7"] and committed.offsets.tolist() == [0, 3, 6]
    assert committed.next_offset == 8                                    # past the markers, not past the LSO
    uncommitted = decode(data, read_committed=False, aborted=[(7, 1)], last_stable_offset=8)
    assert values(uncommitted) == [b"plain", b"aborted-1", b"aborted-2", b"committed", b"later-7", b"open"]
    assert uncommitted.next_offset == 9


def test_only_markers_still_move_the_next_offset():
    records = decode(marker(10, 3, commit=True), fetch_offset=10, read_committed=True)
    assert len(records) == 0 and records.next_offset == 11


def _xerial(data: bytes) -> bytes:
    block = bytes(cramjam.snappy.compress_raw(data))
    return b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block


@pytest.mark.parametrize("codec, compress", [
    (1, lambda d: zlib.compress(d)), (1, lambda d: bytes(cramjam.gzip.compress(d))),
    (2, lambda d: bytes(cramjam.snappy.compress_raw(d))), (2, _xerial),
    (3, lambda d: bytes(cramjam.lz4.compress(d))), (4, lambda d: bytes(cramjam.zstd.compress(d)))],
    ids=["zlib", "gzip", "snappy", "snappy-java", "lz4", "zstd"])
def test_compressed_batches_decode_beside_plain_ones(codec, compress):
    rows = [(str(i).encode(), b'{"v": %d}' % i) for i in range(50)]
    data = batch(0, rows[:20]) + batch(20, rows[20:], codec=codec, compress=compress) + batch(50, [(None, b'{"v": 50}')])
    records = decode(data, fetch_offset=5)
    assert records.offsets.tolist() == list(range(5, 51))
    assert values(records) == [v for _, v in rows[5:]] + [b'{"v": 50}']
    assert kf.binary_array(records, "key").to_pylist()[:2] == [b"5", b"6"]
    assert [line.strip() for line in bytes(kf.json_lines(records)).split(b"\n")] == values(records)


def test_old_message_formats_and_unknown_codecs_fail_naming_the_fix():
    old = bytearray(batch(0, [(None, b"a")]))
    old[16] = 1
    with pytest.raises(kf.KafkaFetchError, match="format v1 .* fetcher='librdkafka'"):
        decode(bytes(old))
    with pytest.raises(kf.KafkaFetchError, match="unknown compression codec 6"):
        decode(batch(0, [(None, b"a")], codec=6, compress=lambda d: d))


def test_a_malformed_record_with_a_good_crc_fails_instead_of_decoding_garbage():
    bad = batch(0, [(None, b"a")])
    body = bytearray(bad[21:])
    body[40] = 0x7E                                                      # the record's length varint: 63 bytes
    fixed = bad[:17] + struct.pack(">I", google_crc32c.value(bytes(body))) + bytes(body)
    with pytest.raises(kf.KafkaFetchError, match="malformed record"):
        decode(fixed)


def test_the_compiled_scan_matches_its_python_source():
    data = bytearray(batch(100, [(b"k" * i, b"v" * (200 - i)) for i in range(120)]))
    buf = np.frombuffer(data, np.uint8)
    compiled, plain = np.zeros((120, 6), np.int64), np.zeros((120, 6), np.int64)
    scan = kf._scan
    assert scan(buf, 61, len(data), 120, compiled, 0) == len(data)
    getattr(scan, "py_func", scan)(buf, 61, len(data), 120, plain, 0)
    assert (compiled == plain).all() and compiled[:, 3].tolist() == list(range(120))


def test_fetch_request_and_response_frames():
    request = kf.encode_fetch({("t", 0): 5, ("t", 1): 9, ("u", 0): 0}, 42, isolation=kf.READ_COMMITTED,
                              max_wait_ms=20, max_bytes=1 << 20, partition_max_bytes=1 << 16)
    assert struct.unpack_from(">ihhi", request, 0)[1:] == (1, 4, 42)
    records = batch(5, [(None, b"x")])
    partition = struct.pack(">ihqq", 1, 0, 10, 8) + struct.pack(">i", 1) + struct.pack(">qq", 7, 3) + \
        struct.pack(">i", len(records)) + records
    frame = bytearray(struct.pack(">ii", 42, 0) + struct.pack(">i", 1) + _string("t") + struct.pack(">i", 2) +
                      struct.pack(">ihqq", 0, 1, -1, -1) + struct.pack(">ii", -1, -1) + partition)
    first, second = kf.decode_fetch(frame, 42)
    assert (first.partition, first.error, first.start, first.end) == (0, kf.OFFSET_OUT_OF_RANGE, first.end, first.end)
    assert (second.high_watermark, second.last_stable_offset, second.aborted) == (10, 8, [(7, 3)])
    assert values(kf.decode_records(frame, second.start, second.end, fetch_offset=5, read_committed=True)) == [b"x"]
    with pytest.raises(kf.KafkaFetchError, match="correlation id 42 does not match the request's 43"):
        kf.decode_fetch(frame, 43)


def test_metadata_and_list_offsets_frames():
    broker = struct.pack(">i", 3) + _string("h") + struct.pack(">i", 9092) + struct.pack(">h", -1)
    partition = struct.pack(">hii", 0, 1, 3) + struct.pack(">iii", 2, 3, 4) + struct.pack(">ii", 1, 3)
    topic = struct.pack(">h", 0) + _string("t") + b"\x00" + struct.pack(">i", 1) + partition
    missing = struct.pack(">h", 3) + _string("gone") + b"\x00" + struct.pack(">i", 0)
    frame = struct.pack(">i", 5) + struct.pack(">i", 1) + broker + struct.pack(">i", 3) + \
        struct.pack(">i", 2) + topic + missing
    metadata = kf.decode_metadata(frame, 5)
    assert metadata.brokers == {3: ("h", 9092)} and metadata.leaders == {("t", 1): 3}
    assert metadata.errors == {"gone": 3}
    offsets = struct.pack(">i", 6) + struct.pack(">i", 1) + _string("t") + struct.pack(">i", 1) + \
        struct.pack(">ihqq", 1, 0, -1, 77)
    assert kf.decode_list_offsets(offsets, 6) == {("t", 1): (0, 77)}


# ===================================================================== against the real broker
def read_values(source, uid="col"):
    from tests.connectors.kafka.test_connector import ctx, read_all

    reader = source.create_reader(ctx(uid=uid))
    reader.assign_splits(source.splits(1))
    reader.open()
    try:
        return read_all(reader)
    finally:
        reader.close()


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_the_columnar_source_reads_batches_a_producer_compressed(kafka_broker, codec):
    from confluent_kafka import Producer

    from tests.connectors.kafka.test_connector import fresh_topic

    topic = fresh_topic(kafka_broker, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_broker, "compression.type": codec, "linger.ms": 5})
    for i in range(2000):
        producer.produce(topic, b'{"value": %d}' % i, partition=i % 2)
    assert producer.flush(30) == 0
    source = ss.sources.Kafka(kafka_broker, [topic], stop_at="latest", batch_size=300, fetcher="columnar")
    assert sorted(read_values(source)) == list(range(2000))


def test_an_offset_out_of_range_fails_naming_the_partition_and_the_fix(kafka_broker):
    """tansu answers a Fetch past the end with no records (Kafka: OFFSET_OUT_OF_RANGE): the
    reader is given that answer as Kafka sends it."""
    from streamsnap.connectors.kafka.source import KafkaSourceError
    from tests.connectors.kafka.test_connector import ctx, fresh_topic

    topic = fresh_topic(kafka_broker, partitions=1)
    source = ss.sources.Kafka(kafka_broker, [topic], starting_offsets={0: 10**6}, fetcher="columnar")
    reader = source.create_reader(ctx(uid="oor"))
    reader.assign_splits(source.splits(1))
    reader.open()
    answer = kf.PartitionData(topic, 0, kf.OFFSET_OUT_OF_RANGE, -1, -1, [], 0, 0)
    try:
        with pytest.raises(KafkaSourceError, match=rf"offset 1000000 of {topic}\[0\] is out of range on "
                                                   rf"{kafka_broker} .* starting_offsets="):
            reader._take((topic, 0), bytearray(), answer)
    finally:
        reader.close()


def test_an_unreachable_broker_fails_naming_it_after_the_retries():
    from streamsnap.connectors.kafka.fetcher import Fetcher, FetcherError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    fetcher = Fetcher(dead, read_committed=True, timeout=0.5, retry_for=0.3)
    with pytest.raises(FetcherError, match=rf"Metadata via '{dead}'.*ConnectionRefused.*failing for"):
        for _ in range(100):
            fetcher.poll({("t", 0): 0})
            time.sleep(0.05)


def test_the_fetcher_choice_is_checked_when_the_source_is_built():
    with pytest.raises(ss.ConfigurationError, match="fetcher must be 'columnar', 'librdkafka' or None"):
        ss.sources.Kafka("127.0.0.1:9092", ["t"], fetcher="fast")
    secure = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}
    with pytest.raises(ss.ConfigurationError, match=r"plaintext Kafka only .*'sasl.mechanism', 'security.protocol'"):
        ss.sources.Kafka("127.0.0.1:9092", ["t"], config=secure, fetcher="columnar")
    assert ss.sources.Kafka("127.0.0.1:9092", ["t"], config=secure).fetcher == "librdkafka"
    assert ss.sources.Kafka("127.0.0.1:9092", ["t"]).fetcher == "columnar"


def test_a_partition_whose_leader_keeps_failing_refreshes_and_then_fails_naming_it(kafka_broker):
    from streamsnap.connectors.kafka.fetcher import FetcherError
    from tests.connectors.kafka.test_connector import ctx, fresh_topic

    topic = fresh_topic(kafka_broker, partitions=1)
    source = ss.sources.Kafka(kafka_broker, [topic], fetcher="columnar")
    reader = source.create_reader(ctx(uid="leader"))
    reader.assign_splits(source.splits(1))
    reader.open()
    reader._fetcher.retry_for = 0.2
    not_leader = kf.PartitionData(topic, 0, 6, -1, -1, [], 0, 0)
    try:
        reader._take((topic, 0), bytearray(), not_leader)
        assert reader._fetcher._stale                                    # the leaders are looked up again
        time.sleep(0.3)
        with pytest.raises(FetcherError, match=rf"Fetch of {topic}\[0\]@0 from {kafka_broker}: "
                                               rf"NOT_LEADER_OR_FOLLOWER \(failing for"):
            reader._take((topic, 0), bytearray(), not_leader)
    finally:
        reader.close()
