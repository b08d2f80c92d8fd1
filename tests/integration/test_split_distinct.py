"""Split distinct aggregation on real Spark: a window aggregate with distinct counts over a few
hot keys, run as a partial stage per (key, distinct column, bucket) and a final sum per key,
gives exactly the unsplit aggregate's rows (checked against a plain-Python reference), on
tumbling and sliding windows, with filters, nulls and every other aggregate beside it."""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa
import pytest

import streamsnap as ss

pytestmark = pytest.mark.spark

N = 4_000
SCHEMA = pa.schema([("ts", pa.int64()), ("channel", pa.string()), ("bidder", pa.int64()),
                    ("auction", pa.int64()), ("price", pa.int32()), ("cheap", pa.bool_()),
                    ("rank1", pa.int64()), ("name", pa.string()), ("weight", pa.float64())])
AGGREGATES = {"n": "count", "bidders": ("count_distinct", "bidder"),
              "cheap_bidders": ("count_distinct", "bidder", "cheap"),
              "auctions": ("count_distinct", "auction"), "rank1_auctions": ("count_distinct", "auction", "rank1"),
              "total": ("sum", "price"), "first_name": ("min", "name"), "top": ("max", "price"),
              "avg": ("mean", "weight")}


def event(i: int) -> dict:
    price = (i * 37) % 1000
    return {"ts": i * 3, "channel": "a" if i % 10 < 7 else "b" if i % 10 < 9 else "c",
            "bidder": (i * 7919) % 97, "auction": None if i % 11 == 0 else (i * 31) % 53,
            "price": price, "cheap": price < 300, "rank1": int(price >= 700), "name": f"n{(i * 5) % 13:02d}",
            "weight": None if i % 5 == 0 else (i % 17) / 2}


def reference(windows) -> list[tuple]:
    groups = defaultdict(list)
    for i in range(N):
        e = event(i)
        for start in windows(e["ts"]):
            groups[e["channel"], start].append(e)
    out = []
    for (channel, start), rows in groups.items():
        weights = [r["weight"] for r in rows if r["weight"] is not None]
        out.append((channel, start, len(rows), len({r["bidder"] for r in rows}),
                    len({r["bidder"] for r in rows if r["cheap"]}),
                    len({r["auction"] for r in rows if r["auction"] is not None}),
                    len({r["auction"] for r in rows if r["auction"] is not None and r["rank1"]}),
                    sum(r["price"] for r in rows), min(r["name"] for r in rows), max(r["price"] for r in rows),
                    pytest.approx(sum(weights) / len(weights)) if weights else None))
    return sorted(out, key=lambda t: t[:2])


def got(rows) -> list[tuple]:
    return sorted(((r["channel"], r["window_start"], *(r[o] for o in AGGREGATES)) for r in rows),
                  key=lambda t: t[:2])


def test_split_distinct_aggregate_gives_the_unsplit_rows(spark):
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    events = env.from_source(ss.sources.Generator(event, count=N, schema=SCHEMA), name="bids",
                             watermark_strategy=strategy)
    tumbling = (events.key_by("channel").window(ss.windows.TumblingEventTimeWindows.of(2))
                .aggregate_columns(AGGREGATES, split_distinct=8, name="tumbling"))
    unsplit = events.key_by("channel").window(ss.windows.TumblingEventTimeWindows.of(2)).aggregate_columns(AGGREGATES)
    assert tumbling.schema == unsplit.schema
    unsplit.sink_to(ss.sinks.Collect(), name="unsplit")
    tumbling.sink_to(ss.sinks.Collect(), name="tumbling")
    sliding = (events.key_by("channel").window(ss.windows.SlidingEventTimeWindows.of(3, 1))
               .aggregate_columns(AGGREGATES, split_distinct=3, name="sliding"))
    # window results as any other: a Window Top-N after it ranks the split aggregate's rows
    sliding.window_top_n(1, by="bidders", name="most bidders").sink_to(ss.sinks.Collect(), name="top")
    sliding.sink_to(ss.sinks.Collect(), name="sliding")
    result = env.execute("split distinct")

    expected = reference(lambda ts: [ts // 2000 * 2000])
    assert got(result.rows("tumbling")) == expected == got(result.rows("unsplit"))
    assert all(r["window_end"] == r["window_start"] + 2000 for r in result.rows("tumbling"))
    expected = reference(lambda ts: range(ts // 1000 * 1000 - 2000, ts // 1000 * 1000 + 1, 1000))
    assert got(result.rows("sliding")) == expected
    best = defaultdict(int)
    for row in expected:
        best[row[1]] = max(best[row[1]], row[3])
    assert sorted((r["window_start"], r["channel"]) for r in result.rows("top")) == \
        sorted((row[1], row[0]) for row in expected if row[3] == best[row[1]])


def test_a_split_distinct_count_over_the_whole_stream(spark):
    """window_all: the partial counts on both subtasks, only their sums at parallelism 1."""
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    events = env.from_source(ss.sources.Generator(event, count=N, schema=SCHEMA), name="bids",
                             watermark_strategy=strategy)
    counts = events.window_all(ss.windows.TumblingEventTimeWindows.of(2)).aggregate_columns(
        {"bidders": ("count_distinct", "bidder"), "auctions": ("count_distinct", "auction", "rank1"),
         "n": "count", "avg": ("mean", "weight")}, split_distinct=8, name="all", uid="all")
    graph = {n.name: n.parallelism for n in env._graph.nodes.values()}
    assert graph["all [partial]"] == 2 and graph["all [final]"] == 1 and graph["all [result]"] == 1
    counts.sink_to(ss.sinks.Collect(), name="all")
    rows = env.execute("split distinct over the whole stream").rows("all")

    windows = defaultdict(list)
    for i in range(N):
        windows[event(i)["ts"] // 2000 * 2000].append(event(i))
    expected = {}
    for start, es in windows.items():
        weights = [e["weight"] for e in es if e["weight"] is not None]
        expected[start] = (len({e["bidder"] for e in es}),
                           len({e["auction"] for e in es if e["auction"] is not None and e["rank1"]}),
                           len(es), pytest.approx(sum(weights) / len(weights)))
    assert {r["window_start"]: (r["bidders"], r["auctions"], r["n"], r["avg"]) for r in rows} == expected
    assert sorted(rows[0]) == ["auctions", "avg", "bidders", "n", "window_end", "window_start"]
