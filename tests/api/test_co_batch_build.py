"""`connect(...).process_batches(fn)` refuses bad input when the pipeline is built: a function
of the wrong kind, inputs not keyed, keys that could never be equal."""

from __future__ import annotations

import pyarrow as pa
import pytest

import streamsnap as ss


class Both(ss.KeyedCoBatchFunction):
    def process_batch1(self, batch, keys):
        return batch

    def process_batch2(self, batch, keys):
        return batch


class PerRow(ss.KeyedCoProcessFunction):
    def process_element1(self, row, ctx):
        yield row

    def process_element2(self, row, ctx):
        yield row


class OneInput(ss.KeyedBatchFunction):
    def process_batch(self, batch, keys):
        return batch


def streams():
    env = ss.StreamEnvironment(parallelism=2)
    a = env.from_collection([{"id": 1, "x": "a"}], name="a")
    b = env.from_collection([{"id": 2, "name": "b", "pair": 3}], name="b")
    return env, a, b


def test_a_keyed_pair_builds_a_two_input_node_with_both_keys():
    env, a, b = streams()
    out = a.key_by("id").connect(b.key_by("id")).process_batches(Both(), name="both")
    [node] = out._upstreams
    assert node.operator.describe() == "keyed_co_process_batches"
    assert [k.columns for k in node.operator.keys] == [("id",), ("id",)]
    assert sorted(e.input_index for e in env._graph.edges if e.target == node.id) == [0, 1]


@pytest.mark.parametrize("function, says", [
    (PerRow(), "a per-row function: run a (Keyed)CoProcessFunction with .process(...) instead"),
    (OneInput(), "a one-input KeyedBatchFunction"),
    (object(), "lacks process_batch1, process_batch2"),
])
def test_a_function_of_another_kind_is_refused_naming_the_right_one(function, says):
    _, a, b = streams()
    with pytest.raises(ss.ConfigurationError, match="process_batch1") as raised:
        a.key_by("id").connect(b.key_by("id")).process_batches(function)
    assert says in str(raised.value)


def test_unkeyed_inputs_are_refused_naming_which_and_the_fix():
    _, a, b = streams()
    with pytest.raises(ss.ConfigurationError) as raised:
        a.key_by("id").connect(b).process_batches(Both(), name="j")
    message = str(raised.value)
    assert "the second input 'Source: b' is not keyed" in message and "a.key_by(k1).connect(b.key_by(k2))" in message
    assert "first input" not in message


def test_keys_that_can_never_be_equal_are_refused():
    _, a, b = streams()
    with pytest.raises(ss.ConfigurationError, match=r"key column 'x' of the first input is string but 'id' of "
                                                     r"the second is int64"):
        a.key_by("x").connect(b.key_by("id")).process_batches(Both())
    with pytest.raises(ss.ConfigurationError, match=r"keyed by 1 column\(s\) \['id'\], the second by 2"):
        a.key_by("id").connect(b.key_by(["id", "pair"])).process_batches(Both())


def test_integer_keys_of_different_widths_are_accepted():
    env = ss.StreamEnvironment(parallelism=1)
    a = env.from_arrow(pa.table({"id": pa.array([1], pa.int32())}), name="a")
    b = env.from_arrow(pa.table({"id": pa.array([1], pa.int64())}), name="b")
    a.key_by("id").connect(b.key_by("id")).process_batches(Both())


def test_output_schema_must_be_a_schema():
    _, a, b = streams()
    with pytest.raises(ss.ConfigurationError, match="output_schema must be a pyarrow.Schema"):
        a.key_by("id").connect(b.key_by("id")).process_batches(Both(), output_schema={"id": "int64"})
