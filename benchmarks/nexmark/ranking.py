"""Nexmark's ranking queries: q18 (each bidder's last bid per auction: deduplication keeping
the latest) and q19 (each auction's 10 highest bids: top-N). Flink's planner turns their
ROW_NUMBER() OVER ... queries into its Deduplicate and Rank operators; the DataStream API has
neither, so q18 is the rolling `max_by` a user would reach for, and q19 a KeyedProcessFunction
keeping the top 10 in keyed state. Both emit updates: the last row per key is the answer."""

from __future__ import annotations

import bisect

import pyarrow as pa

import streamsnap as ss
from benchmarks.nexmark import kinds


def q18(stream):
    """Find last bid: per (bidder, auction), the latest bid so far (rolling max_by date_time)."""
    return kinds.bid_stream(stream, "q18 bids").key_by(["bidder", "auction"]).max_by("date_time", name="q18 last")


Q19_SCHEMA = pa.schema([("auction", pa.int64()), ("rank", pa.int64()), ("bidder", pa.int64()),
                        ("price", pa.int64()), ("date_time", pa.int64())])


class TopBids(ss.KeyedProcessFunction):
    """Per auction, the `n` best bids (highest price, then earliest, then lowest bidder, extra).
    A bid that enters emits the rows whose rank it changed: its own and every one below it."""

    def __init__(self, n: int = 10):
        self.n = n

    def open(self, ctx):
        self.top = ctx.get_state(ss.ValueStateDescriptor("top", default=None))

    def process_element(self, bid, ctx):
        top = self.top.value() or []
        entry = (-bid["price"], bid["date_time"], bid["bidder"], bid["extra"])
        at = bisect.bisect(top, entry)
        if at >= self.n:
            return None
        top.insert(at, entry)
        del top[self.n:]
        self.top.update(top)
        return [{"auction": bid["auction"], "rank": rank + 1, "bidder": e[2], "price": -e[0], "date_time": e[1]}
                for rank, e in enumerate(top[at:], start=at)]


def q19(stream):
    """Auction top-10 price: per auction its 10 highest bids, ranked (an updating result)."""
    return kinds.bid_stream(stream, "q19 bids").key_by("auction").process(TopBids(), name="q19 top 10",
                                                                           output_schema=Q19_SCHEMA)

