"""Event-time API checks made when the pipeline is built (no Spark needed)."""

from __future__ import annotations

import pytest

import streamsnap as ss


def source():
    return ss.sources.Generator(lambda i: {"key": i % 2, "ts": i, "name": str(i)}, count=10)


def test_auto_watermark_interval_is_validated_at_construction():
    assert ss.StreamEnvironment(auto_watermark_interval=0.05).auto_watermark_interval == 0.05
    assert ss.StreamEnvironment(auto_watermark_interval=0).auto_watermark_interval == 0.0
    for bad in (-1, "fast", float("nan")):
        with pytest.raises(ss.ConfigurationError, match="auto_watermark_interval"):
            ss.StreamEnvironment(auto_watermark_interval=bad)


def test_the_timestamp_column_must_exist_and_hold_integers_or_timestamps():
    env = ss.StreamEnvironment()
    with pytest.raises(ss.ConfigurationError, match="'name' has type string"):
        env.from_source(source(), watermark_strategy=ss.WatermarkStrategy.for_monotonous_timestamps()
                        .with_timestamp_assigner("name"))
    stream = env.from_source(source())
    with pytest.raises(ss.ConfigurationError, match=r"assign_timestamps_and_watermarks.*'missing'"):
        stream.assign_timestamps_and_watermarks(
            ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("missing"))
    # No watermarks need no assigner; the stream then carries no timestamps.
    plain = stream.assign_timestamps_and_watermarks(ss.WatermarkStrategy.no_watermarks())
    assert plain.timestamp_assigner is None


def test_timestamps_follow_the_stream_to_the_keyed_process_function():
    env = ss.StreamEnvironment()
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    keyed = env.from_source(source(), watermark_strategy=strategy).filter(lambda r: True).key_by("key")
    assert keyed.timestamp_assigner == "ts"
    processed = keyed.process(ss.KeyedProcessFunction())
    assert processed._upstreams[0].operator.timestamps == "ts"


def test_side_outputs_come_only_from_process_functions():
    env = ss.StreamEnvironment()
    tag = ss.OutputTag("late")
    with pytest.raises(ss.ConfigurationError, match="side outputs come from process"):
        env.from_source(source()).map(lambda r: r).get_side_output(tag)
    with pytest.raises(ss.ConfigurationError, match="OutputTag needs a non-empty name"):
        ss.OutputTag("")
    side = env.from_source(source()).key_by("key").process(ss.KeyedProcessFunction()).get_side_output(tag)
    assert side.schema is None
    side.map(lambda r: r).sink_to(ss.sinks.Collect())
    edges = [e for e in env._graph.edges if e.tag is not None]
    assert [e.tag for e in edges] == ["late"]


def test_timers_need_a_keyed_stream():
    class WithTimer(ss.ProcessFunction):
        def process_element(self, row, ctx):
            ctx.timer_service().register_event_time_timer(1)

        def on_timer(self, timestamp, ctx):
            return None

    env = ss.StreamEnvironment()
    with pytest.raises(ss.ConfigurationError, match=r"need a keyed stream; call \.key_by"):
        env.from_source(source()).process(WithTimer())
    assert isinstance(env.from_source(source()).process(ss.ProcessFunction()), ss.DataStream)
