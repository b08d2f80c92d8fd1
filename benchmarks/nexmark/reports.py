"""The per-day statistics reports: q15 (bidding, per day), q16 (per channel and day), q17 (per
auction and day). Flink runs them as unwindowed GROUP BYs on the formatted day, emitting
updates; here each is a one-day tumbling event-time window (days aligned to the epoch are UTC
days), whose one firing per group is the GROUP BY's final answer.

q17 needs only counts, sums, minima and maxima: the vectorized window aggregate
(`aggregate_columns`) over rank indicator columns made by `map_batches`. q15 and q16 also count
distinct bidders and auctions, which `aggregate_columns` has no function for: they are a per-row
`.aggregate(AggregateFunction)` keeping sets."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import streamsnap as ss
from benchmarks.nexmark import kinds

DAY_S = 86_400
RANK_LIMITS = (10_000, 1_000_000)   # rank 1: price < 10 000, rank 2: < 1 000 000, rank 3: the rest
COUNTS = ("total_bids", "rank1_bids", "rank2_bids", "rank3_bids",
          "total_bidders", "rank1_bidders", "rank2_bidders", "rank3_bidders",
          "total_auctions", "rank1_auctions", "rank2_auctions", "rank3_auctions")


def _day(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d")


def _rank(price: int) -> int:
    return 1 if price < RANK_LIMITS[0] else 2 if price < RANK_LIMITS[1] else 3


class DailyStatistics(ss.AggregateFunction):
    """Bids per price rank, and the distinct bidders and auctions per rank (sets, index 0 for
    all ranks), plus the latest bid time."""

    def create_accumulator(self):
        return [[0, 0, 0, 0], [set(), set(), set(), set()], [set(), set(), set(), set()], 0]

    def add(self, row, acc):
        counts, bidders, auctions, _ = acc
        rank = _rank(row["price"])
        counts[0] += 1
        counts[rank] += 1
        for r in (0, rank):
            bidders[r].add(row["bidder"])
            auctions[r].add(row["auction"])
        acc[3] = max(acc[3], row["date_time"])
        return acc

    def get_result(self, acc):
        counts, bidders, auctions, latest = acc
        return dict(zip(COUNTS, counts + [len(s) for s in bidders] + [len(s) for s in auctions]), latest=latest)

    def merge(self, a, b):
        return [[x + y for x, y in zip(a[0], b[0])], [x | y for x, y in zip(a[1], b[1])],
                [x | y for x, y in zip(a[2], b[2])], max(a[3], b[3])]


Q15_SCHEMA = pa.schema([("day", pa.string())] + [(c, pa.int64()) for c in COUNTS])
Q16_SCHEMA = pa.schema([("channel", pa.string()), ("day", pa.string()), ("minute", pa.string())]
                       + [(c, pa.int64()) for c in COUNTS])


class DayReport(ss.ProcessWindowFunction):
    """One report row per key and day: the key's column, the day (from the window), and the
    statistics; with `minute`, the latest bid's 'HH:mm'."""

    def __init__(self, key_column: str | None, minute: bool = False):
        self.key_column, self.minute = key_column, minute

    def process(self, key, context, elements):
        stats = dict(elements[0])
        latest = stats.pop("latest")
        row = {self.key_column: key} if self.key_column else {}
        row["day"] = _day(context.window.start)
        if self.minute:
            row["minute"] = datetime.fromtimestamp(latest / 1000, tz=timezone.utc).strftime("%H:%M")
        yield {**row, **stats}


def q15(stream):
    """Bidding statistics report per day (one key: every bid of a day goes to one subtask)."""
    bids = kinds.bid_stream(stream, "q15 bids")
    return (bids.key_by(lambda row: 0).window(ss.windows.TumblingEventTimeWindows.of(DAY_S))
            .aggregate(DailyStatistics(), DayReport(None), name="q15 report", schema=Q15_SCHEMA))


def q16(stream):
    """Channel statistics report per channel and day."""
    bids = kinds.bid_stream(stream, "q16 bids")
    return (bids.key_by("channel").window(ss.windows.TumblingEventTimeWindows.of(DAY_S))
            .aggregate(DailyStatistics(), DayReport("channel", minute=True), name="q16 report",
                       schema=Q16_SCHEMA))


Q17_IN = pa.schema([("auction", pa.int64()), ("price", pa.int64()), ("date_time", pa.int64()),
                    ("rank1", pa.int64()), ("rank2", pa.int64()), ("rank3", pa.int64())])
Q17_WINDOWS = pa.schema([("auction", pa.int64()), ("window_start", pa.int64()), ("window_end", pa.int64()),
                         ("total_bids", pa.int64()), ("rank1_bids", pa.int64()), ("rank2_bids", pa.int64()),
                         ("rank3_bids", pa.int64()), ("min_price", pa.int64()), ("max_price", pa.int64()),
                         ("avg_price", pa.float64()), ("sum_price", pa.int64())])
Q17_SCHEMA = pa.schema([Q17_WINDOWS.field("auction"), ("day", pa.string())] + list(Q17_WINDOWS)[3:])


def _ranked(batch: pa.RecordBatch) -> pa.RecordBatch:
    b = kinds.bids(batch)
    price = b.column("price").to_numpy(zero_copy_only=False)
    low, high = price < RANK_LIMITS[0], price >= RANK_LIMITS[1]
    return pa.RecordBatch.from_arrays(
        [b.column("auction"), b.column("price"), b.column("date_time"), pa.array(low.astype(np.int64)),
         pa.array((~low & ~high).astype(np.int64)), pa.array(high.astype(np.int64))], schema=Q17_IN)


def _daily(batch: pa.RecordBatch) -> pa.RecordBatch:
    day = pc.strftime(pc.cast(batch.column("window_start"), pa.timestamp("ms")), format="%Y-%m-%d")
    return pa.RecordBatch.from_arrays([batch.column("auction"), day]
                                      + [batch.column(f.name) for f in list(Q17_WINDOWS)[3:]], schema=Q17_SCHEMA)


def q17(stream):
    """Auction statistics report per auction and day (vectorized window aggregate)."""
    return (stream.map_batches(_ranked, name="q17 ranked", output_schema=Q17_IN)
            .key_by("auction").window(ss.windows.TumblingEventTimeWindows.of(DAY_S))
            .aggregate_columns({"total_bids": "count", "rank1_bids": ("sum", "rank1"),
                                "rank2_bids": ("sum", "rank2"), "rank3_bids": ("sum", "rank3"),
                                "min_price": ("min", "price"), "max_price": ("max", "price"),
                                "avg_price": ("mean", "price"), "sum_price": ("sum", "price")},
                               name="q17 window", schema=Q17_WINDOWS)
            .map_batches(_daily, name="q17 report", output_schema=Q17_SCHEMA))
