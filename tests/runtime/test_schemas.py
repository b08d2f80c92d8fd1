"""The schema rule (runtime/schemas.py) as pure logic: every mismatch named, nothing dropped or filled."""

from __future__ import annotations

import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.batches import to_record_batch
from streamsnap.runtime.schemas import RowSchema, StreamSchema


def guard(spec=None):
    return RowSchema(spec, "enrich", "Source: events -> enrich (2/2)")


def declared(*fields):
    return StreamSchema(pa.schema(fields), "declared")


def fails(g, batch) -> str:
    with pytest.raises(ss.SchemaError) as info:
        g.to_batch(batch) if isinstance(batch, list) else g.conform(batch)
    text = str(info.value)
    assert "operator 'enrich' (subtask Source: events -> enrich (2/2))" in text and "fix:" in text
    return text


def test_the_first_batch_defines_the_schema_and_a_later_new_field_is_an_error_not_a_drop():
    g = guard()
    assert g.to_batch([{"a": 1, "b": "x"}, {"a": 2, "b": None}]).schema == pa.schema([("a", pa.int64()), ("b", pa.string())])
    text = fails(g, [{"a": 3, "b": "y"}, {"a": 4, "b": "z", "extra": 1.5}])
    assert "row has field 'extra', which the stream's schema lacks" in text
    assert "{'a': 4, 'b': 'z', 'extra': 1.5}" in text and 'schema="widen"' in text
    assert g.schema.names == ["a", "b"]  # the failed batch changed nothing


def test_a_missing_field_is_an_error_unless_declared_nullable():
    text = fails(guard(), [{"a": 1, "b": 2}, {"a": 3}])  # within the first batch too: no None fill
    assert "row lacks field 'b'" in text and "{'a': 3}" in text
    optional = guard(declared(("a", pa.int64()), ("b", pa.int64())))
    assert optional.to_batch([{"a": 1}]).to_pylist() == [{"a": 1, "b": None}]
    required = guard(declared(("a", pa.int64()), pa.field("b", pa.int64(), nullable=False)))
    assert "row lacks field 'b'" in fails(required, [{"a": 1}])
    assert "field 'b' is None, but the schema declares it not nullable" in fails(required, [{"a": 1, "b": None}])


def test_same_number_of_fields_but_a_different_one_is_caught():
    g = guard()
    g.to_batch([{"a": 1, "b": 2}])
    text = fails(g, [{"a": 1, "c": 2}])
    assert "row lacks field 'b' (it has 'c' instead)" in text


@pytest.mark.parametrize("value, kind", [("x", "str"), (2.5, "float"), (True, "bool"), (2**70, "int")])
def test_a_value_that_does_not_fit_is_named_with_its_field_and_row(value, kind):
    g = guard()
    g.to_batch([{"a": 1}])
    text = fails(g, [{"a": 2}, {"a": value}])
    assert f"value {value!r} ({kind}) of field 'a' does not fit its type int64" in text
    assert f"row: {{'a': {value!r}}}" in text and "int(value)" in text


def test_lossless_conversions_are_not_errors():
    g = guard(declared(("f", pa.float64()), ("i", pa.int32()), ("s", pa.large_string())))
    out = g.to_batch([{"f": 1, "i": 3.0, "s": "x"}, {"f": 2.5, "i": 7, "s": None}])
    assert out.schema == g.schema and out.to_pylist() == [{"f": 1.0, "i": 3, "s": "x"}, {"f": 2.5, "i": 7, "s": None}]


def test_a_type_inference_could_not_know_takes_the_first_real_values_type():
    """All-None (null) and only-empty-list (list<null>) fields are not a type decision."""
    g = guard()
    g.to_batch([{"a": 1, "note": None, "ids": []}])
    out = g.to_batch([{"a": 2, "note": "late", "ids": [1, 2]}])
    assert out.schema.field("note").type == pa.string() and out.schema.field("ids").type == pa.list_(pa.int64())
    assert out.to_pylist() == [{"a": 2, "note": "late", "ids": [1, 2]}]
    assert "does not fit its type string" in fails(g, [{"a": 3, "note": 4, "ids": []}])  # now it is decided
    sink_side = guard()
    sink_side.conform(pa.RecordBatch.from_pylist([{"ids": []}]))
    assert sink_side.conform(pa.RecordBatch.from_pylist([{"ids": [5]}])).to_pylist() == [{"ids": [5]}]


def test_a_declared_null_type_is_the_users_decision():
    g = guard(declared(("note", pa.null())))
    assert "the schema declares its type as null" in fails(g, [{"note": "late"}])


def test_widening_adds_fields_widens_int_to_float_and_still_refuses_int_to_string():
    g = guard(StreamSchema(None, "widen"))
    g.to_batch([{"a": 1}])
    out = g.to_batch([{"a": 2.5, "b": "x"}, {"a": 3}])
    assert out.schema == pa.schema([("a", pa.float64()), ("b", pa.string())])
    assert out.to_pylist() == [{"a": 2.5, "b": "x"}, {"a": 3.0, "b": None}]
    text = fails(g, [{"a": "text", "b": "y"}])
    assert "does not fit its type double" in text and 'opt into schema="widen"' not in text


def test_arrow_batches_reaching_a_sink_follow_the_same_rule():
    g = guard()
    g.conform(pa.record_batch({"a": [1, 2], "b": ["x", "y"]}))
    assert "a batch has field 'z'" in fails(g, pa.record_batch({"a": [1], "b": ["x"], "z": ["q"]}))
    assert "value 'q' (a string column) of field 'a'" in fails(g, pa.record_batch({"a": ["q"], "b": ["x"]}))
    assert "a batch lacks field 'b'" in fails(g, pa.record_batch({"a": [1]}))
    widening = guard(StreamSchema(None, "widen"))
    widening.conform(pa.record_batch({"a": [1]}))
    grown = widening.conform(pa.record_batch({"a": [1.5], "z": ["q"]}))
    assert grown.schema == pa.schema([("a", pa.float64()), ("z", pa.string())])
    assert widening.conform(pa.record_batch({"a": [4]})).to_pylist() == [{"a": 4.0, "z": None}]


def test_unchecked_conversion_never_takes_the_first_rows_fields_only():
    # pyarrow's from_pylist names columns after the first row; ours infers over the batch.
    with pytest.raises(ss.SchemaError, match="row lacks field 'b'"):
        to_record_batch([{"a": 1}, {"a": 2, "b": 3}])


def test_from_collection_infers_over_all_rows_and_refuses_differing_ones_at_build_time():
    env = ss.StreamEnvironment(parallelism=1)
    assert env.from_collection([{"a": 1}, {"a": 2.5}]).schema == pa.schema([("a", pa.float64())])
    with pytest.raises(ss.ConfigurationError) as info:
        env.from_collection([{"a": 1}, {"a": 2, "extra": "x"}])
    text = str(info.value)
    assert "operator 'from_collection'" in text and "row lacks field 'extra'" in text and "{'a': 1}" in text
    with pytest.raises(ss.ConfigurationError, match="value 'x' \\(str\\) of field 'a' does not fit its type int64"):
        env.from_collection([{"a": 1}, {"a": "x"}], schema=pa.schema([("a", pa.int64())]))


def test_schema_argument_validation():
    env = ss.StreamEnvironment(parallelism=1)
    stream = env.from_collection([{"k": 1}])
    with pytest.raises(ss.ConfigurationError, match='map: schema must be a pyarrow.Schema \\(declared\\), "widen"'):
        stream.map(lambda r: r, schema="grow")
    with pytest.raises(ss.ConfigurationError, match="pass schema= or output_schema="):
        stream.map(lambda r: r, schema=pa.schema([("k", pa.int64())]), output_schema=pa.schema([("k", pa.int64())]))
    assert stream.map(lambda r: r, schema="widen")._stream_schema.mode == "widen"
    generated = env.from_source(ss.sources.Generator(lambda i: {"k": i}, count=5, schema="widen"))
    assert generated._stream_schema.mode == "widen" and generated.schema.names == ["k"]  # row 0 still sampled
    assert env.from_source(ss.sources.Generator(lambda i: {"k": i}, count=5))._stream_schema.mode == "inferred"
    with pytest.raises(ss.ConfigurationError, match="Generator: schema must be a pyarrow.Schema"):
        ss.sources.Generator(lambda i: {"k": i}, count=5, schema={"k": int})
    assert stream.filter(bool)._stream_schema.mode == "declared"  # a collection's schema is checked up front
    with pytest.raises(ss.ConfigurationError, match="allow_null_keys must be True or False"):
        stream.key_by("k", allow_null_keys="yes")


def test_null_keys_are_rejected_by_rows_and_by_columns_unless_allowed():
    rows = [{"k": 1, "v": 1}, {"k": None, "v": 2}]
    selector = KeySelector.of("k").for_operator("sum")
    for call in (lambda: selector.keys_of_rows(rows), lambda: selector.key_groups(pa.RecordBatch.from_pylist(rows), 8),
                 lambda: selector.batch_keys(pa.RecordBatch.from_pylist(rows), 8)):
        with pytest.raises(ss.NullKeyError) as info:
            call()
        text = str(info.value)
        assert "key_by('k') in front of operator 'sum'" in text and "field 'k' is None" in text
        assert "{'k': None, 'v': 2}" in text and "allow_null_keys=True" in text
    with pytest.raises(ss.NullKeyError, match="field 'j' is None"):
        KeySelector.of(["k", "j"]).keys_of_rows([{"k": 1, "j": None}])
    with pytest.raises(ss.NullKeyError, match="the key function 'pick' returned None"):
        def pick(r):
            return None
        KeySelector.of(pick).keys_of_rows([{"k": 1}])
    assert KeySelector.of("k", allow_null=True).keys_of_rows(rows) == [1, None]
