"""Deduplication with state TTL, then revenue per merchant counted once per payment.

A payment gateway delivers its events at least once: after a timeout it sends an event again,
so the stream holds retries of some events a few positions later. The job keys the events by
their id and keeps one flag per id in a `ValueState` with a time-to-live
(`ss.StateTtlConfig(ttl)`): the first occurrence passes, later ones go to a side output. Without
the TTL the job would remember every id it ever saw; with it an id is forgotten `ttl` seconds
(of processing time) after it was first seen — choose it longer than the longest retry delay
of the sender. Expired flags are removed when read and left out of checkpoints and savepoints.

Downstream, a rolling `sum` per merchant adds up each payment once.

Run it:

    python examples/deduplication.py
"""

from __future__ import annotations

import streamsnap as ss

MERCHANTS = ["bakery", "books", "garden", "music"]
DUPLICATE = ss.OutputTag("duplicates")


def payment(n: int) -> dict:
    return {"id": f"pay-{n:05d}", "merchant": MERCHANTS[n * 7 % 4], "amount_cents": 100 + n * 37 % 900}


def delivery(i: int) -> dict:
    """Delivery i of the gateway: deliveries 0, 1, 3, 4, 6, 7, ... are new payments 0, 1, 2, 3,
    4, 5, ...; every third delivery is a retry of one of the last eight payments, and every
    ninth a second retry."""
    latest = i - 1 - i // 3                # the newest payment delivered before delivery i
    if i % 9 == 8:
        n = latest - 3
    elif i % 3 == 2:
        n = latest - i * 5 % 8
    else:
        n = i - i // 3
    return {**payment(max(n, 0)), "delivery": i}


class FirstOccurrence(ss.KeyedProcessFunction):
    """Keyed by payment id: passes the first delivery of each id within the TTL."""

    def __init__(self, ttl: float):
        self.ttl = ttl

    def open(self, ctx):
        self.seen = ctx.get_state(ss.ValueStateDescriptor("seen", ttl=ss.StateTtlConfig(self.ttl)))

    def process_element(self, row, ctx):
        if self.seen.value():
            ctx.output(DUPLICATE, {"id": row["id"], "delivery": row["delivery"]})
            return
        self.seen.update(True)
        yield row


def main(spark=None, deliveries: int = 3_000, ttl: float = 3_600) -> dict:
    """Deduplicates `deliveries` deliveries (TTL `ttl` seconds); returns payments passed,
    duplicates dropped and revenue per merchant."""
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    events = env.from_source(ss.sources.Generator(delivery, count=deliveries), name="gateway")
    unique = events.key_by("id").process(FirstOccurrence(ttl), name="dedup", uid="dedup")
    unique.sink_to(ss.sinks.Collect(), name="payments")
    unique.get_side_output(DUPLICATE).sink_to(ss.sinks.Collect(), name="duplicates")
    unique.key_by("merchant").sum("amount_cents", name="revenue", uid="revenue") \
          .sink_to(ss.sinks.Collect(), name="revenue")
    result = env.execute("deduplicate payments")

    revenue = {}
    for row in result.rows("revenue"):          # running sums: the largest is the total
        revenue[row["merchant"]] = max(revenue.get(row["merchant"], 0), row["amount_cents"])
    out = {"payments": sorted(r["id"] for r in result.rows("payments")),
           "duplicates": len(result.rows("duplicates")), "revenue": revenue}
    print(f"{deliveries} deliveries: {len(out['payments'])} payments, {out['duplicates']} duplicates dropped")
    for merchant in sorted(revenue):
        print(f"  {merchant:<7} {revenue[merchant] / 100:>10,.2f}")
    return out


if __name__ == "__main__":
    main()
