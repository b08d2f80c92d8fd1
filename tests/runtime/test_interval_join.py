"""The interval join operator driven directly (real HashMap keyed backend, manual watermarks):
matches equal a nested-loop reference, bounds and exclusivity, lateness, cleanup by timers,
and build-time errors."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.operators.interval_join import IntervalJoinOperator
from streamsnap.runtime.operators.base import OperatorContext, Output

from tests.runtime.support import Sink


class Pair(ss.ProcessJoinFunction):
    def process_element(self, left, right, ctx):
        yield {"k": ctx.current_key, "l": left["id"], "r": right["id"], "ts": ctx.timestamp(),
               "lts": ctx.left_timestamp(), "rts": ctx.right_timestamp()}


def make(lower, upper, restore=None, base=None, late_tags=(None, None), late_sinks=None):
    clock = ManualScheduler()
    ctx = OperatorContext(name="join", uid="join", subtask_index=0, parallelism=1, max_parallelism=128,
                          attempt=0, job_id="job", task_name="join (1/1)", timers=clock, clock=clock)
    op = IntervalJoinOperator(ctx, Pair(), (KeySelector.of("k"), KeySelector.of("user")), ("t", "time"),
                              lower, upper, late_tags)
    op.output = Output([sink := Sink()], {tag: [target] for tag, target in (late_sinks or {}).items()})
    if restore is not None:
        op.keyed_backend.restore(restore, base)
    op.initialize_state()
    op.open()
    return op, sink


def pairs(sink):
    return sorted((r["l"], r["r"]) for r in sink.items if isinstance(r, dict))


def test_matches_equal_a_nested_loop_reference_with_out_of_order_rows_and_watermarks():
    rng = random.Random(7)
    lower, upper, delay = -30, 50, 40
    left = [{"id": f"l{i}", "k": rng.randrange(4), "t": rng.randrange(0, 2000)} for i in range(300)]
    right = [{"id": f"r{i}", "user": rng.randrange(4), "time": rng.randrange(0, 2000)} for i in range(300)]
    # Arrival: by time with jitter below the watermark delay, so no row is late.
    arrivals = sorted([(r["t"] + rng.randrange(delay), 0, r) for r in left] +
                      [(r["time"] + rng.randrange(delay), 1, r) for r in right], key=lambda x: x[0])
    op, sink = make(lower, upper)
    for i, (at, side, row) in enumerate(arrivals):
        op.process_input(side, [row])
        if i % 25 == 0:
            op.process_watermark(at - delay)
    op.process_watermark(10_000)
    expected = sorted((l["id"], r["id"]) for l in left for r in right
                      if l["k"] == r["user"] and l["t"] + lower <= r["time"] <= l["t"] + upper)
    assert pairs(sink) == expected and len(expected) > 100
    for r in sink.items:
        if isinstance(r, dict):
            assert r["ts"] == max(r["lts"], r["rts"])
    # Every buffered row was cleaned up by its timer.
    assert op.timer_service.num_event_time_timers() == 0
    assert all(op.keyed_backend.get_keys(name) == [] for name in op.keyed_backend.state_names()
               if name.startswith("_interval_join"))


def test_bounds_are_inclusive_and_late_rows_are_dropped():
    op, sink = make(0, 10)
    op.process_input(0, [{"id": "l", "k": 1, "t": 100}])
    op.process_input(1, [{"id": "at-lower", "user": 1, "time": 100}, {"id": "at-upper", "user": 1, "time": 110},
                         {"id": "above", "user": 1, "time": 111}, {"id": "other-key", "user": 2, "time": 105}])
    assert pairs(sink) == [("l", "at-lower"), ("l", "at-upper")]
    op.process_watermark(111)              # past 110: the left row is gone, a row at 111 is on time
    op.process_input(1, [{"id": "after-cleanup", "user": 1, "time": 111}])
    op.process_input(0, [{"id": "late", "k": 1, "t": 105}])   # below the watermark: dropped
    assert pairs(sink) == [("l", "at-lower"), ("l", "at-upper")]


def test_late_rows_go_to_their_sides_late_data_output():
    late_left, late_right = Sink(), Sink()
    op, sink = make(0, 10, late_tags=("late-views", "late-bids"),
                    late_sinks={"late-views": late_left, "late-bids": late_right})
    op.process_input(0, [{"id": "l", "k": 1, "t": 100}])
    op.process_watermark(90)
    op.process_input(1, [{"id": "on-time", "user": 1, "time": 95}, {"id": "r-late", "user": 1, "time": 80}])
    op.process_input(0, [{"id": "l-late", "k": 1, "t": 89}, {"id": "l-on-time", "k": 1, "t": 90}])
    assert pairs(sink) == [("l-on-time", "on-time")]     # 95 is outside [100, 110] for "l"
    rows = lambda s: [r["id"] for r in s.items if isinstance(r, dict)]  # noqa: E731
    assert rows(late_left) == ["l-late"] and rows(late_right) == ["r-late"]


def test_late_data_tags_are_checked_when_the_job_is_built():
    env = ss.StreamEnvironment(parallelism=1)
    timed = ss.WatermarkStrategy.for_bounded_out_of_orderness(1).with_timestamp_assigner("t")
    a = env.from_collection([{"k": 1, "t": 1}], name="a").assign_timestamps_and_watermarks(timed)
    joined = a.key_by("k").interval_join(a.key_by("k")).between(-1, 1)
    with pytest.raises(ss.ConfigurationError, match="side_output_left_late_data takes an ss.OutputTag"):
        joined.side_output_left_late_data("late")
    tag = ss.OutputTag("late")
    with pytest.raises(ss.ConfigurationError, match="give each side its own"):
        joined.side_output_left_late_data(tag).side_output_right_late_data(ss.OutputTag("late"))
    out = joined.side_output_left_late_data(tag).upper_bound_exclusive().process(Pair(), name="j")
    assert out.get_side_output(tag) is not None


def test_buffers_are_in_the_checkpoint_and_join_after_restore(tmp_path):
    op, _ = make(-5, 5)
    op.process_input(0, [{"id": "l", "k": "a", "t": 50}])
    location = f"file://{tmp_path}"
    handles = op.snapshot_state(1, 0.0, location).run()
    restored, sink = make(-5, 5, restore=list(handles.keyed), base=location)
    assert restored.timer_service.num_event_time_timers() == 1
    restored.process_input(1, [{"id": "r", "user": "a", "time": 53}, {"id": "far", "user": "a", "time": 56}])
    assert pairs(sink) == [("l", "r")]


def test_build_time_errors_name_the_problem_and_the_fix():
    env = ss.StreamEnvironment(parallelism=1)
    timed = ss.WatermarkStrategy.for_bounded_out_of_orderness(1).with_timestamp_assigner("t")
    a = env.from_collection([{"k": 1, "t": 1}], name="a").assign_timestamps_and_watermarks(timed)
    b = env.from_collection([{"k": 1, "t": 1}], name="b").assign_timestamps_and_watermarks(timed)
    untimed = env.from_collection([{"k": 1, "t": 1}], name="c")
    with pytest.raises(ss.ConfigurationError, match="lower bound is above the upper"):
        a.key_by("k").interval_join(b.key_by("k")).between(5, -5)
    with pytest.raises(ss.ConfigurationError, match="right input .* has no event timestamps"):
        a.key_by("k").interval_join(untimed.key_by("k")).between(-1, 1).process(Pair())
    with pytest.raises(ss.ConfigurationError, match="both streams must be keyed"):
        a.key_by("k").interval_join(b).between(-1, 1)
    with pytest.raises(ss.ConfigurationError, match="empty"):
        a.key_by("k").interval_join(b.key_by("k")).between(0, 0).lower_bound_exclusive().process(Pair())
    joined = a.key_by("k").interval_join(b.key_by("k")).between(timedelta(seconds=-1), 2)
    assert (joined.lower, joined.upper) == (-1000, 2000)
    assert (joined.upper_bound_exclusive().lower_bound_exclusive().process(Pair()) is not None)


def test_partners_are_found_by_time_not_by_scanning_the_other_buffer(monkeypatch):
    """A row reads only the other side's buckets inside its bounds: the per-key sorted times
    are built from the state once per key, then kept beside it."""
    op, sink = make(-2, 2)
    op.process_input(1, [{"id": f"r{t}", "user": "a", "time": t} for t in range(2000)])
    buffer_type = type(op._buffers[1])
    calls = {"get": 0, "keys": 0, "items": 0}
    for name in calls:
        original = getattr(buffer_type, name)
        def counted(self, *args, _name=name, _original=original):
            calls[_name] += 1
            return _original(self, *args)
        monkeypatch.setattr(buffer_type, name, counted)
    op.process_input(0, [{"id": f"l{t}", "k": "a", "t": t} for t in range(1000, 1100)])
    assert len(pairs(sink)) == 100 * 5
    assert calls["items"] == 0 and calls["keys"] <= 1          # the left side's index, built once
    assert calls["get"] <= 100 * (1 + 5)                         # own bucket + the five partners
    op.process_watermark(1500)             # cleanup timers drop buckets and their index entries
    assert op._times[1].of("a")[0] >= 1500 - 2 and op._times[0].of("a") == []
