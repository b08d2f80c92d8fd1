"""The sink's columnar producer: record batches and requests checked by decoding them (sans I/O),
then transactions, fencing and partitioning against the real broker."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pyarrow as pa
import pytest

from streamsnap.connectors.kafka import fetch as kf
from streamsnap.connectors.kafka import produce as kp


def columns(items):
    return kp.binary_columns(pa.array(items, pa.binary()))


def test_a_record_batch_decodes_back_with_its_producer_fields_and_crc():
    values = columns([b'{"v": %d}' % i for i in range(300)] + [b"x" * 5000])
    keys = columns([str(i).encode() for i in range(301)])
    rows = np.array([0, 2, 299, 300, 7])
    data = kp.record_batch(values, keys, rows, producer_id=42, epoch=3, base_sequence=17, transactional=True,
                           timestamp_ms=1_700_000_000_000)
    attributes, _, _, _, producer_id, epoch, sequence, count = struct.unpack_from(">hiqqqhii", data, 21)
    assert (attributes & 0x10, producer_id, epoch, sequence, count) == (0x10, 42, 3, 17, 5)
    records = kf.decode_records(bytearray(data), 0, len(data), fetch_offset=0, read_committed=False)
    assert records.offsets.tolist() == [0, 1, 2, 3, 4]                  # offset deltas 0..n-1 (the broker sets the base)
    assert kf.binary_array(records, "value").to_pylist() == [b'{"v": 0}', b'{"v": 2}', b'{"v": 299}', b"x" * 5000,
                                                             b'{"v": 7}']
    assert kf.binary_array(records, "key").to_pylist() == [b"0", b"2", b"299", b"300", b"7"]
    assert set(records.timestamps.tolist()) == {1_700_000_000_000}
    keyless = kp.record_batch(values, None, rows[:2], producer_id=-1, epoch=-1, base_sequence=-1,
                              transactional=False, timestamp_ms=0)
    again = kf.decode_records(bytearray(keyless), 0, len(keyless), fetch_offset=0, read_committed=False)
    assert kf.binary_array(again, "key").to_pylist() == [None, None]


def test_keys_go_to_partitions_by_crc32_as_librdkafka_puts_them_and_keyless_rows_in_turn():
    keys = [b"1", b"22", b"abc", "ü".encode()]
    assert kp.partitions_of(columns(keys), 4, 7).tolist() == [zlib.crc32(k) % 7 for k in keys]
    # An empty key is no key to librdkafka's consistent_random partitioner either: in turn.
    assert kp.partitions_of(columns([b"abc", b"", b""]), 3, 7, start=4).tolist() == [zlib.crc32(b"abc") % 7, 5, 6]
    assert kp.partitions_of(None, 5, 3, start=2).tolist() == [2, 0, 1, 2, 0]
    assert kp.partitions_of(columns([b"abc", None, None]), 3, 7, start=1).tolist() == [zlib.crc32(b"abc") % 7, 2, 3]


def test_null_keys_are_written_as_null():
    values, keys = columns([b"a", b"b", b"c"]), columns([b"k", None, b""])
    data = kp.record_batch(values, keys, np.arange(3), producer_id=1, epoch=0, base_sequence=0, transactional=True,
                           timestamp_ms=0)
    records = kf.decode_records(bytearray(data), 0, len(data), fetch_offset=0, read_committed=False)
    assert kf.binary_array(records, "key").to_pylist() == [b"k", None, b""]


def test_request_frames():
    init = kp.encode_init_producer_id("tid", 60_000, 9)
    assert struct.unpack_from(">ihhi", init, 0)[1:] == (22, 3, 9)
    assert kp.decode_init_producer_id(struct.pack(">i", 9) + b"\x00" + struct.pack(">ihqh", 0, 0, 1234, 5) + b"\x00",
                                      9) == (0, 1234, 5)
    add = kp.encode_add_partitions("tid", 1234, 5, "t", [0, 3], 10)
    assert struct.unpack_from(">ihhi", add, 0)[1:] == (24, 1, 10)
    answer = struct.pack(">iii", 10, 0, 1) + struct.pack(">h", 1) + b"t" + struct.pack(">i", 2) + \
        struct.pack(">ih", 0, 0) + struct.pack(">ih", 3, 51)
    assert kp.decode_add_partitions(answer, 10) == {0: 0, 3: 51}
    produce = kp.encode_produce("tid", "t", {1: b"batch"}, 30_000, 11)
    assert struct.unpack_from(">ihhi", produce, 0)[1:] == (0, 3, 11)
    answer = struct.pack(">ii", 11, 1) + struct.pack(">h", 1) + b"t" + struct.pack(">i", 1) + \
        struct.pack(">ihqq", 1, 90, -1, -1) + struct.pack(">i", 0)
    assert kp.decode_produce(answer, 11) == {1: 90} and kp.error_name(90) == "PRODUCER_FENCED"


# ===================================================================== against the real broker
def test_a_transaction_is_seen_once_committed_and_a_new_producer_of_the_id_fences_the_old(kafka_broker):
    from benchmarks import local_kafka
    from streamsnap.connectors.kafka.producer import ColumnarProducer, ProducerError
    from tests.connectors.kafka.test_connector import fresh_topic

    topic = fresh_topic(kafka_broker, partitions=2)
    first = ColumnarProducer(kafka_broker, topic, f"col-{topic}", 60)
    first.begin_transaction()
    keys = [str(i % 5).encode() for i in range(100)]
    first.produce(columns([b"%d" % i for i in range(100)]), columns(keys), 100)
    assert local_kafka.read_committed(kafka_broker, topic, 2) == []      # open: not visible
    first.commit_transaction(30)
    committed = local_kafka.read_committed(kafka_broker, topic, 2)
    assert sorted(int(v) for _, _, v in committed) == list(range(100))
    assert all(p == zlib.crc32(k) % 2 for p, k, _ in committed)          # librdkafka's partition of each key
    first.begin_transaction()
    first.produce(columns([b"-1"]), columns([b"0"]), 1)
    second = ColumnarProducer(kafka_broker, topic, f"col-{topic}", 60)   # fences the first, aborts its transaction
    assert second.epoch > first.epoch
    with pytest.raises(ProducerError, match=rf"col-{topic}"):
        first.commit_transaction(5)
    rows, still_open = local_kafka.read_log(kafka_broker, topic, 2)
    assert len(rows) == 100 and still_open == {}


def test_the_columnar_producer_choice_is_checked_when_the_sink_is_built():
    import streamsnap as ss

    assert ss.sinks.Kafka("127.0.0.1:9092", "t").producer == "columnar"
    assert ss.sinks.Kafka("127.0.0.1:9092", "t", semantic="at_least_once").producer == "librdkafka"
    assert ss.sinks.Kafka("127.0.0.1:9092", "t", config={"sasl.mechanism": "PLAIN"}).producer == "librdkafka"
    with pytest.raises(ss.ConfigurationError, match="producer must be 'librdkafka', 'columnar' or None"):
        ss.sinks.Kafka("127.0.0.1:9092", "t", producer="fast")
    with pytest.raises(ss.ConfigurationError, match="semantic='exactly_once'"):
        ss.sinks.Kafka("127.0.0.1:9092", "t", producer="columnar", semantic="at_least_once")
    with pytest.raises(ss.ConfigurationError, match=r"plaintext Kafka only .*'security.protocol'"):
        ss.sinks.Kafka("127.0.0.1:9092", "t", producer="columnar", config={"security.protocol": "SSL"})
