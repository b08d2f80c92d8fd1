"""Queries on closed auctions — q9 (winning bids) and q6 (average selling price per seller over
its last 10 closed auctions, the query Flink's SQL cannot run).

q9 is written as the joins page teaches: auctions keyed by id connected to bids keyed by auction,
one KeyedCoBatchFunction (vectorized: a batch of either input per call) holding the auction and
its best bid in keyed state, an event-time timer at `expires` closing it. q6 needs only each
auction's final price, not the winning bid's row: q4's closing stage (queries.ClosingPrices, one
keyed stream of both kinds, fixed-width records in state) with the seller in place of the
category, then a KeyedBatchFunction per seller.
"""

from __future__ import annotations

import bisect
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import streamsnap as ss
from benchmarks.nexmark import kinds, queries
from benchmarks.nexmark.joins import last_rows, some
from streamsnap.connectors import nexmark

AUCTION_FIELDS = tuple(nexmark.AUCTION_SCHEMA.names)
WINNING_BID_SCHEMA = pa.schema(list(nexmark.AUCTION_SCHEMA) + [
    ("bidder", pa.int64()), ("price", pa.int64()), ("bid_date_time", pa.int64()), ("bid_extra", pa.string())])
CLOSED = "closed"          # the auction state after its close: later bids are dropped, not kept
BID_RANKED = ("price", "date_time", "bidder", "extra")   # a bid as kept in state: these, as a tuple
NEVER = np.iinfo(np.int64).max


def _rank(bid: tuple) -> tuple:
    """Smallest wins: the highest price, then the earliest bid, then the lowest bidder, extra."""
    price, date_time, bidder, extra = bid
    return -price, date_time, bidder, extra


def _in_range(auction: dict, bid: tuple) -> bool:
    return auction["date_time"] <= bid[1] <= auction["expires"]


def _best_per_key(batch: pa.RecordBatch, index: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, list]:
    """Among `rows` of `batch` (bids), the best per key position of `index`: (the key positions,
    their best bids as tuples) — one Arrow sort, no Python per row."""
    table = pa.table({"k": index[rows], **{f: batch.column(f).take(rows) for f in BID_RANKED}})
    order = pc.sort_indices(table, sort_keys=[("k", "ascending"), ("price", "descending"),
                                               ("date_time", "ascending"), ("bidder", "ascending"),
                                               ("extra", "ascending")]).to_numpy()
    ranked = table.column("k").to_numpy()[order]
    first = order[np.r_[True, ranked[1:] != ranked[:-1]]]
    best = table.take(first)
    return best.column("k").to_numpy(), list(zip(*(best.column(f).to_pylist() for f in BID_RANKED)))


class WinningBid(ss.KeyedCoBatchFunction):
    """Per auction id: input 1 the auctions, input 2 their bids. Keeps the best bid in range;
    bids that come before their auction wait in a list. At `expires` (event time) it emits the
    auction with its winning bid, if any, and keeps only a closed marker."""

    def open(self, ctx):
        self.auction = ctx.get_state(ss.ValueStateDescriptor("auction"))
        self.best = ctx.get_state(ss.ValueStateDescriptor("best"))
        self.early = ctx.get_state(ss.ValueStateDescriptor("early"))
        self.timers = ctx.timer_service()

    def process_batch1(self, batch, keys):
        rows = last_rows(keys)
        auctions = batch.take(pa.array(rows)).to_pylist()
        self.auction.put_many(keys, auctions)
        self.timers.register_event_time_timers(keys, batch.column("expires").to_numpy()[rows])
        early = self.early.get_many(keys)
        held = [i for i, e in enumerate(early) if e]
        if held:
            waited = some(keys, held)
            self.early.put_many(waited, [None] * len(held))
            self.best.put_many(waited, [min((b for b in early[i] if _in_range(auctions[i], b)), key=_rank,
                                            default=None) for i in held])

    def process_batch2(self, batch, keys):
        auctions = self.auction.get_many(keys)
        starts = np.full(len(auctions), NEVER, dtype=np.int64)
        ends = np.full(len(auctions), -NEVER, dtype=np.int64)
        absent = []
        for i, a in enumerate(auctions):
            if a is None:
                absent.append(i)
            elif a != CLOSED:
                starts[i], ends[i] = a["date_time"], a["expires"]
        index = keys.index
        times = batch.column("date_time").to_numpy()
        rows = np.nonzero((times >= starts[index]) & (times <= ends[index]))[0]
        if len(rows):
            positions, candidates = _best_per_key(batch, index, rows)
            changed = some(keys, positions.tolist())
            kept = self.best.get_many(changed)
            self.best.put_many(changed, [c if k is None or _rank(c) < _rank(tuple(k)) else k
                                         for c, k in zip(candidates, kept)])
        if absent:
            self._wait(batch, keys, absent)

    def _wait(self, batch, keys, absent: list[int]) -> None:
        slot = np.full(len(keys.unique), -1)
        slot[absent] = np.arange(len(absent))
        rows = np.nonzero(slot[keys.index] >= 0)[0]
        held = some(keys, absent)
        lists = [list(e) if e else [] for e in self.early.get_many(held)]
        bids = zip(*(batch.column(f).take(rows).to_pylist() for f in BID_RANKED))
        for row, bid in zip(rows.tolist(), bids):
            lists[slot[keys.index[row]]].append(bid)
        self.early.put_many(held, lists)

    def on_timers(self, timers, ctx):
        keys = timers.keys
        auctions, best = self.auction.get_many(keys), self.best.get_many(keys)
        self.auction.put_many(keys, [CLOSED] * len(auctions))
        self.best.put_many(keys, [None] * len(auctions))
        rows = [{**a, "bidder": b[2], "price": b[0], "bid_date_time": b[1], "bid_extra": b[3]}
                for a, b in zip(auctions, best) if b is not None]
        return pa.RecordBatch.from_pylist(rows, schema=WINNING_BID_SCHEMA) if rows else None


def q9(stream):
    """Winning bids: each auction with its highest bid in [date_time, expires], at its close."""
    auctions = kinds.auction_stream(stream, "q9 auctions").key_by("id")
    bids = kinds.bid_stream(stream, "q9 bids").key_by("auction")
    return auctions.connect(bids).process_batches(WinningBid(), name="q9 winning bids",
                                                  output_schema=WINNING_BID_SCHEMA)


Q6_SCHEMA = pa.schema([("seller", pa.int64()), ("average", pa.float64()), ("auctions", pa.int64())])
Q6_CLOSED = pa.schema([("seller", pa.int64()), ("expires", pa.int64()), ("auction", pa.int64()),
                       ("price", pa.int64())])
SOLD = 3   # int64s per sold auction kept per seller: expires, auction id, price


class LastClosedAverages(ss.KeyedBatchFunction):
    """Per seller, vectorized state access: the final prices of its last `n` closed auctions (by
    expires, then id), and an updated average for each closed auction in the batch, in order;
    `auctions` counts the closes so far (the last row per seller has the most). A seller's state
    is one plain bytes value — the count, then up to `n` (expires, id, price) int64 triples — read
    for the batch's sellers in one get_many and written in one put_many."""

    def __init__(self, n: int = 10):
        self.n = n

    def open(self, ctx):
        self.last = ctx.get_state(ss.ValueStateDescriptor("last", default=None))

    def process_batch(self, batch, keys):
        stored = self.last.get_many(keys)
        counts, kept = [], []
        for value in stored:
            values = np.frombuffer(value, dtype=np.int64).tolist() if value else [0]
            counts.append(values[0])
            kept.append([values[i:i + SOLD] for i in range(1, len(values), SOLD)])
        expires, auction, price = (batch.column(c).to_numpy(zero_copy_only=False).tolist()
                                   for c in ("expires", "auction", "price"))
        averages, closes = [], []
        n = self.n
        for k, sold in zip(keys.index.tolist(), zip(expires, auction, price)):
            last = kept[k]
            bisect.insort(last, list(sold))
            if len(last) > n:
                del last[0]
            counts[k] += 1
            averages.append(sum(p for _, _, p in last) / len(last))
            closes.append(counts[k])
        self.last.put_many(keys, [np.array([c] + [v for t in last for v in t], dtype=np.int64).tobytes()
                                  for c, last in zip(counts, kept)])
        return pa.RecordBatch.from_arrays([batch.column("seller"), pa.array(averages, pa.float64()),
                                           pa.array(closes, pa.int64())], schema=Q6_SCHEMA)


def q6(stream):
    """Average selling price by seller over its last 10 closed auctions (an updating result), as
    Flink's q6 is defined: each auction's final price — the highest bid in [date_time, expires],
    q4's first stage with the seller in place of the category — then per seller the average of
    its last ten. Both stages vectorized KeyedBatchFunctions."""
    sides = partial(queries.closing_sides, group="seller")
    closed = (stream.map_batches(sides, name="q6 sides", output_schema=queries.closing_schema("seller"))
              .key_by("auction").process_batches(queries.ClosingPrices("seller", Q6_CLOSED), name="q6 close",
                                                 output_schema=Q6_CLOSED))
    return closed.key_by("seller").process_batches(LastClosedAverages(), name="q6 seller average",
                                                   output_schema=Q6_SCHEMA)
