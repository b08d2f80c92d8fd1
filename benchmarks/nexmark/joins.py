"""Nexmark's stream joins beyond q3, as the docs teach them: q13 (bids enriched from a bounded
side table) is a lookup join — the table shipped to every subtask, each batch joined in Arrow,
no key_by; q20 (bids expanded with their category-10 auction) joins two streams, both keyed
by the auction id, in a KeyedCoBatchFunction keeping each auction in keyed state and the bids
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


def some(keys: ss.BatchKeys, positions) -> ss.BatchKeys:
    """The distinct keys of `keys` at `positions` (in that order), for get_many/put_many on some
    of a batch's keys only."""
    positions = list(positions)
    return ss.BatchKeys([keys.unique[i] for i in positions], np.arange(len(positions)),
                        [keys.key_groups[i] for i in positions])


def last_rows(keys: ss.BatchKeys) -> np.ndarray:
    """For each distinct key, the position of its last row in the batch (its only one when the
    key is unique per batch, as an auction id is)."""
    rows = np.empty(len(keys.unique), dtype=np.int64)
    rows[keys.index] = np.arange(len(keys.index))
    return rows


class Enrich(ss.KeyedCoBatchFunction):
    """Per join key: input 1 the side rows (one per key, kept while `keep(batch)` holds for it),
    input 2 the rows to enrich (waiting in keyed state until their side row is in).

    fields: the columns of input 2's rows to keep; side_fields: (output name, side column)."""

    def __init__(self, schema: pa.Schema, fields: tuple[str, ...], side_fields: tuple[tuple[str, str], ...],
                 keep=None):
        self.schema, self.fields, self.side_fields, self.keep = schema, fields, side_fields, keep

    def open(self, ctx):
        self.side = ctx.get_state(ss.ValueStateDescriptor("side"))
        self.waiting = ctx.get_state(ss.ValueStateDescriptor("waiting"))

    def _output(self, rows: list[tuple], sides: list[tuple]) -> pa.RecordBatch:
        columns = list(zip(*rows)) + list(zip(*sides))
        return pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, self.schema)],
                                          schema=self.schema)

    def process_batch1(self, batch, keys):
        rows = last_rows(keys)
        values = list(zip(*(batch.column(f).take(pa.array(rows)).to_pylist() for _, f in self.side_fields)))
        if self.keep is not None:   # known not to match: False, later rows are dropped at once
            kept = self.keep(batch).to_numpy(zero_copy_only=False)[rows].tolist()
            values = [v if k else False for v, k in zip(values, kept)]
        self.side.put_many(keys, values)
        waiting = self.waiting.get_many(keys)
        held = [i for i, w in enumerate(waiting) if w]
        if not held:
            return None
        self.waiting.put_many(some(keys, held), [None] * len(held))
        out = [(row, values[i]) for i in held if values[i] is not False for row in waiting[i]]
        return self._output([r for r, _ in out], [s for _, s in out]) if out else None

    def process_batch2(self, batch, keys):
        sides = self.side.get_many(keys)
        index = keys.index
        matched = np.fromiter((s is not None and s is not False for s in sides), dtype=bool, count=len(sides))
        absent = [i for i, s in enumerate(sides) if s is None]
        if absent:
            self._wait(batch, keys, index, absent)
        rows = np.nonzero(matched[index])[0]
        if not len(rows):
            return None
        positions = pa.array(index[rows])
        joined = [batch.column(f).take(rows) for f in self.fields]
        found = [sides[i] if m else None for i, m in enumerate(matched.tolist())]
        for j in range(len(self.side_fields)):
            field = self.schema.field(len(self.fields) + j)
            column = pa.array([s[j] if s is not None else None for s in found], type=field.type)
            joined.append(column.take(positions))
        return pa.RecordBatch.from_arrays(joined, schema=self.schema)

    def _wait(self, batch, keys, index, absent: list[int]) -> None:
        """Rows whose side row is not in yet wait in the key's list."""
        slot = np.full(len(keys.unique), -1)
        slot[absent] = np.arange(len(absent))
        rows = np.nonzero(slot[index] >= 0)[0]
        held = some(keys, absent)
        lists = self.waiting.get_many(held)
        lists = [list(w) if w else [] for w in lists]
        values = zip(*(batch.column(f).take(rows).to_pylist() for f in self.fields))
        for row, value in zip(rows.tolist(), values):
            lists[slot[index[row]]].append(value)
        self.waiting.put_many(held, lists)


Q13_IN = nexmark.BID_SCHEMA.append(pa.field("side_key", pa.int64()))
Q13_SCHEMA = pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                        ("date_time", pa.int64()), ("value", pa.string())])


def _keyed_bids(batch: pa.RecordBatch) -> pa.RecordBatch:
    b = kinds.bids(batch)
    return pa.RecordBatch.from_arrays([b.column(f) for f in Q13_SCHEMA.names[:4]]
                                      + [pc.remainder(b.column("auction"), SIDE_KEYS)],
                                      names=[*Q13_SCHEMA.names[:4], "side_key"])


def q13(stream, side: pa.Table | None = None):
    """Bounded side input join: each bid with the side table's value for auction % 10 000;
    `side` is the side table (a pyarrow Table or Spark DataFrame; default `side_table()`)."""
    bids = stream.map_batches(_keyed_bids, name="q13 bids",
                              output_schema=pa.schema(list(Q13_SCHEMA)[:4] + [("side_key", pa.int64())]))
    return bids.lookup_join(side if side is not None else side_table(), on={"side_key": "key"},
                            columns=["value"], name="q13 join")


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
    return auctions.connect(bids).process_batches(
        Enrich(Q20_SCHEMA, BID_FIELDS, Q20_AUCTION, keep=lambda a: pc.equal(a.column("category"), 10)),
        name="q20 join", output_schema=Q20_SCHEMA)
