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

import re
from collections import Counter, defaultdict
from datetime import datetime, timezone

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




# ----------------------------------------------------------------------- q6, q9: closed auctions
def winning_bids(events) -> dict[int, tuple[dict, dict]]:
    """Per auction id, (auction, winning bid) for every auction with a bid in [date_time,
    expires] (inclusive): the highest price, the earliest bid among equal prices, then the
    lowest bidder id (Flink's q9 ranks by price DESC, dateTime ASC and leaves further ties open)."""
    auctions = {a["id"]: a for a in of_kind(events, nexmark.AUCTION)}
    best: dict[int, dict] = {}
    for b in of_kind(events, nexmark.BID):
        a = auctions.get(b["auction"])
        if a is not None and a["date_time"] <= b["date_time"] <= a["expires"]:
            old = best.get(a["id"])
            if old is None or bid_rank(b) < bid_rank(old):
                best[a["id"]] = b
    return {i: (auctions[i], b) for i, b in best.items()}


def bid_rank(b: dict) -> tuple:
    """A bid's place in an auction's ranking, smallest first: price descending, then date_time,
    bidder, extra ascending (q9's winner, q19's top 10)."""
    return -b["price"], b["date_time"], b["bidder"], b["extra"]


def q6(events, *, last: int = 10) -> list[tuple]:
    """Average selling price by seller: (seller, average) of the final prices of the seller's
    last 10 closed auctions (ordered by expires, then auction id) — its value after every
    auction has closed. (Flink's SQL for q6 is an OVER window Flink cannot run.)"""
    closed = defaultdict(list)
    for a, b in winning_bids(events).values():
        closed[a["seller"]].append((a["expires"], a["id"], b["price"]))
    out = []
    for seller, sold in closed.items():
        prices = [p for _, _, p in sorted(sold)[-last:]]
        out.append((seller, sum(prices) / len(prices)))
    return sorted(out)


AUCTION_FIELDS = ("id", "item_name", "description", "initial_bid", "reserve", "date_time", "expires", "seller",
                  "category", "extra")


def q9(events) -> list[tuple]:
    """Winning bids: per auction with a bid in range, the auction's fields then the winning
    bid's (bidder, price, date_time, extra)."""
    return sorted(tuple(a[f] for f in AUCTION_FIELDS) + (b["bidder"], b["price"], b["date_time"], b["extra"])
                  for a, b in winning_bids(events).values())


# ----------------------------------------------------------------------- stateless
def day_and_minute(ms: int) -> tuple[str, str]:
    """('yyyy-MM-dd', 'HH:mm') of an epoch-ms instant, in UTC."""
    t = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return t.strftime("%Y-%m-%d"), t.strftime("%H:%M")


def q10(events) -> list[tuple]:
    """Log to file system: every bid as (auction, bidder, price, date_time, extra, dt, hm), dt
    and hm its day and minute in UTC (the partition columns)."""
    return sorted((b["auction"], b["bidder"], b["price"], b["date_time"], b["extra"], *day_and_minute(b["date_time"]))
                  for b in of_kind(events, nexmark.BID))


def q14(events) -> list[tuple]:
    """Calculation: bids whose euro price is in (1 M, 50 M), as (auction, bidder, euro price,
    bid time type by the UTC hour — dayTime 8-18, nightTime <= 6 or >= 20, else otherTime —,
    date_time, extra, the number of 'c' in extra)."""
    out = []
    for b in of_kind(events, nexmark.BID):
        price = b["price"] * DOLLAR_TO_EURO
        if 1_000_000 < price < 50_000_000:
            hour = datetime.fromtimestamp(b["date_time"] / 1000, tz=timezone.utc).hour
            kind = "dayTime" if 8 <= hour <= 18 else "nightTime" if hour <= 6 or hour >= 20 else "otherTime"
            out.append((b["auction"], b["bidder"], price, kind, b["date_time"], b["extra"], b["extra"].count("c")))
    return sorted(out)


HOT_CHANNEL_IDS = {"apple": "0", "google": "1", "facebook": "2", "baidu": "3"}
CHANNEL_ID = re.compile(r"(&|^)channel_id=([^&]*)")


def q21(events) -> list[tuple]:
    """Add channel id: (auction, bidder, price, channel, channel_id) — the hot channels' fixed
    ids, else the url's channel_id parameter; bids with neither are dropped."""
    out = []
    for b in of_kind(events, nexmark.BID):
        found = CHANNEL_ID.search(b["url"])
        channel_id = HOT_CHANNEL_IDS.get(b["channel"].lower(), found.group(2) if found else None)
        if channel_id is not None:
            out.append((b["auction"], b["bidder"], b["price"], b["channel"], channel_id))
    return sorted(out)


def q22(events) -> list[tuple]:
    """Get URL directories: (auction, bidder, price, channel, dir1, dir2, dir3), the url's path
    parts 3-5 when split at '/' (Flink's SPLIT_INDEX, 0-based)."""
    return sorted((b["auction"], b["bidder"], b["price"], b["channel"], *b["url"].split("/")[3:6])
                  for b in of_kind(events, nexmark.BID))


# ----------------------------------------------------------------------- joins
SIDE_KEYS = 10_000


def side_value(key: int) -> str:
    """q13's side table: the value of key 0 <= key < SIDE_KEYS."""
    return f"value-{key * 7 % 1_000}"


def q13(events) -> list[tuple]:
    """Bounded side input join: (auction, bidder, price, date_time, value) per bid, the value
    of side-table key auction % 10 000."""
    return sorted((b["auction"], b["bidder"], b["price"], b["date_time"], side_value(b["auction"] % SIDE_KEYS))
                  for b in of_kind(events, nexmark.BID))


def q20(events) -> list[tuple]:
    """Expand bid with auction: every bid joined with its auction if that is in category 10
    (an unwindowed inner join): the bid's (auction, bidder, price, channel, url, date_time,
    extra) then the auction's (item_name, description, initial_bid, reserve, date_time,
    expires, seller, category, extra)."""
    auctions = {a["id"]: a for a in of_kind(events, nexmark.AUCTION) if a["category"] == 10}
    return sorted((b["auction"], b["bidder"], b["price"], b["channel"], b["url"], b["date_time"], b["extra"])
                  + tuple(a[f] for f in AUCTION_FIELDS[1:])
                  for b in of_kind(events, nexmark.BID) for a in [auctions.get(b["auction"])] if a is not None)


# ----------------------------------------------------------------------- windows by session and by wall clock
def q11(events, *, gap_ms: int = 10_000) -> list[tuple]:
    """User sessions: (bidder, bids, session start, session end) per session of a bidder's bids,
    a session ending `gap` after its last bid; bids at most `gap` apart share one (as Flink's
    touching session windows merge)."""
    times = defaultdict(list)
    for b in of_kind(events, nexmark.BID):
        times[b["bidder"]].append(b["date_time"])
    out = []
    for bidder, ts in times.items():
        ts.sort()
        start = last = ts[0]
        n = 0
        for t in ts:
            if t > last + gap_ms:
                out.append((bidder, n, start, last + gap_ms))
                start, n = t, 0
            last, n = t, n + 1
        out.append((bidder, n, start, last + gap_ms))
    return sorted(out)


def q12(events) -> dict[int, int]:
    """Processing-time windows: bids per bidder. The windows are wall-clock ones, so which
    window a bid falls in is not a function of the input: the reference is each bidder's total
    (what the windows of a run add up to, given every window fired)."""
    return dict(Counter(b["bidder"] for b in of_kind(events, nexmark.BID)))


# ----------------------------------------------------------------------- reports (per day)
RANK_LIMITS = (10_000, 1_000_000)   # rank 1: price < 10 000, rank 2: < 1 000 000, rank 3: the rest


def price_rank(price: int) -> int:
    return 1 if price < RANK_LIMITS[0] else 2 if price < RANK_LIMITS[1] else 3


def _statistics(bids) -> tuple:
    """q15/q16's 12 counts: bids, bidders and auctions, each in total and per price rank."""
    ranks = [price_rank(b["price"]) for b in bids]
    counts = (len(bids), *(ranks.count(r) for r in (1, 2, 3)))
    distinct = tuple(len({b[field] for b, r in zip(bids, ranks) if rank in (0, r)})
                     for field in ("bidder", "auction") for rank in (0, 1, 2, 3))
    return counts + distinct


def q15(events) -> list[tuple]:
    """Bidding statistics report: per UTC day, (day, bids, rank 1-3 bids, distinct bidders,
    rank 1-3 distinct bidders, distinct auctions, rank 1-3 distinct auctions)."""
    days = defaultdict(list)
    for b in of_kind(events, nexmark.BID):
        days[day_and_minute(b["date_time"])[0]].append(b)
    return sorted((day, *_statistics(bids)) for day, bids in days.items())


def q16(events) -> list[tuple]:
    """Channel statistics report: per channel and UTC day, (channel, day, the latest 'HH:mm' of
    a bid, then q15's 12 counts)."""
    groups = defaultdict(list)
    for b in of_kind(events, nexmark.BID):
        groups[b["channel"], day_and_minute(b["date_time"])[0]].append(b)
    return sorted((channel, day, max(day_and_minute(b["date_time"])[1] for b in bids), *_statistics(bids))
                  for (channel, day), bids in groups.items())


def q17(events) -> list[tuple]:
    """Auction statistics report: per auction and UTC day, (auction, day, bids, rank 1-3 bids,
    min price, max price, average price (a float), sum of prices)."""
    groups = defaultdict(list)
    for b in of_kind(events, nexmark.BID):
        groups[b["auction"], day_and_minute(b["date_time"])[0]].append(b["price"])
    out = []
    for (auction, day), prices in groups.items():
        ranks = [price_rank(p) for p in prices]
        out.append((auction, day, len(prices), ranks.count(1), ranks.count(2), ranks.count(3), min(prices),
                    max(prices), sum(prices) / len(prices), sum(prices)))
    return sorted(out)


# ----------------------------------------------------------------------- dedup and top-N
BID_FIELDS = ("auction", "bidder", "price", "channel", "url", "date_time", "extra")


def q18(events) -> list[tuple]:
    """Find last bid: per (bidder, auction), its latest bid (by date_time, then the greatest
    price) with all its fields."""
    last: dict[tuple, dict] = {}
    for b in of_kind(events, nexmark.BID):
        key = b["bidder"], b["auction"]
        if key not in last or (b["date_time"], b["price"]) > (last[key]["date_time"], last[key]["price"]):
            last[key] = b
    return sorted(tuple(b[f] for f in BID_FIELDS) for b in last.values())


def q19(events, *, n: int = 10) -> list[tuple]:
    """Auction top-10 price: per auction its 10 highest bids (ranked as q9's winner) as
    (auction, rank 1-10, bidder, price, date_time)."""
    bids = defaultdict(list)
    for b in of_kind(events, nexmark.BID):
        bids[b["auction"]].append(b)
    return sorted((auction, rank, b["bidder"], b["price"], b["date_time"])
                  for auction, group in bids.items()
                  for rank, b in enumerate(sorted(group, key=bid_rank)[:n], start=1))


QUERIES = {"q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q6": q6, "q7": q7, "q8": q8, "q9": q9,
           "q10": q10, "q11": q11, "q12": q12, "q13": q13, "q14": q14, "q15": q15, "q16": q16, "q17": q17,
           "q18": q18, "q19": q19, "q20": q20, "q21": q21, "q22": q22}
