"""Two-input operators on real Spark: keyed co-process enrichment, interval join, union of
three streams, and a SIGKILL of a two-input task with exactly-once checkpoints."""

from __future__ import annotations

import os
import signal
from collections import Counter

import pytest

import streamsnap as ss
from tests.integration.support import HeldGenerator, release, wait_completed
from tests.integration.test_event_time import read_parquet_rows

pytestmark = pytest.mark.spark

USERS = 7
DELAY = 0.3          # seconds of out-of-orderness the strategies allow
JITTER = 250         # ms of jitter in the data: within DELAY


def rule(i: int) -> dict:
    """Rule updates of side b: every user gets a new version every 70 ms of event time."""
    return {"uid": i % USERS, "version": i, "ts": i * 10 + (i * 7919) % JITTER}


def click(i: int) -> dict:
    return {"user": i % USERS, "click": i, "ts": i * 6 + (i * 104729) % JITTER}


def reference_enrichment(clicks: int, rules: int) -> list[tuple]:
    out = []
    history = sorted((rule(i) for i in range(rules)), key=lambda r: r["ts"])
    for c in (click(i) for i in range(clicks)):
        known = [r for r in history if r["uid"] == c["user"] and r["ts"] <= c["ts"]]
        # two versions at the same time: the higher one wins (as in Enrich)
        latest = max(known, key=lambda r: (r["ts"], r["version"]))["version"] if known else None
        out.append((c["click"], latest))
    return sorted(out, key=lambda t: t[0])


class Enrich(ss.KeyedCoProcessFunction):
    """Event-time temporal join: a click is answered when the watermark reaches its time, with
    the user's latest rule at or before that time. The watermark is the minimum of both inputs,
    so by then every rule up to the click's time has arrived; timers fire in time order, so
    rules older than the one used can go."""

    def open(self, ctx):
        self.rules = ctx.get_state(ss.MapStateDescriptor("rules"))     # ts -> version
        self.clicks = ctx.get_state(ss.MapStateDescriptor("clicks"))   # ts -> [click ids]

    def process_element1(self, row, ctx):
        ts = ctx.timestamp()
        self.clicks.put(ts, (self.clicks.get(ts) or []) + [row["click"]])
        ctx.timer_service().register_event_time_timer(ts)

    def process_element2(self, row, ctx):
        ts = ctx.timestamp()
        self.rules.put(ts, max(row["version"], self.rules.get(ts, -1)))

    def on_timer(self, timestamp, ctx):
        known = [t for t in self.rules.keys() if t <= timestamp]
        version = self.rules.get(max(known)) if known else None
        for t in known:
            if t != max(known):
                self.rules.remove(t)
        for click_id in self.clicks.get(timestamp):
            yield {"click": click_id, "user": ctx.current_key, "version": version}
        self.clicks.remove(timestamp)


def enrichment_pipeline(env, clicks, rules, rate, sink=None, gate=None):
    """With a `gate`, both inputs hold at 80% until released (HeldGenerator)."""
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(DELAY).with_timestamp_assigner("ts")

    def generator(fn, count, rate, splits):
        if gate is None:
            return ss.sources.Generator(fn, count=count, rate=rate, batch_size=50)
        return HeldGenerator(fn, count=count, rate=rate, batch_size=50, splits=splits, gate=gate,
                             hold_at=count // splits * 4 // 5)
    a = env.from_source(generator(click, clicks, rate, env.parallelism),
                        name="clicks", uid="clicks", watermark_strategy=strategy)
    b = env.from_source(generator(rule, rules, rate * rules / clicks, 1),
                        name="rules", uid="rules", watermark_strategy=strategy, parallelism=1)
    (a.key_by("user").connect(b.key_by("uid")).process(Enrich(), name="enrich", uid="enrich")
        .sink_to(sink or ss.sinks.Collect(), name="out", uid="out"))


def assert_enriched(rows, clicks, rules):
    got = sorted(((r["click"], r["version"]) for r in rows), key=lambda t: t[0])
    assert len(got) == clicks and len({c for c, _ in got}) == clicks, "a click is missing or doubled"
    expected = reference_enrichment(clicks, rules)
    assert got == expected
    assert sum(1 for _, v in expected if v is not None) > clicks // 2


def test_keyed_co_process_enrichment_equals_a_reference(spark):
    clicks, rules = 3000, 1800
    env = ss.StreamEnvironment(parallelism=2, spark=spark, auto_watermark_interval=0.05)
    enrichment_pipeline(env, clicks, rules, rate=3000)
    rows = env.execute("enrichment").rows()
    assert_enriched(rows, clicks, rules)
    assert all(r["user"] == r["click"] % USERS for r in rows)


def bid(i: int) -> dict:
    return {"item": i % 11, "bid": i, "at": i * 4 + (i * 7919) % JITTER}


def view(i: int) -> dict:
    return {"item_id": i % 11, "view": i, "at": i * 5 + (i * 104729) % JITTER}


class Matched(ss.ProcessJoinFunction):
    def process_element(self, left, right, ctx):
        yield {"view": left["view"], "bid": right["bid"], "ts": ctx.timestamp(), "item": ctx.current_key}


def test_interval_and_window_joins_equal_nested_loop_references_and_union_takes_three_streams(spark):
    n_views, n_bids = 1500, 1800
    env = ss.StreamEnvironment(parallelism=2, spark=spark, auto_watermark_interval=0.05)
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(DELAY).with_timestamp_assigner("at")
    views = env.from_source(ss.sources.Generator(view, count=n_views, rate=2000, batch_size=50),
                            name="views", watermark_strategy=strategy)
    bids = env.from_source(ss.sources.Generator(bid, count=n_bids, rate=2400, batch_size=50),
                           name="bids", watermark_strategy=strategy, parallelism=1)
    (views.key_by("item_id").interval_join(bids.key_by("item")).between(-0.05, 0.1)
        .process(Matched(), name="join", parallelism=3).sink_to(ss.sinks.Collect(), name="pairs", parallelism=1))
    (views.join(bids).where("item_id").equal_to("item")
        .window(ss.windows.TumblingEventTimeWindows.of(0.2))
        .apply(lambda v, b: {"view": v["view"], "bid": b["bid"]}, name="window join", parallelism=1)
        .sink_to(ss.sinks.Collect(), name="window pairs", parallelism=1))
    # union of three streams of parallelism 1, 2 and 3 (rebalanced into one map)
    ones = env.from_collection([{"n": i} for i in range(100)], name="one")
    twos = ones.map(lambda r: {"n": r["n"] + 1000}, name="two", parallelism=2)
    threes = ones.map(lambda r: {"n": r["n"] + 2000}, name="three", parallelism=3)
    ones.union(twos, threes).map(lambda r: {"n": r["n"] * 2}, name="double", parallelism=1).sink_to(
        ss.sinks.Collect(), name="unioned", parallelism=1)
    result = env.execute("interval join and union")

    pairs = result.rows("pairs")
    bids_by_item = {}
    for b in map(bid, range(n_bids)):
        bids_by_item.setdefault(b["item"], []).append(b)
    candidates = [(v, b) for v in map(view, range(n_views)) for b in bids_by_item.get(v["item_id"], [])]
    expected = Counter((v["view"], b["bid"]) for v, b in candidates if v["at"] - 50 <= b["at"] <= v["at"] + 100)
    got = Counter((r["view"], r["bid"]) for r in pairs)
    assert got == expected and len(expected) > 500
    assert all(r["ts"] == max(view(r["view"])["at"], bid(r["bid"])["at"]) for r in pairs)
    windowed = Counter((v["view"], b["bid"]) for v, b in candidates if v["at"] // 200 == b["at"] // 200)
    assert Counter((r["view"], r["bid"]) for r in result.rows("window pairs")) == windowed and len(windowed) > 300
    assert sorted(r["n"] for r in result.rows("unioned")) == sorted(
        2 * (i + offset) for i in range(100) for offset in (0, 1000, 2000))


def test_a_sigkill_of_a_two_input_task_gives_the_failure_free_output(spark, tmp_path):
    clicks, rules = 3000, 1800
    out = tmp_path / "out"
    env = ss.StreamEnvironment(
        parallelism=2, spark=spark, auto_watermark_interval=0.05,
        checkpointing=ss.CheckpointConfig(interval=0.3, mode="exactly_once", directory=str(tmp_path / "ckpt")),
        restart=ss.RestartStrategy.fixed_delay(attempts=2, delay=0.1))
    # Both inputs hold at 80% until the kill: on a slow machine they cannot end first.
    gate = tmp_path / "gate"
    enrichment_pipeline(env, clicks, rules, rate=1000, sink=ss.sinks.FileSink(str(out), format="parquet"), gate=gate)
    client = env.execute_async("enrichment with a kill")
    wait_completed(client, 2)
    victim = next(s for s in client.subtasks() if s.vertex.startswith("enrich"))
    os.kill(victim.pid, signal.SIGKILL)
    release(gate)
    result = client.wait()
    assert result.restarts == 1
    assert_enriched(read_parquet_rows(out), clicks, rules)


LIMITS = ss.MapStateDescriptor("limits")
CATEGORIES = ["food", "toys", "books", "tools"]


def purchase(i: int) -> dict:
    return {"user": i % 13, "id": i, "category": CATEGORIES[i % 4] if i % 9 else "unknown",
            "amount": (i * 37) % 100, "ts": 1000 + i * 3 + (i * 7919) % JITTER}


class ApplyLimits(ss.KeyedBroadcastProcessFunction):
    """Rules are broadcast; purchases wait for the watermark (the minimum of both inputs) to
    pass their time, so every rule up to then is in the broadcast state when they are judged.
    A per-user count in keyed state shows keyed state and broadcast state side by side."""

    def open(self, ctx):
        self.pending = ctx.get_state(ss.MapStateDescriptor("pending"))    # ts -> [purchases]
        self.count = ctx.get_state(ss.ValueStateDescriptor("count", default=0))

    def process_broadcast_element(self, row, ctx):
        ctx.get_broadcast_state(LIMITS).put(row["category"], row["limit"])

    def process_element(self, row, ctx):
        ts = ctx.timestamp()
        self.pending.put(ts, (self.pending.get(ts) or []) + [row])
        ctx.timer_service().register_event_time_timer(ts)

    def on_timer(self, timestamp, ctx):
        limits = ctx.get_broadcast_state(LIMITS)
        for row in self.pending.get(timestamp):
            self.count.update(self.count.value() + 1)
            limit = limits.get(row["category"])
            yield {"id": row["id"], "user": ctx.current_key, "limit": limit,
                   "over": limit is not None and row["amount"] > limit}
        self.pending.remove(timestamp)


class Describe(ss.CoProcessFunction):
    def process_element1(self, row, ctx):
        yield {"text": f"word {row['word']}"}

    def process_element2(self, row, ctx):
        yield {"text": f"number {row['n']}"}


def test_broadcast_rules_applied_to_a_keyed_stream(spark):
    n = 2000
    rules = [{"category": c, "limit": 20 * (k + 1), "ts": k * 100} for k, c in enumerate(CATEGORIES)]
    rules += [{"category": "food", "limit": 5, "ts": 450}]        # a later update wins
    env = ss.StreamEnvironment(parallelism=3, spark=spark, auto_watermark_interval=0.05)
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(DELAY).with_timestamp_assigner("ts")
    purchases = env.from_source(ss.sources.Generator(purchase, count=n, rate=2500, batch_size=50),
                                name="purchases", watermark_strategy=strategy)
    limits = env.from_collection(rules, name="rules").assign_timestamps_and_watermarks(strategy)
    (purchases.key_by("user").connect(limits.broadcast(LIMITS)).process(ApplyLimits(), name="limits")
        .sink_to(ss.sinks.Collect(), name="judged"))
    # and a plain (non-keyed) co-process of two streams of different row types
    words = env.from_collection([{"word": w} for w in ("a", "bb", "ccc")], name="words")
    numbers = env.from_collection([{"n": n} for n in range(5)], name="numbers")
    words.connect(numbers).process(Describe(), name="describe", parallelism=1).sink_to(
        ss.sinks.Collect(), name="described", parallelism=1)
    result = env.execute("broadcast limits")
    rows = result.rows("judged")
    assert sorted(r["text"] for r in result.rows("described")) == sorted(
        ["word a", "word bb", "word ccc"] + [f"number {n}" for n in range(5)])
    final = {"food": 5, "toys": 40, "books": 60, "tools": 80}
    expected = sorted((p["id"], final.get(p["category"]), p["category"] in final and p["amount"] > final[p["category"]])
                      for p in map(purchase, range(n)))
    assert sorted((r["id"], r["limit"], r["over"]) for r in rows) == expected
    assert sum(1 for _, _, over in expected if over) > n // 4
