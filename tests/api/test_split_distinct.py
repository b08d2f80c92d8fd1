"""Split distinct aggregation's build (api/split_distinct.py): the stages it adds, the rows its
expansion makes and the final division, and bad input failing when the job is built."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.api.datastream import DataStream
from streamsnap.api.split_distinct import BUCKET, PART, expand, finish
from streamsnap.state.key_groups import assign_key_groups, subtasks_for_key_groups

W = ss.windows
SCHEMA = pa.schema([("ts", pa.int64()), ("k", pa.string()), ("user", pa.int64()), ("item", pa.string()),
                    ("ok", pa.bool_()), ("price", pa.float64())])
AGGS = {"users": ("count_distinct", "user"), "ok_items": ("count_distinct", "item", "ok"),
        "n": "count", "avg": ("mean", "price"), "top": ("max", "price")}


def keyed(env=None, key="k", schema=SCHEMA):
    env = env or ss.StreamEnvironment(parallelism=2)
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    source = ss.sources.Generator(lambda i: {"ts": i, "k": "a", "user": i, "item": str(i), "ok": True,
                                             "price": 1.0}, count=10, schema=schema)
    return env.from_source(source, name="rows", watermark_strategy=strategy).key_by(key)


def test_a_split_aggregate_is_a_partial_stage_per_bucket_and_a_final_one_per_key():
    out = keyed().window(W.TumblingEventTimeWindows.of(1)).aggregate_columns(AGGS, split_distinct=16, name="stats")
    names = [n.name for n in out.env._graph.nodes.values()]
    # the final sums run in two phases (runtime/operators/local_windows.py)
    assert names[-5:] == ["stats [split]", "stats [partial]", "stats [final] (local)", "stats [final]",
                          "stats [result]"]
    named = keyed().window(W.TumblingEventTimeWindows.of(1)).aggregate_columns(AGGS, split_distinct=16, uid="stats")
    assert [n.uid for n in named.env._graph.nodes.values()][-5:] == \
        ["stats-split", "stats-partial", "stats-final-local", "stats-final", "stats-result"]     # stable: a savepoint finds its state
    assert out.schema.names == ["k", "window_start", "window_end", "users", "ok_items", "n", "avg", "top"]
    assert out.schema == keyed().window(W.TumblingEventTimeWindows.of(1)).aggregate_columns(AGGS).schema


def test_the_expansion_spreads_one_hot_key_over_every_subtask():
    n = 2_000
    batch = pa.RecordBatch.from_pydict(
        {"ts": np.arange(n), "k": ["hot"] * n, "user": np.arange(n) % 300, "item": [str(i % 70) for i in range(n)],
         "ok": [i % 3 == 0 for i in range(n)], "price": [None if i % 4 == 0 else float(i) for i in range(n)]},
        schema=SCHEMA)
    out = keyed().window(W.TumblingEventTimeWindows.of(1)).aggregate_columns(AGGS, split_distinct=32)
    expand_node = next(node for node in out.env._graph.nodes.values() if node.name.endswith("[split]"))
    expanded = expand_node.operator.function(batch)
    assert expanded.num_rows == 2 * n                      # once per distinct column (user, item)
    assert expanded.column(PART).to_pylist() == [0] * n + [1] * n
    part0, part1 = expanded.slice(0, n), expanded.slice(n)
    # a value's bucket is the same in every batch and process: a stable hash of the value
    assert expand_node.operator.function(batch.slice(7, 1)).column(BUCKET)[0] == part0.column(BUCKET)[7]
    users = {}
    for user, bucket in zip(part0.column("user").to_pylist(), part0.column(BUCKET).to_pylist()):
        assert users.setdefault(user, bucket) == bucket   # buckets partition the values
    assert len(set(users.values())) == 32
    # each distinct set sees its own part's rows only; the other aggregates only part 0's
    where = [c for c in expanded.schema.names if c.startswith("__split_where")]
    assert [part0.column(c).to_pylist() for c in where] == [[True] * n, [False] * n]
    assert part1.column(where[1]).to_pylist() == batch.column("ok").to_pylist()
    assert part1.column("__split_rows").null_count == n and part0.column("__split_rows").to_pylist() == [1] * n
    keys = pa.StructArray.from_arrays([expanded.column("k"), expanded.column(PART), expanded.column(BUCKET)],
                                      ["k", PART, BUCKET])
    subtasks = subtasks_for_key_groups(assign_key_groups(keys, 128), 128, 2)
    assert np.bincount(subtasks).min() > 0.3 * len(subtasks)   # the hot key's rows on both subtasks


def test_finish_divides_means_and_gives_the_declared_types():
    schema = pa.schema([("k", pa.string()), ("avg", pa.float64()), ("n", pa.int64())])
    batch = pa.RecordBatch.from_pydict({"k": ["a", "b", "c"], "__split_sum_1": [6, None, 0],
                                        "__split_n_1": [4, None, 0], "n": [4, 2, 1]})
    out = finish(batch, (("avg", "__split_sum_1", "__split_n_1"),), schema)
    assert out.schema == schema and out.to_pydict() == {"k": ["a", "b", "c"], "avg": [1.5, None, None], "n": [4, 2, 1]}


def test_bad_input_fails_when_the_job_is_built_naming_the_fix():
    tumbling = W.TumblingEventTimeWindows.of(1)
    with pytest.raises(ss.ConfigurationError, match=r"split_distinct takes a number of buckets .* got 0"):
        keyed().window(tumbling).aggregate_columns(AGGS, split_distinct=0)
    with pytest.raises(ss.ConfigurationError, match="there is no count_distinct to split"):
        keyed().window(tumbling).aggregate_columns({"n": "count"}, split_distinct=8)
    with pytest.raises(ss.ConfigurationError, match="not EventTimeSessionWindows"):
        keyed().window(W.EventTimeSessionWindows.with_gap(1)).aggregate_columns(
            {"users": ("count_distinct", "user")}, split_distinct=8)
    with pytest.raises(ss.ConfigurationError, match="not TumblingProcessingTimeWindows"):
        keyed().window(W.TumblingProcessingTimeWindows.of(1)).aggregate_columns(AGGS, split_distinct=8)
    with pytest.raises(ss.ConfigurationError, match="takes no allowed_lateness"):
        keyed().window(tumbling).allowed_lateness(5).aggregate_columns(AGGS, split_distinct=8)
    with pytest.raises(ss.ConfigurationError, match="drop side_output_late_data or split_distinct"):
        keyed().window(tumbling).side_output_late_data(ss.OutputTag("late")).aggregate_columns(AGGS, split_distinct=8)
    with pytest.raises(ss.ConfigurationError, match="key by column names"):
        keyed(key=lambda row: row["k"]).window(tumbling).aggregate_columns(AGGS, split_distinct=8)
    with pytest.raises(ss.ConfigurationError, match=r"outputs named __split_\* are the split's own"):
        keyed().window(tumbling).aggregate_columns({"__split_x": ("count_distinct", "user")}, split_distinct=8)
    with pytest.raises(ss.ConfigurationError, match="cannot be declared for a split aggregate"):
        keyed().window(tumbling).aggregate_columns(AGGS, split_distinct=8, schema=pa.schema([("k", pa.string())]))
    with pytest.raises(ss.ConfigurationError, match=r"unknown option\(s\) \['colour'\]"):
        keyed().window(tumbling).aggregate_columns(AGGS, split_distinct=8, colour="red")
    whole = keyed()
    rows = DataStream(whole.env, whole._upstreams)     # the rows before key_by
    with pytest.raises(ss.ConfigurationError, match="there is no count_distinct to split"):
        rows.window_all(tumbling).aggregate_columns({"n": "count"}, split_distinct=8)
    with pytest.raises(ss.ConfigurationError, match="takes no allowed_lateness"):
        rows.window_all(tumbling).allowed_lateness(5).aggregate_columns(AGGS, split_distinct=8)
    env = ss.StreamEnvironment(parallelism=2)
    unknown = keyed(env).map(lambda row: row).key_by("k")
    with pytest.raises(ss.ConfigurationError, match="schema must be known when the job is built"):
        unknown.window(tumbling).aggregate_columns(AGGS, split_distinct=8)
