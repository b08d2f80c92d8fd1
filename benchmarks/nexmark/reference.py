"""Plain-Python answers of the Nexmark queries: the yardstick streamsnap's implementations are
checked against.

Each query takes events as `streamsnap.connectors.nexmark` makes them (flat dicts with an
`event_type`; `nexmark.events(config)(i)` for i in a range, or `event(...)` below) — all of a
bounded input, in any order — and returns the query's final output as a sorted list of tuples.
The semantics are those of the standard queries as Flink's Nexmark runs them, in event time:
`date_time` (epoch ms) puts an event in the windows [start, start + size) with start a multiple
of the slide (aligned to the epoch); the end of the input closes every window and every auction
(a bounded source ends with the maximum watermark), so the answer depends neither on arrival
order nor on out-of-orderness. Window parameters are in milliseconds, the Flink queries' by
default. Where an output differs in form from Flink's SQL, the query's docstring says how.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from streamsnap.connectors import nexmark

DOLLAR_TO_EURO = 0.908
_PREFIX = {nexmark.PERSON: "person_", nexmark.AUCTION: "auction_", nexmark.BID: "bid_"}


def event(kind: int, date_time: int, **fields) -> dict:
    """A hand-made event of `kind` (nexmark.PERSON / AUCTION / BID) in the flat schema:
    `fields` unprefixed (id=, name=, ...), unset columns None."""
    row = dict.fromkeys(nexmark.SCHEMA.names)
    row.update({"event_type": kind, "date_time": date_time})
    for name, value in fields.items():
        if _PREFIX[kind] + name not in row:
            raise KeyError(f"{name!r} is not a field of kind {kind}")
        row[_PREFIX[kind] + name] = value
    return row


def of_kind(events, kind: int) -> list[dict]:
    """The events of `kind`, unprefixed (as nexmark.persons()/auctions()/bids() give them)."""
    prefix = _PREFIX[kind]
    return [{"date_time": e["date_time"], **{k[len(prefix):]: v for k, v in e.items() if k.startswith(prefix)}}
            for e in events if e["event_type"] == kind]


def window_starts(t: int, size_ms: int, slide_ms: int) -> range:
    """Starts of the windows [s, s + size) containing t, s a multiple of the slide."""
    last = t - t % slide_ms
    return range(last, t - size_ms, -slide_ms)


def q0(events) -> list[tuple]:
    """Pass-through: every bid as (auction, bidder, price, date_time, extra)."""
    return sorted((b["auction"], b["bidder"], b["price"], b["date_time"], b["extra"])
                  for b in of_kind(events, nexmark.BID))


def q1(events) -> list[tuple]:
    """Currency conversion: every bid as (auction, bidder, price * 0.908 (euros, a float),
    date_time, extra). Flink's SQL gives a DECIMAL; the float is the same IEEE product numpy
    computes."""
    return sorted((b["auction"], b["bidder"], b["price"] * DOLLAR_TO_EURO, b["date_time"], b["extra"])
                  for b in of_kind(events, nexmark.BID))


def q2(events) -> list[tuple]:
    """Selection: (auction, price) of the bids on auctions whose id % 123 == 0."""
    return sorted((b["auction"], b["price"]) for b in of_kind(events, nexmark.BID) if b["auction"] % 123 == 0)


def q3(events) -> list[tuple]:
    """Local item suggestion: (name, city, state, auction id) for each auction in category 10
    whose seller is a person in OR, ID or CA — an unwindowed inner join of all auctions with all
    persons (an auction may come before its seller)."""
    local = {p["id"]: p for p in of_kind(events, nexmark.PERSON) if p["state"] in ("OR", "ID", "CA")}
    return sorted((local[a["seller"]]["name"], local[a["seller"]]["city"], local[a["seller"]]["state"], a["id"])
                  for a in of_kind(events, nexmark.AUCTION) if a["category"] == 10 and a["seller"] in local)


def q4(events, *, require_reserve: bool = False) -> list[tuple]:
    """Average selling price per category: (category, average as a float). An auction's selling
    price is its highest bid with auction date_time <= bid date_time <= expires (inclusive, as
    Flink's BETWEEN); auctions without such a bid are not counted. Unwindowed: an auction closes
    at `expires`, and all have closed at the end of the input. With `require_reserve` only bids
    >= the reserve count (Beam's "winning bids"); Flink's SQL ignores the reserve. (Flink's AVG
    over BIGINT truncates to an integer; compare this float with a tolerance.)"""
    auctions = {a["id"]: a for a in of_kind(events, nexmark.AUCTION)}
    final: dict[int, int] = {}
    for b in of_kind(events, nexmark.BID):
        a = auctions.get(b["auction"])
        if (a is not None and a["date_time"] <= b["date_time"] <= a["expires"]
                and (not require_reserve or b["price"] >= a["reserve"])):
            final[a["id"]] = max(final.get(a["id"], b["price"]), b["price"])
    prices = defaultdict(list)
    for auction_id, price in final.items():
        prices[auctions[auction_id]["category"]].append(price)
    return sorted((category, sum(p) / len(p)) for category, p in prices.items())


def q5(events, *, size_ms: int = 10_000, slide_ms: int = 2_000) -> list[tuple]:
    """Hot items: in each sliding window [start, start + 10 s) starting every 2 s, the auctions
    with the most bids: (window_start, window_end, auction, count) for every auction whose bid
    count equals the window's maximum (ties all listed). Flink's output is (auction, count)."""
    counts: Counter = Counter()
    for b in of_kind(events, nexmark.BID):
        for start in window_starts(b["date_time"], size_ms, slide_ms):
            counts[start, b["auction"]] += 1
    top: dict[int, int] = {}
    for (start, _), n in counts.items():
        top[start] = max(top.get(start, 0), n)
    return sorted((start, start + size_ms, auction, n) for (start, auction), n in counts.items() if n == top[start])


def q7(events, *, size_ms: int = 10_000) -> list[tuple]:
    """Highest bid: in each tumbling window [start, start + 10 s), the bids with the window's
    highest price: (window_start, window_end, auction, bidder, price, date_time). (Flink's SQL
    joins the maximum back to bids in [end - 10 s, end], so a bid at exactly `end` would also be
    matched to the earlier window; here it is only in its own.)"""
    windows = defaultdict(list)
    for b in of_kind(events, nexmark.BID):
        windows[b["date_time"] - b["date_time"] % size_ms].append(b)
    return sorted((start, start + size_ms, b["auction"], b["bidder"], b["price"], b["date_time"])
                  for start, bids in windows.items() for top in [max(b["price"] for b in bids)]
                  for b in bids if b["price"] == top)


def q8(events, *, size_ms: int = 10_000) -> list[tuple]:
    """New users: (person id, name, window_start) for each person who registered and, in the
    same tumbling window [start, start + 10 s), created an auction as its seller."""
    sellers = {(a["seller"], a["date_time"] - a["date_time"] % size_ms) for a in of_kind(events, nexmark.AUCTION)}
    return sorted({(p["id"], p["name"], start) for p in of_kind(events, nexmark.PERSON)
                   for start in [p["date_time"] - p["date_time"] % size_ms] if (p["id"], start) in sellers})


QUERIES = {"q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q7": q7, "q8": q8}
