"""Queries on closed auctions — q9 (winning bids) and q6 (average selling price per seller over
its last 10 closed auctions, the query Flink's SQL cannot run) — written as the joins page
teaches: auctions keyed by id connected to bids keyed by auction, one KeyedCoProcessFunction
holding the auction and its best bid in keyed state, an event-time timer at `expires` closing it.
"""

from __future__ import annotations

import pyarrow as pa

import streamsnap as ss
from benchmarks.nexmark import kinds
from streamsnap.connectors import nexmark

AUCTION_FIELDS = tuple(nexmark.AUCTION_SCHEMA.names)
WINNING_BID_SCHEMA = pa.schema(list(nexmark.AUCTION_SCHEMA) + [
    ("bidder", pa.int64()), ("price", pa.int64()), ("bid_date_time", pa.int64()), ("bid_extra", pa.string())])
CLOSED = "closed"          # the auction state after its close: later bids are dropped, not kept


def _rank(bid: dict) -> tuple:
    """Smallest wins: the highest price, then the earliest bid, then the lowest bidder, extra."""
    return -bid["price"], bid["date_time"], bid["bidder"], bid["extra"]


def _in_range(auction: dict, bid: dict) -> bool:
    return auction["date_time"] <= bid["date_time"] <= auction["expires"]


class WinningBid(ss.KeyedCoProcessFunction):
    """Per auction id: input 1 the auction, input 2 its bids. Keeps the best bid in range; bids
    that come before their auction wait in a list. At `expires` (event time) it emits the auction
    with its winning bid, if any, and keeps only a closed marker."""

    def open(self, ctx):
        self.auction = ctx.get_state(ss.ValueStateDescriptor("auction"))
        self.best = ctx.get_state(ss.ValueStateDescriptor("best"))
        self.early = ctx.get_state(ss.ListStateDescriptor("early"))

    def process_element1(self, auction, ctx):
        self.auction.update(auction)
        ctx.timer_service().register_event_time_timer(auction["expires"])
        waiting = [b for b in self.early.get() if _in_range(auction, b)]
        self.early.clear()
        if waiting:
            self.best.update(min(waiting, key=_rank))

    def process_element2(self, bid, ctx):
        auction = self.auction.value()
        if auction is None:
            self.early.add(bid)
        elif auction != CLOSED and _in_range(auction, bid):
            best = self.best.value()
            if best is None or _rank(bid) < _rank(best):
                self.best.update(bid)

    def on_timer(self, timestamp, ctx):
        auction, best = self.auction.value(), self.best.value()
        self.auction.update(CLOSED)
        self.best.clear()
        if best is not None:
            yield {**auction, "bidder": best["bidder"], "price": best["price"],
                   "bid_date_time": best["date_time"], "bid_extra": best["extra"]}


def q9(stream):
    """Winning bids: each auction with its highest bid in [date_time, expires], at its close."""
    auctions = kinds.auction_stream(stream, "q9 auctions").key_by("id")
    bids = kinds.bid_stream(stream, "q9 bids").key_by("auction")
    return auctions.connect(bids).process(WinningBid(), name="q9 winning bids", schema=WINNING_BID_SCHEMA)


Q6_SCHEMA = pa.schema([("seller", pa.int64()), ("average", pa.float64()), ("auctions", pa.int64())])


class LastClosedAverage(ss.KeyedProcessFunction):
    """Per seller: the final prices of its last `n` closed auctions (by expires, then id), and
    an updated average at each close; `auctions` counts the closes so far (the last row per
    seller has the most)."""

    def __init__(self, n: int = 10):
        self.n = n

    def open(self, ctx):
        self.last = ctx.get_state(ss.ValueStateDescriptor("last", default=None))
        self.closed = ctx.get_state(ss.ValueStateDescriptor("closed", default=0))

    def process_element(self, row, ctx):
        last = sorted((self.last.value() or []) + [(row["expires"], row["id"], row["price"])])[-self.n:]
        closed = self.closed.value() + 1
        self.last.update(last)
        self.closed.update(closed)
        prices = [p for _, _, p in last]
        return {"seller": row["seller"], "average": sum(prices) / len(prices), "auctions": closed}


def q6(stream):
    """Average selling price by seller over its last 10 closed auctions (an updating result)."""
    return q9(stream).key_by("seller").process(LastClosedAverage(), name="q6 seller average",
                                               output_schema=Q6_SCHEMA)
