"""window_all's build: the graph it makes (local stage in parallel, windows at parallelism 1)
and bad input failing when the job is built, naming the thing and the fix."""

from __future__ import annotations

import pyarrow as pa
import pytest

import streamsnap as ss

W = ss.windows


def stream(env=None):
    env = env or ss.StreamEnvironment(parallelism=4)
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    schema = pa.schema([("ts", pa.int64()), ("price", pa.int64()), ("name", pa.string())])
    return env.from_source(ss.sources.Generator(lambda i: {"ts": i, "price": i % 7, "name": "a"}, count=10,
                                                schema=schema), watermark_strategy=strategy)


def nodes(env):
    return {n.name: n for n in env._graph.nodes.values()}


def test_two_phases_local_in_parallel_windows_at_parallelism_one():
    s = stream()
    s.window_all(W.TumblingEventTimeWindows.of(1)).sum("price", name="sums")
    s.window_all(W.TumblingEventTimeWindows.of(1)).top_n(2, by="price", name="top")
    s.window_all(W.TumblingEventTimeWindows.of(1)).reduce(lambda a, b: a, name="reduced")
    graph = nodes(s.env)
    assert graph["sums (local)"].parallelism == 4 and graph["sums"].parallelism == 1
    assert graph["top (local)"].parallelism == 4 and graph["top"].parallelism == 1
    assert graph["reduced"].parallelism == 1 and "reduced (local)" not in graph
    assert graph["top"].schema.names == ["ts", "price", "name", "window_start", "window_end", "rank"]


def test_bad_input_fails_at_build_time_naming_the_fix():
    windows = stream().window_all(W.TumblingEventTimeWindows.of(1))
    with pytest.raises(ss.ConfigurationError, match="column 'nope' is not in the stream's schema"):
        windows.sum("nope")
    with pytest.raises(ss.ConfigurationError, match=r"'name' has type string; mean takes"):
        windows.mean("name")
    with pytest.raises(ss.ConfigurationError, match=r"EventTimeSessionWindows is not vectorized; use tumbling"):
        stream().window_all(W.EventTimeSessionWindows.with_gap(1)).count()
    with pytest.raises(ss.ConfigurationError, match=r"EventTimeSessionWindows is not vectorized"):
        stream().window_all(W.EventTimeSessionWindows.with_gap(1)).top_n(1, by="price")
    with pytest.raises(ss.ConfigurationError, match="default trigger; CountTrigger needs .aggregate"):
        windows.trigger(W.CountTrigger.of(3)).max("price")
    with pytest.raises(ss.ConfigurationError, match=r"parallelism=3; .* run at parallelism 1 .* key_by\(...\).window"):
        windows.count(parallelism=3)
    with pytest.raises(ss.ConfigurationError, match=r"by='nope' is not a column of the stream"):
        windows.top_n(1, by="nope")
    with pytest.raises(ss.ConfigurationError, match=r"column 'name' has type string; the window top-N ranks by"):
        windows.top_n(1, by="name")
    with pytest.raises(ss.ConfigurationError, match=r"n is how many rows to keep"):
        windows.top_n(0, by="price")
    with pytest.raises(ss.ConfigurationError, match=r"already has column\(s\) \['price'\].*another rank_column="):
        windows.top_n(1, by="price", rank_column="price")
    with pytest.raises(ss.ConfigurationError, match=r"window_all\(\) takes a window assigner"):
        stream().window_all(60)
    with pytest.raises(ss.ConfigurationError, match=r"takes a ProcessAllWindowFunction"):
        windows.process(object())


def test_event_time_windows_need_timestamps():
    env = ss.StreamEnvironment()
    plain = env.from_collection([{"price": 1}])
    with pytest.raises(ss.ConfigurationError, match="event-time windows need event timestamps"):
        plain.window_all(W.TumblingEventTimeWindows.of(1))


def test_window_top_n_ranks_window_results_by_their_own_windows():
    s = stream()
    counts = s.key_by("name").window(W.SlidingEventTimeWindows.of(2, 1)).count(name="counts")
    counts.window_top_n(1, by="count", name="hot")
    graph = nodes(s.env)
    assert graph["hot"].parallelism == 1 and graph["hot (local)"].parallelism == 4
    assert graph["counts"].timestamps.size_ms == 2000
    typed = pa.schema([("name", pa.string()), ("window_start", pa.int64()), ("window_end", pa.int64()),
                       ("count", pa.int64())])
    counts.map_batches(lambda b: b, output_schema=typed).window_top_n(2, by="count", name="typed")
    assert nodes(s.env)["typed"].schema == typed.append(pa.field("rank", pa.int64()))   # its windows are the input's


def test_window_top_n_fails_at_build_time_where_there_are_no_window_results():
    s = stream()
    with pytest.raises(ss.ConfigurationError, match=r"window_top_n on 'Source'.*results of a tumbling or "
                                                    r"sliding window aggregate.*window_all\(assigner\).top_n"):
        s.window_top_n(1, by="price")
    sessions = s.key_by("name").window(W.EventTimeSessionWindows.with_gap(1)).count(name="sessions")
    with pytest.raises(ss.ConfigurationError, match="session window results have no fixed window size"):
        sessions.window_top_n(1, by="count")
    counts = s.key_by("name").window(W.TumblingEventTimeWindows.of(1)).count(name="counts")
    projected = counts.map_batches(lambda b: b.select(["name", "count", "window_end"]),
                                   output_schema=pa.schema([("name", pa.string()), ("count", pa.int64()),
                                                            ("window_end", pa.int64())]))
    with pytest.raises(ss.ConfigurationError, match=r"lost their \['window_start'\] column"):
        projected.window_top_n(1, by="count")
    projected = projected.map_batches(lambda b: b, output_schema=pa.schema(
        [("window_start", pa.int64()), ("window_end", pa.int64()), ("count", pa.int64())]))
    with pytest.raises(ss.ConfigurationError, match=r"by='nope' is not a column of the stream"):
        projected.window_top_n(1, by="nope")


def test_a_vectorized_window_aggregate_knows_its_output_schema_at_build_time():
    s = stream()
    keyed = s.key_by("name").window(W.SlidingEventTimeWindows.of(2, 1)).aggregate_columns(
        {"n": "count", "avg": ("mean", "price"), "low": ("min", "name"), "high": ("max", "price"),
         "total": ("sum", "price"), "prices": ("count_distinct", "price")})
    assert keyed.schema == pa.schema([("name", pa.string()), ("window_start", pa.int64()), ("window_end", pa.int64()),
                                      ("n", pa.int64()), ("avg", pa.float64()), ("low", pa.string()),
                                      ("high", pa.int64()), ("total", pa.int64()), ("prices", pa.int64())])
    assert s.window_all(W.TumblingEventTimeWindows.of(1)).sum("price").schema.names == \
        ["window_start", "window_end", "price"]
    assert s.key_by(lambda r: r["name"]).window(W.TumblingEventTimeWindows.of(1)).count().schema is None
    with pytest.raises(ss.ConfigurationError, match=r"by='nope' is not a column of the stream"):
        keyed.window_top_n(1, by="nope")       # so checks after it fail when the job is built
