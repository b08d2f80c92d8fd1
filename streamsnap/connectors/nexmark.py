"""Nexmark: the online-auction benchmark's event stream (persons, auctions, bids).

The model is the standard one, as Apache Flink's and Apache Beam's Nexmark generators have it:
events come in epochs of 50 event ids — 1 person, 3 auctions, 46 bids — and ids grow with the
epoch; an auction is sold by a recent or a "hot" person, a bid goes to a recent or a hot auction
from a recent or a hot bidder; ids may lead the last created one by a few (so that a bid can
arrive before its auction, as in a real system); event time advances by 1/rate per event from a
fixed base, and an out-of-order group size shuffles event ids — and with them the timestamps —
inside groups of consecutive events.

What differs from those generators is where the randomness comes from. They draw from one
sequential RNG, so event i depends on every event before it. Here each random choice is a
counter-based hash (splitmix64) of (seed, event id, field), so event i is a pure function of i:
a source restored at any position replays exactly the same events (the property exactly-once
recovery needs), any slice of indices can be generated on its own, and the vectorized generator
(numpy over an index array, no per-row Python) produces exactly what the per-row one does.
Smaller differences, for the same reasons (cheap, exact, vectorizable): prices are log-uniform
over 2**16 fixed levels rather than computed with pow(); `extra` padding is one of 4096 fixed
strings per kind; the base time is a fixed configured instant, not the wall clock at start; and
the reference generator's bidder ids, which add the first person id twice, are not copied.

Timestamps are int epoch milliseconds. All three kinds share one flat schema (`SCHEMA`): an
`event_type` column (0 person, 1 auction, 2 bid), a `date_time` column for all, and nullable
columns prefixed `person_`, `auction_`, `bid_`. `persons()`, `auctions()`, `bids()` give one
kind alone, unprefixed (`PERSON_SCHEMA` ...), where the k-th element is a pure function of k.

    import streamsnap as ss
    from streamsnap.connectors import nexmark
    cfg = nexmark.NexmarkConfig(seed=7, events_per_second=100_000)
    env.from_source(nexmark.source(cfg, count=10_000_000), name="nexmark")         # vectorized
    env.from_source(ss.sources.Generator(nexmark.events(cfg), count=1000, schema=nexmark.SCHEMA), ...)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import cached_property, lru_cache

import numpy as np
import pyarrow as pa

from streamsnap.errors import ConfigurationError

PERSON, AUCTION, BID = 0, 1, 2
KINDS = ("events", "persons", "auctions", "bids")

FIRST_PERSON_ID = 1000      # ids start above 0 so that small inputs still find matches
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5          # few categories, so that q3/q4 find results on small inputs
ID_LEAD = 10                # how far a random person/auction id may run ahead of the last created
HOT_BATCH = 100             # the hot auction/seller/bidder is the first of the last batch of 100
AVG_BYTES = {PERSON: 200, AUCTION: 500, BID: 100}   # `extra` pads events to these average sizes,
OTHER_BYTES = {PERSON: 60, AUCTION: 110, BID: 32}    # given the other fields' average sizes
NUM_EXTRAS = 4096           # `extra` is one of this many fixed strings per kind
OUT_OF_ORDER_STRIDE = 953   # position of event n inside its group: (n * 953) % group size

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
             "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter",
               "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
NUM_CHANNELS = 10_000

PERSON_SCHEMA = pa.schema([
    ("id", pa.int64()), ("name", pa.string()), ("email_address", pa.string()),
    ("credit_card", pa.string()), ("city", pa.string()), ("state", pa.string()),
    ("date_time", pa.int64()), ("extra", pa.string())])
AUCTION_SCHEMA = pa.schema([
    ("id", pa.int64()), ("item_name", pa.string()), ("description", pa.string()),
    ("initial_bid", pa.int64()), ("reserve", pa.int64()), ("date_time", pa.int64()),
    ("expires", pa.int64()), ("seller", pa.int64()), ("category", pa.int64()), ("extra", pa.string())])
BID_SCHEMA = pa.schema([
    ("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()), ("channel", pa.string()),
    ("url", pa.string()), ("date_time", pa.int64()), ("extra", pa.string())])
_KIND_SCHEMA = {PERSON: PERSON_SCHEMA, AUCTION: AUCTION_SCHEMA, BID: BID_SCHEMA}
_PREFIX = {PERSON: "person_", AUCTION: "auction_", BID: "bid_"}
# flat: event_type, date_time, then every kind's own columns (but its date_time) prefixed
_FLAT_COLUMNS = {k: [(f.name, _PREFIX[k] + f.name) for f in s if f.name != "date_time"]
                 for k, s in _KIND_SCHEMA.items()}
SCHEMA = pa.schema([("event_type", pa.int8()), ("date_time", pa.int64())]
                   + [(flat, s.field(name).type) for k, s in _KIND_SCHEMA.items()
                      for name, flat in _FLAT_COLUMNS[k]])
SCHEMAS = {"events": SCHEMA, "persons": PERSON_SCHEMA, "auctions": AUCTION_SCHEMA, "bids": BID_SCHEMA}
_EMPTY_ROW = dict.fromkeys(SCHEMA.names)


@dataclass(frozen=True)
class NexmarkConfig:
    """What the stream looks like; equal configs give equal streams.

    seed: selects the stream; events_per_second: event-time rate (the timestamps only — how fast
      a source emits is the Generator's `rate`); first_event_ms: timestamp of event 0;
    num_active_people / num_in_flight_auctions: how far back a random seller/bidder/auction is drawn;
    hot_*_ratio: a bid/auction goes to the hot auction/bidder/seller with probability 1 - 1/ratio;
    out_of_order_group_size: events are shuffled inside groups of this many (1 = in order; the
      standard shuffle reorders nothing for divisors of 952, so those are refused), see
      `out_of_orderness_ms()`; *_proportion: kinds per epoch; pad_extra: fill `extra` so events
      have the standard average sizes (200/500/100 bytes, bids ~175 with channel and url), else
      leave it empty. Counts and ratios go up to 2**31 - 1.
    Defaults are Flink Nexmark's, but for the base time: fixed (replayable), aligned to 10 s.
    """

    seed: int = 0
    events_per_second: int = 10_000
    first_event_ms: int = 1_700_000_000_000
    num_active_people: int = 1000
    num_in_flight_auctions: int = 100
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    out_of_order_group_size: int = 1
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    pad_extra: bool = True

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "pad_extra":
                if not isinstance(value, bool):
                    raise ConfigurationError(f"NexmarkConfig.pad_extra must be True or False, got {value!r}")
                continue
            low, high = {"seed": (None, None), "first_event_ms": (0, None)}.get(f.name, (1, _M31))
            if (isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low)
                    or (high is not None and value > high)):
                allowed = ("an integer" if low is None else f"an integer >= {low}" if high is None
                           else f"an integer from {low} to {high}")
                raise ConfigurationError(f"NexmarkConfig.{f.name} must be {allowed}, got {value!r}")
        g = self.out_of_order_group_size
        if g > 1 and OUT_OF_ORDER_STRIDE % g in (0, 1):
            raise ConfigurationError(
                f"NexmarkConfig.out_of_order_group_size must not divide {OUT_OF_ORDER_STRIDE} or "
                f"{OUT_OF_ORDER_STRIDE - 1}: the standard shuffle, (n * {OUT_OF_ORDER_STRIDE}) % size, "
                f"would then {'repeat events' if OUT_OF_ORDER_STRIDE % g == 0 else 'reorder nothing'}; "
                f"got {g} (3, 5, 10, 37 or 100 reorder)")

    @cached_property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    def out_of_orderness_ms(self, kind: str = "events") -> int:
        """How much earlier than an already emitted event an event of the `kind` stream can be:
        the bound for `WatermarkStrategy.for_bounded_out_of_orderness` (in seconds: / 1000).
        A group spans g - 1 event ids in `events`, more in a one-kind stream."""
        g = self.out_of_order_group_size
        if g == 1:
            return 0
        if kind == "events":
            span = g - 1
        else:
            own = {"persons": self.person_proportion, "auctions": self.auction_proportion,
                   "bids": self.bid_proportion}[kind]
            span = ((g - 1) // own + 1) * self.total_proportion + own - 1
        return -(-span * 1000 // self.events_per_second)

    def timestamp(self, event_id: int) -> int:
        """Event time (epoch ms) of event id `event_id`; non-decreasing in the id."""
        return self.first_event_ms + event_id * 1000 // self.events_per_second

    @cached_property
    def _key(self) -> int:
        return _mix(self.seed & _M64)


def kind_count(config: NexmarkConfig, kind: str, num_events: int) -> int:
    """How many of the first `num_events` events are of `kind` ("persons"/"auctions"/"bids"):
    the count to give `persons()`/`auctions()`/`bids()` for the same events as
    `events()` over `num_events` (exact when num_events is a multiple of 50 (the epoch) times
    the out-of-order group size: the shuffle then stays inside the range in every stream)."""
    c = config
    epochs, rem = divmod(num_events, c.total_proportion)
    if kind == "persons":
        return epochs * c.person_proportion + min(rem, c.person_proportion)
    if kind == "auctions":
        return epochs * c.auction_proportion + min(max(rem - c.person_proportion, 0), c.auction_proportion)
    if kind == "bids":
        return epochs * c.bid_proportion + max(rem - c.person_proportion - c.auction_proportion, 0)
    raise ConfigurationError(f"kind must be 'persons', 'auctions' or 'bids', got {kind!r}")


def events(config: NexmarkConfig, *, vectorized: bool = False) -> _Events:
    """Event i of the stream: a dict of SCHEMA's columns (None for the other kinds' columns), or
    with `vectorized=True` a function of an index array returning a RecordBatch of SCHEMA."""
    return _Events(config, "events", vectorized)


def persons(config: NexmarkConfig, *, vectorized: bool = False) -> _Events:
    """The k-th person alone (PERSON_SCHEMA), as `events` does it."""
    return _Events(config, "persons", vectorized)


def auctions(config: NexmarkConfig, *, vectorized: bool = False) -> _Events:
    """The k-th auction alone (AUCTION_SCHEMA), as `events` does it."""
    return _Events(config, "auctions", vectorized)


def bids(config: NexmarkConfig, *, vectorized: bool = False) -> _Events:
    """The k-th bid alone (BID_SCHEMA), as `events` does it: a bids-only query skips the 8 % of
    events it would filter out."""
    return _Events(config, "bids", vectorized)


def source(config: NexmarkConfig, *, kind: str = "events", count: int | None = None,
           vectorized: bool = True, **generator_options):
    """A replayable `ss.sources.Generator` of the stream (or of one kind), schema set.
    `generator_options` go to Generator (rate, splits, batch_size)."""
    from streamsnap.connectors.sources import Generator
    if kind not in KINDS:
        raise ConfigurationError(f"nexmark.source kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return Generator(_Events(config, kind, vectorized), count=count, vectorized=vectorized,
                     schema=SCHEMAS[kind], **generator_options)


class _Events:
    """The generator function handed to `Generator`: picklable, and carries its `schema`.

    Vectorized, it reads ahead: a request for a run of indices with a fixed stride (what a
    Generator split asks for) computes READ_AHEAD of them at once and serves the following
    requests of that run as zero-copy slices — numpy's per-call overhead, not the rows, is what
    costs at small batch sizes. Events are a pure function of the index, so this changes nothing
    in the output.
    """

    READ_AHEAD = 8192
    MAX_RUNS = 16       # runs cached at once (a reader round-robins over its splits)

    def __init__(self, config: NexmarkConfig, kind: str, vectorized: bool):
        if not isinstance(config, NexmarkConfig):
            raise ConfigurationError(f"nexmark needs a NexmarkConfig, got {type(config).__name__}")
        self.config, self.kind, self.vectorized = config, kind, vectorized
        self.schema = SCHEMAS[kind]
        self._runs: dict = {}    # (stride, first index % stride) -> (first index, batch)

    def __getstate__(self):
        return {**self.__dict__, "_runs": {}}

    def __call__(self, index):
        if self.vectorized:
            return self._read_ahead(np.asarray(index, dtype=np.int64))
        c, n = self.config, _adjusted(self.config, int(index))
        if self.kind == "events":
            return _flat_row(c, n)
        k = KINDS.index(self.kind) - 1
        return _ROW[k](c, _kind_to_event_id(c, k, n))

    def _read_ahead(self, index: np.ndarray) -> pa.RecordBatch:
        n = len(index)
        if n == 0 or n >= self.READ_AHEAD:
            return self._generate(index)
        first = int(index[0])
        stride = int(index[1]) - first if n > 1 else 1
        if stride < 1 or not np.array_equal(index, first + stride * np.arange(n)):
            return self._generate(index)
        key = (stride, first % stride)
        start, batch = self._runs.get(key, (None, None))
        if start is None or not (start <= first and first + stride * n <= start + stride * batch.num_rows):
            if len(self._runs) >= self.MAX_RUNS:
                self._runs.clear()
            start, batch = first, self._generate(first + stride * np.arange(self.READ_AHEAD))
            self._runs[key] = (start, batch)
        return batch.slice((first - start) // stride, n)

    def _generate(self, index: np.ndarray) -> pa.RecordBatch:
        c, n = self.config, _adjusted_np(self.config, index)
        if self.kind == "events":
            return _flat_batch(c, n)
        k = KINDS.index(self.kind) - 1
        return pa.RecordBatch.from_pydict(_COLUMNS_NP[k](c, _kind_to_event_id(c, k, n)), schema=self.schema)

    def __repr__(self):
        return f"nexmark.{self.kind}({self.config!r}, vectorized={self.vectorized})"


# ============================================================= hashing (per row and numpy)
_M64, _M32, _M31 = (1 << 64) - 1, (1 << 32) - 1, (1 << 31) - 1
_GOLDEN, _C1, _C2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_U_C1, _U_C2 = np.uint64(_C1), np.uint64(_C2)


def _mix(x: int) -> int:
    """splitmix64's output function: a bijection of 64-bit ints with good avalanche."""
    x = (x + _GOLDEN) & _M64
    x = ((x ^ (x >> 30)) * _C1) & _M64
    x = ((x ^ (x >> 27)) * _C2) & _M64
    return x ^ (x >> 31)


def _mix_np(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(_GOLDEN)           # uint64 arithmetic wraps like the & _M64 above
    x ^= x >> 30
    x *= _U_C1
    x ^= x >> 27
    x *= _U_C2
    x ^= x >> 31
    return x


# The random bits of event id e are hash(seed, e * 64 + field); a hash is split into 32- or
# 16-bit parts where one choice needs fewer bits. Fields per kind (events of different kinds never
# share an id, so the numbers repeat across kinds):
_F_NAME, _F_EMAIL, _F_CARD, _F_PLACE, _F_EXTRA = 0, 1, 4, 5, 6      # person; letters of the email: 2, 3
_F_SELLER, _F_INITIAL, _F_EXPIRES, _F_LENGTHS = 0, 1, 2, 3          # auction (+ _F_EXTRA); initial
_F_ITEM, _F_DESCRIPTION = 8, 11                                     # bid, reserve, category share one
_F_AUCTION, _F_BIDDER, _F_PRICE = 0, 1, 2                           # bid; price, extra, channel share one


def _h(c: NexmarkConfig, e: int, field: int) -> int:
    return _mix((c._key + e * 64 + field) & _M64)


def _below(r, n):
    """A uniform choice in [0, n) from 32 random bits r, for n < 2**32 (Lemire's multiply-shift:
    no division). r and n: ints, or uint64 / int64 arrays."""
    if isinstance(r, np.ndarray):
        return ((r * (n.astype(np.uint64) if isinstance(n, np.ndarray) else np.uint64(n))) >> 32).astype(np.int64)
    return (r * n) >> 32


def _lo(h):
    return h & _M32


def _hi(h):
    return h >> 32


# ============================================================= the model: ids and time
def _adjusted(c: NexmarkConfig, n: int) -> int:
    g = c.out_of_order_group_size
    return n - n % g + (n * OUT_OF_ORDER_STRIDE) % g


def _adjusted_np(c: NexmarkConfig, n: np.ndarray) -> np.ndarray:
    g = c.out_of_order_group_size
    return n if g == 1 else n - n % g + (n * OUT_OF_ORDER_STRIDE) % g


def _kind_of(c: NexmarkConfig, e):
    r = e % c.total_proportion
    if isinstance(r, np.ndarray):
        return ((r >= c.person_proportion).astype(np.int8)
                + (r >= c.person_proportion + c.auction_proportion).astype(np.int8))
    return PERSON if r < c.person_proportion else AUCTION if r < c.person_proportion + c.auction_proportion else BID


def _kind_to_event_id(c: NexmarkConfig, kind: int, k):
    """Event id of the k-th event of `kind` (works on ints and numpy arrays alike)."""
    own = (c.person_proportion, c.auction_proportion, c.bid_proportion)[kind]
    before = (0, c.person_proportion, c.person_proportion + c.auction_proportion)[kind]
    return (k // own) * c.total_proportion + before + k % own


def _last_person(c: NexmarkConfig, e):
    """Base-0 id of the newest person at event id e (e's own if e is a person)."""
    epoch, off = e // c.total_proportion, e % c.total_proportion
    return epoch * c.person_proportion + _minimum(off, c.person_proportion - 1)


def _last_auction(c: NexmarkConfig, e):
    """Base-0 id of the newest auction at event id e (e's own if e is an auction; -1 before any)."""
    p, a = c.person_proportion, c.auction_proportion
    epoch, off = e // c.total_proportion, e % c.total_proportion
    if isinstance(e, np.ndarray):
        return epoch * a + np.where(off < p, -1, np.minimum(off - p, a - 1))
    return epoch * a + (-1 if off < p else min(off - p, a - 1))


def _random_person(c: NexmarkConfig, e, r):
    """A recent person (r: 32 random bits): one of the last `num_active_people`, or one of the
    ID_LEAD next ones, not created yet (as if events had been reordered)."""
    people = _last_person(c, e) + 1
    active = _minimum(people, c.num_active_people)
    return people - active + _below(r, active + ID_LEAD)


def _random_auction(c: NexmarkConfig, e, r):
    """A probably still open auction (r: 32 random bits): one of the last
    `num_in_flight_auctions`, or one of the ID_LEAD next ones."""
    last = _last_auction(c, e)
    low = _maximum(last - c.num_in_flight_auctions, 0)
    return low + _below(r, last - low + 1 + ID_LEAD)


def _minimum(a, b):
    return np.minimum(a, b) if isinstance(a, np.ndarray) else min(a, b)


def _maximum(a, b):
    return np.maximum(a, b) if isinstance(a, np.ndarray) else max(a, b)


def _timestamp_np(c: NexmarkConfig, e: np.ndarray) -> np.ndarray:
    return c.first_event_ms + e * 1000 // c.events_per_second


def _auction_horizon_ms(c: NexmarkConfig, e, ts):
    """Auctions last 1 + uniform(2 * horizon) ms on average, where horizon is the time until
    `num_in_flight_auctions` more auctions will have been created."""
    ahead = c.num_in_flight_auctions * c.total_proportion // c.auction_proportion
    future = _timestamp_np(c, e + ahead) if isinstance(e, np.ndarray) else c.timestamp(e + ahead)
    return _maximum((future - ts) * 2, 1)


def _expiry(h, horizon):
    """1 + uniform [0, horizon) ms from a 64-bit hash (horizon may exceed 2**32 at low rates)."""
    if isinstance(h, np.ndarray):
        return 1 + (h % horizon.astype(np.uint64)).astype(np.int64)
    return 1 + h % horizon


@lru_cache(maxsize=None)
def _tables():
    """Seed-independent vocabularies, built once per process (deterministically)."""
    # prices: log-uniform over [1, 10^6) dollars in cents, quantized to 2^16 levels so per-row
    # and numpy code share the exact integers (no transcendental function in the hot path)
    prices = [math.floor(10.0 ** (6.0 * j / 65536) * 100.0 + 0.5) for j in range(65536)]
    channels, urls = _channels()
    names = [f"{f} {l}" for f in FIRST_NAMES for l in LAST_NAMES]
    extras = {kind: _extras(kind) for kind in (PERSON, AUCTION, BID)}
    vocabularies = dict(channels=channels, urls=urls, names=names, cities=US_CITIES, states=US_STATES,
                        **{f"extras{kind}": v for kind, v in extras.items()})
    return dict(prices=prices, prices_np=np.array(prices, dtype=np.int64), channels=channels, urls=urls,
                names=names, extras=extras, arrays={k: pa.array(v, pa.string()) for k, v in vocabularies.items()})


def _channels() -> tuple[list, list]:
    """NUM_CHANNELS channels "channel-i" with a random item url each (9 in 10 naming the channel
    by its bit-reversed number), then the hot channels with theirs."""
    n = NUM_CHANNELS + len(HOT_CHANNELS)
    raw = _bytes_of(_mix_np(np.arange(n, dtype=np.uint64)[:, None] * np.uint64(3) + np.arange(3, dtype=np.uint64)))
    raw = raw.reshape(n, 3, 8)[:, :, :5]
    path = np.where(raw % 13 == 0, ord("_"), raw % 26 + 97).astype(np.uint8)        # 3 words of 5
    urls = [f"https://www.nexmark.com/{w[0:5]}/{w[5:10]}/{w[10:15]}/item.htm?query=1"
            for w in (row.tobytes().decode("ascii") for row in path.reshape(n, 15))]
    for i in range(NUM_CHANNELS):
        if _mix(i ^ 0xC0FFEE) % 10 > 0:
            reversed_bits = int(f"{i:032b}"[::-1], 2)       # as a signed 32-bit int, then abs
            urls[i] += f"&channel_id={abs(reversed_bits - (1 << 32) if reversed_bits >= 1 << 31 else reversed_bits)}"
    return [f"channel-{i}" for i in range(NUM_CHANNELS)] + list(HOT_CHANNELS), urls


def _extras(kind: int) -> list:
    """NUM_EXTRAS padding strings for `kind`: lowercase letters, of the length that brings an
    event to AVG_BYTES on average, ±20 % (uniform). (The standard generator cuts a fresh slice of
    a random string per event, sized to that event's other fields; a fixed set keeps `extra` a
    single vectorized take and the average size the same.)"""
    want = AVG_BYTES[kind] - OTHER_BYTES[kind]
    delta = (2 * want + 5) // 10                                          # round(want * 0.2)
    keys = (kind << 40) + np.arange(NUM_EXTRAS * 64, dtype=np.uint64).reshape(NUM_EXTRAS, 64)
    letters = _bytes_of(_mix_np(keys)) % 26 + 97                          # 512 letters per string
    return [letters[j, :want - delta + _mix(j) % (2 * delta)].tobytes().decode("ascii") for j in range(NUM_EXTRAS)]


# ============================================================= per-row events
def _string(c: NexmarkConfig, e: int, field: int, length: int) -> str:
    raw = b"".join(_h(c, e, field + j).to_bytes(8, "little") for j in range(-(-length // 8)))
    return bytes(97 + b % 26 for b in raw[:length]).decode("ascii")


def _extra(c: NexmarkConfig, kind: int, h: int) -> str:
    return _tables()["extras"][kind][h % NUM_EXTRAS] if c.pad_extra else ""


def _person_row(c: NexmarkConfig, e: int) -> dict:
    h_name, h_email, h_card, h_place = (_h(c, e, f) for f in (_F_NAME, _F_EMAIL, _F_CARD, _F_PLACE))
    user = _string(c, e, _F_EMAIL + 1, 3 + _below(_lo(h_email), 4))
    domain = _string(c, e, _F_EMAIL + 2, 3 + _below(_hi(h_email), 2))
    return {"id": _last_person(c, e) + FIRST_PERSON_ID,
            "name": f"{FIRST_NAMES[_below(_lo(h_name), len(FIRST_NAMES))]} "
                    f"{LAST_NAMES[_below(_hi(h_name), len(LAST_NAMES))]}",
            "email_address": f"{user}@{domain}.com",
            "credit_card": " ".join(f"{((h_card >> (16 * g)) & 0xFFFF) * 10_000 >> 16:04d}" for g in range(4)),
            "city": US_CITIES[_below(_lo(h_place), len(US_CITIES))],
            "state": US_STATES[_below(_hi(h_place), len(US_STATES))],
            "date_time": c.timestamp(e), "extra": _extra(c, PERSON, _h(c, e, _F_EXTRA))}


def _auction_row(c: NexmarkConfig, e: int) -> dict:
    prices = _tables()["prices"]
    ts = c.timestamp(e)
    h_seller, h_lengths, h_initial = _h(c, e, _F_SELLER), _h(c, e, _F_LENGTHS), _h(c, e, _F_INITIAL)
    if _below(_lo(h_seller), c.hot_sellers_ratio) > 0:
        seller = _last_person(c, e) // HOT_BATCH * HOT_BATCH
    else:
        seller = _random_person(c, e, _hi(h_seller))
    return {"id": _last_auction(c, e) + FIRST_AUCTION_ID,
            "item_name": _string(c, e, _F_ITEM, 3 + _below(_lo(h_lengths), 17)),
            "description": _string(c, e, _F_DESCRIPTION, 3 + _below(_hi(h_lengths), 97)),
            "initial_bid": prices[h_initial & 0xFFFF],
            "reserve": prices[h_initial & 0xFFFF] + prices[(h_initial >> 16) & 0xFFFF],
            "date_time": ts, "expires": ts + _expiry(_h(c, e, _F_EXPIRES), _auction_horizon_ms(c, e, ts)),
            "seller": seller + FIRST_PERSON_ID,
            "category": FIRST_CATEGORY_ID + _below(_hi(h_initial), NUM_CATEGORIES),
            "extra": _extra(c, AUCTION, _h(c, e, _F_EXTRA))}


def _bid_row(c: NexmarkConfig, e: int) -> dict:
    t = _tables()
    h_auction, h_bidder, h_price = _h(c, e, _F_AUCTION), _h(c, e, _F_BIDDER), _h(c, e, _F_PRICE)
    if _below(_lo(h_auction), c.hot_auction_ratio) > 0:
        auction = _last_auction(c, e) // HOT_BATCH * HOT_BATCH
    else:
        auction = _random_auction(c, e, _hi(h_auction))
    if _below(_lo(h_bidder), c.hot_bidders_ratio) > 0:   # the hot bidder is the batch's second person
        bidder = _last_person(c, e) // HOT_BATCH * HOT_BATCH + 1
    else:
        bidder = _random_person(c, e, _hi(h_bidder))
    r = _hi(h_price)          # half the bids come from the hot channels
    channel = NUM_CHANNELS + _below(r, len(HOT_CHANNELS)) if r & 1 else _below(r, NUM_CHANNELS)
    return {"auction": auction + FIRST_AUCTION_ID, "bidder": bidder + FIRST_PERSON_ID,
            "price": t["prices"][h_price & 0xFFFF], "channel": t["channels"][channel], "url": t["urls"][channel],
            "date_time": c.timestamp(e), "extra": _extra(c, BID, h_price >> 16)}


_ROW = {PERSON: _person_row, AUCTION: _auction_row, BID: _bid_row}


def _flat_row(c: NexmarkConfig, e: int) -> dict:
    kind = _kind_of(c, e)
    own = _ROW[kind](c, e)
    row = dict(_EMPTY_ROW)
    row["event_type"], row["date_time"] = kind, own["date_time"]
    for name, flat in _FLAT_COLUMNS[kind]:
        row[flat] = own[name]
    return row


# ============================================================= vectorized events
def _hashes_np(c: NexmarkConfig, e: np.ndarray, fields) -> np.ndarray:
    """(n, len(fields)) matrix of _h(c, e[r], fields[j]), one pass of numpy over all of them."""
    offset = np.asarray(fields, dtype=np.uint64) + np.uint64(c._key)     # wraps like & _M64
    return _mix_np(e.astype(np.uint64)[:, None] * np.uint64(64) + offset[None, :])


def _bytes_of(h: np.ndarray) -> np.ndarray:
    """A (n, k) hash matrix as its (n, 8k) little-endian bytes (what int.to_bytes(8, "little") gives)."""
    return np.ascontiguousarray(h, dtype="<u8").view(np.uint8)


def _pack(chars: np.ndarray, keep: np.ndarray | None, lengths: np.ndarray) -> pa.Array:
    """Row r = the bytes chars[r][keep[r]] (lengths[r] of them; all of chars[r] if keep is None),
    as Arrow strings, in one copy."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = np.ascontiguousarray(chars).ravel() if keep is None else chars[keep]
    return pa.StringArray.from_buffers(len(lengths), pa.py_buffer(offsets), pa.py_buffer(data))


def _letters_np(raw: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """Lowercase strings: row r is raw[r][:lengths[r]] mapped to a-z (as `_string` does)."""
    return _pack(raw % 26 + 97, np.arange(raw.shape[1]) < lengths[:, None], lengths)


def _extra_np(c: NexmarkConfig, kind: int, h: np.ndarray) -> pa.Array:
    if not c.pad_extra:
        return _empty_strings(len(h))
    return _tables()["arrays"][f"extras{kind}"].take(pa.array((h % np.uint64(NUM_EXTRAS)).astype(np.int64)))


def _empty_strings(n: int) -> pa.Array:
    return pa.StringArray.from_buffers(n, pa.py_buffer(np.zeros(n + 1, dtype=np.int32)), pa.py_buffer(b""))


def _take(name: str, indices: np.ndarray) -> pa.Array:
    return _tables()["arrays"][name].take(pa.array(indices, pa.int64()))


_EMAIL_TAIL = np.frombuffer(b".com", dtype=np.uint8)
_CARD_DIGITS = np.array([1000, 100, 10, 1], dtype=np.int64)
_CARD_SHIFTS = np.array([0, 16, 32, 48], dtype=np.uint64)


def _persons_np(c: NexmarkConfig, e: np.ndarray) -> dict:
    n = len(e)
    h = _hashes_np(c, e, range(_F_EXTRA + 1))          # name, email lengths, user, domain, card, place, extra
    raw = _bytes_of(h)
    first, last = _below(_lo(h[:, _F_NAME]), len(FIRST_NAMES)), _below(_hi(h[:, _F_NAME]), len(LAST_NAMES))
    user_len, domain_len = 3 + _below(_lo(h[:, _F_EMAIL]), 4), 3 + _below(_hi(h[:, _F_EMAIL]), 2)
    email, keep = np.empty((n, 15), np.uint8), np.ones((n, 15), bool)     # user(<=6) @ domain(<=4) .com
    email[:, :6], email[:, 6] = raw[:, 16:22] % 26 + 97, ord("@")
    email[:, 7:11], email[:, 11:] = raw[:, 24:28] % 26 + 97, _EMAIL_TAIL
    keep[:, :6], keep[:, 7:11] = np.arange(6) < user_len[:, None], np.arange(4) < domain_len[:, None]
    groups = (((h[:, _F_CARD, None] >> _CARD_SHIFTS) & 0xFFFF) * np.uint64(10_000) >> 16).astype(np.int64)
    card = np.full((n, 4, 5), ord(" "), np.uint8)                      # "dddd dddd dddd dddd"
    card[:, :, :4] = groups[:, :, None] // _CARD_DIGITS % 10 + ord("0")
    return {"id": _last_person(c, e) + FIRST_PERSON_ID, "name": _take("names", first * len(LAST_NAMES) + last),
            "email_address": _pack(email, keep, user_len + domain_len + 5),
            "credit_card": _pack(card.reshape(n, 20)[:, :19], None, np.full(n, 19)),
            "city": _take("cities", _below(_lo(h[:, _F_PLACE]), len(US_CITIES))),
            "state": _take("states", _below(_hi(h[:, _F_PLACE]), len(US_STATES))),
            "date_time": _timestamp_np(c, e), "extra": _extra_np(c, PERSON, h[:, _F_EXTRA])}


def _auctions_np(c: NexmarkConfig, e: np.ndarray) -> dict:
    prices = _tables()["prices_np"]
    ts = _timestamp_np(c, e)
    h = _hashes_np(c, e, range(_F_DESCRIPTION + 13))
    raw = _bytes_of(h)
    h_seller, h_initial, h_lengths = h[:, _F_SELLER], h[:, _F_INITIAL], h[:, _F_LENGTHS]
    seller = np.where(_below(_lo(h_seller), c.hot_sellers_ratio) > 0,
                      _last_person(c, e) // HOT_BATCH * HOT_BATCH, _random_person(c, e, _hi(h_seller)))
    initial = prices[(h_initial & 0xFFFF).astype(np.int64)]
    item_len, description_len = 3 + _below(_lo(h_lengths), 17), 3 + _below(_hi(h_lengths), 97)
    return {"id": _last_auction(c, e) + FIRST_AUCTION_ID,
            "item_name": _letters_np(raw[:, 8 * _F_ITEM:8 * _F_ITEM + 19], item_len),
            "description": _letters_np(raw[:, 8 * _F_DESCRIPTION:8 * _F_DESCRIPTION + 99], description_len),
            "initial_bid": initial, "reserve": initial + prices[((h_initial >> 16) & 0xFFFF).astype(np.int64)],
            "date_time": ts, "expires": ts + _expiry(h[:, _F_EXPIRES], _auction_horizon_ms(c, e, ts)),
            "seller": seller + FIRST_PERSON_ID,
            "category": FIRST_CATEGORY_ID + _below(_hi(h_initial), NUM_CATEGORIES),
            "extra": _extra_np(c, AUCTION, h[:, _F_EXTRA])}


def _bids_np(c: NexmarkConfig, e: np.ndarray) -> dict:
    h = _hashes_np(c, e, (_F_AUCTION, _F_BIDDER, _F_PRICE))
    h_auction, h_bidder, h_price = h.T
    # e is all bids, so the newest person and auction are the last of e's epoch
    epoch = e // c.total_proportion
    last_person, last_auction = (epoch + 1) * c.person_proportion - 1, (epoch + 1) * c.auction_proportion - 1
    low = np.maximum(last_auction - c.num_in_flight_auctions, 0)
    auction = np.where(_below(_lo(h_auction), c.hot_auction_ratio) > 0, last_auction // HOT_BATCH * HOT_BATCH,
                       low + _below(_hi(h_auction), last_auction - low + 1 + ID_LEAD))
    active = np.minimum(last_person + 1, c.num_active_people)
    bidder = np.where(_below(_lo(h_bidder), c.hot_bidders_ratio) > 0, last_person // HOT_BATCH * HOT_BATCH + 1,
                      last_person + 1 - active + _below(_hi(h_bidder), active + ID_LEAD))
    r = _hi(h_price)
    channel = np.where((r & 1) > 0, NUM_CHANNELS + _below(r, len(HOT_CHANNELS)), _below(r, NUM_CHANNELS))
    return {"auction": auction + FIRST_AUCTION_ID, "bidder": bidder + FIRST_PERSON_ID,
            "price": _tables()["prices_np"][(h_price & 0xFFFF).astype(np.int64)],
            "channel": _take("channels", channel), "url": _take("urls", channel),
            "date_time": _timestamp_np(c, e), "extra": _extra_np(c, BID, h_price >> 16)}


_COLUMNS_NP = {PERSON: _persons_np, AUCTION: _auctions_np, BID: _bids_np}


def _flat_batch(c: NexmarkConfig, e: np.ndarray) -> pa.RecordBatch:
    n = len(e)
    kinds = _kind_of(c, e)
    columns = {"event_type": kinds, "date_time": _timestamp_np(c, e)}
    for kind in (PERSON, AUCTION, BID):
        mine = kinds == kind
        rows = np.flatnonzero(mine)
        if len(rows) == 0:
            columns.update((flat, pa.nulls(n, SCHEMA.field(flat).type)) for _, flat in _FLAT_COLUMNS[kind])
            continue
        own = _COLUMNS_NP[kind](c, e[rows])
        if len(rows) == n:
            columns.update((flat, own[name]) for name, flat in _FLAT_COLUMNS[kind])
            continue
        columns.update(_spread(own, _FLAT_COLUMNS[kind], rows, n, mine))
    return pa.RecordBatch.from_pydict(columns, schema=SCHEMA)


def _spread(own: dict, names: list, rows: np.ndarray, n: int, mine: np.ndarray) -> list:
    """One kind's columns as n-row columns, the i-th value at row rows[i] and null elsewhere.
    With before[r] = how many of the kind's rows precede row r, a number column is a gather at
    before[r], and a string column keeps its data buffer and takes its offsets at before[r]
    (rows ascending, so the bytes stay in order; other rows get empty strings)."""
    validity, nulls = pa.py_buffer(np.packbits(mine, bitorder="little")), n - len(rows)
    before = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(mine, out=before[1:])
    at = np.minimum(before[:-1], len(rows) - 1)         # (any own row for the other kinds' rows: masked)
    spread = []
    for name, flat in names:
        values = own[name]
        if isinstance(values, pa.Array):                # built here: offset 0, no nulls
            offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[before]
            column = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), values.buffers()[2], validity, nulls)
        else:
            column = pa.Array.from_buffers(pa.int64(), n, [validity, pa.py_buffer(values[at])], nulls)
        spread.append((flat, column))
    return spread
