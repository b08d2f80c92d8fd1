"""Columnar decoding of flat Avro records (streamsnap/connectors/kafka/avro_columns.py) equals
fastavro's, and refuses (None) anything that is not exactly one record per message."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from streamsnap.connectors.kafka import avro_columns
from streamsnap.connectors.kafka.avro import AvroCodec, AvroDecodeError, AvroEncodeError

FLAT = {"type": "record", "name": "Flat", "fields": [
    {"name": "k", "type": "long"}, {"name": "i", "type": ["null", "int"]}, {"name": "b", "type": "boolean"},
    {"name": "f", "type": "float"}, {"name": "d", "type": ["double", "null"]},
    {"name": "s", "type": ["null", "string"]}, {"name": "y", "type": "bytes"},
    {"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}}]}


def messages(n: int, seed: int = 1) -> tuple[AvroCodec, list[bytes]]:
    rnd = random.Random(seed)
    codec = AvroCodec(FLAT)
    extremes = [-2 ** 63, 2 ** 63 - 1, 0, -1, 63, 64, -65]
    rows = [{"k": rnd.choice(extremes) if rnd.random() < 0.2 else rnd.randint(-2 ** 63, 2 ** 63 - 1),
             "i": None if rnd.random() < 0.3 else rnd.choice([-2 ** 31, 2 ** 31 - 1, rnd.randint(-9, 9)]),
             "b": rnd.random() < 0.5, "f": rnd.random(),
             "d": None if rnd.random() < 0.3 else rnd.uniform(-1e300, 1e300),
             "s": None if rnd.random() < 0.3 else "ü€x"[:rnd.randint(0, 3)] * rnd.randint(0, 50),
             "y": bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 200))),
             "t": rnd.randint(0, 2 ** 41), "day": rnd.randint(-30_000, 30_000)} for _ in range(n)]
    storage = pa.schema([f.with_type(pa.int64()) if f.name == "t" else f.with_type(pa.int32()) if f.name == "day"
                         else f for f in codec.arrow_schema])
    return codec, codec.encode(pa.RecordBatch.from_pylist(rows, schema=storage))


def per_message(codec: AvroCodec, values: list[bytes]) -> pa.RecordBatch:
    flat, codec._flat = codec._flat, None
    try:
        return codec.decode(values)
    finally:
        codec._flat = flat


def direct(codec, values):
    lengths = np.array([len(v) for v in values], dtype=np.int64)
    return avro_columns.decode(codec._flat, b"".join(values), np.cumsum(lengths), codec.arrow_schema)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_columnar_decoding_equals_fastavro_record_by_record(seed):
    codec, values = messages(3000, seed)
    assert codec._flat is not None
    fast = direct(codec, values)
    assert fast is not None and fast.equals(per_message(codec, values))
    assert codec.decode(values).equals(fast)
    assert direct(codec, []).num_rows == 0


def test_nested_or_multi_branch_schemas_have_no_columnar_plan():
    nested = {"type": "record", "name": "N", "fields": [{"name": "tags", "type": {"type": "array", "items": "long"}}]}
    assert avro_columns.flat_plan(nested) is None
    assert avro_columns.flat_plan({"type": "record", "name": "U", "fields": [
        {"name": "u", "type": ["null", "long", "string"]}]}) is None


@pytest.mark.parametrize("damage", ["extra byte", "truncated", "trailing byte on the last", "bad utf-8"])
def test_damaged_messages_are_refused_and_the_fallback_names_them(damage):
    codec, values = messages(50)
    target = len(values) - 1 if damage == "trailing byte on the last" else 7
    if damage == "truncated":
        values[target] = values[target][:-1]
    elif damage == "bad utf-8":
        row = {"k": 1, "i": None, "b": True, "f": 1.0, "d": None, "s": "ab", "y": b"", "t": 0, "day": 0}
        encoded = codec.encode(pa.RecordBatch.from_pylist([row], schema=codec.arrow_schema))[0]
        values[target] = encoded.replace(b"\x04ab", b"\x04\xff\xfe")      # length 2, then not UTF-8
    else:
        values[target] = values[target] + b"\x00"
    assert direct(codec, values) is None
    with pytest.raises(AvroDecodeError) as error:
        codec.decode(values)
    assert error.value.index == target


def test_a_union_branch_outside_the_schema_is_refused():
    codec = AvroCodec({"type": "record", "name": "N", "fields": [{"name": "n", "type": ["null", "long"]}]})
    values = [b"\x02\x04", b"\x00", b"\x06\x04"]                  # branch 1 (long 2), null, branch 3
    assert direct(codec, values[:2]).column("n").to_pylist() == [2, None]
    assert direct(codec, values) is None
    with pytest.raises(AvroDecodeError) as error:
        codec.decode(values)
    assert error.value.index == 2


@pytest.mark.parametrize("length", [2 ** 63 - 1, 2 ** 62])
def test_a_string_length_near_the_int64_limit_is_refused_not_wrapped_around(length):
    # pos + length overflowed int64 and passed the bounds check: a raw ValueError, unnamed message.
    codec = AvroCodec({"type": "record", "name": "S", "fields": [{"name": "s", "type": "string"}]})
    u = length << 1
    varint = bytearray()
    while True:
        varint.append((u & 0x7F) | (0x80 if u > 0x7F else 0))
        u >>= 7
        if not u:
            break
    values = [b"\x06abc", bytes(varint) + b"abc"]
    assert direct(codec, values) is None
    with pytest.raises(AvroDecodeError) as error:
        codec.decode(values)
    assert error.value.index == 1


def fastavro_encode(codec: AvroCodec, batch: pa.RecordBatch) -> list[bytes]:
    flat, codec._flat = codec._flat, None
    try:
        return codec.encode(batch)
    finally:
        codec._flat = flat


@pytest.mark.parametrize("framing", ["none", "confluent"])
def test_columnar_encoding_is_byte_for_byte_fastavros(framing):
    codec, values = messages(2000, seed=4)
    batch = codec.decode(values)
    if framing == "confluent":
        codec = AvroCodec(FLAT, framing="confluent", schema_id=77)
    assert codec.encode(batch) == fastavro_encode(codec, batch)
    sliced = batch.slice(17, 500)                     # arrays with an offset into their buffers
    assert codec.encode(sliced) == fastavro_encode(codec, sliced)
    assert codec.encode(batch.slice(0, 0)) == []
    nulls = pa.RecordBatch.from_pylist([{"k": 1, "i": None, "b": False, "f": 0.5, "d": None, "s": None, "y": b"",
                                         "t": 0, "day": 0}] * 3, schema=codec.arrow_schema)
    assert codec.encode(nulls) == fastavro_encode(codec, nulls)
    if framing == "none":
        assert codec.decode(codec.encode(batch)).equals(batch)


def test_a_null_in_a_field_that_is_not_nullable_is_refused_naming_it():
    codec = AvroCodec(FLAT)
    rows = pa.RecordBatch.from_pylist([{"k": None, "i": 1, "b": True, "f": 1.0, "d": 1.0, "s": "x", "y": b"",
                                        "t": 0, "day": 0}],
                                      schema=pa.schema([f.with_nullable(True) for f in codec.arrow_schema]))
    with pytest.raises(AvroEncodeError, match=r"\['k'\] hold nulls"):
        codec.encode(rows)
