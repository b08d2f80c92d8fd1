"""The vectorized window aggregation against a plain-Python reference (no Spark)."""

from __future__ import annotations

import random
from collections import defaultdict

import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.runtime.operators.vectorized_windows import ColumnAggregate, VectorizedWindowOperator
from streamsnap.time.watermarks import MAX_WATERMARK
from tests.runtime.test_window_operator import Sink

W = ss.windows
ALL = (ColumnAggregate("n", "count", None), ColumnAggregate("total", "sum", "value"),
       ColumnAggregate("low", "min", "value"), ColumnAggregate("high", "max", "value"),
       ColumnAggregate("avg", "mean", "x"))


def operator(assigner, aggregates=ALL, *, lateness=0, late="late", key="key"):
    clock = ManualScheduler()
    ctx = OperatorContext(name="vwindow", uid="vwindow", subtask_index=0, parallelism=1,
                          max_parallelism=128, attempt=0, job_id="job", task_name="vwindow (1/1)",
                          timers=clock, clock=clock)
    op = VectorizedWindowOperator(ctx, KeySelector.of(key), assigner, lateness, aggregates,
                                  late, "ts")
    main, side = Sink(), Sink()
    op.output = Output([main], {"late": [side]})
    op.initialize_state()
    op.open()
    return op, main, side


def reference(rows, assigner):
    groups = defaultdict(list)
    for r in rows:
        for w in assigner.assign_windows(r["ts"]):
            groups[(r["key"], w.start, w.end)].append(r)
    out = {}
    for (k, start, end), members in groups.items():
        values = [m["value"] for m in members if m["value"] is not None]
        xs = [m["x"] for m in members if m["x"] is not None]
        out[(k, start, end)] = {
            "n": len(members), "total": sum(values) if values else None,
            "low": min(values, default=None), "high": max(values, default=None),
            "avg": sum(xs) / len(xs) if xs else None}
    return out


def by_window(rows):
    return {(r["key"], r["window_start"], r["window_end"]):
            {k: r[k] for k in ("n", "total", "low", "high", "avg")} for r in rows}


@pytest.mark.parametrize("assigner", [W.TumblingEventTimeWindows.of(1),
                                      W.SlidingEventTimeWindows.of(2, 0.5)])
def test_random_batches_equal_a_per_row_reference(assigner):
    rng = random.Random(3)
    rows = [{"key": f"k{rng.randrange(5)}", "ts": i * 20 + rng.randrange(1_000),
             "value": None if rng.random() < 0.1 else rng.randrange(-50, 50),
             "x": rng.random() if rng.random() < 0.9 else None} for i in range(3_000)]
    schema = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("value", pa.int64()),
                        ("x", pa.float64())])
    op, main, side = operator(assigner)
    for start in range(0, len(rows), 250):
        chunk = rows[start:start + 250]
        op.process(pa.RecordBatch.from_pylist(chunk, schema=schema))
        op.process_watermark(max(r["ts"] for r in rows[:start + 250]) - 1_001)
    op.process_watermark(MAX_WATERMARK)
    got = by_window(main.rows())
    assert len(got) == len(main.rows())           # each window fired once
    expected = reference(rows, assigner)
    assert got.keys() == expected.keys()
    for window, values in expected.items():
        assert got[window] == pytest.approx(values), window
    assert side.rows() == [] and isinstance(got[next(iter(got))]["total"], (int, type(None)))


def test_lateness_refires_and_too_late_rows_go_to_the_side_output():
    op, main, side = operator(W.TumblingEventTimeWindows.of(10), (ColumnAggregate("n", "count", None),),
                              lateness=5_000)
    op.process([{"key": 1, "ts": 1_000}, {"key": 1, "ts": 2_000}])
    op.process_watermark(10_000)
    assert [r["n"] for r in main.rows()] == [2]
    op.process([{"key": 1, "ts": 3_000}, {"key": 1, "ts": 12_000}])    # re-fires [0, 10 s)
    assert [r["n"] for r in main.rows()] == [2, 3]
    op.process_watermark(15_000)                                         # cleaned up at 14 999
    op.process([{"key": 1, "ts": 4_000}, {"key": 2, "ts": 14_000}])
    assert side.rows() == [{"key": 1, "ts": 4_000}]
    op.process_watermark(MAX_WATERMARK)
    assert [(r["key"], r["window_start"], r["n"]) for r in main.rows()] == [
        (1, 0, 2), (1, 0, 3), (1, 10_000, 1), (2, 10_000, 1)]


def test_a_bad_column_names_the_operator_and_the_column_type():
    op, _, _ = operator(W.TumblingEventTimeWindows.of(10), (ColumnAggregate("s", "sum", "value"),))
    with pytest.raises(ss.UserFunctionError, match=r"(?s)type string cannot be aggregated.*where: .*operator 'vwindow'"):
        op.process([{"key": 1, "ts": 1, "value": "x"}])


def test_build_time_checks_of_aggregate_columns():
    env = ss.StreamEnvironment()
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    source = ss.sources.Generator(lambda i: {"key": i % 2, "ts": i, "value": i, "name": "a"}, count=10)
    keyed = env.from_source(source, watermark_strategy=strategy).key_by("key")
    tumbling = keyed.window(W.TumblingEventTimeWindows.of(1))
    with pytest.raises(ss.ConfigurationError, match="not vectorized"):
        keyed.window(W.ProcessingTimeSessionWindows.with_gap(1)).sum("value")
    with pytest.raises(ss.ConfigurationError, match="default trigger"):
        tumbling.trigger(W.CountTrigger.of(2)).count()
    with pytest.raises(ss.ConfigurationError, match="'nope' is not in the stream's schema"):
        tumbling.sum("nope")
    with pytest.raises(ss.ConfigurationError, match="'name' has type string"):
        tumbling.mean("name")
    with pytest.raises(ss.ConfigurationError, match="give \\('sum'"):
        tumbling.aggregate_columns({"x": ("median", "value")})
    with pytest.raises(ss.ConfigurationError, match="output name 'window_start'"):
        tumbling.aggregate_columns({"window_start": "count"})
    assert tumbling.side_output_late_data(ss.OutputTag("late")).sum("value") \
        .get_side_output(ss.OutputTag("late")) is not None


def test_processing_time_windows_aggregate_batches_and_fire_on_the_clock():
    op, main, _ = operator(W.TumblingProcessingTimeWindows.of(1),
                           (ColumnAggregate("total", "sum", "value"),))
    clock = op.ctx.clock
    op.process(pa.RecordBatch.from_pylist([{"key": 1, "value": 2}, {"key": 1, "value": 3},
                                           {"key": 2, "value": 4}]))
    assert main.rows() == []
    clock.advance(1.0)
    assert sorted((r["key"], r["total"], r["window_end"] - r["window_start"]) for r in main.rows()) \
        == [(1, 5, 1_000), (2, 4, 1_000)]
    assert op.timer_service.num_processing_time_timers() == 0


@pytest.mark.parametrize("assigner", [W.TumblingEventTimeWindows.of(1),
                                      W.SlidingEventTimeWindows.of(2, 0.5)])
def test_min_and_max_of_a_string_column_equal_a_per_row_reference(assigner):
    rng = random.Random(5)
    rows = [{"key": rng.randrange(4), "ts": i * 20 + rng.randrange(1_000),
             "name": None if rng.random() < 0.3 else rng.choice(["b", "a\x00", "a", "", "zz", "ä"]),
             "value": rng.randrange(10)} for i in range(2_000)]
    schema = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("name", pa.string()),
                        ("value", pa.int64())])
    aggregates = (ColumnAggregate("low", "min", "name"), ColumnAggregate("high", "max", "name"),
                  ColumnAggregate("top", "max", "value"), ColumnAggregate("n", "count", None))
    op, main, side = operator(assigner, aggregates, lateness=300)
    for start in range(0, len(rows), 100):
        op.process(pa.RecordBatch.from_pylist(rows[start:start + 100], schema=schema))
        op.process_watermark(max(r["ts"] for r in rows[:start + 100]) - 1_001)
    op.process_watermark(MAX_WATERMARK)
    groups = defaultdict(list)
    for r in rows:
        for w in assigner.assign_windows(r["ts"]):
            groups[(r["key"], w.start)].append(r)
    expected = {}
    for window, members in groups.items():
        names = [m["name"] for m in members if m["name"] is not None]
        expected[window] = (min(names, default=None), max(names, default=None),
                            max(m["value"] for m in members), len(members))
    got = {}
    for r in main.rows():      # the last firing of each window (late rows re-fire it)
        got[(r["key"], r["window_start"])] = (r["low"], r["high"], r["top"], r["n"])
    assert got == expected and side.rows() == []


def test_strings_take_min_and_max_only():
    env = ss.StreamEnvironment()
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    source = ss.sources.Generator(lambda i: {"key": i % 2, "ts": i, "name": "a"}, count=10,
                                  schema=pa.schema([("key", pa.int64()), ("ts", pa.int64()),
                                                    ("name", pa.string())]))
    tumbling = env.from_source(source, watermark_strategy=strategy).key_by("key") \
        .window(W.TumblingEventTimeWindows.of(1))
    assert tumbling.aggregate_columns({"low": ("min", "name"), "high": ("max", "name")}) is not None
    with pytest.raises(ss.ConfigurationError, match="'name' has type string"):
        tumbling.sum("name")
    op, _, _ = operator(W.TumblingEventTimeWindows.of(10), (ColumnAggregate("low", "min", "value"),
                                                             ColumnAggregate("s", "sum", "value")))
    with pytest.raises(ss.UserFunctionError, match="type string cannot be aggregated"):
        op.process([{"key": 1, "ts": 1, "value": "x"}])


def test_fired_windows_leave_as_one_arrow_batch_typed_as_their_rows_would_infer():
    """No dict per row: a firing is one RecordBatch — int64 counts and sums, float64 means,
    nulls where a window had no value — and keys Arrow cannot type (a key function giving ints
    and strs) leave as rows, for the stream's schema check to name."""
    class Batches(Sink):
        def __init__(self):
            super().__init__()
            self.parts = []

        def process(self, batch):
            self.parts.append(batch)
            super().process(batch)

    op, _, _ = operator(W.TumblingEventTimeWindows.of(1), ALL)
    op.output = Output([sink := Batches()], {"late": [Sink()]})
    op.process(pa.RecordBatch.from_pylist([{"key": 1, "ts": 5, "value": None, "x": 1.5},
                                           {"key": 2, "ts": 6, "value": 3, "x": 2.5}]))
    op.process_watermark(MAX_WATERMARK)
    (part,) = sink.parts
    assert isinstance(part, pa.RecordBatch)
    assert part.schema == pa.schema([("key", pa.int64()), ("window_start", pa.int64()), ("window_end", pa.int64()),
                                     ("n", pa.int64()), ("total", pa.int64()), ("low", pa.int64()),
                                     ("high", pa.int64()), ("avg", pa.float64())])
    assert part.to_pylist() == pa.RecordBatch.from_pylist(part.to_pylist()).to_pylist()
    assert [(r["key"], r["total"], r["avg"]) for r in sink.rows()] == [(1, None, 1.5), (2, 3, 2.5)]

    clock = ManualScheduler()
    ctx = OperatorContext(name="vwindow", uid="vwindow", subtask_index=0, parallelism=1, max_parallelism=128,
                          attempt=0, job_id="job", task_name="vwindow (1/1)", timers=clock, clock=clock)
    mixed = VectorizedWindowOperator(ctx, KeySelector.of(lambda r: r["key"] if r["key"] else "zero"),
                                     W.TumblingEventTimeWindows.of(1), 0, (ColumnAggregate("n", "count", None),),
                                     None, "ts")
    mixed.output = Output([rows := Batches()])
    mixed.initialize_state()
    mixed.process(pa.RecordBatch.from_pylist([{"key": 0, "ts": 1}, {"key": 7, "ts": 2}]))
    mixed.process_watermark(MAX_WATERMARK)
    assert [type(p) for p in rows.parts] == [list]
    assert sorted(map(str, rows.rows())) == sorted(map(str, [{"key": "zero", "window_start": 0, "window_end": 1_000, "n": 1},
                                                             {"key": 7, "window_start": 0, "window_end": 1_000, "n": 1}]))


def test_results_are_checked_against_a_schema_the_user_declared():
    """A declared results schema is enforced per batch, as it was per row: lossless casts
    (int64 counts into int32, int sums into float64) pass, a misfit fails naming the field."""
    from streamsnap.runtime.schemas import SchemaError

    clock = ManualScheduler()
    ctx = OperatorContext(name="vwindow", uid="vwindow", subtask_index=0, parallelism=1, max_parallelism=128,
                          attempt=0, job_id="job", task_name="vwindow (1/1)", timers=clock, clock=clock)
    aggregates = (ColumnAggregate("n", "count", None), ColumnAggregate("total", "sum", "value"))
    declared = pa.schema([("key", pa.int64()), ("window_start", pa.int64()), ("window_end", pa.int64()),
                          ("n", pa.int32()), ("total", pa.float64())])
    for schema, ok in ((declared, True), (declared.set(4, pa.field("total", pa.string())), False)):
        op = VectorizedWindowOperator(ctx, KeySelector.of("key"), W.TumblingEventTimeWindows.of(1), 0, aggregates,
                                      None, "ts", declared=schema)
        op.output = Output([sink := Sink()])
        op.initialize_state()
        op.process(pa.RecordBatch.from_pylist([{"key": 1, "ts": 5, "value": 2}, {"key": 1, "ts": 6, "value": 3}]))
        if ok:
            op.process_watermark(MAX_WATERMARK)
            assert sink.rows() == [{"key": 1, "window_start": 0, "window_end": 1_000, "n": 2, "total": 5.0}]
        else:
            with pytest.raises(SchemaError, match="total"):
                op.process_watermark(MAX_WATERMARK)
