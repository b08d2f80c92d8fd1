"""The vectorized keyed path: key factorization, bulk state access, group_cumsum."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.properties import examples

import streamsnap as ss
from streamsnap.graph.keys import KeySelector
from streamsnap.state.backends.hashmap import HashMapKeyedStateBackend
from streamsnap.state.key_groups import assign_to_key_group, key_group_range_for_subtask


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(-1000, 1000)), max_size=60),
       st.lists(st.integers(-50, 50), min_size=5, max_size=5))
def test_group_cumsum_equals_a_python_reference(rows, initial):
    index = np.array([k for k, _ in rows], dtype=np.int64)
    values = np.array([v for _, v in rows], dtype=np.int64)
    running, totals = ss.group_cumsum(values, index, np.array(initial, dtype=np.int64))
    acc = list(initial)
    expected = []
    for k, v in rows:
        acc[k] += v
        expected.append(acc[k])
    assert running.tolist() == expected and totals.tolist() == acc


def test_group_cumsum_rejects_misaligned_input():
    with pytest.raises(ValueError, match="3 values but 2 key positions"):
        ss.group_cumsum([1, 2, 3], [0, 1], [0, 0])
    with pytest.raises(ValueError, match="key positions must lie in 0..1"):
        ss.group_cumsum([1, 2], [0, 2], [0, 0])


@pytest.mark.parametrize("key", ["k", ["k", "j"], lambda r: (r["k"] or 0) * 10 + r["j"]])
def test_batch_keys_factorize_in_first_appearance_order(key):
    batch = pa.RecordBatch.from_pylist([{"k": k, "j": j} for k, j in [(3, 0), (1, 1), (3, 0), (None, 2), (1, 1)]])
    selector = KeySelector.of(key, allow_null=True)   # None is a key here (key_by(..., allow_null_keys=True))
    keys = selector.batch_keys(batch, 32)
    per_row = selector.keys_of_rows(batch.to_pylist())
    assert [keys.unique[i] for i in keys.index] == per_row
    assert len(keys) == len(set(per_row))
    assert keys.key_groups == [assign_to_key_group(k, 32) for k in keys.unique]


COLUMN_KINDS = {"int": (st.integers(-3, 3), pa.int64()), "small": (st.integers(0, 2), pa.int8()),
                "bool": (st.booleans(), pa.bool_()), "str": (st.sampled_from(["", "a", "b", "é"]), pa.string()),
                "bytes": (st.sampled_from([b"", b"x", b"\x00"]), pa.binary()),
                "dict": (st.sampled_from(["p", "q"]), pa.dictionary(pa.int32(), pa.string())),
                "float": (st.sampled_from([0.0, -0.0, 1.5]), pa.float64())}


@settings(max_examples=examples(200), deadline=None)
@given(data=st.data())
def test_batch_keys_of_several_columns_equal_the_per_row_keys_for_every_column_kind(data):
    """Several key columns are factorized by Arrow and numpy (floats per row): the distinct
    keys in order of first appearance, each row's position, and the key groups the rows are
    routed by, all as the per-row tuples give them; nulls are keys where allowed."""
    kinds = data.draw(st.lists(st.sampled_from(sorted(COLUMN_KINDS)), min_size=2, max_size=3))
    allow_null = data.draw(st.booleans())
    names = [f"c{i}" for i in range(len(kinds))]
    count = data.draw(st.integers(1, 40))
    columns = []
    for kind in kinds:
        values, arrow_type = COLUMN_KINDS[kind]
        drawn = [None if allow_null and data.draw(st.integers(0, 5)) == 0 else data.draw(values)
                 for _ in range(count)]
        columns.append(pa.array(drawn, type=arrow_type))
    batch = pa.RecordBatch.from_arrays(columns, names=names)
    selector = KeySelector.of(names, allow_null=allow_null)
    keys = selector.batch_keys(batch, 128)
    per_row = selector.keys_of_rows(batch.to_pylist())
    assert keys.unique == list(dict.fromkeys(per_row))
    assert [keys.unique[i] for i in keys.index] == per_row
    assert keys.key_groups == [assign_to_key_group(k, 128) for k in keys.unique]
    assert keys.key_groups == [int(g) for g in dict(zip(per_row, selector.key_groups(batch, 128))).values()]


def test_a_null_in_a_key_column_fails_naming_it_when_nulls_are_not_keys():
    batch = pa.RecordBatch.from_pylist([{"k": 1, "j": "a"}, {"k": None, "j": "b"}])
    with pytest.raises(ss.NullKeyError, match="'k'"):
        KeySelector.of(["k", "j"]).batch_keys(batch, 32)
    with pytest.raises(KeyError, match="no column 'x'"):
        KeySelector.of(["k", "x"]).batch_keys(batch, 32)


def test_bulk_state_access_respects_running_snapshots(tmp_path):
    backend = HashMapKeyedStateBackend("op", 16, key_group_range_for_subtask(16, 1, 0))
    state = backend.get_state(ss.ValueStateDescriptor("total", default=0))
    keys = ss.BatchKeys([1, 2, "x"], np.array([0, 1, 2]), [assign_to_key_group(k, 16) for k in (1, 2, "x")])
    assert state.get_many(keys) == [0, 0, 0]
    state.put_many(keys, np.array([5, 6, 7]))
    snapshot = backend.snapshot(1, f"file://{tmp_path}")
    state.put_many(keys, [50, None, 70])  # after the snapshot began: must not leak into it
    handle = snapshot.run()
    assert state.get_many(keys) == [50, 0, 70]
    restored = HashMapKeyedStateBackend("op", 16, key_group_range_for_subtask(16, 1, 0))
    restored.restore([handle], f"file://{tmp_path}")
    again = restored.get_state(ss.ValueStateDescriptor("total", default=0))
    assert again.get_many(keys) == [5, 6, 7]
    assert all(type(v) is int for v in again.get_many(keys))  # numpy numbers stored as Python ints
    with pytest.raises(ValueError, match="2 values for 3 keys"):
        state.put_many(keys, [1, 2])


def test_process_batches_needs_a_keyed_batch_function():
    env = ss.StreamEnvironment()
    stream = env.from_collection([{"k": 1}]).key_by("k")
    with pytest.raises(ss.ConfigurationError, match="process_batches takes a KeyedBatchFunction"):
        stream.process_batches(lambda b, k: b)
