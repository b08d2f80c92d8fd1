"""Kafka source reader and sink writer against the real broker (scripts/kafka-broker), no Spark."""

from __future__ import annotations

import json
import pickle
import time
import uuid

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException

import streamsnap as ss
from streamsnap.connectors.kafka.sink import encode_json
from streamsnap.runtime.operators.base import OperatorContext
from benchmarks import local_kafka


@pytest.fixture(params=["columnar", "librdkafka"])
def fetcher(request):
    """The source reader tests run on both fetchers (ss.sources.Kafka(fetcher=...))."""
    return request.param


def ctx(subtask=0, parallelism=1, attempt=0, restored=False, uid="k"):
    return OperatorContext(name=uid, uid=uid, subtask_index=subtask, parallelism=parallelism, max_parallelism=128,
                           attempt=attempt, job_id="job-kafka-tests", task_name=f"{uid} ({subtask + 1}/{parallelism})",
                           restored_operator=restored, extra={"checkpointing": True})


def fresh_topic(bootstrap, partitions=2, prefix="t") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    local_kafka.create_topic(bootstrap, name, partitions)
    return name


def rows(start, n):
    return pa.RecordBatch.from_pylist([{"key": i % 3, "v": i} for i in range(start, start + n)])


def committed_values(bootstrap, topic):
    return sorted(json.loads(v)["v"] for _, _, v in local_kafka.read_committed(bootstrap, topic, 2))


@pytest.mark.parametrize("producer", ["librdkafka", "columnar"])
def test_a_restored_sink_commits_the_pre_committed_transaction_and_fences_its_predecessor(kafka_broker, producer):
    topic = fresh_topic(kafka_broker)
    sink = ss.sinks.Kafka(kafka_broker, topic, key="key", transactional_id_prefix=f"fence-{topic}",
                          producer=producer)
    first = sink.create_writer(ctx())
    first.open()
    first.write(rows(0, 10))
    first.prepare_commit(1)
    first.commit(1)
    assert committed_values(kafka_broker, topic) == list(range(10))
    first.write(rows(10, 5))
    checkpoint_2 = first.prepare_commit(2)       # checkpoint 2 completes, then the task dies
    first.write(rows(100, 5))                    # ...with checkpoint 3's transaction open
    assert committed_values(kafka_broker, topic) == list(range(10))
    # A librdkafka read_committed consumer does not see open transactions either.
    assert len(local_kafka.consumer_read_committed(kafka_broker, topic, 2, expect=10)) == 10

    restored = sink.create_writer(ctx(attempt=1, restored=True))
    restored.recover(checkpoint_2)
    restored.open()
    assert committed_values(kafka_broker, topic) == list(range(15))
    zombie = first._txn["producer"]
    with pytest.raises((KafkaException, ss.StreamsnapError)):   # librdkafka: at the commit; columnar: the write
        first._produce(zombie, rows(-1, 1))
        zombie.commit_transaction(3)
    # Restoring the same checkpoint again (a second failure) commits nothing twice.
    again = sink.create_writer(ctx(attempt=2, restored=True))
    again.recover(checkpoint_2)
    again.write(rows(15, 5))
    again.commit(3)                               # nothing pre-committed yet: nothing to commit
    again.prepare_commit(3)
    again.commit(3)
    assert committed_values(kafka_broker, topic) == list(range(20))


@pytest.mark.parametrize("producer", ["librdkafka", "columnar"])
def test_a_rescaled_restore_fences_the_ids_of_the_old_subtasks_it_now_owns(kafka_broker, producer):
    topic = fresh_topic(kafka_broker)
    sink = ss.sinks.Kafka(kafka_broker, topic, transactional_id_prefix=f"rescale-{topic}", transaction_pool_size=2,
                          producer=producer)
    old = [sink.create_writer(ctx(s, 2)) for s in range(2)]
    state = []
    for s, writer in enumerate(old):
        writer.open()
        writer.write(rows(s * 100, 3))
        state += writer.prepare_commit(1)
        writer.write(rows(s * 100 + 50, 3))      # open, never committed
    single = sink.create_writer(ctx(0, 1, attempt=1, restored=True))
    single.recover(state)
    assert committed_values(kafka_broker, topic) == [0, 1, 2, 100, 101, 102]
    for writer in old:
        # Fenced: the broker refuses it (tansu drops the connection, so the client times out).
        with pytest.raises((KafkaException, ss.StreamsnapError)):
            writer._txn["producer"].commit_transaction(3)
    assert committed_values(kafka_broker, topic) == [0, 1, 2, 100, 101, 102]


@pytest.mark.parametrize("producer", ["librdkafka", "columnar"])
def test_the_next_transaction_is_made_ready_while_the_current_one_writes(kafka_broker, producer):
    topic = fresh_topic(kafka_broker)
    sink = ss.sinks.Kafka(kafka_broker, topic, key="key", transactional_id_prefix=f"ready-{topic}",
                          transaction_pool_size=2, producer=producer)
    writer = sink.create_writer(ctx())
    writer.open()
    prepared = writer._next.result(30)            # readied in the background after open
    assert prepared["id"] == f"ready-{topic}-0-0" and prepared["rows"] == 0
    writer.write(rows(0, 5))
    assert writer._txn is prepared
    assert writer._next.result(30)["id"] == f"ready-{topic}-0-1"   # the following one, meanwhile
    writer.prepare_commit(1)
    writer.write(rows(5, 5))                      # slot 1; slot 0 still awaits checkpoint 1's commit...
    assert writer._txn["id"] == f"ready-{topic}-0-1" and writer._next is None   # ...so it is not touched
    assert committed_values(kafka_broker, topic) == []
    writer.commit(1)
    writer.prepare_commit(2)
    writer.commit(2)
    writer.write(rows(10, 5))                     # slot 0 again, readied on the spot
    writer.prepare_commit(3)
    writer.commit(3)
    assert committed_values(kafka_broker, topic) == list(range(15))
    writer.close()


def test_json_messages_are_encoded_column_wise_as_json_dumps_would():
    batch = pa.RecordBatch.from_pylist([
        {"i": 1, "f": 2.5, "s": 'say "hi"\\', "b": True, "n": None},
        {"i": None, "f": -1e20, "s": "ünï", "b": False, "n": None}])
    assert [json.loads(v) for v in encode_json(batch)] == batch.to_pylist()
    nested = pa.RecordBatch.from_pylist([{"l": [1, 2], "s": "line\nbreak"}])
    assert [json.loads(v) for v in encode_json(nested)] == nested.to_pylist()


def read_all(reader, until=None, timeout=30.0):
    got = []
    deadline = time.monotonic() + timeout
    while not reader.is_finished() and (until is None or len(got) < until):
        assert time.monotonic() < deadline, f"read {len(got)} rows"
        batch = reader.poll()
        if batch is not None:
            got += batch.column("value").to_pylist()
    return got


def test_the_source_resumes_from_its_checkpointed_offsets_at_another_parallelism(kafka_broker, fetcher):
    topic = fresh_topic(kafka_broker, partitions=3)
    local_kafka.produce_json(kafka_broker, topic, [{"key": i % 7, "value": i} for i in range(3000)], key="key")
    source = ss.sources.Kafka(kafka_broker, [topic], stop_at="latest", batch_size=100, fetcher=fetcher)
    splits = source.splits(2)
    readers = [source.create_reader(ctx(s, 2, uid="src")) for s in range(2)]
    seen, state = [], []
    for s, reader in enumerate(readers):
        reader.assign_splits(splits[s::2])
        reader.open()
        seen += read_all(reader, until=400)
        state += reader.snapshot_splits(1)
        reader.close()
    assert sum(stop for *_, stop in state) == 3000                  # end offsets fixed at the first read
    restored = ss.sources.Kafka(kafka_broker, [topic], stop_at="latest", fetcher=fetcher).create_reader(ctx(0, 1, 1, True, "src"))
    restored.assign_splits(state)
    restored.open()
    rest = read_all(restored)
    restored.close()
    assert sorted(seen + rest) == list(range(3000))                 # each row once


def test_an_unbounded_pattern_source_discovers_new_topics(kafka_broker, fetcher):
    tag = uuid.uuid4().hex[:6]
    first = fresh_topic(kafka_broker, 1, prefix=f"disc{tag}")
    local_kafka.produce_json(kafka_broker, first, [{"value": i} for i in range(10)])
    source = ss.sources.Kafka(kafka_broker, pattern=f"disc{tag}-.*", discovery_interval=0.2, fetcher=fetcher)
    reader = source.create_reader(ctx(uid="disc"))
    reader.assign_splits(source.splits(1))
    reader.open()
    assert sorted(read_all(reader, until=10)) == list(range(10))
    second = fresh_topic(kafka_broker, 2, prefix=f"disc{tag}")
    local_kafka.produce_json(kafka_broker, second, [{"value": 100 + i} for i in range(20)])
    assert sorted(read_all(reader, until=20)) == list(range(100, 120))
    # Each partition is its own split for per-partition watermarks.
    assert reader.active_splits() == sorted([f"{first}:0", f"{second}:0", f"{second}:1"])
    assert reader.current_split() in (f"{second}:0", f"{second}:1")
    reader.close()


AVRO = {"type": "record", "name": "Reading", "fields": [
    {"name": "key", "type": "long"}, {"name": "value", "type": "long"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "note", "type": ["null", "string"]}]}


@pytest.mark.parametrize("framing", ["none", "confluent"])
def test_avro_rows_written_by_the_sink_are_read_back_by_the_source(kafka_broker, framing, fetcher):
    topic = fresh_topic(kafka_broker)
    sink = ss.sinks.Kafka(kafka_broker, topic, key="key", format="avro", avro_schema=AVRO,
                          avro_schema_id=None if framing == "none" else 7, semantic="at_least_once")
    writer = sink.create_writer(ctx(uid="avro-out"))
    writer.open()
    rows_in = [{"key": i % 5, "value": i, "at": 1_700_000_000_000 + i, "note": None if i % 3 else f"n{i}"}
               for i in range(500)]
    writer.write(pa.RecordBatch.from_pylist(rows_in))
    writer.prepare_commit(1)
    writer.close()
    source = ss.sources.Kafka(kafka_broker, [topic], format="avro", avro_schema=AVRO, avro_framing=framing,
                              stop_at="latest", batch_size=64, fetcher=fetcher)
    assert source.schema.field("at").type == pa.timestamp("ms", tz="UTC")
    reader = source.create_reader(ctx(uid="avro-in"))
    reader.assign_splits(source.splits(1))
    reader.open()
    got = []
    while not reader.is_finished():
        batch = reader.poll()
        if batch is not None:
            assert batch.schema.equals(source.schema)
            batch = batch.set_column(2, "at", batch.column("at").cast(pa.int64()))
            got += batch.to_pylist()
    reader.close()
    assert sorted(got, key=lambda r: r["value"]) == rows_in


def test_an_undecodable_avro_message_fails_naming_its_topic_partition_and_offset(kafka_broker, fetcher):
    topic = fresh_topic(kafka_broker, partitions=1)
    sink = ss.sinks.Kafka(kafka_broker, topic, format="avro", avro_schema=AVRO, semantic="at_least_once")
    good = sink.encode(pa.RecordBatch.from_pylist([{"key": 1, "value": 2, "at": 3, "note": "x"}]))[0]
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka_broker})
    for value in (good, good, good + b"\x07", good):         # offset 2 carries a stray byte
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0
    source = ss.sources.Kafka(kafka_broker, [topic], format="avro", avro_schema=AVRO, stop_at="latest",
                              fetcher=fetcher)
    reader = source.create_reader(ctx(uid="avro-bad"))
    reader.assign_splits(source.splits(1))
    with pytest.raises(ss.DataError, match=rf"{topic}\[0\]@2 .*avro_schema=") as info:
        reader.open()                    # a bounded source fetches once to learn the end offsets
        while not reader.is_finished():
            reader.poll()
    reader.close()
    assert (info.value.topic, info.value.partition, info.value.offset) == (topic, 0, 2)


def read_until_error(bootstrap, topic, **options):
    source = ss.sources.Kafka(bootstrap, [topic], stop_at="latest", **options)
    reader = source.create_reader(ctx(uid="poison"))
    reader.assign_splits(source.splits(1))
    try:
        with pytest.raises(ss.DataError) as info:
            reader.open()
            while not reader.is_finished():
                reader.poll()
    finally:
        reader.close()
    return info.value


@pytest.mark.parametrize("poison", ["bad json", "wrong type", "two objects", "empty", "tombstone"])
def test_a_message_that_does_not_decode_is_a_data_error_naming_topic_partition_offset_and_fix(kafka_broker, poison,
                                                                                             fetcher):
    from confluent_kafka import Producer

    from streamsnap.connectors.kafka.source import KafkaDecodeError, KafkaSourceError

    topic = fresh_topic(kafka_broker, partitions=1)
    bad = {"bad json": b'{"key": 1, "v": ', "wrong type": b'{"key": 1, "v": "seven"}',
           "two objects": b'{"key": 1, "v": 1}\n{"key": 1, "v": 2}', "empty": b"", "tombstone": None}[poison]
    producer = Producer({"bootstrap.servers": kafka_broker})
    for i in range(7):
        producer.produce(topic, bad if i == 5 else json.dumps({"key": 1, "v": i}).encode(), partition=0)
    assert producer.flush(30) == 0
    schema = pa.schema([("key", pa.int64()), ("v", pa.int64())])
    error = read_until_error(kafka_broker, topic, schema=schema, fetcher=fetcher)
    assert isinstance(error, KafkaDecodeError) and isinstance(error, KafkaSourceError)
    assert (error.topic, error.partition, error.offset) == (topic, 0, 5)
    text = str(error)
    assert f"{topic}[0]@5 (from '{kafka_broker}')" in text and "Kafka source 'poison' (poison (1/1))" in text
    assert "Fix: " in text and "format='raw'" in text
    assert f"starting_offsets={{('{topic}', 0): 6}}" in text          # how to skip it
    again = pickle.loads(pickle.dumps(error))                        # crosses from the task to the driver
    assert (type(again), str(again), again.offset, again.subtask) == (KafkaDecodeError, text, 5, "poison (1/1)")


def test_json_values_that_read_alone_but_not_together_name_the_range(kafka_broker, fetcher):
    topic = fresh_topic(kafka_broker, partitions=1)
    local_kafka.produce_json(kafka_broker, topic, [{"v": 1}, {"v": 2}, {"v": "x"}], partition=0)
    error = read_until_error(kafka_broker, topic, fetcher=fetcher)                    # no schema=: inferred per batch
    assert error.offset is None and f"{topic}[0]@0..2" in str(error) and "declare schema=" in str(error)


def test_read_committed_hides_an_open_transaction_until_it_commits(kafka_broker, fetcher):
    from confluent_kafka import Producer

    topic = fresh_topic(kafka_broker, partitions=1)
    producer = Producer({"bootstrap.servers": kafka_broker, "transactional.id": f"open-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, json.dumps({"value": i}).encode(), partition=0)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(10, 15):
        producer.produce(topic, json.dumps({"value": i}).encode(), partition=0)
    assert producer.flush(30) == 0
    reader = ss.sources.Kafka(kafka_broker, [topic], fetcher=fetcher).create_reader(ctx(uid="open"))
    reader.assign_splits(reader._source.splits(1))
    reader.open()
    try:
        seen, deadline = [], time.monotonic() + 2.0
        while time.monotonic() < deadline:
            batch = reader.poll()
            seen += [] if batch is None else batch.column("value").to_pylist()
        assert seen == list(range(10))                       # the open transaction's rows stay hidden
        producer.commit_transaction(30)
        assert read_all(reader, until=5) == list(range(10, 15))
    finally:
        reader.close()
