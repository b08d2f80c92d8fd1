"""Nexmark's ranking queries: q18 (each bidder's last bid per auction: deduplication keeping
the latest) and q19 (each auction's 10 highest bids: top-N). Flink's planner turns their
ROW_NUMBER() OVER ... queries into its Deduplicate and Rank operators; here they are the keyed
stream's `deduplicate` and `top_n`. Both emit updates (upsert streams): the last row per key
(q18: per bidder and auction; q19: per auction and rank) is the answer."""

from __future__ import annotations

from benchmarks.nexmark import kinds


def q18(stream):
    """Find last bid: per (bidder, auction), the latest bid (by date_time, then price)."""
    return kinds.bid_stream(stream, "q18 bids").key_by(["bidder", "auction"]) \
        .deduplicate(keep="last", order_by=["date_time", "price"], name="q18 last")


def q19(stream):
    """Auction top-10 price: per auction its 10 highest bids (highest price, then earliest,
    then lowest bidder, extra), ranked 1-10 in the column `rank`."""
    return kinds.bid_stream(stream, "q19 bids").key_by("auction") \
        .top_n(10, by=["price", "date_time", "bidder", "extra"], descending=[True, False, False, False],
               name="q19 top 10")
