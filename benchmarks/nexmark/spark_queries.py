"""Nexmark on Spark Structured Streaming: the queries of `reference.py` that Spark SS can express
as defined, written as a Spark user would (DataFrame API, append mode, event-time watermarks),
over the flat event stream as Parquet files (`bench.write_events_parquet`), one file per batch.

Event time is `ts = timestamp_millis(date_time)`, watermarked on the flat stream with the
config's out-of-orderness (streamsnap's bound; Spark drops a row only once its window ends at or
before the watermark, so the same delay accepts the same late rows). Spark's windows start at
multiples of the slide from the epoch, as the reference's.

End of input: a bounded Flink or streamsnap source ends with the maximum watermark, which fires
every window. Spark has none (its watermark stays at the largest event time - delay when the
files run out), so in append mode the last windows would never be emitted. The input therefore
ends with one END row (`end_marker()`: event_type END, date_time far beyond every event): it
moves the watermark past everything, and the no-data batch Spark then runs emits every
remaining window. Spark's optimizer pushes filters that do not read the event-time column below
the watermark, so each query's kind filter lets the END row through and a filter on `ts` above
the watermark drops it.

Not expressible, so not here: q4 (average closing price per category) joins auctions with their
bids, takes each auction's maximum bid once it has closed, and averages those per category,
unwindowed. A Spark SS query has one output mode. The closing price is final only in append mode
(an aggregation keyed by the watermarked closing time, emitted once the watermark passes it);
but append mode refuses the per-category average, an aggregation keyed by no event time, which
is never final. In update mode the average would see each auction's maximum as a stream of
updates, and Spark's aggregations cannot retract the superseded ones (the average would count
every intermediate maximum); Spark 4 also refuses that query as a possible correctness issue
(rows older than the global watermark fed to a stateful operator). Complete mode refuses the
join. transformWithStateInPandas could hold q4 as hand-written keyed state and timers (a
DataStream program in Python, like streamsnap's own q4), which is not the Spark SS query this
compares.
"""

from __future__ import annotations

from streamsnap.connectors import nexmark

END = -1                          # event_type of the end-of-input marker row
END_MS = 253_402_300_799_000      # its date_time: 9999-12-31T23:59:59Z, past every window
DOLLAR_TO_EURO = 0.908
WINDOW = "10 seconds"             # q5 window size, q7/q8 tumbling size
SLIDE = "2 seconds"               # q5 slide
LOCAL_STATES = ("OR", "ID", "CA")

# How many times a query scans the input (Spark's progress counts the rows of every scan): q3's
# join reads the flat stream once per side.
SCANS = {"q3": 2}

SPARK_QUERIES = ("q0", "q1", "q2", "q3", "q5", "q7", "q8")


def end_marker():
    """The end-of-input row, a one-row Arrow table of nexmark.SCHEMA (see the module doc)."""
    import pyarrow as pa

    columns = {name: [None] for name in nexmark.SCHEMA.names}
    columns.update(event_type=[END], date_time=[END_MS])
    return pa.Table.from_pydict(columns, schema=nexmark.SCHEMA)


def spark_schema():
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(nexmark.SCHEMA)


def queries(spark, input_dir: str, config: nexmark.NexmarkConfig) -> dict:
    """{name: function making the query's streaming DataFrame} over the Parquet files in
    `input_dir`; columns as `queries.OUTPUT_FIELDS`, times in epoch ms."""
    from pyspark.sql import functions as F

    delay = f"{config.out_of_orderness_ms()} milliseconds"

    def read(watermarked: bool = True):
        events = spark.readStream.schema(spark_schema()).option("maxFilesPerTrigger", 1).parquet(input_dir)
        if not watermarked:
            return events
        return events.withColumn("ts", F.timestamp_millis("date_time")).withWatermark("ts", delay)

    def kinds(df, *kinds: int):
        """The events of `kinds`; the END row reaches the watermark and is dropped after it."""
        return (df.where(F.col("event_type").isin(*kinds, END))
                .where(F.col("ts") < F.timestamp_millis(F.lit(END_MS))))

    def of_kind(df, kind: int, prefix: str, *names: str):
        return kinds(df, kind).select("ts", "date_time", *(F.col(prefix + n).alias(n) for n in names))

    def bids():
        return of_kind(read(), nexmark.BID, "bid_", "auction", "bidder", "price", "extra")

    def plain_bids():
        """Bids without event time, for the stateless q0-q2."""
        return read(watermarked=False).where(F.col("event_type") == nexmark.BID).select(
            *(F.col("bid_" + n).alias(n) for n in ("auction", "bidder", "price")), "date_time",
            F.col("bid_extra").alias("extra"))

    def q3():
        """Stream-stream inner join, unwindowed like the reference's (both sides kept in state:
        an auction may come before its seller)."""
        events = read()
        persons = (of_kind(events, nexmark.PERSON, "person_", "id", "name", "city", "state")
                   .where(F.col("state").isin(*LOCAL_STATES)).select("id", "name", "city", "state"))
        auctions = (of_kind(events, nexmark.AUCTION, "auction_", "id", "seller", "category")
                    .where(F.col("category") == 10).select(F.col("id").alias("auction"), "seller"))
        return (persons.join(auctions, persons["id"] == auctions["seller"])
                .select("name", "city", "state", F.col("auction").alias("id")))

    def q5():
        """Sliding-window count per auction, then a second aggregation on the window column
        that keeps every auction with the window's maximum count (ties)."""
        counts = bids().groupBy(F.window("ts", WINDOW, SLIDE), "auction").count()
        per_window = counts.groupBy("window").agg(F.collect_list(F.struct("auction", "count")).alias("c"))
        top = per_window.select("window", F.explode(F.filter(
            "c", lambda x: x["count"] == F.array_max(F.col("c")["count"]))).alias("t"))
        return top.select(F.unix_millis("window.start").alias("window_start"),
                          F.unix_millis("window.end").alias("window_end"),
                          "t.auction", "t.count")

    def q7():
        """Tumbling-window maximum price, with the window's bids collected in the same
        aggregation and filtered to that price (ties)."""
        per_window = bids().groupBy(F.window("ts", WINDOW)).agg(
            F.max("price").alias("top"),
            F.collect_list(F.struct("auction", "bidder", "price", "date_time")).alias("bids"))
        top = per_window.select("window", F.explode(F.filter(
            "bids", lambda b: b["price"] == F.col("top"))).alias("b"))
        return top.select(F.unix_millis("window.start").alias("window_start"),
                          F.unix_millis("window.end").alias("window_end"),
                          "b.auction", "b.bidder", "b.price", "b.date_time")

    def q8():
        """One tumbling-window aggregation over persons and auctions keyed by person id (a
        person's id, an auction's seller): the window's person names if it also has an auction."""
        events = kinds(read(), nexmark.PERSON, nexmark.AUCTION)
        is_person = F.col("event_type") == nexmark.PERSON
        keyed = events.select("ts",
                              F.when(is_person, F.col("person_id")).otherwise(F.col("auction_seller")).alias("id"),
                              F.when(is_person, F.col("person_name")).alias("name"),
                              (~is_person).alias("is_auction"))
        per_window = keyed.groupBy(F.window("ts", WINDOW), "id").agg(
            F.collect_set("name").alias("names"), F.bool_or("is_auction").alias("sold"))
        return per_window.where("sold").select("id", F.explode("names").alias("name"),
                                               F.unix_millis("window.start").alias("window_start"))

    def q0():
        """q0-q2: stateless projections and selections of the bids, as before (no watermark)."""
        return plain_bids()

    def q1():
        return plain_bids().select("auction", "bidder", (F.col("price") * DOLLAR_TO_EURO).alias("price"),
                                   "date_time", "extra")

    def q2():
        return plain_bids().where(F.col("auction") % 123 == 0).select("auction", "price")

    return {"q0": q0, "q1": q1, "q2": q2, "q3": q3, "q5": q5, "q7": q7, "q8": q8}
