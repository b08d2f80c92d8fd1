"""Timers of a KeyedProcessOperator: event time fires before the watermark moves on,
processing time from a wake-up on the task's timer queue (manual clock here)."""

from __future__ import annotations

import pytest

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.runtime.operators.process import KeyedProcessOperator
from tests.runtime.support import Sink




class Timers(ss.KeyedProcessFunction):
    def process_element(self, row, ctx):
        timers = ctx.timer_service()
        if "event" in row:
            timers.register_event_time_timer(row["event"])
        if "processing" in row:
            timers.register_processing_time_timer(row["processing"])
        if "delete" in row:
            timers.delete_event_time_timer(row["delete"])

    def on_timer(self, timestamp, ctx):
        yield {"key": ctx.current_key, "at": timestamp, "domain": ctx.time_domain().value,
               "timestamp": ctx.timestamp()}
        if timestamp == 20:      # a timer set while firing, already due: fires in the same advance
            ctx.timer_service().register_event_time_timer(25)


def operator(function, clock):
    ctx = OperatorContext(name="timers", uid="timers", subtask_index=0, parallelism=1, max_parallelism=128,
                          attempt=0, job_id="job", task_name="timers (1/1)", timers=clock, clock=clock)
    op = KeyedProcessOperator(ctx, function, KeySelector.of("key"), timestamps="ts")
    op.output = Output([sink := Sink()])
    op.initialize_state()
    op.open()
    return op, sink


def test_event_time_timers_fire_in_order_once_before_the_watermark_is_forwarded():
    op, sink = operator(Timers(), ManualScheduler())
    op.process([{"key": "a", "event": 20}, {"key": "b", "event": 10}, {"key": "a", "event": 20},
                {"key": "b", "event": 40}, {"key": "b", "event": 50, "delete": 40}])
    op.process_watermark(30)
    assert sink.items == [
        {"key": "b", "at": 10, "domain": "event_time", "timestamp": 10},
        {"key": "a", "at": 20, "domain": "event_time", "timestamp": 20},
        {"key": "a", "at": 25, "domain": "event_time", "timestamp": 25},
        ("watermark", 30)]
    op.process_watermark(60)
    assert sink.items[-2:] == [{"key": "b", "at": 50, "domain": "event_time", "timestamp": 50},
                               ("watermark", 60)]
    assert op.timer_service.num_event_time_timers() == 0


def test_processing_time_timers_fire_from_the_timer_queue_never_early():
    clock = ManualScheduler()
    op, sink = operator(Timers(), clock)
    now = int(clock.wall() * 1000)
    op.process([{"key": "a", "processing": now + 500}, {"key": "b", "processing": now + 200}])
    clock.advance(0.1)
    assert sink.items == []
    clock.advance(0.1)
    assert [r["key"] for r in sink.items] == ["b"]
    op.process([{"key": "c", "processing": now + 300}])     # earlier than the pending wake-up
    clock.advance(0.1)
    assert [r["key"] for r in sink.items] == ["b", "c"]
    clock.advance(0.2)
    assert [(r["key"], r["domain"]) for r in sink.items] == [
        ("b", "processing_time"), ("c", "processing_time"), ("a", "processing_time")]
    assert clock.pending_timers() == 0


def test_a_timer_without_on_timer_names_the_operator_and_the_timer():
    class NoOnTimer(ss.KeyedProcessFunction):
        def process_element(self, row, ctx):
            ctx.timer_service().register_event_time_timer(5)

    op, _ = operator(NoOnTimer(), ManualScheduler())
    op.process([{"key": "k"}])
    with pytest.raises(ss.UsageError, match=r"(?s)no on_timer.*event_time timer 5 of key 'k'"):
        op.process_watermark(10)


def test_element_timestamps_come_from_the_streams_assigner_and_side_outputs_are_routed():
    late = ss.OutputTag("late")

    class Split(ss.KeyedProcessFunction):
        def process_element(self, row, ctx):
            ts = ctx.timestamp()        # None: the row has no timestamp field
            if ts is not None and ts < 100:
                ctx.output(late, {"ts": ts})
            else:
                yield {"ts": ts}

    clock = ManualScheduler()
    op, _ = operator(Split(), clock)
    main, side = Sink(), Sink()
    op.output = Output([main], {"late": [side]})
    op.process([{"key": 1, "ts": 50}, {"key": 1, "ts": 150}, {"key": 2}])
    assert main.items == [{"ts": 150}, {"ts": None}] and side.items == [{"ts": 50}]
    op.process_watermark(7)
    assert main.items[-1] == side.items[-1] == ("watermark", 7)
