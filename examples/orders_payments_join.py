"""Orders ⋈ payments: an event-time interval join.

An order counts as paid when a payment for it arrives within 15 minutes after the order was
placed. The two streams are keyed by order id and joined with
`orders.interval_join(payments).between(0, 15 * 60)`: for every order and every payment of the
same order with `order.ts <= payment.ts <= order.ts + 15 min`, a `ProcessJoinFunction` emits
one row. Orders paid in instalments match once per instalment; payments made too late (or
orders never paid) match nothing, and the job lists those orders from its output.

Both inputs carry a bounded-out-of-orderness watermark. Rows wait in keyed state only until the
watermark passes the end of their interval, so the join's state stays small however long the
streams run.

Run it:

    python examples/orders_payments_join.py
"""

from __future__ import annotations

import streamsnap as ss

PAY_WITHIN = 15 * 60          # seconds after the order
START = 1_795_000_000_000      # event timestamps are epoch milliseconds
MINUTE = 60_000


def order(i: int) -> dict:
    """Order i, placed 20 s after order i-1."""
    return {"order": f"o{i:03d}", "customer": f"c{i % 7}", "amount_cents": 1_000 + (i * 379) % 9_000,
            "ts": START + i * 20_000}


def payments_of(i: int) -> list[dict]:
    """The payments of order i: none for every tenth order, two instalments for every seventh,
    else one, made 0-24 minutes after the order (so some are too late)."""
    if i % 10 == 9:
        return []
    o = order(i)
    delay = (i * 7_919) % 25 * MINUTE + (i * 13) % 60 * 1_000
    if i % 7 == 3:
        half = o["amount_cents"] // 2
        return [{"payment": f"p{i:03d}a", "order": o["order"], "amount_cents": half, "ts": o["ts"] + delay // 2},
                {"payment": f"p{i:03d}b", "order": o["order"], "amount_cents": o["amount_cents"] - half,
                 "ts": o["ts"] + delay}]
    return [{"payment": f"p{i:03d}", "order": o["order"], "amount_cents": o["amount_cents"], "ts": o["ts"] + delay}]


def inputs(orders: int) -> tuple[list[dict], list[dict]]:
    """The two streams in arrival order: payments arrive in the order they were made."""
    payments = sorted((p for i in range(orders) for p in payments_of(i)), key=lambda p: p["ts"])
    return [order(i) for i in range(orders)], payments


class PaidOrder(ss.ProcessJoinFunction):
    def process_element(self, order, payment, ctx):
        yield {"order": order["order"], "customer": order["customer"], "payment": payment["payment"],
               "amount_cents": payment["amount_cents"],
               "paid_after_s": (ctx.right_timestamp() - ctx.left_timestamp()) // 1000}


def main(spark=None, orders: int = 60) -> dict:
    """Joins `orders` orders with their payments; returns the matches and the unpaid orders."""
    order_rows, payment_rows = inputs(orders)
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    # Each input is in time order within 10 minutes (payments are sorted; orders strictly so).
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(600).with_timestamp_assigner("ts")
    order_stream = env.from_collection(order_rows, name="orders").assign_timestamps_and_watermarks(strategy)
    payment_stream = env.from_collection(payment_rows, name="payments").assign_timestamps_and_watermarks(strategy)

    (order_stream.key_by("order")
        .interval_join(payment_stream.key_by("order"))
        .between(0, PAY_WITHIN)                       # seconds: order.ts <= payment.ts <= order.ts + 15 min
        .process(PaidOrder(), name="paid orders", uid="paid-orders")
        .sink_to(ss.sinks.Collect(), name="paid"))
    result = env.execute("orders-payments")

    matches = sorted(result.rows("paid"), key=lambda r: r["payment"])
    paid = {}
    for m in matches:
        paid[m["order"]] = paid.get(m["order"], 0) + m["amount_cents"]
    unpaid = sorted(o["order"] for o in order_rows if paid.get(o["order"], 0) < o["amount_cents"])
    print(f"{len(matches)} payments matched {len(paid)} orders within {PAY_WITHIN // 60} minutes, e.g.:")
    for m in matches[:5]:
        print(f"  {m['order']} ({m['customer']}) {m['payment']}: {m['amount_cents'] / 100:.2f} "
              f"after {m['paid_after_s']} s")
    print(f"{len(unpaid)} orders not (fully) paid in time: {', '.join(unpaid)}")
    return {"matches": matches, "unpaid": unpaid}


if __name__ == "__main__":
    main()
