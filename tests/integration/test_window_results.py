"""Window results carry their window's time (Flink's `window.maxTimestamp()`): after a vectorized
window aggregate, a second window over its results (cascaded windows), a Window Top-N over
them (`window_top_n`, by each result's own window) and a keyed function's `ctx.timestamp()` see
each result at `window_end - 1`, on real Spark."""

from __future__ import annotations

from collections import Counter

import pytest

import streamsnap as ss

pytestmark = pytest.mark.spark

N = 3_000


def event(i: int) -> dict:
    return {"ts": i * 2, "k": i % 7}     # 500 events per second of event time, 6 s in all


class Stamp(ss.KeyedProcessFunction):
    def process_element(self, row, ctx):
        yield {"window_end": row["window_end"], "ts": ctx.timestamp()}


def test_a_window_over_window_results_and_a_timestamp_after_them_use_the_window_end(spark):
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    counts = (env.from_source(ss.sources.Generator(event, count=N), name="events", watermark_strategy=strategy)
              .key_by("k").window(ss.windows.TumblingEventTimeWindows.of(0.5)).count(name="per key"))
    (counts.window_all(ss.windows.TumblingEventTimeWindows.of(1)).aggregate_columns(
        {"n": ("sum", "count"), "keys": "count"}, name="per second").sink_to(ss.sinks.Collect(), name="seconds"))
    counts.key_by("k").process(Stamp(), name="stamp").sink_to(ss.sinks.Collect(), name="stamps")
    sliding = (env.from_source(ss.sources.Generator(event, count=N), name="again", watermark_strategy=strategy)
               .key_by("k").window(ss.windows.SlidingEventTimeWindows.of(1, 0.5)).count(name="sliding"))
    sliding.window_top_n(2, by="count", name="hot keys").sink_to(ss.sinks.Collect(), name="hot")
    result = env.execute("window results")

    per_second = Counter(event(i)["ts"] // 1000 * 1000 for i in range(N))
    assert sorted((r["window_start"], r["n"], r["keys"]) for r in result.rows("seconds")) == \
        [(s, n, 14) for s, n in sorted(per_second.items())]     # two half-second windows of 7 keys each
    stamps = result.rows("stamps")
    assert len(stamps) == 12 * 7 and all(r["ts"] == r["window_end"] - 1 for r in stamps)

    per_window = Counter()          # RANK() <= 2 per sliding window: ties share a rank, all kept
    for i in range(N):
        last = event(i)["ts"] // 500 * 500
        for start in (last, last - 500):
            per_window[start, event(i)["k"]] += 1
    expected = sorted((start, k, n, 1 + sum(m > n for (s2, _), m in per_window.items() if s2 == start))
                      for (start, k), n in per_window.items())
    expected = [e for e in expected if e[3] <= 2]
    assert sorted((r["window_start"], r["k"], r["count"], r["rank"]) for r in result.rows("hot")) == expected
    assert all(r["window_end"] == r["window_start"] + 1000 for r in result.rows("hot"))


def test_ranking_window_results_of_narrow_typed_columns_runs_on_their_schema(spark):
    """The results' build-time schema is what their rows hold (an int32 key comes out int64, a
    boolean's min as 0/1), so top_n and deduplicate after them run a batch at a time."""
    import pyarrow as pa

    schema = pa.schema([("k", pa.int32()), ("flag", pa.bool_()), ("ts", pa.int64())])
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    rows = ss.sources.Generator(lambda i: {"k": i % 3, "flag": i % 5 == 0, "ts": i * 100}, count=300, schema=schema)
    counts = (env.from_source(rows, name="typed", watermark_strategy=strategy).key_by("k")
              .window(ss.windows.TumblingEventTimeWindows.of(1)).aggregate_columns({"n": "count", "any": ("max", "flag")}))
    assert counts.schema.field("k").type == pa.int64() and counts.schema.field("any").type == pa.int64()
    counts.key_by("k").top_n(1, by="n", name="busiest").sink_to(ss.sinks.Collect(), name="busiest")
    counts.key_by("k").deduplicate("last", order_by="window_end", name="latest").sink_to(ss.sinks.Collect(), name="latest")
    result = env.execute("typed window results")

    latest = {r["k"]: (r["window_start"], r["n"], r["any"]) for r in result.rows("latest")}
    assert latest == {0: (29_000, 3, 0), 1: (29_000, 3, 1), 2: (29_000, 4, 1)}
    busiest = {r["k"]: r["n"] for r in result.rows("busiest")}      # the last row per key (rank 1)
    assert busiest == {0: 4, 1: 4, 2: 4}
