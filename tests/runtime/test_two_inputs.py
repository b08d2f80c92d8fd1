"""Two-input plumbing without Spark: which logical input each channel feeds (graph → input side),
barrier alignment across both inputs, and the (keyed) co-process operators driven directly."""

from __future__ import annotations

import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.graph.execution_graph import build_execution_graph
from streamsnap.graph.job_graph import build_job_graph
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.operators.co_process import CoProcessOperator, KeyedCoProcessOperator
from streamsnap.runtime.events import CheckpointBarrier, EndOfPartition, Watermark
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.time.watermarks import MAX_WATERMARK

from tests.runtime.test_input_watermarks import data, event, make_input
from tests.runtime.support import Sink


class Tag(ss.CoProcessFunction):
    def process_element1(self, row, ctx):
        yield {"side": 1, "v": row["v"], "ts": ctx.timestamp()}

    def process_element2(self, row, ctx):
        yield {"side": 2, "v": row["v"], "ts": ctx.timestamp()}


def _execution_graph(env_parallelism=2):
    env = ss.StreamEnvironment(parallelism=env_parallelism)
    rows = env.from_collection([{"k": 1, "v": 1}], name="rows")
    a = rows.map(dict, name="a", parallelism=2)
    b = rows.map(dict, name="b", parallelism=1)
    c = rows.map(dict, name="c", parallelism=3)
    joined = a.union(c).key_by("k").connect(b.key_by("k")).process(Enrich(), name="co")
    joined.sink_to(ss.sinks.Collect(), name="out")
    return build_execution_graph(build_job_graph(env._graph))


class Enrich(ss.KeyedCoProcessFunction):
    def open(self, ctx):
        self.latest = ctx.get_state(ss.ValueStateDescriptor("latest"))

    def process_element1(self, row, ctx):
        yield {"k": ctx.current_key, "v": row["v"], "rule": self.latest.value()}

    def process_element2(self, row, ctx):
        self.latest.update(row["v"])


def test_every_channel_of_a_two_input_task_knows_its_logical_input():
    graph = _execution_graph()
    co = [v for v in graph.vertices if v.vertex_id.startswith("co-")]
    assert len(co) == 2
    for vertex in co:
        assert len(vertex.input_of) == len(vertex.inputs)
        sources = {cid.source_vertex: set() for cid in vertex.inputs}
        for cid, logical in zip(vertex.inputs, vertex.input_of):
            sources[cid.source_vertex].add(logical)
        # a (2 subtasks) and c (3 subtasks), unioned, are input 0; b (chained to the source) is input 1
        assert {s.split("-")[0]: v for s, v in sources.items()} == {"a": {0}, "c": {0}, "source__rows": {1}}
        assert vertex.input_of.count(0) == 5 and vertex.input_of.count(1) == 1


def test_batches_carry_their_logical_input_and_alignment_spans_both_inputs():
    gate, (a1, a2, b1), task = make_input(3, input_of=[0, 0, 1])
    data(b1, [7])
    batch = gate.poll_next()
    assert batch.column("v").to_pylist() == [7] and gate.last_input == 1
    event(a1, CheckpointBarrier(1, 0.0))
    event(a2, CheckpointBarrier(1, 0.0))
    data(a1, [1])                         # behind the barrier: blocked until b's barrier
    assert gate.poll_next() is None and task.triggered == []
    event(b1, CheckpointBarrier(1, 0.0))
    batch = gate.poll_next()                # the last barrier releases input 0's channels
    assert task.triggered == [1]
    assert batch.column("v").to_pylist() == [1] and gate.last_input == 0


def test_end_of_input_needs_both_inputs_and_an_ended_input_leaves_event_time_to_the_other():
    gate, (a, b), _ = make_input(2, input_of=[0, 1])
    event(a, Watermark(50))
    event(b, Watermark(10))
    assert gate.poll_next() == Watermark(10)
    event(b, Watermark(MAX_WATERMARK))      # a bounded input ends event time, then its partition
    event(b, EndOfPartition())
    assert gate.poll_next() == Watermark(50)
    assert gate.poll_next() is None
    assert not gate.all_end_of_data
    event(a, EndOfPartition())
    while gate.poll_next() is not None:
        pass
    assert gate.all_end_of_data


def _ctx(name="co"):
    return OperatorContext(name=name, uid=name, subtask_index=0, parallelism=1, max_parallelism=128,
                           attempt=0, job_id="job", task_name=f"{name} (1/1)", timers=ManualScheduler(),
                           clock=ManualScheduler())


def test_co_process_operator_calls_the_input_s_method_with_its_own_timestamps():
    op = CoProcessOperator(_ctx(), Tag(), timestamps=("t1", "t2"))
    op.output = Output([sink := Sink()])
    op.initialize_state()
    op.open()
    op.process_input(0, [{"v": "x", "t1": 5, "t2": 99}])
    op.process_input(1, pa.RecordBatch.from_pylist([{"v": "y", "t1": 99, "t2": 8}]))
    assert sink.items == [{"side": 1, "v": "x", "ts": 5}, {"side": 2, "v": "y", "ts": 8}]


class Expiring(ss.KeyedCoProcessFunction):
    """Input 2 sets a rule per key and a timer; input 1 reads it; the timer clears it."""

    def open(self, ctx):
        self.rule = ctx.get_state(ss.ValueStateDescriptor("rule"))

    def process_element1(self, row, ctx):
        yield {"user": ctx.current_key, "rule": self.rule.value()}

    def process_element2(self, row, ctx):
        self.rule.update(row["rule"])
        ctx.timer_service().register_event_time_timer(row["until"])

    def on_timer(self, timestamp, ctx):
        self.rule.clear()
        yield {"user": ctx.current_key, "expired": timestamp}


def test_keyed_co_process_shares_state_between_inputs_keyed_by_different_columns():
    op = KeyedCoProcessOperator(_ctx(), Expiring(), (KeySelector.of("user"), KeySelector.of("id")))
    op.output = Output([sink := Sink()])
    op.initialize_state()
    op.open()
    op.process_input(1, [{"id": "ann", "rule": "r1", "until": 100}])
    op.process_input(0, [{"user": "ann"}, {"user": "bob"}])
    op.process_watermark(100)
    op.process_input(0, [{"user": "ann"}])
    assert sink.items == [{"user": "ann", "rule": "r1"}, {"user": "bob", "rule": None},
                          {"user": "ann", "expired": 100}, ("watermark", 100),
                          {"user": "ann", "rule": None}]


def test_keyed_co_process_on_non_keyed_inputs_fails_at_build_time_naming_the_fix():
    env = ss.StreamEnvironment(parallelism=1)
    a = env.from_collection([{"user": "a"}], name="a")
    b = env.from_collection([{"id": "a"}], name="b")
    with pytest.raises(ss.ConfigurationError, match="key_by"):
        a.connect(b).process(Expiring())
    with pytest.raises(ss.ConfigurationError, match="process_element2"):
        a.connect(b).process(object())
    a.connect(b).key_by("user", "id").process(Expiring()).sink_to(ss.sinks.Collect())


def test_window_join_pairs_rows_of_one_key_and_window_like_a_reference():
    import random

    from streamsnap.runtime.operators.window_join import WindowJoinOperator

    assigner = ss.windows.TumblingEventTimeWindows.of(0.1)
    op = WindowJoinOperator(_ctx("join"), (KeySelector.of("k"), KeySelector.of("key")), ("t", "ts"),
                            assigner, assigner.default_trigger(), 0,
                            lambda left, right: {"l": left["id"], "r": right["id"]})
    op.output = Output([sink := Sink()])
    op.initialize_state()
    op.open()
    rng = random.Random(3)
    left = [{"id": f"l{i}", "k": rng.randrange(3), "t": rng.randrange(1000)} for i in range(120)]
    right = [{"id": f"r{i}", "key": rng.randrange(3), "ts": rng.randrange(1000)} for i in range(120)]
    op.process_input(0, left[:60])
    op.process_input(1, pa.RecordBatch.from_pylist(right))
    op.process_input(0, left[60:])
    op.process_watermark(999)
    expected = sorted((a["id"], b["id"]) for a in left for b in right
                      if a["k"] == b["key"] and a["t"] // 100 == b["ts"] // 100)
    got = sorted((r["l"], r["r"]) for r in sink.items if isinstance(r, dict))
    assert got == expected and len(expected) > 300
    assert sink.items[-1] == ("watermark", 999)


def test_window_join_build_errors_name_the_fix():
    env = ss.StreamEnvironment(parallelism=1)
    a = env.from_collection([{"k": 1, "t": 1}], name="a")
    b = env.from_collection([{"k": 1, "t": 1}], name="b")
    with pytest.raises(ss.ConfigurationError, match="no event timestamps"):
        a.join(b).where("k").equal_to("k").window(ss.windows.TumblingEventTimeWindows.of(1))
    with pytest.raises(ss.ConfigurationError, match="after .where"):
        a.join(b).equal_to("k")
    with pytest.raises(ss.ConfigurationError, match="without key_by"):
        a.key_by("k").join(b)
    joined = (a.join(b).where("k").equal_to("k").window(ss.windows.TumblingProcessingTimeWindows.of(1))
              .apply(lambda x, y: {**x, **y}))
    joined.sink_to(ss.sinks.Collect())
