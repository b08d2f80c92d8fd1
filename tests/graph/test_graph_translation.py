"""StreamGraph -> JobGraph (chaining) -> ExecutionGraph (subtasks, channels)."""

import pytest

import streamsnap as ss
from streamsnap.graph.execution_graph import build_execution_graph
from streamsnap.graph.job_graph import build_job_graph
from streamsnap.graph.partitioners import (
    BroadcastPartitioner, ForwardPartitioner, KeyGroupPartitioner, RebalancePartitioner,
)


class Sum(ss.KeyedProcessFunction):
    def process_element(self, row, ctx):
        yield row


def gen(n=10):
    return ss.sources.Generator(lambda i: {"key": i % 3, "value": i}, count=n)


def plan(env):
    job = build_job_graph(env._graph)
    return job, build_execution_graph(job)


def test_forward_operators_of_equal_parallelism_chain_into_one_task():
    env = ss.StreamEnvironment(parallelism=2)
    (env.from_source(gen(), name="src").map(lambda r: r, name="m1").filter(lambda r: True, name="f")
        .key_by("key").process(Sum(), name="sum").map(lambda r: r, name="m2")
        .sink_to(ss.sinks.Collect(), name="out"))
    job, eg = plan(env)
    names = [v.name for v in job.vertices.values()]
    assert names == ["Source: src -> m1 -> f", "sum -> m2 -> out"]
    assert len(job.edges) == 1 and isinstance(job.edges[0].partitioner, KeyGroupPartitioner)
    assert eg.num_tasks == 4
    # all-to-all hash edge: every downstream subtask has one input channel per upstream subtask
    downstream = eg.subtasks(list(job.vertices)[1])
    assert [len(v.inputs) for v in downstream] == [2, 2]
    assert [c.source_index for c in downstream[1].inputs] == [0, 1]


def test_different_parallelism_breaks_the_chain_with_a_rebalance():
    env = ss.StreamEnvironment(parallelism=2)
    env.from_source(gen(), name="src").map(lambda r: r, name="wide", parallelism=3).sink_to(ss.sinks.Collect(), name="o")
    job, eg = plan(env)
    assert [v.name for v in job.vertices.values()] == ["Source: src", "wide", "o"]
    assert isinstance(job.edges[0].partitioner, RebalancePartitioner)
    assert isinstance(job.edges[1].partitioner, RebalancePartitioner)  # 3 -> 2
    assert eg.num_tasks == 2 + 3 + 2


def test_a_branching_chain_and_a_union_input():
    env = ss.StreamEnvironment(parallelism=1)
    src = env.from_source(gen(), name="src")
    a = src.map(lambda r: r, name="a")
    b = src.map(lambda r: r, name="b")
    a.union(b).sink_to(ss.sinks.Collect(), name="out")
    job, eg = plan(env)
    first = list(job.vertices.values())[0]
    assert first.name == "Source: src -> a -> b"
    assert first.chained[first.head] == [first.nodes[1], first.nodes[2]]
    sink_vertex = list(job.vertices.values())[1]
    assert sink_vertex.name == "out" and len(sink_vertex.inputs) == 2  # a union is two input edges
    assert all(isinstance(e.partitioner, ForwardPartitioner) for e in sink_vertex.inputs)
    assert len(eg.subtasks(sink_vertex.id)[0].inputs) == 2


def test_broadcast_and_explicit_forward():
    env = ss.StreamEnvironment(parallelism=2)
    env.from_source(gen(), name="src").broadcast().map(lambda r: r, name="m").sink_to(ss.sinks.Collect())
    job, eg = plan(env)
    assert isinstance(job.edges[0].partitioner, BroadcastPartitioner)
    env = ss.StreamEnvironment(parallelism=2)
    env.from_source(gen(), name="src").forward().map(lambda r: r, parallelism=3).sink_to(ss.sinks.Collect())
    with pytest.raises(ss.ConfigurationError, match="equal parallelism"):
        plan(env)


def test_uids_are_stable_and_unique():
    env = ss.StreamEnvironment(parallelism=1)
    src = env.from_source(gen(), name="src", uid="my-source")
    with pytest.raises(ss.ConfigurationError, match="used by two operators"):
        src.map(lambda r: r, uid="my-source")
    with pytest.raises(ss.ConfigurationError, match="without spaces"):
        src.map(lambda r: r, uid="has space")


def test_pipelines_without_sink_or_source_are_rejected():
    env = ss.StreamEnvironment()
    env.from_source(gen()).map(lambda r: r)
    with pytest.raises(ss.ConfigurationError, match="goes nowhere|no sink"):
        plan(env)
    with pytest.raises(ss.ConfigurationError, match="no source"):
        plan(ss.StreamEnvironment())


def test_slot_sharing_puts_subtask_i_of_every_vertex_into_slot_i():
    from streamsnap.graph.slot_sharing import plan_slots

    env = ss.StreamEnvironment(parallelism=2)
    env.from_source(gen(), name="src").map(lambda r: r, name="wide", parallelism=3).sink_to(ss.sinks.Collect(), name="o")
    _, eg = plan(env)
    shared = plan_slots(eg, shared=True)
    # src#0,1 = tasks 0,1; wide#0..2 = 2,3,4; o#0,1 = 5,6: as many slots as the widest vertex
    assert shared == ((0, 2, 5), (1, 3, 6), (4,))
    assert sorted(t for slot in shared for t in slot) == list(range(eg.num_tasks))
    assert plan_slots(eg, shared=False) == tuple((t,) for t in range(7))
