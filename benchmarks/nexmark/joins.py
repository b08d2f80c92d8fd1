"""Nexmark's stream joins beyond q3: q13 (bids enriched from a bounded side table) and q20
(bids expanded with their category-10 auction), as the docs teach enrichment: both sides keyed
by the join key, a KeyedCoProcessFunction keeping the one-row side in keyed state and the rows
that came before it in a waiting list."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import streamsnap as ss
from benchmarks.nexmark import kinds
from streamsnap.connectors import nexmark

SIDE_KEYS = 10_000


def side_table() -> pa.Table:
    """q13's side input: keys 0..9 999 with a string value each (as reference.side_value)."""
    keys = np.arange(SIDE_KEYS, dtype=np.int64)
    return pa.table({"key": keys, "value": [f"value-{k * 7 % 1_000}" for k in keys.tolist()]})


class Enrich(ss.KeyedCoProcessFunction):
    """Per join key: input 1 the side row (one per key, kept), input 2 the rows to enrich
    (waiting until their side row is in)."""

    def __init__(self, fields: tuple[str, ...], side_fields: tuple[str, ...], keep=lambda side: True):
        self.fields, self.side_fields, self.keep = fields, side_fields, keep

    def open(self, ctx):
        self.side = ctx.get_state(ss.ValueStateDescriptor("side"))
        self.waiting = ctx.get_state(ss.ListStateDescriptor("waiting"))

    def _joined(self, row: dict, side: dict) -> dict:
        return {**{f: row[f] for f in self.fields}, **{out: side[f] for out, f in self.side_fields}}

    def process_element1(self, side, ctx):
        if not self.keep(side):
            self.side.update(False)          # known not to match: later rows are dropped at once
            self.waiting.clear()
            return
        self.side.update(side)
        for row in self.waiting.get():
            yield self._joined(row, side)
        self.waiting.clear()

    def process_element2(self, row, ctx):
        side = self.side.value()
        if side is None:
            self.waiting.add(row)
        elif side is not False:
            yield self._joined(row, side)


Q13_IN = nexmark.BID_SCHEMA.append(pa.field("side_key", pa.int64()))
Q13_SCHEMA = pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                        ("date_time", pa.int64()), ("value", pa.string())])


def _keyed_bids(batch: pa.RecordBatch) -> pa.RecordBatch:
    b = kinds.bids(batch)
    return pa.RecordBatch.from_arrays(b.columns + [pc.remainder(b.column("auction"), SIDE_KEYS)], schema=Q13_IN)


def q13(stream, side: ss.DataStream | None = None):
    """Bounded side input join: each bid with the side table's value for auction % 10 000;
    `side` is the side table as a stream (default: `side_table()` from Arrow)."""
    side = side if side is not None else stream.env.from_arrow(side_table(), name="q13 side")
    bids = stream.map_batches(_keyed_bids, name="q13 bids", output_schema=Q13_IN).key_by("side_key")
    return side.key_by("key").connect(bids).process(
        Enrich(tuple(Q13_SCHEMA.names[:4]), (("value", "value"),)), name="q13 join", schema=Q13_SCHEMA)


BID_FIELDS = tuple(nexmark.BID_SCHEMA.names)
Q20_AUCTION = (("item_name", "item_name"), ("description", "description"), ("initial_bid", "initial_bid"),
               ("reserve", "reserve"), ("auction_date_time", "date_time"), ("expires", "expires"),
               ("seller", "seller"), ("category", "category"), ("auction_extra", "extra"))
Q20_SCHEMA = pa.schema(list(nexmark.BID_SCHEMA) + [
    (out, nexmark.AUCTION_SCHEMA.field(f).type) for out, f in Q20_AUCTION])


def q20(stream):
    """Expand bid with auction: every bid on a category-10 auction with the auction's fields (an
    unwindowed inner join; an auction of another category marks its key as not matching)."""
    auctions = kinds.auction_stream(stream, "q20 auctions").key_by("id")
    bids = kinds.bid_stream(stream, "q20 bids").key_by("auction")
    return auctions.connect(bids).process(
        Enrich(BID_FIELDS, Q20_AUCTION, keep=lambda a: a["category"] == 10), name="q20 join", schema=Q20_SCHEMA)
