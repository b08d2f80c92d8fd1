"""`stream.lookup_join(table, ...)` refuses bad input when the pipeline is built, naming the
column, the types or the limit and the fix."""

from __future__ import annotations

import pyarrow as pa
import pytest

import streamsnap as ss

TABLE = pa.table({"id": [1, 2], "name": ["a", "b"], "price": [1.5, 2.5]})


def stream():
    env = ss.StreamEnvironment(parallelism=2)
    return env.from_collection([{"id": 1, "qty": 3, "name": "x"}], name="orders")


def test_a_good_join_declares_its_output_schema():
    out = stream().lookup_join(TABLE, on="id", columns={"name": "product", "price": "price"}, how="left")
    assert out.schema.names == ["id", "qty", "name", "product", "price"]
    assert out._upstreams[0].operator.describe() == "lookup_join(left, 2 rows)"


@pytest.mark.parametrize("kwargs, says", [
    (dict(on="sku"), "the table has no join column 'sku'"),
    (dict(on={"sku": "id"}), "the stream has no join column 'sku'"),
    (dict(on="id", columns=["colour"]), "the table has no column 'colour'"),
    (dict(on="id", how="outer"), "how must be one of ('inner', 'left'), got 'outer'"),
    (dict(on="id", columns=["name"]), "the output would have two columns 'name'"),
    (dict(on="id", max_table_bytes=10), "above max_table_bytes=10"),
    (dict(on=[]), "on= needs at least one join column"),
])
def test_bad_input_is_refused_at_build_time(kwargs, says):
    with pytest.raises(ss.ConfigurationError) as raised:
        stream().lookup_join(TABLE, **kwargs)
    assert says in str(raised.value)


def test_a_key_of_another_type_is_refused_naming_both_types():
    table = pa.table({"id": ["1", "2"], "v": [1, 2]})
    with pytest.raises(ss.ConfigurationError, match="the stream's join column 'id' is int64 but the table's 'id' "
                                                     "is string; such keys never match"):
        stream().lookup_join(table, on="id")


def test_a_too_large_table_names_the_limit_and_the_ways_out():
    with pytest.raises(ss.ConfigurationError) as raised:
        stream().lookup_join(TABLE, on="id", max_table_bytes=TABLE.nbytes - 1)
    message = str(raised.value)
    assert "raise max_table_bytes=" in message and ".process_batches(...)" in message


def test_the_table_must_be_arrow_or_a_dataframe():
    with pytest.raises(ss.ConfigurationError, match="the table must be a pyarrow Table or a batch Spark DataFrame"):
        stream().lookup_join([{"id": 1}], on="id")


def test_a_keyed_stream_is_refused():
    with pytest.raises(ss.ConfigurationError, match="a lookup join needs no key_by"):
        stream().key_by("id").lookup_join(TABLE, on="id")
