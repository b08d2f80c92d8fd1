"""The window operator driven directly: rows and watermarks in, rows out (no Spark).

It runs on a real HashMapKeyedStateBackend, so snapshot/restore below goes through the same
files and key-group assignment a job uses.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.runtime.operators.windows import (CONTENTS, AggregateContents, ListContents,
                                                ReduceContents, WindowOperator)
from streamsnap.state.assignment import assign_operator_state
from streamsnap.state.key_groups import assign_key_groups
from streamsnap.time.watermarks import MAX_WATERMARK
from tests.runtime.support import Sink

W = ss.windows
LATE = ss.OutputTag("late")




def add_values(a, b):
    return {"key": a["key"], "value": a["value"] + b["value"]}


def kv(items):
    """(key, value) of the rows among `items`, in order (a one-row window emits that row)."""
    return [(r["key"], r["value"]) for r in items if isinstance(r, dict)]


class Rows(ss.ProcessWindowFunction):
    """The window, its key and its rows' values in arrival order (pre-aggregated: the result)."""

    def process(self, key, context, elements):
        yield {"key": key, "start": context.window.start, "end": context.window.end,
               "values": [e.get("value", e) for e in elements],
               "watermark": context.current_watermark()}


class CountSum(ss.AggregateFunction):
    def open(self, ctx):
        self.opened_in = ctx.operator_name

    def create_accumulator(self):
        return [0, 0]

    def add(self, row, acc):
        acc[0] += 1
        acc[1] += row["value"]
        return acc

    def get_result(self, acc):
        return {"count": acc[0], "sum": acc[1]}

    def merge(self, a, b):
        return [a[0] + b[0], a[1] + b[1]]


def window_operator(assigner, contents, function=None, *, trigger=None, lateness=0,
                    late=None, clock=None, subtask=0, parallelism=1, restore=None, base=None):
    clock = clock or ManualScheduler()
    ctx = OperatorContext(name="window", uid="window", subtask_index=subtask,
                          parallelism=parallelism, max_parallelism=128, attempt=0, job_id="job",
                          task_name=f"window ({subtask + 1}/{parallelism})", timers=clock,
                          clock=clock, restore=restore, restore_base=base)
    op = WindowOperator(ctx, KeySelector.of("key"), assigner, trigger or assigner.default_trigger(),
                        lateness, contents, function, late, "ts")
    main, side = Sink(), Sink()
    op.output = Output([main], {"late": [side]})
    op.initialize_state()
    op.open()
    return op, main, side


def test_tumbling_windows_fire_in_order_when_the_watermark_passes_their_end():
    op, main, _ = window_operator(W.TumblingEventTimeWindows.of(10), ReduceContents(add_values))
    op.process([{"key": "a", "ts": 12_000, "value": 1}, {"key": "a", "ts": 3_000, "value": 2},
                {"key": "b", "ts": 9_999, "value": 4}, {"key": "a", "ts": 10_000, "value": 8}])
    assert main.items == []
    op.process_watermark(9_998)
    assert main.items == [("watermark", 9_998)]
    op.process_watermark(9_999)      # the window [0, 10 s) ends at 9 999 ms: fires now
    assert sorted(kv(main.items[1:-1])) == [("a", 2), ("b", 4)]
    assert main.items[-1] == ("watermark", 9_999)
    op.process_watermark(30_000)
    assert main.items[-2:] == [{"key": "a", "value": 9}, ("watermark", 30_000)]
    # Fired, cleaned up: no contents and no timers remain.
    assert op.timer_service.num_event_time_timers() == 0
    assert list(op.keyed_backend.iter_entries(CONTENTS)) == []


def test_every_keys_window_fires_at_the_watermark_that_passes_it():
    # Many keys registering timers one after another: all are due at once (the timer heap
    # must stay ordered as timers are added between firings).
    op, main, _ = window_operator(W.TumblingEventTimeWindows.of(1), ReduceContents(add_values))
    op.process([{"key": k, "ts": t, "value": 1} for k in range(50) for t in (500, 1_500)])
    op.process_watermark(999)
    assert sorted(r["key"] for r in main.rows()) == list(range(50))
    assert op.timer_service.num_event_time_timers() == 50
    op.process_watermark(1_999)
    assert len(main.rows()) == 100 and op.timer_service.num_event_time_timers() == 0


def test_random_out_of_order_input_equals_a_reference_of_tumbling_sums():
    rng = random.Random(7)
    rows = [{"key": rng.randrange(4), "ts": i * 50 + rng.randrange(2_000), "value": i}
            for i in range(2_000)]
    op, main, side = window_operator(W.TumblingEventTimeWindows.of(1), ReduceContents(add_values),
                                     late=LATE.name)
    reference = defaultdict(int)
    for start in range(0, len(rows), 100):
        batch = rows[start:start + 100]
        op.process(batch)
        for r in batch:
            reference[(r["key"], r["ts"] // 1_000)] += r["value"]
        op.process_watermark(max(r["ts"] for r in rows[:start + 100]) - 2_000)   # bounded: 2 s
    op.process_watermark(MAX_WATERMARK)
    got = sorted((r["key"], r["value"]) for r in main.rows())
    assert side.rows() == [] and op.num_late_records_dropped == 0
    assert got == sorted((k, v) for (k, _), v in reference.items())


def test_sliding_windows_aggregate_with_window_bounds():
    assigner = W.SlidingEventTimeWindows.of(10, 5)
    op, main, _ = window_operator(assigner, AggregateContents(aggregate := CountSum()), Rows())
    assert aggregate.opened_in == "window"        # the AggregateFunction's open hook ran
    op.process([{"key": 1, "ts": 1_000, "value": 1}, {"key": 1, "ts": 7_000, "value": 2},
                {"key": 1, "ts": 12_000, "value": 4}])
    op.process_watermark(MAX_WATERMARK)
    got = {(r["start"], r["end"]): r["values"][0] for r in main.rows()}
    assert got == {(-5_000, 5_000): {"count": 1, "sum": 1}, (0, 10_000): {"count": 2, "sum": 3},
                   (5_000, 15_000): {"count": 2, "sum": 6}, (10_000, 20_000): {"count": 1, "sum": 4}}
    assert [r["start"] for r in main.rows()] == sorted(r["start"] for r in main.rows())


def test_session_windows_merge_across_out_of_order_arrivals():
    op, main, _ = window_operator(W.EventTimeSessionWindows.with_gap(10), ListContents(), Rows())
    op.process([{"key": "u", "ts": 1_000, "value": 1}, {"key": "u", "ts": 15_000, "value": 2},
                {"key": "v", "ts": 30_000, "value": 5}])
    assert op.timer_service.num_event_time_timers() == 3
    op.process([{"key": "u", "ts": 9_000, "value": 3}])     # bridges [1, 11) and [15, 25)
    # The merged session has one timer, at its own end; the swallowed windows' are gone.
    assert op.timer_service.num_event_time_timers() == 2
    assert op.timer_service.next_event_time() == 24_999
    op.process_watermark(24_998)
    assert main.rows() == []
    op.process_watermark(24_999)
    assert main.rows() == [{"key": "u", "start": 1_000, "end": 25_000, "values": [1, 2, 3],
                            "watermark": 24_999}]
    op.process([{"key": "u", "ts": 26_000, "value": 7}])  # a new session after the gap
    op.process_watermark(MAX_WATERMARK)
    assert main.rows()[1:] == [
        {"key": "u", "start": 26_000, "end": 36_000, "values": [7], "watermark": MAX_WATERMARK},
        {"key": "v", "start": 30_000, "end": 40_000, "values": [5], "watermark": MAX_WATERMARK}]
    assert op.sessions.value() is None and op.timer_service.num_event_time_timers() == 0


def test_sessions_merge_aggregates_and_count_trigger_state():
    op, main, _ = window_operator(W.EventTimeSessionWindows.with_gap(10),
                                  AggregateContents(CountSum()), trigger=W.CountTrigger.of(3))
    op.process([{"key": "u", "ts": 1_000, "value": 1}, {"key": "u", "ts": 15_000, "value": 2}])
    assert main.rows() == []      # one element in each session: no count reached 3
    op.process([{"key": "u", "ts": 9_000, "value": 4}])
    # The merged session's count is 1 + 1 + this element: it fires with all three.
    assert main.rows() == [{"count": 3, "sum": 7}]


def test_allowed_lateness_refires_then_late_rows_go_to_the_side_output():
    op, main, side = window_operator(W.TumblingEventTimeWindows.of(10), ReduceContents(add_values),
                                     lateness=5_000, late=LATE.name)
    op.process([{"key": "a", "ts": 1_000, "value": 1}])
    op.process_watermark(10_000)
    assert kv(main.rows()) == [("a", 1)]
    # Late but within the lateness: the window is still there and fires again at once.
    op.process([{"key": "a", "ts": 2_000, "value": 10}])
    assert main.rows()[-1] == {"key": "a", "value": 11}
    assert op.timer_service.num_event_time_timers() == 1     # the cleanup timer at 14 999
    op.process_watermark(14_999)
    assert list(op.keyed_backend.iter_entries(CONTENTS)) == []
    late_row = {"key": "a", "ts": 3_000, "value": 100}
    op.process([late_row, {"key": "a", "ts": 20_000, "value": 1}])
    assert side.rows() == [late_row] and len(main.rows()) == 2
    assert op.num_late_records_dropped == 0


def test_late_rows_without_a_side_output_are_dropped_and_counted():
    op, main, side = window_operator(W.TumblingEventTimeWindows.of(10), ReduceContents(add_values))
    op.process_watermark(50_000)
    op.process([{"key": "a", "ts": 1_000, "value": 1}, {"key": "a", "ts": 49_000, "value": 1},
                {"key": "b", "ts": 60_000, "value": 1}])
    assert op.num_late_records_dropped == 2 and side.rows() == []
    op.process_watermark(MAX_WATERMARK)
    assert kv(main.rows()) == [("b", 1)]


def test_count_trigger_on_global_windows_fires_every_n_and_purging_resets():
    rows = [{"key": k, "ts": i, "value": i} for i in range(1, 8) for k in ("a", "b")]
    op, main, _ = window_operator(W.GlobalWindows.create(), ReduceContents(add_values),
                                  trigger=W.CountTrigger.of(3))
    op.process(rows)
    # Without purging the window keeps everything: the second fire includes the first three.
    assert [r["value"] for r in main.rows() if r["key"] == "a"] == [1 + 2 + 3, 21]
    purging, purged_main, _ = window_operator(
        W.GlobalWindows.create(), ReduceContents(add_values),
        trigger=W.PurgingTrigger.of(W.CountTrigger.of(3)))
    purging.process(rows)
    assert [r["value"] for r in purged_main.rows() if r["key"] == "a"] == [1 + 2 + 3, 4 + 5 + 6]
    # The seventh element waits in the window; the global window has no timer.
    assert purging.timer_service.num_event_time_timers() == 0
    assert len(list(purging.keyed_backend.iter_entries(CONTENTS))) == 2
    purging.process_watermark(MAX_WATERMARK)
    assert len(purged_main.rows()) == 4


def test_processing_time_windows_fire_from_the_clock():
    clock = ManualScheduler(start=1000.0, wall_offset=1_700_000_000.0)   # wall ms: ...000
    op, main, _ = window_operator(W.TumblingProcessingTimeWindows.of(1), ListContents(), Rows(),
                                  clock=clock)
    op.process([{"key": "a", "value": 1}, {"key": "a", "value": 2}])
    clock.advance(0.5)
    op.process([{"key": "a", "value": 3}])
    assert main.rows() == []
    clock.advance(0.5)       # the wall clock reaches the end of the 1-second window
    assert [(r["end"] - r["start"], r["values"]) for r in main.rows()] == [(1_000, [1, 2, 3])]
    op.process([{"key": "a", "value": 4}])
    clock.advance(1.0)
    assert [r["values"] for r in main.rows()] == [[1, 2, 3], [4]]
    assert op.timer_service.num_processing_time_timers() == 0 and clock.pending_timers() == 0


def test_snapshot_restored_into_two_subtasks_keeps_every_pending_window_and_timer(tmp_path):
    rows = [{"key": k, "ts": t, "value": k * 1000 + t} for k in range(40) for t in (1_000, 12_000)]
    sessions = [{"key": k, "ts": 30_000 + k, "value": 1} for k in range(40)]

    def build(**kw):
        return window_operator(W.TumblingEventTimeWindows.of(10), ReduceContents(add_values), **kw)

    def build_sessions(**kw):
        return window_operator(W.EventTimeSessionWindows.with_gap(5), ListContents(), Rows(),
                               **kw)

    reference, ref_main, _ = build()
    reference.process(rows)
    reference.process_watermark(MAX_WATERMARK)

    op, main, _ = build()
    op.process(rows)
    op.process_watermark(10_000)             # the first windows fired; [10 s, 20 s) pending
    assert main.rows() and op.timer_service.num_event_time_timers() == 40
    sess, _, _ = build_sessions()
    sess.process(sessions)
    location = str(tmp_path)
    state = op.snapshot_state(1, 0.0, location).run()
    sess_state = sess.snapshot_state(1, 0.0, location).run()
    restored = assign_operator_state({0: state}, 128, 2)
    sess_restored = assign_operator_state({0: sess_state}, 128, 2)
    timers, out, sess_out = 0, [], []
    for i in range(2):
        new, new_main, _ = build(subtask=i, parallelism=2, restore=restored[i], base=location)
        assert new.timer_service.current_watermark < 10_000
        timers += new.timer_service.num_event_time_timers()
        new.process_watermark(10_000)        # the watermark is not state: it comes again
        new.process_watermark(MAX_WATERMARK)
        out += new_main.rows()
        s, s_main, _ = build_sessions(subtask=i, parallelism=2, restore=sess_restored[i],
                                      base=location)
        s.process([{"key": k, "ts": 33_000 + k, "value": 2} for k in range(40)
                   if assign_key_groups([k], 128)[0] in s.keyed_backend.key_group_range])
        s.process_watermark(MAX_WATERMARK)
        sess_out += s_main.rows()
    assert timers == 40
    assert sorted(map(str, main.rows() + out)) == sorted(map(str, ref_main.rows()))
    # Each session kept its window and merged with the element that arrived after the restore.
    assert sorted((r["key"], r["start"], r["end"], r["values"]) for r in sess_out) == \
        [(k, 30_000 + k, 38_000 + k, [1, 2]) for k in range(40)]


def test_windows_are_checked_when_the_pipeline_is_built():
    env = ss.StreamEnvironment()
    source = ss.sources.Generator(lambda i: {"key": i % 2, "ts": i, "value": i}, count=10)
    plain = env.from_source(source)
    with pytest.raises(ss.ConfigurationError, match=r"non-keyed stream.*key_by"):
        plain.window(W.TumblingProcessingTimeWindows.of(1))
    with pytest.raises(ss.ConfigurationError, match="event-time windows need event timestamps"):
        plain.key_by("key").window(W.TumblingEventTimeWindows.of(1))
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    keyed = env.from_source(source, watermark_strategy=strategy).key_by("key")
    with pytest.raises(ss.ConfigurationError, match="session gap must be at least 1 ms"):
        W.EventTimeSessionWindows.with_gap(0)
    windowed = keyed.window(W.TumblingEventTimeWindows.of(1))
    with pytest.raises(ss.ConfigurationError, match="allowed_lateness must not be negative"):
        windowed.allowed_lateness(-1)
    with pytest.raises(ss.ConfigurationError, match="ProcessWindowFunction"):
        windowed.process(lambda key, ctx, rows: rows)
    with pytest.raises(ss.ConfigurationError, match="has no merge"):
        class NoMerge(ss.AggregateFunction):
            def create_accumulator(self):
                return 0

            def add(self, row, acc):
                return acc + 1

            def get_result(self, acc):
                return {"n": acc}

        keyed.window(W.EventTimeSessionWindows.with_gap(1)).aggregate(NoMerge())
    result = windowed.allowed_lateness(2).side_output_late_data(LATE).reduce(add_values)
    assert result.get_side_output(LATE) is not None


class InPlaceCountSum(CountSum):
    def add(self, row, acc):       # changes the stored accumulator in place
        acc[0] += 1
        acc[1] += row["value"]
        return acc


@pytest.mark.parametrize("contents, expected, live", [
    (ListContents, [1, 2], [1, 2, 4]),
    (lambda: AggregateContents(InPlaceCountSum()), [{"count": 2, "sum": 3}],
     [{"count": 3, "sum": 7}])])
def test_a_snapshot_holds_the_contents_of_its_moment_while_elements_keep_arriving(
        tmp_path, contents, expected, live):
    op, live_main, _ = window_operator(W.TumblingEventTimeWindows.of(10), contents(), Rows())
    op.process([{"key": "a", "ts": 1, "value": 1}, {"key": "a", "ts": 2, "value": 2}])
    pending = op.snapshot_state(1, 0.0, str(tmp_path))      # synchronous part only
    op.process([{"key": "a", "ts": 3, "value": 4}])          # before the async part runs
    state = pending.run()
    restored, main, _ = window_operator(W.TumblingEventTimeWindows.of(10), contents(), Rows(),
                                        restore=assign_operator_state({0: state}, 128, 1)[0],
                                        base=str(tmp_path))
    restored.process_watermark(MAX_WATERMARK)
    assert [r["values"] for r in main.rows()] == [expected]
    op.process_watermark(MAX_WATERMARK)          # the live operator kept all three rows
    assert [r["values"] for r in live_main.rows()] == [live]
