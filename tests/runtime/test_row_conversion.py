"""The per-row fast paths give exactly what the general conversions give.

Rows -> Arrow (`RowSchema.to_batch`'s one-pass path), Arrow -> rows (`batches.rows_and_columns`),
rows routed by key (converted before routing when a writer routes by key), and the keys and key
groups a keyed operator reads from the columns it already converted.
"""

from __future__ import annotations

import datetime

import numpy as np
import pyarrow as pa
import pytest

from streamsnap.errors import SchemaError
from streamsnap.graph.keys import KeySelector
from streamsnap.graph.partitioners import KeyGroupPartitioner
from streamsnap.network.frames import decode_batches
from streamsnap.runtime.batches import rows_and_columns, to_rows
from streamsnap.runtime.output import CONVERT_FIRST_MIN_ROWS, RecordWriter
from streamsnap.runtime.schemas import RowSchema, StreamSchema
from streamsnap.state.key_groups import assign_key_groups, subtasks_for_key_groups


# ----------------------------------------------------------------------------- Arrow -> rows
@pytest.mark.parametrize("batch", [
    pa.RecordBatch.from_pylist([{"a": 1, "b": "x", "c": {"z": [1, 2]}, "d": None},
                                {"a": None, "b": None, "c": None, "d": None}]),
    pa.RecordBatch.from_pylist([{"word": "stream"}, {"word": "snap"}]),
    pa.RecordBatch.from_pylist([{"it's \"quoted\"\n": 1.5, "t": datetime.datetime(2020, 1, 2, 3)}]),
    pa.RecordBatch.from_arrays([pa.array([1, 2]), pa.array([3, 4])], names=["a", "a"]),   # duplicates
    pa.RecordBatch.from_pylist([], schema=pa.schema([("a", pa.int64())])),
    pa.RecordBatch.from_arrays([pa.array([[("k", 1)]], type=pa.map_(pa.string(), pa.int64()))], names=["m"]),
])
def test_rows_of_an_arrow_batch_equal_to_pylist(batch):
    rows, columns = rows_and_columns(batch)
    assert rows == batch.to_pylist()
    assert to_rows(batch) == batch.to_pylist()
    if columns is not None:
        assert columns == [c.to_pylist() for c in batch.columns]


def test_rows_are_fresh_dicts_per_call():
    batch = pa.RecordBatch.from_pylist([{"a": 1}])
    first = to_rows(batch)
    first[0]["a"] = 99
    assert to_rows(batch) == [{"a": 1}]


# ----------------------------------------------------------------------------- rows -> Arrow
def _schema(mode="inferred", schema=None) -> RowSchema:
    return RowSchema(StreamSchema(schema, mode), "op", "op (1/1)")


def test_the_fast_path_converts_what_fits_and_keeps_the_declared_schema():
    declared = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("s", pa.string())])
    rows = [{"k": i, "s": str(i)} for i in range(1000)]
    batch = _schema("declared", declared).to_batch(rows)
    assert batch.schema.equals(declared) and batch.to_pylist() == rows


@pytest.mark.parametrize("bad, field", [(2.5, "k"), (True, "k"), ("7", "k"), (2 ** 70, "k")])
def test_one_misfit_among_many_rows_still_fails_naming_field_and_row(bad, field):
    converter = _schema()
    converter.to_batch([{"k": 1, "v": 1.0}])
    rows = [{"k": i, "v": 1.0} for i in range(500)]
    rows[321] = {"k": bad, "v": 1.0}
    with pytest.raises(SchemaError) as info:
        converter.to_batch(rows)
    assert info.value.field == field and info.value.row == rows[321]


def test_a_row_with_another_field_of_the_same_count_is_caught():
    converter = _schema()
    converter.to_batch([{"a": 1, "b": 2}])
    rows = [{"a": i, "b": i} for i in range(100)] + [{"a": 1, "c": 2}]
    with pytest.raises(SchemaError, match="row lacks field 'b'.*'c' instead"):
        converter.to_batch(rows)


def test_a_none_in_a_not_nullable_field_is_caught_and_a_nullable_one_passes():
    declared = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.float64())])
    converter = _schema("declared", declared)
    assert converter.to_batch([{"k": 1, "v": None}] * 100).column("v").null_count == 100
    with pytest.raises(SchemaError, match="'k' is None"):
        converter.to_batch([{"k": 1, "v": 1.0}] * 100 + [{"k": None, "v": 1.0}])


def test_ints_into_a_float_field_and_fields_in_another_order_take_the_general_path():
    declared = pa.schema([("x", pa.float64()), ("y", pa.int64())])
    converter = _schema("declared", declared)
    batch = converter.to_batch([{"y": 1, "x": 2}, {"x": 3.5, "y": 4}])
    assert batch.schema.equals(declared) and batch.to_pylist() == [{"x": 2.0, "y": 1}, {"x": 3.5, "y": 4}]


# ----------------------------------------------------------------------------- routing by key
class _Channel:
    frame_rows = None       # no buffer-debloating ask from the receiver

    def __init__(self):
        self.payloads = []

    def enqueue(self, kind, payload):
        self.payloads.append(payload)

    def is_available(self):
        return True


class _Gate:
    def __init__(self, key):
        self.partitioner = KeyGroupPartitioner(key, 128)
        self.tag = None
        self.source_node = 0


@pytest.mark.parametrize("n", [CONVERT_FIRST_MIN_ROWS - 1, 5000])
@pytest.mark.parametrize("channels", [1, 3])
def test_rows_routed_by_key_reach_the_channel_owning_their_key_group_in_order(n, channels):
    key = KeySelector.of("word")
    outs = [_Channel() for _ in range(channels)]
    writer = RecordWriter(_Gate(key), outs, 0, batch_size=100_000, buffer_timeout=10.0,
                          schema=RowSchema(None, "split", "split (1/1)"))
    rows = [{"word": f"w{i % 37}", "i": i} for i in range(n)]
    writer.process(rows[: n // 2])
    writer.process(rows[n // 2:])
    writer.flush_all()
    groups = assign_key_groups([r["word"] for r in rows], 128)
    owner = subtasks_for_key_groups(groups, 128, channels)
    for c, channel in enumerate(outs):
        got = [r for p in channel.payloads for b in decode_batches(p) for r in b.to_pylist()]
        assert got == [r for r, o in zip(rows, owner.tolist()) if o == c]


# ----------------------------------------------------------------------------- keys from columns
@pytest.mark.parametrize("values", [["a", "b", "a", "é", ""], [b"x", b"y", b"x"], [3, -1, 3, 2 ** 40],
                                    [1.5, 2.0, 1.5]])
def test_keys_and_key_groups_from_converted_columns_equal_the_per_row_ones(values):
    from streamsnap.runtime.operators.keyed import keys_of

    class _Op:
        class ctx:
            max_parallelism = 128
        key = KeySelector.of("k").for_operator("op")

    batch = pa.RecordBatch.from_pylist([{"v": i, "k": v} for i, v in enumerate(values)])
    rows, columns = rows_and_columns(batch)
    fast = keys_of(_Op, batch, rows, columns=columns)
    general = keys_of(_Op, batch, rows)
    assert fast == general
    assert fast[1] == assign_key_groups(np.array(values, dtype=object).tolist(), 128).tolist()


def test_remembered_key_groups_of_string_keys_stay_equal_to_hashing_them(monkeypatch):
    from streamsnap.runtime.operators import keyed

    monkeypatch.setattr(keyed, "KEY_GROUP_CACHE_ENTRIES", 6)
    monkeypatch.setattr(keyed, "KEY_GROUP_CACHE_KEY_LENGTH", 3)

    class _Op:
        class ctx:
            max_parallelism = 128
        key = KeySelector.of("k").for_operator("op")

    batches = [["a", "b", "a"], ["a", "b", "long"], ["c", "a", "d", "e", "f", "g"], ["g", "h", "a"], ["b", "a"]]
    for values in batches:
        batch = pa.RecordBatch.from_pylist([{"k": v} for v in values])
        rows, columns = rows_and_columns(batch)
        keys, groups = keyed.keys_of(_Op, batch, rows, columns=columns)
        assert keys == values
        assert groups == assign_key_groups(values, 128).tolist()
    # Remembered until the cache held its bound (after the third batch), never beyond it; a key
    # longer than the bound on key length is never remembered.
    assert set(_Op._key_group_cache) == {"a", "b", "c", "d", "e", "f", "g"}
