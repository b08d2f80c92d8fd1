"""Enriching a stream from a Spark DataFrame, and the result back into Spark.

An online shop's order lines carry only a SKU. The product catalog lives in Spark: here two
small DataFrames (products and categories) joined and filtered with Spark SQL — in production a
table of the lakehouse. The job:

1. reads the catalog with `env.from_dataframe(df)` (a bounded, replayable source: Spark writes
   it once as Parquet into the job's checkpoint storage) and the order lines from a stream;
2. connects both, keyed by SKU, in a `KeyedCoProcessFunction`: a catalog row is kept in keyed
   state, an order line is enriched with it — or waits in keyed list state if its product has
   not arrived yet;
3. decides what to do with order lines whose SKU is not in the catalog with an event-time timer:
   the catalog source has no watermarks, so event time cannot pass an order line before the
   whole catalog has been read. When the timer fires and the product is still unknown, the
   line goes to a side output;
4. hands the enriched rows back to Spark (`result.to_dataframe(spark)`) for revenue per category.

Run it:

    python examples/dataframe_enrichment.py
"""

from __future__ import annotations

import tempfile

import streamsnap as ss

START = 1_795_000_000_000
UNKNOWN_SKU = ss.OutputTag("unknown-sku")
SKUS = [f"sku-{n:02d}" for n in range(24)]


def catalog(spark):
    """Active products with their category name: a small Spark SQL job."""
    products = spark.createDataFrame(
        [(sku, f"product {n}", 199 + n * 250, n % 4, n % 7 != 6) for n, sku in enumerate(SKUS[:20])],
        "sku string, title string, price_cents long, category_id int, active boolean")
    categories = spark.createDataFrame([(0, "kitchen"), (1, "garden"), (2, "toys"), (3, "books")],
                                       "category_id int, category string")
    return (products.where("active").join(categories, "category_id")
            .select("sku", "title", "price_cents", "category"))


def order_line(i: int) -> dict:
    """Order line i: 1-3 units of one of 24 SKUs; sku-20..23 and inactive ones are not in the catalog."""
    return {"order": f"o{i // 3:04d}", "sku": SKUS[(i * 11) % 24], "units": 1 + i % 3, "ts": START + i * 1_000}


class Enrich(ss.KeyedCoProcessFunction):
    """Keyed by SKU: input 1 is the catalog, input 2 the order lines."""

    def open(self, ctx):
        self.product = ctx.get_state(ss.ValueStateDescriptor("product"))
        self.waiting = ctx.get_state(ss.ListStateDescriptor("waiting"))

    def enrich(self, line, product):
        return {"order": line["order"], "sku": line["sku"], "title": product["title"],
                "category": product["category"], "units": line["units"],
                "revenue_cents": line["units"] * product["price_cents"]}

    def process_element1(self, product, ctx):          # a catalog row
        self.product.update(product)
        for line in self.waiting.get():
            yield self.enrich(line, product)
        self.waiting.clear()

    def process_element2(self, line, ctx):             # an order line
        product = self.product.value()
        if product is not None:
            yield self.enrich(line, product)
        else:
            self.waiting.add(line)
            ctx.timer_service().register_event_time_timer(ctx.timestamp())

    def on_timer(self, timestamp, ctx):
        # Event time passed the line: the whole catalog has been read, so still waiting means unknown.
        for line in self.waiting.get():
            ctx.output(UNKNOWN_SKU, line)
        self.waiting.clear()


def main(spark=None, lines: int = 600) -> dict:
    """Enriches `lines` order lines; returns revenue per category (from Spark) and unknown lines."""
    if spark is None:                   # your own session: its Python workers run this interpreter
        import sys
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master("local[4]").appName("enrichment")
                 .config("spark.pyspark.python", sys.executable).getOrCreate())

    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=ss.CheckpointConfig(
        interval=1.0, directory=tempfile.mkdtemp(prefix="enrichment-")))
    products = env.from_dataframe(catalog(spark), name="catalog", uid="catalog")
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    orders = env.from_source(ss.sources.Generator(order_line, count=lines), name="order lines",
                             uid="order-lines", watermark_strategy=strategy)
    enriched = (products.key_by("sku").connect(orders.key_by("sku"))
                .process(Enrich(), name="enrich", uid="enrich"))
    enriched.sink_to(ss.sinks.Collect(), name="enriched")
    enriched.get_side_output(UNKNOWN_SKU).sink_to(ss.sinks.Collect(), name="unknown")
    result = env.execute("enrich orders")

    by_category = (result.to_dataframe(spark, "enriched")
                   .groupBy("category").sum("revenue_cents").withColumnRenamed("sum(revenue_cents)", "revenue_cents")
                   .orderBy("category").collect())
    revenue = {r["category"]: r["revenue_cents"] for r in by_category}
    unknown = sorted({r["sku"] for r in result.rows("unknown")})
    print("revenue per category (Spark, from the enriched stream):")
    for category, cents in revenue.items():
        print(f"  {category:<8} {cents / 100:>10,.2f}")
    print(f"{len(result.rows('unknown'))} order lines with SKUs not in the catalog: {', '.join(unknown)}")
    return {"revenue": revenue, "enriched": len(result.rows("enriched")),
            "unknown_lines": len(result.rows("unknown")), "unknown_skus": unknown}


if __name__ == "__main__":
    main()
