"""deduplicate and top_n on a keyed stream: build-time checks, without Spark."""

import pyarrow as pa
import pytest

import streamsnap as ss

SCHEMA = pa.schema([("auction", pa.int64()), ("price", pa.int64()), ("ts", pa.int64())])


def keyed():
    env = ss.StreamEnvironment(parallelism=1)
    return env.from_source(ss.sources.Generator(lambda i: {"auction": i % 3, "price": i, "ts": i}, count=10,
                                                schema=SCHEMA), name="bids").key_by("auction")


def test_top_n_declares_its_output_schema_with_the_rank_column():
    assert keyed().top_n(3, by="price").schema == SCHEMA.append(pa.field("rank", pa.int64()))
    assert keyed().deduplicate("last", order_by="ts").schema == SCHEMA


@pytest.mark.parametrize("call, needle", [
    (lambda k: k.top_n(0, by="price"), "top_n: n is how many rows to keep per key, an int >= 1; got 0"),
    (lambda k: k.top_n(-1, by="price"), "got -1"),
    (lambda k: k.top_n(3, by="cost"), "by names the column 'cost'.*its columns: auction, price, ts"),
    (lambda k: k.top_n(3, by=["price", "ts"], descending=[True]), "one True/False per column"),
    (lambda k: k.top_n(3, by="price", rank_column="price"), "already has a column 'price'.*rank_column="),
    (lambda k: k.deduplicate("newest"), "keep must be 'first' or 'last'.*got 'newest'"),
    (lambda k: k.deduplicate("last", order_by="time"), "order_by names the column 'time'"),
    (lambda k: k.deduplicate("first", ttl="1h"), "deduplicate: ttl must be seconds"),
])
def test_bad_arguments_fail_when_the_job_is_built_naming_the_fix(call, needle):
    with pytest.raises(ss.ConfigurationError, match=needle):
        call(keyed())


def test_top_n_runs_a_batch_at_a_time_when_the_schema_is_known_else_per_row():
    from streamsnap.runtime.operators.top_n import TopN, TopNBatches

    batched = keyed().top_n(3, by="price")._upstreams[0].operator
    assert batched.vectorized and isinstance(batched.function, TopNBatches)
    env = ss.StreamEnvironment(parallelism=1)
    untyped = env.from_source(ss.sources.Generator(lambda i: {"auction": i % 3, "price": i}, count=10)) \
        .map(lambda row: row)     # a map's rows have no schema known at build time
    per_row = untyped.key_by("auction").top_n(3, by="price")._upstreams[0].operator
    assert not per_row.vectorized and type(per_row.function) is TopN


def test_deduplicate_runs_a_batch_at_a_time_when_the_schema_is_known_else_per_row():
    from streamsnap.runtime.operators.deduplicate import Deduplicate, DeduplicateBatches

    batched = keyed().deduplicate("first", order_by="ts")._upstreams[0].operator
    assert batched.vectorized and isinstance(batched.function, DeduplicateBatches)
    env = ss.StreamEnvironment(parallelism=1)
    untyped = env.from_source(ss.sources.Generator(lambda i: {"auction": i % 3, "ts": i}, count=10)).map(lambda r: r)
    per_row = untyped.key_by("auction").deduplicate("first")._upstreams[0].operator
    assert not per_row.vectorized and type(per_row.function) is Deduplicate
