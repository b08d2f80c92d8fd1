"""Broadcast state without Spark: the operator driven directly (or through the test harness), its
state in checkpoints and restored at another parallelism (every subtask gets one identical copy),
build-time errors."""

from __future__ import annotations

import pytest

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.operators.broadcast import BroadcastProcessOperator, KeyedBroadcastProcessOperator
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.state.assignment import assign_operator_state
from streamsnap.testing import harness

from tests.runtime.support import Sink

RULES = ss.MapStateDescriptor("limits")
REJECTED = ss.OutputTag("rejected")


class Limits(ss.KeyedBroadcastProcessFunction):
    def open(self, ctx):
        self.total = ctx.get_state(ss.ValueStateDescriptor("total", default=0))

    def process_broadcast_element(self, row, ctx):
        ctx.get_broadcast_state(RULES).put(row["category"], row["limit"])
        if row["limit"] < 0:
            ctx.output(REJECTED, row)

    def process_element(self, row, ctx):
        limit = ctx.get_broadcast_state(RULES).get(row["category"])
        self.total.update(self.total.value() + row["amount"])
        yield {"user": ctx.current_key, "total": self.total.value(),
               "over": limit is not None and self.total.value() > limit}


def make(cls=KeyedBroadcastProcessOperator, index=0, parallelism=1, restore=None, base=None, fn=None):
    clock = ManualScheduler()
    ctx = OperatorContext(name="limits", uid="limits", subtask_index=index, parallelism=parallelism,
                          max_parallelism=128, attempt=0, job_id="job", task_name="limits",
                          timers=clock, clock=clock, restore=restore, restore_base=base)
    if cls is KeyedBroadcastProcessOperator:
        op = cls(ctx, fn or Limits(), KeySelector.of("user"), (RULES,))
    else:
        op = cls(ctx, fn, (RULES,))
    op.output = Output([sink := Sink()], {"rejected": [side := Sink()]})
    op.initialize_state()
    op.open()
    return op, sink, side


def test_the_broadcast_side_writes_the_element_side_reads_with_keyed_state():
    op, sink, side = make()
    op.process_input(1, [{"category": "food", "limit": 10}, {"category": "bad", "limit": -1}])
    op.process_input(0, [{"user": "a", "category": "food", "amount": 6},
                         {"user": "b", "category": "food", "amount": 6},
                         {"user": "a", "category": "food", "amount": 6},
                         {"user": "a", "category": "toys", "amount": 1}])
    assert sink.items == [{"user": "a", "total": 6, "over": False}, {"user": "b", "total": 6, "over": False},
                          {"user": "a", "total": 12, "over": True}, {"user": "a", "total": 13, "over": False}]
    assert side.items == [{"category": "bad", "limit": -1}]


class Cheater(ss.BroadcastProcessFunction):
    def process_broadcast_element(self, row, ctx):
        return None

    def process_element(self, row, ctx):
        ctx.get_broadcast_state(RULES).put("x", 1)     # read-only here: fails


class KeyedInBroadcast(ss.BroadcastProcessFunction):
    def process_broadcast_element(self, row, ctx):
        ctx.get_state(ss.ValueStateDescriptor("v"))

    def process_element(self, row, ctx):
        ctx.get_broadcast_state("undeclared")


def test_the_element_side_cannot_write_and_the_broadcast_side_has_no_key():
    op, _, _ = make(BroadcastProcessOperator, fn=Cheater())
    with pytest.raises(ss.UserFunctionError, match="put"):
        op.process_input(0, [{"user": "a"}])
    op, _, _ = make(BroadcastProcessOperator, fn=KeyedInBroadcast())
    with pytest.raises(ss.UsageError, match=r"no current key(?s:.*)row: \{'rule': 1\}") as info:
        op.process_input(1, [{"rule": 1}])   # not restarted: a replay would call it again
    assert isinstance(info.value, ss.DataError) and info.value.operator
    with pytest.raises(ss.UserFunctionError, match="undeclared"):
        op.process_input(0, [{"user": "a"}])


def test_every_subtask_restores_one_identical_copy_at_another_parallelism(tmp_path):
    location = f"file://{tmp_path}"
    states = {}
    for index in range(2):
        op, _, _ = make(index=index, parallelism=2)
        op.process_input(1, [{"category": "food", "limit": 10}, {"category": "toys", "limit": 3}])
        states[index] = op.snapshot_state(1, 0.0, location).run()
    assert all(s.operator for s in states.values())     # each subtask checkpointed its copy
    for assignment in assign_operator_state(states, 128, 3):
        op, _, _ = make(index=assignment.subtask_index, parallelism=3, restore=assignment, base=location)
        view = op.context.get_broadcast_state(RULES)
        assert dict(view.items()) == {"food": 10, "toys": 3}


def test_build_time_errors_name_the_problem_and_the_fix():
    env = ss.StreamEnvironment(parallelism=2)
    events = env.from_collection([{"user": "a", "category": "food", "amount": 1}], name="events")
    rules = env.from_collection([{"category": "food", "limit": 1}], name="rules")
    with pytest.raises(ss.ConfigurationError, match="MapStateDescriptor"):
        rules.broadcast("limits")
    with pytest.raises(ss.ConfigurationError, match="declares its state"):
        events.connect(rules.broadcast()).process(Cheater())
    with pytest.raises(ss.ConfigurationError, match="keyed stream"):
        events.connect(rules.broadcast(RULES)).process(Limits())
    out = events.key_by("user").connect(rules.broadcast(RULES)).process(Limits(), name="limits")
    out.get_side_output(REJECTED).sink_to(ss.sinks.Collect())
    out.sink_to(ss.sinks.Collect())


class ResetOnRule(ss.KeyedBroadcastProcessFunction):
    """A new rule clears the totals of every user over its limit (Flink's applyToKeyedState)."""

    TOTAL = ss.ValueStateDescriptor("total", default=0)

    def open(self, ctx):
        self.total = ctx.get_state(self.TOTAL)

    def process_broadcast_element(self, row, ctx):
        def reset(user, total):
            if total.value() > row["limit"]:
                ctx.output(REJECTED, {"user": user, "total": total.value()})
                total.clear()
        ctx.apply_to_keyed_state(self.TOTAL, reset)

    def process_element(self, row, ctx):
        self.total.update(self.total.value() + row["amount"])
        yield {"user": ctx.current_key, "total": self.total.value()}


def test_the_broadcast_side_visits_every_keys_state():
    h = harness(ResetOnRule(), key_by="user", broadcast=RULES)
    h.process_batch([{"user": u, "amount": a} for u, a in (("a", 5), ("b", 20), ("c", 30), ("a", 1))])
    h.process_broadcast({"limit": 10})
    assert sorted(h.side_output(REJECTED), key=lambda r: r["user"]) == [{"user": "b", "total": 20},
                                                                       {"user": "c", "total": 30}]
    assert h.state("total") == {"a": 6}
    h.process_batch([{"user": "b", "amount": 1}, {"user": "a", "amount": 1}])
    assert h.output[-2:] == [{"user": "b", "total": 1}, {"user": "a", "total": 7}]


def test_apply_to_keyed_state_needs_a_keyed_input():
    class Unkeyed(ss.BroadcastProcessFunction):
        def process_broadcast_element(self, row, ctx):
            ctx.apply_to_keyed_state(ss.ValueStateDescriptor("total"), lambda key, state: None)

        def process_element(self, row, ctx):
            return None

    op, _, _ = make(BroadcastProcessOperator, fn=Unkeyed())
    with pytest.raises(Exception, match="is not keyed, so it has no keyed state to apply to"):
        op.process_input(1, [{"limit": 1}])
