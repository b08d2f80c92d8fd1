"""The test harness (streamsnap.testing): users' functions on the real operators, no Spark.

The README's functions, a window and timer case, two-input and broadcast functions and a small
pipeline, run deterministically; snapshots restore at the same and another parallelism; misuse
fails at once, naming the fix.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.testing import HarnessError, RegisteredTimer, harness
from streamsnap.time.timestamps import TimestampError
from streamsnap.time.watermarks import MAX_WATERMARK, MIN_WATERMARK
from streamsnap.time.windows import TimeWindow
from tests.runtime.test_broadcast import REJECTED, RULES, Limits
from tests.runtime.test_two_inputs import Expiring
from tests.runtime.test_window_operator import CountSum, Rows, add_values

W = ss.windows
LATE = ss.OutputTag("late")


# ---------------------------------------------------------------------------- README functions
# The README and the docs pages that define the functions a newcomer starts from.
DOCUMENTED = ("README.md", "docs/concepts/streams-and-operators.md", "docs/concepts/event-time.md")


def readme_functions() -> dict:
    """The function classes of the README's and the docs' examples, as those pages define them
    (their code blocks are the source: an edit of a page is tested here)."""
    root = Path(__file__).parents[2]
    # A module name no import finds: Spark's pickling ships the classes by value to its workers.
    namespace = {"ss": ss, "np": np, "pa": pa, "__name__": "readme_examples"}
    for page in DOCUMENTED:
        for block in re.findall(r"```python\n(.*?)```", (root / page).read_text(), flags=re.S):
            for match in re.finditer(r"^class \w+\(ss\.\w+\):\n(?:(?: .*)?\n)+", block, flags=re.M):
                exec(match.group(0), namespace)
    return namespace


README = readme_functions()
RunningSum, BatchRunningSum, BucketSums = (README[n] for n in ("RunningSum", "BatchRunningSum", "BucketSums"))


def test_the_readme_running_sum_keeps_a_total_per_key():
    h = harness(RunningSum(), key_by="key")
    for i in range(6):
        h.process({"key": i % 2, "value": i})
    assert h.output == [{"key": 0, "total": 0}, {"key": 1, "total": 1}, {"key": 0, "total": 2},
                        {"key": 1, "total": 4}, {"key": 0, "total": 6}, {"key": 1, "total": 9}]
    assert h.state("total", key=1) == 9 and h.state("total") == {0: 6, 1: 9}
    assert h.state("total", key=7) is None and h.timers() == []


def test_the_readme_batch_running_sum_takes_a_whole_batch():
    h = harness(BatchRunningSum(), key_by="key")
    h.process_batch([{"key": "a", "value": 1}, {"key": "b", "value": 10}, {"key": "a", "value": 2}])
    h.process_batch([{"key": "b", "value": 5}])
    assert h.output == [{"key": "a", "total": 1}, {"key": "b", "total": 10}, {"key": "a", "total": 3},
                        {"key": "b", "total": 15}]
    assert h.state("total") == {"a": 3, "b": 15}


def test_the_readme_bucket_sums_fire_on_the_watermark_and_clean_up():
    h = harness(BucketSums(), key_by="key")
    h.process({"key": "a", "value": 1}, timestamp=1_000)
    h.process({"key": "a", "value": 2}, timestamp=9_000)
    h.process({"key": "a", "value": 4}, timestamp=12_000)
    h.process({"key": "b", "value": 8}, timestamp=3_000)
    assert h.timers() == [RegisteredTimer("event_time", 9_999, "a"), RegisteredTimer("event_time", 9_999, "b"),
                          RegisteredTimer("event_time", 19_999, "a")]
    assert h.state("sums", key="a") == {0: 3, 10_000: 4}
    h.advance_watermark(9_998)
    assert h.output == [] and h.watermarks == [9_998]
    h.advance_watermark(10_000)
    assert h.take_output() == [{"key": "a", "bucket": 0, "sum": 3}, {"key": "b", "bucket": 0, "sum": 8}]
    assert h.watermarks == [9_998, 10_000]
    assert h.state("sums") == {"a": {10_000: 4}}      # an emptied map is no entry
    h.end_input()            # a bounded input ends: every event-time timer fires
    assert h.output == [{"key": "a", "bucket": 10_000, "sum": 4}] and h.timers() == []
    assert h.watermarks[-1] == MAX_WATERMARK


# ---------------------------------------------------------------------------- windows and timers
def late_window_scenario():
    h = harness(add_values, key_by="key", window=W.TumblingEventTimeWindows.of(10),
                allowed_lateness=5, late_data=LATE)
    h.process({"key": "a", "value": 1}, timestamp=1_000)
    h.process({"key": "b", "value": 2}, timestamp=9_999)
    h.process({"key": "a", "value": 4}, timestamp=12_000)
    first, second = TimeWindow(0, 10_000), TimeWindow(10_000, 20_000)
    # Each window's trigger timer at its end, and its cleanup timer 5 s (the lateness) later.
    assert h.timers() == [RegisteredTimer("event_time", 9_999, "a", first),
                          RegisteredTimer("event_time", 9_999, "b", first),
                          RegisteredTimer("event_time", 14_999, "a", first),
                          RegisteredTimer("event_time", 14_999, "b", first),
                          RegisteredTimer("event_time", 19_999, "a", second),
                          RegisteredTimer("event_time", 24_999, "a", second)]
    h.advance_watermark(9_999)                    # [0, 10 s) fires, kept 5 s for late rows
    h.process({"key": "a", "value": 10}, timestamp=2_000)    # late but allowed: fires again
    h.advance_watermark(14_999)                   # the lateness is over: [0, 10 s) is gone
    h.process({"key": "a", "value": 100}, timestamp=3_000)   # too late: the side output
    h.end_input()
    return h


def test_event_time_windows_fire_refire_within_lateness_and_route_later_rows():
    h = late_window_scenario()
    assert h.output == [{"key": "a", "value": 1}, {"key": "b", "value": 2}, {"key": "a", "value": 11},
                        {"key": "a", "value": 4}]
    assert h.side_output(LATE) == [{"key": "a", "value": 100}]
    assert h.timers() == [] and h.operator.num_late_records_dropped == 0


def test_the_same_scenario_gives_the_same_output_every_time():
    runs = [late_window_scenario() for _ in range(3)]
    assert all(r.output == runs[0].output and r.watermarks == runs[0].watermarks for r in runs)


def test_aggregate_with_a_window_function_and_a_count_trigger():
    class WithWindow(ss.ProcessWindowFunction):
        def process(self, key, context, elements):
            yield {"key": key, "end": context.window.end, **elements[0]}

    h = harness(CountSum(), key_by="key", window=W.EventTimeSessionWindows.with_gap(10),
                window_function=WithWindow(), trigger=W.CountTrigger.of(3))
    h.process({"key": "u", "value": 1}, timestamp=1_000)
    h.process({"key": "u", "value": 2}, timestamp=15_000)
    assert h.output == []
    h.process({"key": "u", "value": 4}, timestamp=9_000)       # merges both sessions: 3 rows
    assert h.output == [{"key": "u", "end": 25_000, "count": 3, "sum": 7}]


class Reminder(ss.KeyedProcessFunction):
    """Processing-time timers: a reminder 2 s after each key's first row, unless it is cancelled."""

    def open(self, ctx):
        self.due = ctx.get_state(ss.ValueStateDescriptor("due"))

    def process_element(self, row, ctx):
        timers = ctx.timer_service()
        if row.get("cancel"):
            timers.delete_processing_time_timer(self.due.value())
            self.due.clear()
        elif self.due.value() is None:
            self.due.update(timers.current_processing_time() + 2_000)
            timers.register_processing_time_timer(self.due.value())

    def on_timer(self, timestamp, ctx):
        yield {"key": ctx.current_key, "at": timestamp, "now": ctx.timer_service().current_processing_time(),
               "domain": ctx.time_domain().value}
        self.due.clear()


def test_processing_time_timers_fire_when_the_clock_is_advanced_each_at_its_time():
    h = harness(Reminder(), key_by="key", processing_time=1_000)
    h.process({"key": "a"})
    h.advance_processing_time(0.5)
    h.process({"key": "b"})
    h.process({"key": "c"})
    assert [t.timestamp for t in h.timers()] == [3_000, 3_500, 3_500]
    h.process({"key": "c", "cancel": True})
    h.advance_processing_time(1.499)             # 2 999 ms: one short of the first
    assert h.output == []
    h.advance_processing_time(5)
    assert h.output == [{"key": "a", "at": 3_000, "now": 3_000, "domain": "processing_time"},
                        {"key": "b", "at": 3_500, "now": 3_500, "domain": "processing_time"}]
    assert h.processing_time == 7_999 and h.timers() == []


def test_processing_time_windows_fire_from_the_manual_clock():
    h = harness(Rows(), key_by="key", window=W.TumblingProcessingTimeWindows.of(1))
    h.process({"key": "a", "value": 1})
    h.advance_processing_time(0.4)
    h.process({"key": "a", "value": 2})
    h.advance_processing_time(0.598)
    assert h.output == []
    h.advance_processing_time(0.001)      # a window fires at its last millisecond, end - 1
    assert h.output == [{"key": "a", "start": 0, "end": 1_000, "values": [1, 2],
                         "watermark": MIN_WATERMARK}]      # no event time: no watermark


def test_state_time_to_live_counts_the_harness_clock():
    class Remember(ss.KeyedProcessFunction):
        def open(self, ctx):
            self.last = ctx.get_state(ss.ValueStateDescriptor("last", ttl=ss.StateTtlConfig(10)))

        def process_element(self, row, ctx):
            yield {"key": ctx.current_key, "before": self.last.value()}
            self.last.update(row["value"])

    h = harness(Remember(), key_by="key")
    h.process({"key": "a", "value": 1})
    h.advance_processing_time(9.999)
    h.process({"key": "a", "value": 2})          # written again: lives 10 s from now
    h.advance_processing_time(10)
    h.process({"key": "a", "value": 3})
    assert [r["before"] for r in h.output] == [None, 1, None]


# ---------------------------------------------------------------------------- two inputs
def test_keyed_co_process_shares_state_and_waits_for_both_inputs_watermarks():
    h = harness(Expiring(), key_by=("user", "id"))
    h.process2({"id": "ann", "rule": "r1", "until": 100})
    h.process1({"user": "ann"})
    h.process({"user": "bob"}, input="input1")
    h.advance_watermark(500, input="input1")
    assert h.output == [{"user": "ann", "rule": "r1"}, {"user": "bob", "rule": None}]
    assert h.watermarks == [] and h.timers() == [RegisteredTimer("event_time", 100, "ann")]
    h.advance_watermark(100, input="input2")      # the operator's watermark: min of both
    assert h.output[-1] == {"user": "ann", "expired": 100} and h.watermarks == [100]
    assert h.state("rule") == {}


class OverBudget(ss.KeyedCoBatchFunction):
    """Budgets (first input) per user until a time; spends (second) above the budget come out;
    a budget's timer at `until` drops it and says so."""

    def open(self, ctx):
        self.limit = ctx.get_state(ss.ValueStateDescriptor("limit"))
        self.timers = ctx.timer_service()

    def process_batch1(self, batch, keys):
        rows = batch.to_pylist()
        last = {u: rows[i] for i, u in enumerate(keys.index.tolist())}   # the last budget per user
        self.limit.put_many(keys, [last[u]["limit"] for u in range(len(keys))])
        self.timers.register_event_time_timers(keys, [last[u]["until"] for u in range(len(keys))])

    def process_batch2(self, batch, keys):
        limits = self.limit.get_many(keys)
        over = [r for r, u in zip(batch.to_pylist(), keys.index.tolist())
                if limits[u] is not None and r["amount"] > limits[u]]
        return {"user": [r["name"] for r in over], "amount": [r["amount"] for r in over]} if over else None

    def on_timers(self, timers, ctx):
        self.limit.put_many(timers.keys, [None] * len(timers.keys))
        return {"user": list(timers.keys.unique), "expired": timers.timestamps.tolist()}


def test_a_keyed_co_batch_function_shares_state_and_timers_and_restores_them():
    h = harness(OverBudget(), key_by=("user", "name"))
    h.process_batch([{"user": "ann", "limit": 5, "until": 100}, {"user": "bob", "limit": 9, "until": 200},
                     {"user": "ann", "limit": 7, "until": 100}], timestamps=[1, 1, 2], input="input1")
    h.process_batch([{"name": "ann", "amount": 6}, {"name": "ann", "amount": 8}, {"name": "cy", "amount": 99}],
                    timestamps=[3, 4, 5], input="input2")
    assert h.output == [{"user": "ann", "amount": 8}]
    assert h.state("limit") == {"ann": 7, "bob": 9}
    restored = harness(OverBudget(), key_by=("user", "name"), restore=h.snapshot())
    for each in (h, restored):
        each.advance_watermark(150, input="input1")
        each.advance_watermark(150, input="input2")
        assert each.output[-1] == {"user": "ann", "expired": 100} and each.state("limit") == {"bob": 9}
    with pytest.raises(HarnessError, match="OverBudget is a KeyedCoBatchFunction: pass key_by="):
        harness(OverBudget())


def test_co_process_reads_each_inputs_timestamps():
    class Tag(ss.CoProcessFunction):
        def process_element1(self, row, ctx):
            yield {"side": 1, "ts": ctx.timestamp()}

        def process_element2(self, row, ctx):
            yield {"side": 2, "ts": ctx.timestamp()}

    h = harness(Tag(), timestamps={"input1": "t1", "input2": lambda row: row["t2"] * 1000})
    h.process1({"t1": 5, "t2": 99})
    h.process2({"t1": 99, "t2": 8}, timestamp=8_000)
    assert h.output == [{"side": 1, "ts": 5}, {"side": 2, "ts": 8_000}]


def test_keyed_broadcast_state_is_written_by_the_broadcast_side_and_restored_on_every_subtask():
    h = harness(Limits(), key_by="user", broadcast=RULES)
    h.process_broadcast({"category": "food", "limit": 10})
    h.process_broadcast({"category": "bad", "limit": -1})
    for user, amount in (("a", 6), ("b", 6), ("a", 6)):
        h.process({"user": user, "category": "food", "amount": amount})
    assert h.output == [{"user": "a", "total": 6, "over": False}, {"user": "b", "total": 6, "over": False},
                        {"user": "a", "total": 12, "over": True}]
    assert h.side_output(REJECTED) == h.side_output("rejected") == [{"category": "bad", "limit": -1}]
    snapshot = h.snapshot()
    totals = {}
    for index in range(3):
        sub = harness(Limits(), key_by="user", broadcast=RULES, restore=snapshot, subtask=(index, 3))
        totals.update(sub.state("total"))
        user = next(u for u in ("a", "b", "c", "d", "e", "f") if sub.owns_key(u))
        sub.process({"user": user, "category": "food", "amount": 11})
        assert sub.output[-1]["over"] is True       # every subtask has the rules
    assert totals == {"a": 12, "b": 6}


# ---------------------------------------------------------------------------- a pipeline
def test_a_small_pipeline_runs_its_operators_chained_in_order():
    def pipeline(events, corrections):
        merged = events.union(corrections.map(lambda r: {**r, "value": -r["value"]}))
        return (merged.filter(lambda r: r["value"] != 0).key_by("key").process(RunningSum())
                .map(lambda r: {**r, "big": r["total"] > 5}))

    h = harness(pipeline, inputs=("events", "corrections"))
    h.process({"key": "a", "value": 4}, input="events")
    h.process({"key": "a", "value": 0}, input="events")
    h.process({"key": "a", "value": 3}, input="events")
    h.process({"key": "a", "value": 2}, input="corrections")
    assert h.output == [{"key": "a", "total": 4, "big": False}, {"key": "a", "total": 7, "big": True},
                        {"key": "a", "total": 5, "big": False}]
    h.advance_watermark(50, input="events")
    assert h.watermarks == []                    # the union waits for both inputs
    h.advance_watermark(70)
    assert h.watermarks == [70] and h.state("total", key="a") == 5


def test_a_pipeline_subtask_keeps_only_the_rows_of_its_key_groups_after_a_key_by():
    rows = [{"key": k, "value": 1} for k in range(20)]
    seen = []
    for index in range(2):
        h = harness(lambda s: s.map(dict).key_by("key").process(RunningSum()), subtask=(index, 2))
        for row in rows:
            h.process(dict(row))
        assert all(h.owns_key(r["key"]) for r in h.output)
        seen += [r["key"] for r in h.output]
    assert sorted(seen) == list(range(20))


def test_a_two_input_pipeline_joins_by_interval_and_cleans_up_on_the_watermark():
    class Pair(ss.ProcessJoinFunction):
        def process_element(self, left, right, ctx):
            yield {"left": left["id"], "right": right["id"], "ts": ctx.timestamp()}

    h = harness(lambda a, b: a.key_by("k").interval_join(b.key_by("k")).between(-1, 1).process(Pair()),
                inputs=("left", "right"), timestamps="ts")
    h.process({"k": 1, "id": "l1", "ts": 1_000}, input="left")
    h.process({"k": 1, "id": "r1", "ts": 1_500}, input="right")
    h.process({"k": 2, "id": "r2", "ts": 1_500}, input="right")
    h.process({"k": 1, "id": "r3", "ts": 2_500}, input="right")
    assert h.output == [{"left": "l1", "right": "r1", "ts": 1_500}]
    assert len(h.timers()) == 4                    # each buffered row waits for its cleanup
    h.advance_watermark(5_000, input="left")
    assert len(h.timers()) == 4                    # the right input still holds event time back
    h.advance_watermark(5_000, input="right")
    assert h.timers() == [] and h.watermarks == [5_000]


def test_the_observed_stream_can_be_a_side_output():
    def late_rows(stream):
        windowed = stream.key_by("key").window(W.TumblingEventTimeWindows.of(1)).side_output_late_data(LATE)
        return windowed.reduce(add_values).get_side_output(LATE)

    h = harness(late_rows)
    h.advance_watermark(5_000)
    h.process({"key": "x", "value": 1}, timestamp=10)
    h.process({"key": "y", "value": 1}, timestamp=6_000)
    assert h.output == [{"key": "x", "value": 1}] and h.side_output(LATE) == []


# ---------------------------------------------------------------------------- snapshots
@pytest.mark.parametrize("backends", [("hashmap", "hashmap"), ("rocksdb", "rocksdb"), ("rocksdb", "hashmap")])
def test_a_snapshot_restores_state_and_timers_and_the_restored_harness_goes_on(backends):
    h = harness(BucketSums(), key_by="key", state_backend=backends[0])
    h.process({"key": "a", "value": 1}, timestamp=1_000)
    h.process({"key": "b", "value": 2}, timestamp=15_000)
    snapshot = h.snapshot()
    h.process({"key": "a", "value": 100}, timestamp=2_000)      # after the snapshot: not in it
    h.close()
    restored = harness(BucketSums(), key_by="key", restore=snapshot, state_backend=backends[1])
    assert restored.state("sums") == {"a": {0: 1}, "b": {10_000: 2}}
    assert restored.timers() == [RegisteredTimer("event_time", 9_999, "a"),
                                 RegisteredTimer("event_time", 19_999, "b")]
    restored.process({"key": "a", "value": 5}, timestamp=3_000)
    restored.end_input()
    assert restored.output == [{"key": "a", "bucket": 0, "sum": 6}, {"key": "b", "bucket": 10_000, "sum": 2}]


def test_a_rescaled_restore_takes_only_its_key_groups_and_scales_back_in():
    h = harness(RunningSum(), key_by="key")
    keys = [f"user-{i}" for i in range(30)]
    for i, key in enumerate(keys):
        h.process({"key": key, "value": i})
    snapshot = h.snapshot()
    parts = [harness(RunningSum(), key_by="key", restore=snapshot, subtask=(i, 3)) for i in range(3)]
    owned = [set(p.state("total")) for p in parts]
    assert all(owned) and set().union(*owned) == set(keys)
    assert sum(len(o) for o in owned) == len(keys)          # each key on exactly one subtask
    for part, keys_of_part in zip(parts, owned):
        assert all(part.owns_key(k) for k in keys_of_part)
        assert part.state("total") == {k: keys.index(k) for k in keys_of_part}
    # Three subtasks' snapshots restore into one subtask again, with every key.
    merged = harness(RunningSum(), key_by="key", restore=[p.snapshot() for p in parts])
    assert merged.state("total") == {k: i for i, k in enumerate(keys)}
    merged.process({"key": "user-3", "value": 10})
    assert merged.output == [{"key": "user-3", "total": 13}]


def test_window_contents_and_timers_survive_a_rescaled_restore():
    def scenario(**kw):
        return harness(Rows(), key_by="key", window=W.TumblingEventTimeWindows.of(10), **kw)

    h = scenario()
    for k in range(10):
        h.process({"key": k, "value": k}, timestamp=1_000 + k)
    snapshot = h.snapshot()
    out = []
    for index in range(2):
        sub = scenario(restore=snapshot, subtask=(index, 2))
        assert all(sub.owns_key(t.key) for t in sub.timers())
        sub.advance_watermark(9_999)
        out += sub.output
    assert sorted((r["key"], r["values"]) for r in out) == [(k, [k]) for k in range(10)]


def test_checkpoint_listeners_hear_of_completed_checkpoints():
    class Listening(RunningSum, ss.CheckpointListener):
        completed: list = []

        def notify_checkpoint_complete(self, checkpoint_id):
            self.completed.append(checkpoint_id)

    function = Listening()
    h = harness(function, key_by="key")
    snapshot = h.snapshot()
    h.notify_checkpoint_complete(snapshot.checkpoint_id)
    assert function.completed == [1] and h.snapshot().checkpoint_id == 2


# ---------------------------------------------------------------------------- misuse
def test_a_row_without_a_timestamp_into_an_event_time_window_names_the_fix():
    h = harness(add_values, key_by="key", window=W.TumblingEventTimeWindows.of(10))
    with pytest.raises(TimestampError, match=r"(?s)Window.*process\(row, timestamp=ms\).*timestamps='field'"):
        h.process({"key": "a", "value": 1})
    assert h.output == []


def test_the_watermark_does_not_go_back():
    h = harness(RunningSum(), key_by="key")
    h.advance_watermark(1_100)
    h.advance_watermark(1_100)                     # the same watermark again: nothing happens
    with pytest.raises(HarnessError, match=r"advance_watermark\(500\).*already at watermark 1100.*only move forward"):
        h.advance_watermark(500)
    with pytest.raises(HarnessError, match="does not go back"):
        h.set_processing_time(-1)
    assert h.watermark == 1_100


def test_reading_undeclared_state_lists_the_declared_ones():
    h = harness(RunningSum(), key_by="key")
    with pytest.raises(HarnessError, match=r"no keyed state named 'totals'.*\['total'\].*ctx.get_state"):
        h.state("totals", key="a")


def test_a_harness_needs_a_function_and_says_which_kinds():
    with pytest.raises(TypeError, match=r"harness\(\) runs a KeyedProcessFunction.*got int 42"):
        harness(42)
    with pytest.raises(TypeError, match=r"not a class: harness\(RunningSum\(\)\)"):
        harness(RunningSum)
    with pytest.raises(HarnessError, match="pass key_by="):
        harness(RunningSum())
    with pytest.raises(HarnessError, match=r"broadcast=ss.MapStateDescriptor"):
        harness(Limits(), key_by="user")
    with pytest.raises(HarnessError, match="pass window=assigner too"):
        harness(RunningSum(), key_by="key", allowed_lateness=5)
    with pytest.raises(HarnessError, match="must return the DataStream"):
        harness(lambda s: None)
    with pytest.raises(HarnessError, match=r"return the stream.*h.output"):
        harness(lambda s: s.sink_to(ss.sinks.Collect()))


def test_pushing_rows_wrongly_fails_naming_the_input_and_the_fix():
    h = harness(Expiring(), key_by=("user", "id"))
    with pytest.raises(HarnessError, match=r"inputs \['input1', 'input2'\].*process1 / process2"):
        h.process({"user": "a"})
    with pytest.raises(HarnessError, match="no broadcast input"):
        h.process_broadcast({"rule": 1})
    with pytest.raises(HarnessError, match="rows are dicts"):
        h.process1(("user", "a"))
    timed = harness(RunningSum(), key_by="key", timestamps="ts")
    with pytest.raises(HarnessError, match=r"timestamp 5 by input 'input''s assigner 'ts'.*timestamp=6"):
        timed.process({"key": "a", "ts": 5, "value": 1}, timestamp=6)
    sub = harness(RunningSum(), key_by="key", subtask=(0, 2))
    other = next(k for k in range(100) if not sub.owns_key(k))
    with pytest.raises(HarnessError, match=rf"key {other} in key group .* subtask 0 of 2 does not own.*subtask 1"):
        sub.process({"key": other, "value": 1})


def test_a_restore_that_cannot_fit_names_why():
    snapshot = harness(RunningSum(), key_by="key").snapshot()
    with pytest.raises(HarnessError, match="max_parallelism"):
        harness(RunningSum(), key_by="key", restore=snapshot, max_parallelism=64)
    with pytest.raises(HarnessError, match=r"does not have.*same function"):
        harness(BucketSums(), key_by="key", restore=snapshot)
    with pytest.raises(HarnessError, match="distinct subtasks"):
        harness(RunningSum(), key_by="key", restore=[snapshot, snapshot])
    with pytest.raises(HarnessError, match=r"what h.snapshot\(\) returned"):
        harness(RunningSum(), key_by="key", restore="chk-1")


def test_a_user_function_error_names_the_operator_and_the_row():
    class Failing(ss.KeyedProcessFunction):
        def process_element(self, row, ctx):
            raise ValueError("boom")

    h = harness(Failing(), key_by="key")
    with pytest.raises(ss.UserFunctionError, match=r"(?s)ValueError: boom.*where: .*operator 'Failing'.*'key': 'x'"):
        h.process({"key": "x"})


def test_a_harness_runs_in_milliseconds():
    start = time.perf_counter()
    h = harness(BucketSums(), key_by="key")
    for i in range(200):
        h.process({"key": i % 7, "value": i}, timestamp=i * 100)
    h.end_input()
    h.snapshot()
    assert len(h.output) == 7 * 2
    assert time.perf_counter() - start < 0.5


def test_the_example_of_docs_testing_md_runs():
    text = (Path(__file__).parents[2] / "docs" / "testing.md").read_text()
    example = re.search(r"```python\n(import streamsnap as ss\n.*?)```", text, flags=re.S).group(1)
    namespace = {"__name__": "docs_testing_example"}
    exec(example, namespace)
    namespace["test_bucket_sums"]()


def test_the_module_docstring_example_runs():
    import sys
    import textwrap

    doc = sys.modules["streamsnap.testing.harnesses"].__doc__
    example = doc[doc.index("    import streamsnap as ss"):doc.index("What it runs")]
    exec(textwrap.dedent(example), {"__name__": "harness_docstring_example"})
