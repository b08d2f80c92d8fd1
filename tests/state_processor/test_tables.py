"""State entries → DataFrame columns, without Spark: shapes per kind, TTL, serializers, types."""

from __future__ import annotations

import pyarrow as pa
import pytest

from streamsnap.errors import ConfigurationError
from streamsnap.state.serialization import PickleSerializer
from streamsnap.state_processor import tables


def test_value_list_and_map_states_have_their_row_shapes():
    assert tables.keyed_rows("s", "value", "msgpack", {1: 10, 2: 20}, None) == \
        {"key": [1, 2], "value": [10, 20]}
    assert tables.keyed_rows("s", "list", "msgpack", {"a": [1, 2]}, None) == \
        {"key": ["a"], "value": [[1, 2]]}
    assert tables.keyed_rows("s", "map", "msgpack", {"a": {"x": 1, "y": 2}}, None) == \
        {"key": ["a", "a"], "map_key": ["x", "y"], "value": [1, 2]}


def test_tuples_become_structs_and_ttl_timestamps_are_dropped():
    rows = tables.keyed_rows("s", "value", "msgpack+ttl", {(1, "a"): [1700000000000, (2, 3.5)]}, None)
    assert rows == {"key": [{"_1": 1, "_2": "a"}], "value": [{"_1": 2, "_2": 3.5}]}
    schema = tables.infer_schema(rows, "here")
    assert schema.field("key").type == pa.struct([("_1", pa.int64()), ("_2", pa.string())])


def test_another_serializer_must_be_named_and_then_decodes():
    wire = {1: PickleSerializer().dumps({"a"})}
    with pytest.raises(ConfigurationError, match="'pickle' serializer; pass serializer="):
        tables.keyed_rows("s", "value", "pickle", wire, None)
    assert tables.keyed_rows("s", "value", "pickle", wire, PickleSerializer())["value"] == [{"a"}]


def test_types_unify_over_tasks_and_a_column_null_everywhere_reads_as_string():
    a = tables.infer_schema({"key": [1], "value": [None]}, "here")
    b = tables.infer_schema({"key": [2], "value": [None]}, "here")
    assert tables.unify([a, b], ("key", "value"), {}, "here") == \
        pa.schema([("key", pa.int64()), ("value", pa.string())])
    c = tables.infer_schema({"key": [3], "value": [2.5]}, "here")
    assert tables.unify([a, c], ("key", "value"), {}, "here").field("value").type == pa.float64()
    with pytest.raises(ConfigurationError, match="'value' column's values have no common type"):
        tables.infer_schema({"key": [1, 2], "value": [1, "x"]}, "state 's'")
