"""The lookup join's per-batch logic (runtime/operators/lookup_join.py LookupTable), without a
job: unique and repeated table keys, inner and left, composite keys, nulls, integer widths."""

from __future__ import annotations

import pyarrow as pa
import pytest

from streamsnap.runtime.operators.lookup_join import LookupTable


def rows(batch: pa.RecordBatch) -> list[tuple]:
    return [tuple(r.values()) for r in batch.to_pylist()]


def test_a_unique_table_adds_its_columns_in_stream_order_and_inner_drops_rows_without_match():
    table = pa.table({"id": [3, 1, 2], "name": ["c", "a", "b"], "size": [30, 10, 20]})
    index = LookupTable(table, (("k", "id"),), {"name": "name"})
    batch = pa.record_batch({"k": [2, 9, 1, 2], "x": [0, 1, 2, 3]})
    assert index.unique
    assert rows(index.join(batch, "inner")) == [(2, 0, "b"), (1, 2, "a"), (2, 3, "b")]
    left = index.join(batch, "left")
    assert rows(left) == [(2, 0, "b"), (9, 1, None), (1, 2, "a"), (2, 3, "b")]
    assert left.schema.names == ["k", "x", "name"]


def test_a_repeated_table_key_gives_one_row_per_match_in_table_order_as_in_sql():
    table = pa.table({"id": [1, 2, 1, 3], "tag": ["a1", "b", "a2", "c"]})
    index = LookupTable(table, (("k", "id"),), {"tag": "tag"})
    batch = pa.record_batch({"k": [1, 4, 3], "x": [0, 1, 2]})
    assert not index.unique
    assert rows(index.join(batch, "inner")) == [(1, 0, "a1"), (1, 0, "a2"), (3, 2, "c")]
    assert rows(index.join(batch, "left")) == [(1, 0, "a1"), (1, 0, "a2"), (4, 1, None), (3, 2, "c")]


def test_null_keys_match_nothing_on_either_side():
    table = pa.table({"id": [None, 1], "v": ["null", "one"]})
    index = LookupTable(table, (("k", "id"),), {"v": "v"})
    batch = pa.record_batch({"k": pa.array([None, 1], pa.int64())})
    assert rows(index.join(batch, "left")) == [(None, None), (1, "one")]
    assert rows(index.join(batch, "inner")) == [(1, "one")]


def test_composite_keys_renamed_columns_and_integer_widths():
    table = pa.table({"a": pa.array([1, 1, 2], pa.int32()), "b": ["x", "y", "x"], "v": [10, 11, 20]})
    index = LookupTable(table, (("left_a", "a"), ("b", "b")), {"v": "value"})
    batch = pa.record_batch({"left_a": pa.array([1, 2, 2, 1], pa.int64()), "b": ["y", "x", "y", None]})
    assert rows(index.join(batch, "left")) == [(1, "y", 11), (2, "x", 20), (2, "y", None), (1, None, None)]


def test_an_empty_batch_and_an_empty_table():
    table = pa.table({"id": pa.array([], pa.int64()), "v": pa.array([], pa.string())})
    index = LookupTable(table, (("k", "id"),), {"v": "v"})
    batch = pa.record_batch({"k": [1, 2]})
    assert rows(index.join(batch, "inner")) == []
    assert rows(index.join(batch, "left")) == [(1, None), (2, None)]
    assert index.join(batch.slice(0, 0), "left").num_rows == 0


def test_a_stream_key_of_another_type_fails_naming_arrow_s_reason():
    index = LookupTable(pa.table({"id": [1], "v": ["a"]}), (("k", "id"),), {"v": "v"})
    with pytest.raises(pa.ArrowInvalid):
        index.join(pa.record_batch({"k": ["one"]}), "inner")
