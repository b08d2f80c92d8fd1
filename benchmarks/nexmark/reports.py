"""The per-day statistics reports: q15 (bidding, per day), q16 (per channel and day), q17 (per
auction and day). Flink runs them as unwindowed GROUP BYs on the formatted day, emitting
updates; here each is a one-day tumbling event-time window (days aligned to the epoch are UTC
days), whose one firing per group is the GROUP BY's final answer.

All three run on the vectorized window aggregate (`aggregate_columns`) over rank indicator
columns made by `map_batches`; q15 and q16 count distinct bidders and auctions, in total and
per rank, with `("count_distinct", column, filter column)` — SQL's `COUNT(DISTINCT bidder)
FILTER (WHERE price < 10000)` — in the same one window."""

from __future__ import annotations

from functools import partial

import numpy as np
import pyarrow as pa

import streamsnap as ss
from benchmarks.nexmark import kinds, stateless

DAY_S = 86_400
RANK_LIMITS = (10_000, 1_000_000)   # rank 1: price < 10 000, rank 2: < 1 000 000, rank 3: the rest
COUNTS = ("total_bids", "rank1_bids", "rank2_bids", "rank3_bids",
          "total_bidders", "rank1_bidders", "rank2_bidders", "rank3_bidders",
          "total_auctions", "rank1_auctions", "rank2_auctions", "rank3_auctions")


DAY = ss.windows.TumblingEventTimeWindows.of(DAY_S)
RANKED = pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("channel", pa.string()),
                    ("price", pa.int64()), ("date_time", pa.int64()),
                    ("rank1", pa.int64()), ("rank2", pa.int64()), ("rank3", pa.int64())])


def _ranked(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The bids with a 0/1 indicator column per price rank."""
    b = kinds.bids(batch)
    price = b.column("price").to_numpy(zero_copy_only=False)
    low, high = price < RANK_LIMITS[0], price >= RANK_LIMITS[1]
    return pa.RecordBatch.from_arrays(
        [b.column("auction"), b.column("bidder"), b.column("channel"), b.column("price"), b.column("date_time"),
         pa.array(low.astype(np.int64)), pa.array((~low & ~high).astype(np.int64)),
         pa.array(high.astype(np.int64))], schema=RANKED)


def _report(batch: pa.RecordBatch, group: tuple[str, ...], schema: pa.Schema) -> pa.RecordBatch:
    day = stateless.utc_text(batch.column("window_start"), "%Y-%m-%d", stateless.DAY_MS)
    minute = stateless.utc_text(batch.column("latest"), "%H:%M", stateless.MINUTE_MS)
    named = {"day": day, "minute": minute, **{g: batch.column(g) for g in group},
             **{c: batch.column(c) for c in COUNTS}}
    return pa.RecordBatch.from_arrays([named[f.name] for f in schema], schema=schema)


DAILY = pa.schema(list(RANKED) + [("day", pa.int64())])


def _ranked_daily(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The ranked bids with their UTC day (days since the epoch), the reports' GROUP BY key."""
    ranked = _ranked(batch)
    day = ranked.column("date_time").to_numpy(zero_copy_only=False) // (DAY_S * 1000)
    return pa.RecordBatch.from_arrays(ranked.columns + [pa.array(day)], schema=DAILY)


def daily_statistics(stream, group: tuple[str, ...], name: str, schema: pa.Schema, split_distinct: int | None = None):
    """q15's counts per `group` and day: one day window per (group, day), its bids counted per
    rank and its bidders and auctions counted distinct, in total and per rank (as Flink's
    `COUNT(DISTINCT bidder) FILTER (WHERE price < 10000)`). `split_distinct`: buckets to split
    the distinct counts over (benchmarks/split_distinct.py measures it; the suite runs unsplit,
    which is faster on this machine's two cores)."""
    distinct = {f"total_{of}": ("count_distinct", column) for of, column in (("bidders", "bidder"),
                                                                             ("auctions", "auction"))}
    for r in (1, 2, 3):
        distinct.update({f"rank{r}_bidders": ("count_distinct", "bidder", f"rank{r}"),
                         f"rank{r}_auctions": ("count_distinct", "auction", f"rank{r}")})
    counts = {"total_bids": "count", **{f"rank{r}_bids": ("sum", f"rank{r}") for r in (1, 2, 3)}, **distinct,
              "latest": ("max", "date_time")}
    return (stream.map_batches(_ranked_daily, name=f"{name} ranked", output_schema=DAILY)
            .key_by([*group, "day"]).window(DAY)
            .aggregate_columns(counts, split_distinct=split_distinct, name=f"{name} window")
            .map_batches(partial(_report, group=group, schema=schema), name=f"{name} report",
                         output_schema=schema))


Q15_SCHEMA = pa.schema([("day", pa.string())] + [(c, pa.int64()) for c in COUNTS])
Q16_SCHEMA = pa.schema([("channel", pa.string()), ("day", pa.string()), ("minute", pa.string())]
                       + [(c, pa.int64()) for c in COUNTS])


def q15(stream, split_distinct: int | None = None):
    """Bidding statistics report per day."""
    return daily_statistics(stream, (), "q15", Q15_SCHEMA, split_distinct)


def q16(stream, split_distinct: int | None = None):
    """Channel statistics report per channel and day (`minute`: the latest bid's 'HH:mm')."""
    return daily_statistics(stream, ("channel",), "q16", Q16_SCHEMA, split_distinct)


Q17_WINDOWS = pa.schema([("auction", pa.int64()), ("window_start", pa.int64()), ("window_end", pa.int64()),
                         ("total_bids", pa.int64()), ("rank1_bids", pa.int64()), ("rank2_bids", pa.int64()),
                         ("rank3_bids", pa.int64()), ("min_price", pa.int64()), ("max_price", pa.int64()),
                         ("avg_price", pa.float64()), ("sum_price", pa.int64())])
Q17_SCHEMA = pa.schema([Q17_WINDOWS.field("auction"), ("day", pa.string())] + list(Q17_WINDOWS)[3:])


def _daily(batch: pa.RecordBatch) -> pa.RecordBatch:
    day = stateless.utc_text(batch.column("window_start"), "%Y-%m-%d", stateless.DAY_MS)
    return pa.RecordBatch.from_arrays([batch.column("auction"), day]
                                      + [batch.column(f.name) for f in list(Q17_WINDOWS)[3:]], schema=Q17_SCHEMA)


def q17(stream):
    """Auction statistics report per auction and day (vectorized window aggregate)."""
    return (stream.map_batches(_ranked, name="q17 ranked", output_schema=RANKED)
            .key_by("auction").window(ss.windows.TumblingEventTimeWindows.of(DAY_S))
            .aggregate_columns({"total_bids": "count", "rank1_bids": ("sum", "rank1"),
                                "rank2_bids": ("sum", "rank2"), "rank3_bids": ("sum", "rank3"),
                                "min_price": ("min", "price"), "max_price": ("max", "price"),
                                "avg_price": ("mean", "price"), "sum_price": ("sum", "price")},
                               name="q17 window", schema=Q17_WINDOWS)
            .map_batches(_daily, name="q17 report", output_schema=Q17_SCHEMA))
