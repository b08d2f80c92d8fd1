"""deduplicate and top_n on real Spark, on both keyed state backends: a subtask of the top-N
operator is SIGKILLed after a checkpoint mid-input, the job restores its keyed state and the
exactly-once output equals a plain-Python reference of a failure-free run — every emitted
update once, none missing, none extra (a lost ranking would emit extra rows after the restore).
Both run a batch at a time where the schema is known and per row where it is not (after a
`map`), with the same output."""

from __future__ import annotations

import os
import signal
from collections import Counter

import pytest

import streamsnap as ss
from tests.integration import support

pytestmark = pytest.mark.spark

N = 4_000
HOLD_AT = 1_200     # of each split's 2,000 rows
KEYS = 20
TOP = 3


def bid(i: int) -> dict:
    # Split i % 2 feeds keys 0..19, split 1 keys 100..119: a key's rows come from one split, in
    # order, so its updates are deterministic. Event times go backwards now and then.
    return {"auction": (i % 2) * 100 + (i // 2) % KEYS, "price": (i * 7919) % 1000,
            "ts": i - (i * 31) % 17, "i": i}


def expected_top(rows) -> Counter:
    """For each row, the ranks it changed when it entered its key's top TOP (ties: arrival)."""
    seen: dict = {}
    out = Counter()
    for r in rows:
        before = sorted(seen.get(r["auction"], []), key=lambda b: (-b["price"], b["i"]))[:TOP]
        seen.setdefault(r["auction"], []).append(r)
        after = sorted(seen[r["auction"]], key=lambda b: (-b["price"], b["i"]))[:TOP]
        for rank, b in enumerate(after):
            if rank >= len(before) or before[rank] is not b:
                out[(b["auction"], rank + 1, b["i"])] += 1
    return out


def expected_last(rows) -> Counter:
    latest: dict = {}
    out = Counter()
    for r in rows:
        if r["auction"] not in latest or r["ts"] >= latest[r["auction"]]:
            latest[r["auction"]] = r["ts"]
            out[(r["auction"], r["ts"], r["i"])] += 1
    return out


DEDUP_MODES = (("first", None), ("first", "ts"), ("last", None))


def expected_dedup(rows, keep: str, order_by) -> Counter:
    """(auction, i) of each row a deduplicate emits: the first per key, a strictly earlier ts
    than the kept row's, or every row."""
    held: dict = {}
    out = Counter()
    for r in rows:
        a = r["auction"]
        if keep == "last" or a not in held or (order_by and r["ts"] < held[a]["ts"]):
            held[a] = r
            out[(a, r["i"])] += 1
    return out


@support.both_backends
def test_top_n_and_deduplicate_restore_their_state_after_a_sigkill_exactly_once(spark, tmp_path, state_backend):
    gate = tmp_path / "gate"
    env = ss.StreamEnvironment(parallelism=2, spark=spark, state_backend=state_backend,
                               checkpointing=ss.CheckpointConfig(interval=0.3, directory=str(tmp_path / "ckpt")),
                               restart=ss.RestartStrategy.fixed_delay(3, 0.0),
                               network=ss.NetworkConfig(batch_size=256, credits=2, output_queue_frames=2))
    bids = env.from_source(support.HeldGenerator(bid, count=N, splits=2, gate=gate, hold_at=HOLD_AT), name="bids",
                           uid="bids")
    bids.key_by("auction").top_n(TOP, by="price", name="top3", uid="top3").sink_to(ss.sinks.Collect(), name="top")
    # Rows of no known schema (a map's): top_n runs per row (TopN), with the same output as
    # the batch at a time (TopNBatches) above, where the generator's schema is known.
    untyped = bids.map(lambda row: row, name="untyped")
    untyped.key_by("auction").top_n(TOP, by="price", name="top3 per row", uid="top3-per-row") \
        .sink_to(ss.sinks.Collect(), name="top per row")
    bids.key_by("auction").deduplicate("last", order_by="ts", name="last", uid="last") \
        .sink_to(ss.sinks.Collect(), name="latest")
    for keep, order_by in DEDUP_MODES:      # batch at a time (typed) and per row (untyped)
        for stream, how in ((bids, "batches"), (untyped, "rows")):
            stream.key_by("auction").deduplicate(keep, order_by=order_by, name=f"{keep} {order_by} {how}") \
                .sink_to(ss.sinks.Collect(), name=f"{keep} {order_by} {how}")
    client = env.execute_async(f"ranking on {state_backend} with a kill")
    support.wait_held(gate, 2, client)
    # A checkpoint taken while the source is held: the rankings of rows before the hold are in it.
    held_at = client.checkpoint_stats().counts.completed
    support.wait_completed(client, held_at + 1, timeout=60)
    victim = next(s for s in client.subtasks() if "top3" in s.vertex and s.state == "RUNNING")
    os.kill(victim.pid, signal.SIGKILL)
    support.release(gate)
    result = client.wait(180)
    assert result.restarts == 1

    rows = [bid(i) for i in range(N)]
    top = Counter((r["auction"], r["rank"], r["i"]) for r in result.rows("top"))
    assert top == expected_top(rows)
    assert Counter((r["auction"], r["rank"], r["i"]) for r in result.rows("top per row")) == top
    assert all(set(r) == {"auction", "price", "ts", "i", "rank"} for r in result.rows("top"))
    latest = Counter((r["auction"], r["ts"], r["i"]) for r in result.rows("latest"))
    assert latest == expected_last(rows)
    for keep, order_by in DEDUP_MODES:
        want = expected_dedup(rows, keep, order_by)
        for how in ("batches", "rows"):
            assert Counter((r["auction"], r["i"]) for r in result.rows(f"{keep} {order_by} {how}")) == want, \
                (keep, order_by, how)
    # the answers: the last row per (auction, rank) / per auction
    final = {(r["auction"], r["rank"]): r["i"] for r in result.rows("top")}
    for auction in {r["auction"] for r in rows}:
        mine = sorted((r for r in rows if r["auction"] == auction), key=lambda b: (-b["price"], b["i"]))[:TOP]
        assert [final[(auction, rank + 1)] for rank in range(TOP)] == [b["i"] for b in mine]
