"""The Nexmark queries on streamsnap's public API, with the semantics of `reference.py`.

Each `qN(stream)` takes the flat Nexmark event stream made by `events(env, config, count)`
(event timestamps from `date_time`, watermarks bounded by `config.out_of_orderness_ms()`) and
returns the query's output DataStream; several queries can share one source.

Vectorized where the query allows: selections, projections and the per-kind split are
`map_batches` on Arrow batches (q0-q2, and the front of every other query); q5's per-auction
sliding count is `window(...).count()`; q8 is one vectorized window aggregate per (person id,
window) (`aggregate_columns`: the person's name as a string min, whether an auction was seen as a
max) and a vectorized filter; q4 closes auctions and averages per category with
KeyedBatchFunctions (numpy per batch, state read and written in bulk, batch timers at each
auction's `expires`); q5 keeps only each batch's per-window maximum rows before the keyed
maximum stage (the window's maximum rows are always among them); q7 is a window Top-N over the
whole stream (`window_all(...).top_n(1, by="price")`, local candidates per batch in parallel, then
one ranking stage). Per-row operators remain where a row's fate depends on keyed state: q3's join (`q3_connected`: persons.connect(auctions) with a
KeyedCoProcessFunction; `q3`: the same on the flat stream with one KeyedProcessFunction holding
both sides), q5's maximum per window with ties (on the few rows left).

Output rows carry the reference's tuple fields (`OUTPUT_FIELDS`); q4 emits an updating running
average per category (the last row per category is the answer, as Flink's q4 emits updates).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import streamsnap as ss
from streamsnap.connectors import nexmark

DOLLAR_TO_EURO = 0.908
WINDOW_MS = 10_000          # q5 window size, q7/q8 tumbling size
SLIDE_MS = 2_000            # q5 slide
LOCAL_STATES = ("OR", "ID", "CA")

OUTPUT_FIELDS = {
    "q0": ("auction", "bidder", "price", "date_time", "extra"),
    "q1": ("auction", "bidder", "price", "date_time", "extra"),
    "q2": ("auction", "price"),
    "q3": ("name", "city", "state", "id"),
    "q3_flat": ("name", "city", "state", "id"),
    "q4": ("category", "average"),
    "q5": ("window_start", "window_end", "auction", "count"),
    "q7": ("window_start", "window_end", "auction", "bidder", "price", "date_time"),
    "q8": ("id", "name", "window_start"),
}


def events(env: ss.StreamEnvironment, config: nexmark.NexmarkConfig, count: int, *,
           batch_size: int = 8192, name: str = "nexmark", source=None):
    """The flat event stream (vectorized), timestamps from `date_time`, watermarks bounded by
    the config's out-of-orderness; `source` replaces `nexmark.source(config, ...)`."""
    strategy = (ss.WatermarkStrategy.for_bounded_out_of_orderness(config.out_of_orderness_ms() / 1000)
                .with_timestamp_assigner("date_time"))
    source = source or nexmark.source(config, count=count, batch_size=batch_size)
    return env.from_source(source, name=name, uid=name, watermark_strategy=strategy)


# ----------------------------------------------------------------------- vectorized front
def _of_kind(batch: pa.RecordBatch, kind: int, *columns: str) -> pa.RecordBatch:
    """The events of `kind`, with only `columns`: selected before the filter, which then copies
    those columns and not the flat batch's other kinds' (long strings among them)."""
    return batch.select(list(columns)).filter(pc.equal(batch.column("event_type"), kind))


BID_SCHEMA = pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                        ("date_time", pa.int64()), ("extra", pa.string())])
Q1_SCHEMA = BID_SCHEMA.set(2, pa.field("price", pa.float64()))
Q2_SCHEMA = pa.schema([("auction", pa.int64()), ("price", pa.int64()), ("date_time", pa.int64())])


def _bids(batch: pa.RecordBatch) -> pa.RecordBatch:
    b = _of_kind(batch, nexmark.BID, "bid_auction", "bid_bidder", "bid_price", "date_time", "bid_extra")
    return pa.RecordBatch.from_arrays(
        [b.column("bid_auction"), b.column("bid_bidder"), b.column("bid_price"), b.column("date_time"),
         b.column("bid_extra")], schema=BID_SCHEMA)


def _converted(batch: pa.RecordBatch) -> pa.RecordBatch:
    b = _of_kind(batch, nexmark.BID, "bid_auction", "bid_bidder", "bid_price", "date_time", "bid_extra")
    euros = b.column("bid_price").to_numpy(zero_copy_only=False) * DOLLAR_TO_EURO
    return pa.RecordBatch.from_arrays(
        [b.column("bid_auction"), b.column("bid_bidder"), pa.array(euros), b.column("date_time"),
         b.column("bid_extra")], schema=Q1_SCHEMA)


def _selected(batch: pa.RecordBatch) -> pa.RecordBatch:
    auction = batch.column("bid_auction").fill_null(1).to_numpy()
    mask = (batch.column("event_type").to_numpy() == nexmark.BID) & (auction % 123 == 0)
    b = batch.select(["bid_auction", "bid_price", "date_time"]).filter(pa.array(mask))
    return pa.RecordBatch.from_arrays([b.column("bid_auction"), b.column("bid_price"), b.column("date_time")],
                                      schema=Q2_SCHEMA)


def q0(stream):
    """Pass-through: every bid, projected (vectorized)."""
    return stream.map_batches(_bids, name="q0", output_schema=BID_SCHEMA)


def q1(stream):
    """Currency conversion: price in euros as a float64 (vectorized)."""
    return stream.map_batches(_converted, name="q1", output_schema=Q1_SCHEMA)


def q2(stream):
    """Selection: bids on auctions with id % 123 == 0 (vectorized)."""
    return stream.map_batches(_selected, name="q2", output_schema=Q2_SCHEMA)


# ----------------------------------------------------------------------- q3
Q3_IN = pa.schema([("event_type", pa.int8()), ("key", pa.int64()), ("id", pa.int64()),
                   ("name", pa.string()), ("city", pa.string()), ("state", pa.string()),
                   ("date_time", pa.int64())])
Q3_OUT = pa.schema([("name", pa.string()), ("city", pa.string()), ("state", pa.string()),
                    ("id", pa.int64())])


def _q3_sides(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Local persons and category-10 auctions, keyed by person id / seller (vectorized)."""
    kind = batch.column("event_type")
    person = pc.and_kleene(pc.equal(kind, nexmark.PERSON), pc.is_in(batch.column("person_state"),
                                                              value_set=pa.array(LOCAL_STATES)))
    auction = pc.and_kleene(pc.equal(kind, nexmark.AUCTION), pc.equal(batch.column("auction_category"), 10))
    b = batch.select(["event_type", "person_id", "auction_seller", "auction_id", "person_name", "person_city",
                      "person_state", "date_time"]).filter(pc.fill_null(pc.or_kleene(person, auction), False))
    is_person = pc.equal(b.column("event_type"), nexmark.PERSON)
    return pa.RecordBatch.from_arrays(
        [b.column("event_type"), pc.if_else(is_person, b.column("person_id"), b.column("auction_seller")),
         b.column("auction_id"), b.column("person_name"), b.column("person_city"), b.column("person_state"),
         b.column("date_time")], schema=Q3_IN)


class LocalItemJoin(ss.KeyedProcessFunction):
    """Per person id: the person (if local) and the auctions that came before it."""

    def open(self, ctx):
        self.person = ctx.get_state(ss.ValueStateDescriptor("person", default=None))
        self.waiting = ctx.get_state(ss.ValueStateDescriptor("waiting", default=None))

    def process_element(self, row, ctx):
        if row["event_type"] == nexmark.PERSON:
            person = [row["name"], row["city"], row["state"]]
            self.person.update(person)
            waiting = self.waiting.value()
            if waiting:
                self.waiting.clear()
                return [{"name": person[0], "city": person[1], "state": person[2], "id": a} for a in waiting]
            return None
        person = self.person.value()
        if person is not None:
            return {"name": person[0], "city": person[1], "state": person[2], "id": row["id"]}
        self.waiting.update((self.waiting.value() or []) + [row["id"]])
        return None


def q3(stream):
    """Local item suggestion: an unwindowed join of local persons with category-10 auctions."""
    return (stream.map_batches(_q3_sides, name="q3 sides", output_schema=Q3_IN)
            .key_by("key").process(LocalItemJoin(), name="q3 join", output_schema=Q3_OUT))


LOCAL_PERSONS = pa.schema([("id", pa.int64()), ("name", pa.string()), ("city", pa.string()),
                           ("state", pa.string()), ("date_time", pa.int64())])
CATEGORY_10 = pa.schema([("id", pa.int64()), ("seller", pa.int64()), ("date_time", pa.int64())])


def _local_persons(batch: pa.RecordBatch) -> pa.RecordBatch:
    b = _of_kind(batch, nexmark.PERSON, "person_id", "person_name", "person_city", "person_state", "date_time")
    b = b.filter(pc.is_in(b.column("person_state"), value_set=pa.array(LOCAL_STATES)))
    return pa.RecordBatch.from_arrays([b.column("person_id"), b.column("person_name"), b.column("person_city"),
                                       b.column("person_state"), b.column("date_time")], schema=LOCAL_PERSONS)


def _category_10(batch: pa.RecordBatch) -> pa.RecordBatch:
    b = _of_kind(batch, nexmark.AUCTION, "auction_id", "auction_seller", "auction_category", "date_time")
    b = b.filter(pc.equal(b.column("auction_category"), 10))
    return pa.RecordBatch.from_arrays([b.column("auction_id"), b.column("auction_seller"), b.column("date_time")],
                                      schema=CATEGORY_10)


class LocalItemCoJoin(ss.KeyedCoProcessFunction):
    """Two-input q3, per person id: input 1 local persons, input 2 their category-10 auctions."""

    def open(self, ctx):
        self.person = ctx.get_state(ss.ValueStateDescriptor("person", default=None))
        self.waiting = ctx.get_state(ss.ValueStateDescriptor("waiting", default=None))

    def process_element1(self, row, ctx):
        self.person.update([row["name"], row["city"], row["state"]])
        waiting = self.waiting.value()
        if waiting:
            self.waiting.clear()
            return [{"name": row["name"], "city": row["city"], "state": row["state"], "id": a} for a in waiting]
        return None

    def process_element2(self, row, ctx):
        person = self.person.value()
        if person is not None:
            return {"name": person[0], "city": person[1], "state": person[2], "id": row["id"]}
        self.waiting.update((self.waiting.value() or []) + [row["id"]])
        return None


def q3_connected(stream):
    """q3 with a two-input operator: local persons keyed by id connected to category-10
    auctions keyed by seller."""
    persons = stream.map_batches(_local_persons, name="q3 persons", output_schema=LOCAL_PERSONS)
    auctions = stream.map_batches(_category_10, name="q3 auctions", output_schema=CATEGORY_10)
    return (persons.key_by("id").connect(auctions.key_by("seller"))
            .process(LocalItemCoJoin(), name="q3 join", schema=Q3_OUT))


# ----------------------------------------------------------------------- q4
Q4_IN = pa.schema([("event_type", pa.int8()), ("auction", pa.int64()), ("date_time", pa.int64()),
                   ("expires", pa.int64()), ("category", pa.int64()), ("price", pa.int64())])
Q4_CLOSED = pa.schema([("category", pa.int64()), ("price", pa.int64())])
Q4_OUT = pa.schema([("category", pa.int64()), ("average", pa.float64()), ("auctions", pa.int64())])


def closing_sides(batch: pa.RecordBatch, group: str = "category") -> pa.RecordBatch:
    """Auctions and bids as one stream keyed by the auction id, for ClosingPrices: Q4_IN, with
    the auction's `group` column (category for q4, seller for q6) in place of category."""
    b = batch.select(["event_type", "bid_auction", "auction_id", "date_time", "auction_expires", f"auction_{group}",
                      "bid_price"]).filter(pc.not_equal(batch.column("event_type"), nexmark.PERSON))
    is_bid = pc.equal(b.column("event_type"), nexmark.BID)
    return pa.RecordBatch.from_arrays(
        [b.column("event_type"), pc.if_else(is_bid, b.column("bid_auction"), b.column("auction_id")),
         b.column("date_time"), b.column("auction_expires"), b.column(f"auction_{group}"),
         b.column("bid_price")], schema=closing_schema(group))


def closing_schema(group: str) -> pa.Schema:
    """ClosingPrices' input with `group` as the auction's grouping column (Q4_IN for category)."""
    return Q4_IN.set(Q4_IN.get_field_index("category"), pa.field(group, pa.int64()))


NO_BID = np.iinfo(np.int64).min   # an auction's best price before any bid in its range
RECORD = 32                        # an auction in state: int64 start, expires, category, best (bytes)


def _some(keys: ss.BatchKeys, positions) -> ss.BatchKeys:
    """The distinct keys at `positions` (of `keys.unique`), for get_many/put_many and timers."""
    positions = positions.tolist() if hasattr(positions, "tolist") else positions
    return ss.BatchKeys([keys.unique[i] for i in positions], np.arange(len(positions)),
                        [keys.key_groups[i] for i in positions])


def _int64s(column: pa.Array) -> np.ndarray:
    """An int64 column's values as numpy without a copy, whatever its nulls (their values are
    unspecified: use only where the row's kind says the field is set)."""
    return np.frombuffer(column.buffers()[1], dtype=np.int64, count=len(column),
                         offset=column.offset * 8)


def _records(values: np.ndarray) -> list[bytes]:
    """Rows of an (n, 4) int64 array as RECORD-byte strings (plain state values: no encoding)."""
    blob = np.ascontiguousarray(values, dtype=np.int64).tobytes()
    return [blob[i:i + RECORD] for i in range(0, len(blob), RECORD)]


class ClosingPrices(ss.KeyedBatchFunction):
    """Per auction, vectorized: the highest bid in [date_time, expires], emitted when the
    watermark passes `expires` as a row of `schema`, whose columns are picked by name from the
    auction's `group` column (category for q4, seller for q6), its closing `price`, `expires`
    and `auction` id. Per batch: the stored auctions of its distinct keys in one
    `get_many`, numpy for the per-auction maximum of the in-range bids, one `put_many` of the
    auctions that changed, one timer per new auction. Bids before their auction (common when
    the sources run apart) wait in state (`early`) and are folded in, vectorized, when it
    arrives. Both states hold fixed-width int64 records as bytes (plain values: no encoding
    per write)."""

    def __init__(self, group: str = "category", schema: pa.Schema | None = None):
        self.group, self.schema = group, schema if schema is not None else Q4_CLOSED

    def open(self, ctx):
        self.auction = ctx.get_state(ss.ValueStateDescriptor("auction", default=None))  # RECORD bytes
        self.early = ctx.get_state(ss.ValueStateDescriptor("early", default=None))      # int64 time, price, ...
        self.timers = ctx.timer_service()

    def process_batch(self, batch, keys):
        u = len(keys.unique)
        index = keys.index
        kind = batch.column("event_type").to_numpy(zero_copy_only=False)
        t = _int64s(batch.column("date_time"))
        info = np.empty((u, 4), dtype=np.int64)          # start, expires, group, best per key
        info[:, 3] = NO_BID
        stored = self.auction.get_many(keys)
        known = np.fromiter((v is not None for v in stored), dtype=bool, count=u)
        if known.any():
            info[known] = np.frombuffer(b"".join([v for v in stored if v is not None]),
                                        dtype=np.int64).reshape(-1, 4)
        before = info[:, 3].copy()
        # New auctions: their start, expires and category (a bid may precede them in the batch).
        auctions = np.flatnonzero(kind == nexmark.AUCTION)
        new = np.zeros(u, dtype=bool)
        if len(auctions):
            at = index[auctions]
            info[at, 0] = t[auctions]
            info[at, 1] = _int64s(batch.column("expires"))[auctions]
            info[at, 2] = _int64s(batch.column(self.group))[auctions]
            new[at] = True
        # Bids on auctions known by now: the maximum in-range price per auction.
        bids = np.flatnonzero(kind == nexmark.BID)
        bid_keys = index[bids]
        bid_times = t[bids]
        price = _int64s(batch.column("price"))[bids]
        on_known = (known | new)[bid_keys]
        in_range = on_known & (info[bid_keys, 0] <= bid_times) & (bid_times <= info[bid_keys, 1])
        best = info[:, 3].copy()
        np.maximum.at(best, bid_keys[in_range], price[in_range])
        info[:, 3] = best
        # Bids before their auction: appended to the key's waiting list.
        waiting = np.flatnonzero(~on_known)
        if len(waiting):
            order = waiting[np.argsort(bid_keys[waiting], kind="stable")]
            wait_keys, starts = np.unique(bid_keys[order], return_index=True)
            blob = np.column_stack([bid_times[order], price[order]]).astype(np.int64).tobytes()
            bounds = (16 * np.r_[starts, len(order)]).tolist()
            some = _some(keys, wait_keys)
            self.early.put_many(some, [(old or b"") + blob[lo:hi] for old, lo, hi in
                                       zip(self.early.get_many(some), bounds[:-1], bounds[1:])])
        # New auctions whose bids came first: fold the waiting ones in range into the best.
        fresh = np.flatnonzero(new & ~known)
        if len(fresh):
            some = _some(keys, fresh)
            early = self.early.get_many(some)
            had = [i for i, e in enumerate(early) if e]
            if had:
                waited = [early[i] for i in had]
                pairs = np.frombuffer(b"".join(waited), dtype=np.int64).reshape(-1, 2)
                owner = np.repeat(fresh[had], [len(e) // 16 for e in waited])
                hit = (info[owner, 0] <= pairs[:, 0]) & (pairs[:, 0] <= info[owner, 1])
                best = info[:, 3].copy()
                np.maximum.at(best, owner[hit], pairs[hit, 1])
                info[:, 3] = best
                self.early.put_many(_some(some, had), [None] * len(had))
        changed = np.flatnonzero(new | (info[:, 3] != before))
        if len(changed):
            self.auction.put_many(_some(keys, changed), _records(info[changed]))
        added = np.flatnonzero(new)
        if len(added):
            self.timers.register_event_time_timers(_some(keys, added), info[added, 1])
        return None

    def on_timers(self, timers, ctx):
        stored = self.auction.get_many(timers.keys)
        present = [i for i, v in enumerate(stored) if v is not None]
        if not present:
            return None
        info = np.frombuffer(b"".join([stored[i] for i in present]), dtype=np.int64).reshape(-1, 4)
        sold = np.flatnonzero(info[:, 3] != NO_BID)
        if not len(sold):
            return None
        closed = info[sold].copy()
        positions = [present[i] for i in sold.tolist()]
        columns = {self.group: closed[:, 2], "price": closed[:, 3], "expires": closed[:, 1]}
        if "auction" in self.schema.names:
            columns["auction"] = np.array([timers.keys.unique[i] for i in positions], dtype=np.int64)
        out = pa.RecordBatch.from_arrays([pa.array(columns[f.name]) for f in self.schema], schema=self.schema)
        closed[:, 3] = NO_BID            # closed: later (late) bids are not emitted again
        self.auction.put_many(_some(timers.keys, positions), _records(closed))
        return out


class RunningAverages(ss.KeyedBatchFunction):
    """Per category, vectorized: the running average of closing prices (an updating result),
    one output row per input row (running sums per key with `ss.group_cumsum`)."""

    def open(self, ctx):
        self.totals = ctx.get_state(ss.ValueStateDescriptor("totals", default=None))   # [total, n]

    def process_batch(self, batch, keys):
        stored = self.totals.get_many(keys)
        initial = np.array([v or (0, 0) for v in stored], dtype=np.int64).reshape(-1, 2)
        price = batch.column("price").to_numpy(zero_copy_only=False)
        total, final_total = ss.group_cumsum(price, keys.index, initial[:, 0])
        n, final_n = ss.group_cumsum(np.ones(len(price), dtype=np.int64), keys.index, initial[:, 1])
        self.totals.put_many(keys, np.column_stack([final_total, final_n]).tolist())
        return pa.RecordBatch.from_arrays([batch.column("category"), pa.array(total / n), pa.array(n)],
                                          schema=Q4_OUT)


def q4(stream):
    """Average closing price per category: close each auction at `expires`, then average
    (both stages vectorized KeyedBatchFunctions)."""
    closed = (stream.map_batches(closing_sides, name="q4 sides", output_schema=Q4_IN)
              .key_by("auction").process_batches(ClosingPrices(), name="q4 close", output_schema=Q4_CLOSED))
    return closed.key_by("category").process_batches(RunningAverages(), name="q4 average", output_schema=Q4_OUT)


# ----------------------------------------------------------------------- q5 and q7
WINDOW_BIDS = pa.schema([("auction", pa.int64()), ("date_time", pa.int64())])


def _bid_auctions(batch: pa.RecordBatch) -> pa.RecordBatch:
    b = _of_kind(batch, nexmark.BID, "bid_auction", "date_time")
    return pa.RecordBatch.from_arrays([b.column("bid_auction"), b.column("date_time")], schema=WINDOW_BIDS)


def q5(stream):
    """Hot items: bids per auction in 10 s windows sliding by 2 s (vectorized window count),
    then per window the auctions with the most bids, ties kept (`window_top_n`, Flink SQL's
    Window Top-N after a window aggregation)."""
    counts = (stream.map_batches(_bid_auctions, name="q5 bids", output_schema=WINDOW_BIDS)
              .key_by("auction")
              .window(ss.windows.SlidingEventTimeWindows.of(WINDOW_MS / 1000, SLIDE_MS / 1000))
              .count(name="q5 counts"))
    return counts.window_top_n(1, by="count", rank_column=None, name="q5 top")


Q7_BIDS = pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                     ("date_time", pa.int64())])


def _q7_bids(batch: pa.RecordBatch) -> pa.RecordBatch:
    b = _of_kind(batch, nexmark.BID, "bid_auction", "bid_bidder", "bid_price", "date_time")
    return pa.RecordBatch.from_arrays([b.column("bid_auction"), b.column("bid_bidder"), b.column("bid_price"),
                                       b.column("date_time")], schema=Q7_BIDS)


def q7(stream):
    """Highest bid: per 10 s tumbling window over all bids, the bids with the highest price,
    ties all kept — a window Top-N with RANK() <= 1 (`window_all(...).top_n`), which keeps each
    batch's candidates in parallel (vectorized) and ranks them per window at parallelism 1."""
    return (stream.map_batches(_q7_bids, name="q7 bids", output_schema=Q7_BIDS)
            .window_all(ss.windows.TumblingEventTimeWindows.of(WINDOW_MS / 1000))
            .top_n(1, by="price", rank_column=None, name="q7 top"))


# ----------------------------------------------------------------------- q8
Q8_IN = pa.schema([("id", pa.int64()), ("name", pa.string()), ("sold", pa.int8()), ("date_time", pa.int64())])
Q8_OUT = pa.schema([("id", pa.int64()), ("name", pa.string()), ("window_start", pa.int64())])


def _q8_sides(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Persons as (id, name, sold=0), auctions as (seller, null, sold=1)."""
    kind = batch.column("event_type")
    b = batch.select(["event_type", "person_id", "auction_seller", "person_name", "date_time"]).filter(
        pc.not_equal(kind, nexmark.BID))
    is_person = pc.equal(b.column("event_type"), nexmark.PERSON)
    return pa.RecordBatch.from_arrays(
        [pc.if_else(is_person, b.column("person_id"), b.column("auction_seller")), b.column("person_name"),
         pc.cast(pc.invert(is_person), pa.int8()), b.column("date_time")], schema=Q8_IN)


Q8_WINDOWS = pa.schema([("id", pa.int64()), ("window_start", pa.int64()), ("window_end", pa.int64()),
                        ("name", pa.string()), ("sold", pa.int8())])


def _new_users(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The (id, window) groups with a person (a name) and an auction (sold)."""
    keep = pc.and_(pc.is_valid(batch.column("name")), pc.fill_null(pc.equal(batch.column("sold"), 1), False))
    b = batch.filter(keep)
    return pa.RecordBatch.from_arrays([b.column("id"), b.column("name"), b.column("window_start")],
                                      schema=Q8_OUT)


def q8(stream):
    """New users: persons who registered and sold in the same 10 s tumbling window. Vectorized
    window aggregate per (id, window): the person's name (string min; null without a person)
    and whether an auction was seen (max of `sold`), then a vectorized filter."""
    return (stream.map_batches(_q8_sides, name="q8 sides", output_schema=Q8_IN)
            .key_by("id").window(ss.windows.TumblingEventTimeWindows.of(WINDOW_MS / 1000))
            .aggregate_columns({"name": ("min", "name"), "sold": ("max", "sold")}, name="q8 window",
                               schema=Q8_WINDOWS)
            .map_batches(_new_users, name="q8 new users", output_schema=Q8_OUT))


QUERIES = {"q0": q0, "q1": q1, "q2": q2, "q3": q3_connected, "q4": q4, "q5": q5, "q7": q7, "q8": q8}
FLAT_Q3 = q3   # the one-input formulation (one KeyedProcessFunction on the flat stream)


def output_tuples(query: str, rows) -> list[tuple]:
    """A query's output rows as the reference's sorted tuples (q4: the last update per category)."""
    fields = OUTPUT_FIELDS[query]
    if query == "q4":
        final = {}
        for r in rows:
            if r["auctions"] > final.get(r["category"], {"auctions": 0})["auctions"]:
                final[r["category"]] = r
        rows = final.values()
    return sorted(tuple(r[f] for f in fields) for r in rows)
