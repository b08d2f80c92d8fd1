"""Keyed window aggregates build in two phases (runtime/operators/local_windows.py) where they
can: the local stage chained to the input at its parallelism, the global one keyed, and the
default uids of the job's own operators unchanged by the added stage (their savepoint state
stays theirs)."""

from __future__ import annotations

import pyarrow as pa

import streamsnap as ss

W = ss.windows
SCHEMA = pa.schema([("ts", pa.int64()), ("k", pa.string()), ("price", pa.int64())])


def stream(env):
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    source = ss.sources.Generator(lambda i: {"ts": i, "k": "a", "price": i % 7}, count=10, schema=SCHEMA)
    return env.from_source(source, name="rows", watermark_strategy=strategy, parallelism=3)


def nodes(env):
    return {n.name: n for n in env._graph.nodes.values()}


def test_the_local_stage_runs_at_the_inputs_parallelism_and_the_global_one_is_keyed():
    env = ss.StreamEnvironment(parallelism=2)
    stream(env).key_by("k").window(W.TumblingEventTimeWindows.of(1)).aggregate_columns(
        {"n": "count", "top": ("max", "price")}, name="stats").map(lambda r: r, name="after")
    graph = nodes(env)
    assert graph["stats (local)"].parallelism == 3 and graph["stats"].parallelism == 2
    assert [type(graph["stats"].operator).__name__, type(graph["stats (local)"].operator).__name__] == \
        ["KeyedGlobalWindowAggregateOperatorFactory", "LocalKeyedWindowAggregateOperatorFactory"]
    # the job's operators keep the default uids they had in one phase
    assert [graph[n].uid for n in ("Source: rows", "stats", "after")] == ["source__rows-0", "stats-1", "after-2"]
    assert graph["stats (local)"].uid != graph["stats"].uid


def test_a_given_uid_names_the_local_stage_after_it():
    env = ss.StreamEnvironment(parallelism=2)
    stream(env).key_by("k").window(W.SlidingEventTimeWindows.of(3, 2)).count(name="counts", uid="counts")
    graph = nodes(env)
    assert graph["counts (local)"].uid == "counts-local" and graph["counts"].uid == "counts"


def test_aggregates_that_need_every_row_or_a_key_function_run_in_one_phase():
    env = ss.StreamEnvironment(parallelism=2)
    s = stream(env)
    s.key_by(lambda r: r["k"]).window(W.TumblingEventTimeWindows.of(1)).count(name="by function")
    s.key_by("k").window(W.TumblingProcessingTimeWindows.of(1)).count(name="processing time")
    s.key_by("k").window(W.TumblingEventTimeWindows.of(1)).aggregate_columns(
        {"d": ("count_distinct", "price")}, name="distinct")
    s.key_by("k").window(W.SlidingEventTimeWindows.of(2, 1)).count(name="sliced")   # slices: their own operator
    assert not [n for n in nodes(env) if n.endswith("(local)")]


def test_session_windows_split_too():
    env = ss.StreamEnvironment(parallelism=2)
    stream(env).key_by("k").window(W.EventTimeSessionWindows.with_gap(1)).count(name="sessions")
    graph = nodes(env)
    assert [type(graph[n].operator).__name__ for n in ("sessions (local)", "sessions")] == \
        ["LocalSessionAggregateOperatorFactory", "KeyedGlobalSessionAggregateOperatorFactory"]
