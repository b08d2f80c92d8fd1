"""Avro ↔ Arrow (streamsnap/connectors/kafka/avro.py): types, framing, misaligned messages, bad schemas."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.connectors.kafka.avro import AvroCodec, AvroDecodeError, AvroEncodeError

SCHEMA = {"type": "record", "name": "Event", "namespace": "test", "fields": [
    {"name": "key", "type": "long"},
    {"name": "value", "type": ["null", "double"]},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "counts", "type": {"type": "map", "values": "int"}},
    {"name": "place", "type": {"type": "record", "name": "Place", "fields": [
        {"name": "day", "type": {"type": "int", "logicalType": "date"}}]}},
    {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
    {"name": "previous", "type": ["null", "Place"]}]}

ROWS = [{"key": 1, "value": None, "at": dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=dt.timezone.utc),
         "tags": ["a", "b"], "counts": [("x", 1)], "place": {"day": dt.date(2026, 1, 2)}, "color": "GREEN",
         "previous": None},
        {"key": 2, "value": 2.5, "at": dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc), "tags": [], "counts": [],
         "place": {"day": dt.date(1999, 12, 31)}, "color": "RED", "previous": {"day": dt.date(2000, 1, 1)}}]


def batch(codec):
    return pa.RecordBatch.from_pylist(ROWS, schema=codec.arrow_schema)


def test_records_round_trip_with_arrow_types_derived_from_the_avro_schema():
    codec = AvroCodec(SCHEMA)
    assert codec.arrow_schema.field("at").type == pa.timestamp("ms", tz="UTC")
    assert codec.arrow_schema.field("value").nullable and not codec.arrow_schema.field("key").nullable
    assert codec.arrow_schema.field("previous").type == codec.arrow_schema.field("place").type
    decoded = codec.decode(codec.encode(batch(codec)))
    assert decoded.equals(batch(codec))
    # Columns in another order, with extra ones and castable types, are written by name.
    exact = batch(codec)
    loose = pa.RecordBatch.from_arrays(
        [pa.array(["x", "y"]), exact.column("color"), exact.column("key").cast(pa.int32()),
         *[exact.column(n) for n in exact.schema.names if n not in ("key", "color")]],
        names=["extra", "color", "key", *[n for n in exact.schema.names if n not in ("key", "color")]])
    assert codec.decode(codec.encode(loose)).equals(batch(codec))


def test_the_confluent_wire_header_is_written_and_checked():
    framed = AvroCodec(SCHEMA, framing="confluent", schema_id=42)
    messages = framed.encode(batch(framed))
    assert all(m[:5] == b"\x00\x00\x00\x00\x2a" for m in messages)
    assert framed.decode(messages).equals(batch(framed))
    with pytest.raises(AvroDecodeError) as bare:
        framed.decode(AvroCodec(SCHEMA).encode(batch(framed))[:1] + messages)
    assert bare.value.index == 0 and "magic byte" in bare.value.reason


@pytest.mark.parametrize("damage", ["extra byte", "truncated", "trailing byte on the last"])
def test_a_message_that_is_not_exactly_one_record_is_named_by_its_index(damage):
    codec = AvroCodec(SCHEMA)
    messages = codec.encode(batch(codec)) * 2
    target = 3 if damage == "trailing byte on the last" else 1
    messages[target] = messages[target][:-2] if damage == "truncated" else messages[target] + b"\x00"
    with pytest.raises(AvroDecodeError) as error:
        codec.decode(messages)
    assert error.value.index == target


@pytest.mark.parametrize("schema, match", [
    ('{"type": "record"', "not JSON"),
    ({"type": "int"}, "must be an Avro record schema"),
    ({"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}, "not a valid Avro schema"),
    ({"type": "record", "name": "R", "fields": [{"name": "a", "type": ["int", "string"]}]}, "union"),
    ({"type": "record", "name": "R", "fields": [{"name": "a", "type": {
        "type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2}}]}, "decimal"),
    ({"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}, "recursive"),
])
def test_a_bad_schema_is_refused_when_the_source_or_sink_is_built(schema, match):
    with pytest.raises(ss.ConfigurationError, match=match):
        ss.sources.Kafka("127.0.0.1:9092", ["t"], format="avro", avro_schema=schema)
    with pytest.raises(ss.ConfigurationError, match=match):
        ss.sinks.Kafka("127.0.0.1:9092", "t", format="avro", avro_schema=schema)


def test_format_and_schema_arguments_must_agree():
    with pytest.raises(ss.ConfigurationError, match="needs avro_schema"):
        ss.sources.Kafka("127.0.0.1:9092", ["t"], format="avro")
    with pytest.raises(ss.ConfigurationError, match="only to format='avro'"):
        ss.sinks.Kafka("127.0.0.1:9092", "t", avro_schema=SCHEMA)
    with pytest.raises(ss.ConfigurationError, match="avro_framing"):
        ss.sources.Kafka("127.0.0.1:9092", ["t"], format="avro", avro_schema=SCHEMA, avro_framing="magic")
    source = ss.sources.Kafka("127.0.0.1:9092", ["t"], format="avro", avro_schema=SCHEMA)
    assert source.schema_mode == "declared" and source.schema.names[0] == "key"


def test_avro_only_arguments_are_refused_without_format_avro():
    # They were silently ignored: a sink meant to write the Schema Registry header wrote JSON.
    with pytest.raises(ss.ConfigurationError, match="avro_framing= applies only to format='avro'"):
        ss.sources.Kafka("127.0.0.1:9092", ["t"], avro_framing="confluent")
    with pytest.raises(ss.ConfigurationError, match="avro_schema_id= applies only to format='avro'"):
        ss.sinks.Kafka("127.0.0.1:9092", "t", avro_schema_id=3)


def test_a_row_fastavro_cannot_write_is_named_with_the_fix():
    # fastavro's own error was all the task said: "'Z' is not in list".
    codec = AvroCodec({"type": "record", "name": "R", "fields": [
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}]})
    with pytest.raises(AvroEncodeError, match=r"row 1 of the batch \(\{'e': 'Z'\}\) does not fit avro_schema.*Fix"):
        codec.encode(pa.RecordBatch.from_pylist([{"e": "A"}, {"e": "Z"}]))
