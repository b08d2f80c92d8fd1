"""`stream.lookup_join(table, ...)` on real Spark: a pyarrow Table joined inner and a Spark
DataFrame (collected when the pipeline is built) joined left, in one job at parallelism 2 —
each output equal to a plain-Python join of the same rows (the other pairings of table kind and
`how` are the same operator: tests/runtime/test_lookup_join.py covers both hows)."""

from __future__ import annotations

import pyarrow as pa
import pytest

import streamsnap as ss

pytestmark = pytest.mark.spark

N = 3_000


def order(i: int) -> dict:
    return {"order": i, "sku": i % 13, "qty": i % 4 + 1}


# skus 0..9, sku 4 twice (two suppliers): an order of sku 4 matches two rows; 10..12 match none
CATALOG = [(s, f"item-{s}", float(s) / 2) for s in range(10)] + [(4, "item-4b", 9.0)]


def expected(how: str) -> list[tuple]:
    out = []
    for o in map(order, range(N)):
        found = [(name, price) for sku, name, price in CATALOG if sku == o["sku"]]
        if not found and how == "left":
            found = [(None, None)]
        out.extend((o["order"], o["sku"], o["qty"], name, price) for name, price in found)
    return sorted(out, key=repr)


def test_enrichment_from_an_arrow_table_inner_and_a_dataframe_left(spark):
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    orders = env.from_source(ss.sources.Generator(order, count=N, batch_size=200), name="orders")
    arrow = pa.table({"sku": [c[0] for c in CATALOG], "item": [c[1] for c in CATALOG],
                      "price": [c[2] for c in CATALOG]})
    frame = spark.createDataFrame(CATALOG, "id long, item string, price double")
    joins = (("arrow", arrow, "sku", "inner"), ("frame", frame, {"sku": "id"}, "left"))
    for kind, table, on, how in joins:
        (orders.lookup_join(table, on=on, columns=["item", "price"], how=how, name=f"{kind} {how}")
            .sink_to(ss.sinks.Collect(), name=f"{kind}-{how}"))
    result = env.execute("lookup joins")
    for kind, _, _, how in joins:
        rows = result.rows(f"{kind}-{how}")
        got = sorted(((r["order"], r["sku"], r["qty"], r["item"], r["price"]) for r in rows), key=repr)
        assert got == expected(how), (kind, how)


def test_a_dataframe_too_large_is_refused_before_the_driver_collects_it(spark, monkeypatch):
    from streamsnap.api.lookup import arrow_bytes

    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    orders = env.from_source(ss.sources.Generator(order, count=N, batch_size=200), name="orders")
    frame = spark.range(50_000).selectExpr("id", "repeat('x', 100) AS item")
    size = arrow_bytes(frame)
    assert 0.8 < size / frame.toArrow().nbytes < 1.25     # what toArrow would bring, summed where the rows lie

    def collected(self):
        raise AssertionError("the DataFrame was collected before its size was checked")

    monkeypatch.setattr(type(frame), "toArrow", collected)
    with pytest.raises(ss.ConfigurationError, match=rf"the table holds {size:,} bytes, above max_table_bytes=1,000,000"):
        orders.lookup_join(frame, on={"sku": "id"}, max_table_bytes=1_000_000)
