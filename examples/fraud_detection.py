"""Fraud detection with event-time timers and broadcast rules.

Card transactions are checked against rules that operations staff change while the job runs.
The rules are a second, *broadcast* stream: every subtask keeps the same copy in broadcast
state. The transactions are keyed by card, so each card's recent history lives in keyed state.
A `KeyedBroadcastProcessFunction` joins the two:

- `process_broadcast_element` stores each rule version under its name, effective from its
  timestamp, in the broadcast state (every subtask applies it the same way);
- `process_element` does not judge a transaction at once — the two inputs interleave in
  arrival order — but parks it in keyed state and sets an event-time timer at its timestamp;
- `on_timer` fires once the watermark (the minimum of both inputs) has passed the transaction,
  so every rule version up to then has arrived, and judges it by the rules in force at its
  time: an amount above `max-amount`, or more than `burst.count` transactions of the card
  within `burst.within_s` seconds. A second timer, `within_s` after each transaction, drops the
  card's history once it can no longer matter, so the keyed state stays small.

Judging by event time makes the alerts independent of arrival order: the same input gives the
same alerts on every run, at any parallelism, and after a restore from a checkpoint.

Run it:

    python examples/fraud_detection.py
"""

from __future__ import annotations

import streamsnap as ss

START = 1_795_000_000_000       # epoch milliseconds
CARDS = ["card-a", "card-b", "card-c", "card-d", "card-e"]
RULES = ss.MapStateDescriptor("rules")      # rule name -> [[effective from (ms), parameters], ...]

# The rule changes, in the order operations staff made them.
RULE_CHANGES = [
    {"rule": "max-amount", "ts": START, "params": {"limit_cents": 50_000}},
    {"rule": "burst", "ts": START, "params": {"count": 3, "within_s": 60}},
    {"rule": "max-amount", "ts": START + 30 * 60_000, "params": {"limit_cents": 30_000}},  # tightened at +30 min
    {"rule": "burst", "ts": START + 45 * 60_000, "params": None},                           # switched off at +45 min
]


def transaction(i: int) -> dict:
    """Transaction i, 15 s after transaction i-1. The first 8 of every 50 come in runs of four
    on one card (bursts); the others spread over the cards. Amounts are under 200.00, except
    every 17th transaction's, which is 400.00-699.99."""
    card = CARDS[(i // 4) % 5] if i % 50 < 8 else CARDS[(i * 7) % 5]
    amount = (i * 7_919) % 20_000 if i % 17 else 40_000 + (i * 131) % 30_000
    return {"tx": i, "card": card, "amount_cents": amount, "ts": START + i * 15_000}


def in_force(versions, ts):
    """The parameters of the last version effective at `ts` (None: the rule is off)."""
    current = None
    for effective, params in versions or []:
        if effective <= ts:
            current = params
    return current


class FraudCheck(ss.KeyedBroadcastProcessFunction):
    def open(self, ctx):
        self.pending = ctx.get_state(ss.MapStateDescriptor("pending"))     # ts -> transaction waiting for the watermark
        self.recent = ctx.get_state(ss.ListStateDescriptor("recent"))      # the card's recent transaction times

    def process_broadcast_element(self, change, ctx):
        rules = ctx.get_broadcast_state(RULES)
        versions = sorted((rules.get(change["rule"]) or []) + [[change["ts"], change["params"]]],
                          key=lambda v: v[0])
        rules.put(change["rule"], versions)

    def process_element(self, tx, ctx):
        self.pending.put(tx["ts"], tx)
        ctx.timer_service().register_event_time_timer(tx["ts"])

    def on_timer(self, timestamp, ctx):
        rules = ctx.get_broadcast_state(RULES)
        burst = in_force(rules.get("burst"), timestamp)
        window_ms = 1000 * (burst["within_s"] if burst else 60)
        # Forget transactions too old to count towards a burst (this also runs on cleanup timers).
        self.recent.update([ts for ts in self.recent.get() if ts > timestamp - window_ms])
        tx = self.pending.get(timestamp)
        if tx is None:
            return
        self.pending.remove(timestamp)
        self.recent.add(timestamp)
        ctx.timer_service().register_event_time_timer(timestamp + window_ms)   # cleanup

        limit = in_force(rules.get("max-amount"), timestamp)
        if limit and tx["amount_cents"] > limit["limit_cents"]:
            yield {"tx": tx["tx"], "card": ctx.current_key, "rule": "max-amount",
                   "detail": f"{tx['amount_cents'] / 100:.2f} > {limit['limit_cents'] / 100:.2f}"}
        if burst and len(self.recent.get()) > burst["count"]:
            yield {"tx": tx["tx"], "card": ctx.current_key, "rule": "burst",
                   "detail": f"{len(self.recent.get())} transactions in {burst['within_s']} s"}


def main(spark=None, transactions: int = 240) -> list[dict]:
    """Checks `transactions` transactions (15 s apart); returns the alerts sorted by transaction."""
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(5).with_timestamp_assigner("ts")
    txs = env.from_source(ss.sources.Generator(transaction, count=transactions), name="transactions",
                          watermark_strategy=strategy)
    rules = env.from_collection(RULE_CHANGES, name="rules").assign_timestamps_and_watermarks(strategy)
    (txs.key_by("card")
        .connect(rules.broadcast(RULES))
        .process(FraudCheck(), name="fraud check", uid="fraud-check")
        .sink_to(ss.sinks.Collect(), name="alerts"))
    result = env.execute("fraud detection")

    alerts = sorted(result.rows("alerts"), key=lambda a: (a["tx"], a["rule"]))
    print(f"{len(alerts)} alerts for {transactions} transactions:")
    for a in alerts:
        minute = (transaction(a["tx"])["ts"] - START) / 60_000
        print(f"  +{minute:5.2f} min  tx {a['tx']:>3} {a['card']}  {a['rule']:<10} {a['detail']}")
    return alerts


if __name__ == "__main__":
    main()
