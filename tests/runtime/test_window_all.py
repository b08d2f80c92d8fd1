"""window_all's local/global stages against a plain-Python reference of one operator over the
whole stream (no Spark): several local subtasks whose watermarks run ahead of each other feed
one global stage whose watermark is their minimum, as the network delivers them."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import numpy as np
import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.runtime.operators.vectorized_windows import ColumnAggregate
from streamsnap.runtime.operators.window_all import (WINDOW_ALL_KEY, GlobalWindowAggregateOperator,
                                                     LocalWindowAggregateOperator)
from streamsnap.runtime.operators.window_top_n import (RankContents, RankedRows, Ranking,
                                                       WindowTopNCandidatesOperator, best_pairs, pair_ranks)
from streamsnap.runtime.operators.windows import WindowOperator
from streamsnap.time.lateness import is_element_late
from streamsnap.time.watermarks import MAX_WATERMARK, MIN_WATERMARK
from tests.runtime.support import Sink

W = ss.windows
SUBTASKS = 3
AGGREGATES = (ColumnAggregate("n", "count", None), ColumnAggregate("total", "sum", "value"),
              ColumnAggregate("low", "min", "value"), ColumnAggregate("high", "max", "value"),
              ColumnAggregate("avg", "mean", "x"), ColumnAggregate("first", "min", "name"))
SCHEMA = pa.schema([("ts", pa.int64()), ("value", pa.int64()), ("x", pa.float64()), ("name", pa.string())])


def context(name: str, index: int = 0, parallelism: int = 1) -> OperatorContext:
    clock = ManualScheduler()
    return OperatorContext(name=name, uid=name, subtask_index=index, parallelism=parallelism,
                           max_parallelism=128, attempt=0, job_id="job", task_name=f"{name} ({index + 1}/{parallelism})",
                           timers=clock, clock=clock)


class Channels:
    """The global stage's input: batches as they come, its watermark the channels' minimum."""

    def __init__(self, target, channels: int):
        self.target = target
        self.watermarks = [MIN_WATERMARK] * channels
        self.current = MIN_WATERMARK
        self.partials = self.raw = 0

    def channel(self, i: int):
        channels = self

        class Channel:
            def process(self, batch):
                partial = "__window_all.start" in batch.schema.names
                channels.partials += partial
                channels.raw += not partial
                channels.target.process(batch)

            def process_watermark(self, timestamp):
                channels.watermarks[i] = timestamp
                if min(channels.watermarks) > channels.current:
                    channels.current = min(channels.watermarks)
                    channels.target.process_watermark(channels.current)

            def process_watermark_status(self, status):
                raise AssertionError("no watermark status in this test")

        return Channel()


def random_input(seed: int):
    """Per step and subtask a batch; subtasks advance at different speeds, some rows are late."""
    rng = random.Random(seed)
    steps = []
    for step in range(50):
        for i in range(SUBTASKS):
            base = step * 150 * (i + 1)
            rows = [{"ts": max(0, base + rng.randrange(-400, 400) - (rng.random() < 0.08) * rng.randrange(1_000, 6_000)),
                     "value": None if rng.random() < 0.1 else rng.randrange(-1_000, 1_000),
                     "x": rng.random() if rng.random() < 0.9 else None,
                     "name": None if rng.random() < 0.2 else f"n{rng.randrange(100)}"}
                    for _ in range(rng.randrange(1, 40))]
            steps.append((i, rows, base - 500))
    return steps


def run(steps, locals_, channels, global_op):
    """Feed the steps; returns each step's rows with the global watermark they met."""
    met = []
    for i, rows, watermark in steps:
        met.append((rows, channels.current))
        locals_[i].process(pa.RecordBatch.from_pylist(rows, schema=SCHEMA))
        locals_[i].process_watermark(max(watermark, locals_[i]._watermark))
    for op in locals_:
        op.process_watermark(MAX_WATERMARK)
    return met


def accepted(met, assigner, lateness):
    """One operator over the whole stream: per window its rows, and the late rows."""
    windows, late = defaultdict(list), []
    for rows, watermark in met:
        for r in rows:
            taken = False
            for w in assigner.assign_windows(r["ts"]):
                if w.end - 1 > watermark - lateness:
                    windows[(w.start, w.end)].append(r)
                    taken = True
            if not taken and is_element_late(r["ts"], lateness, watermark, True):
                late.append(r)
    return windows, late


def aggregates_of(members):
    values = [m["value"] for m in members if m["value"] is not None]
    xs = [m["x"] for m in members if m["x"] is not None]
    names = [m["name"] for m in members if m["name"] is not None]
    return {"n": len(members), "total": sum(values) if values else None, "low": min(values, default=None),
            "high": max(values, default=None), "avg": sum(xs) / len(xs) if xs else None,
            "first": min(names, default=None)}


def two_phases(assigner, lateness, reduces: bool = True):
    """The global stage with its main and late outputs, fed by SUBTASKS local stages through
    Channels; `reduces` False: the local stages forward their batches as they are (one phase:
    the global stage sees every row)."""
    global_op = GlobalWindowAggregateOperator(context("global"), WINDOW_ALL_KEY, assigner, lateness,
                                              AGGREGATES, "late", "ts")
    main, side = Sink(), Sink()
    global_op.output = Output([main], {"late": [side]})
    global_op.initialize_state()
    global_op.open()
    channels = Channels(global_op, SUBTASKS)
    locals_ = []
    for i in range(SUBTASKS):
        op = LocalWindowAggregateOperator(context("local", i, SUBTASKS), assigner, lateness, AGGREGATES, "ts")
        op.reduces = reduces
        op.output = Output([channels.channel(i)])
        locals_.append(op)
    return global_op, main, side, channels, locals_


def one_phase_firings(steps, assigner, lateness) -> Counter:
    """The (window start, row count) of every firing in one phase."""
    global_op, main, _, channels, locals_ = two_phases(assigner, lateness, reduces=False)
    run(steps, locals_, channels, global_op)
    assert channels.partials == 0
    return Counter((r["window_start"], r["n"]) for r in main.rows())


@pytest.mark.parametrize("assigner, lateness", [(W.TumblingEventTimeWindows.of(1), 0),
                                                (W.TumblingEventTimeWindows.of(1), 700),
                                                (W.SlidingEventTimeWindows.of(2, 0.5), 300),
                                                (W.SlidingEventTimeWindows.of(2, 0.5), 1500)])
def test_local_global_aggregates_equal_one_operator_over_the_stream(assigner, lateness):
    global_op, main, side, channels, locals_ = two_phases(assigner, lateness)
    met = run(random_input(7), locals_, channels, global_op)
    one_phase = one_phase_firings(random_input(7), assigner, lateness)

    windows, late = accepted(met, assigner, lateness)
    # As often as one operator fires: a batch with rows late for its subtask goes on whole, so
    # a window within the allowed lateness refires once for it, not once per part.
    assert Counter((r["window_start"], r["n"]) for r in main.rows()) == one_phase
    final = {}
    for r in main.rows():
        assert set(r) == {"window_start", "window_end", *(a.output for a in AGGREGATES)}
        final[(r["window_start"], r["window_end"])] = {k: r[k] for k in aggregates_of([])}
    assert final.keys() == windows.keys()
    for window, members in windows.items():
        assert final[window] == pytest.approx(aggregates_of(members)), window
    key = lambda r: (r["ts"], r["value"] or 0, r["name"] or "")   # noqa: E731
    assert sorted(side.rows(), key=key) == sorted(late, key=key)
    assert late and channels.partials > 0 and channels.raw > 0     # both paths taken
    # Fired only when the global watermark passed the end: never before, in watermark order.
    watermarks = [item[1] for item in main.items if isinstance(item, tuple)]
    assert watermarks == sorted(watermarks)


def test_rows_late_for_their_subtask_but_not_for_the_stream_are_not_lost():
    """Subtask 0's watermark is far ahead; a row behind it is still on time for the stream."""
    assigner = W.TumblingEventTimeWindows.of(10)
    global_op = GlobalWindowAggregateOperator(context("global"), WINDOW_ALL_KEY, assigner, 0,
                                              (ColumnAggregate("n", "count", None),), None, "ts")
    main = Sink()
    global_op.output = Output([main])
    global_op.initialize_state()
    channels = Channels(global_op, 2)
    fast = LocalWindowAggregateOperator(context("local", 0, 2), assigner, 0, (ColumnAggregate("n", "count", None),), "ts")
    fast.output = Output([channels.channel(0)])
    fast.process_watermark(50_000)
    fast.process(pa.RecordBatch.from_pylist([{"ts": 1_000}, {"ts": 2_000}, {"ts": 60_000}]))
    assert channels.partials == 0 and channels.raw == 1     # with two early rows, the batch went on whole
    channels.channel(1).process_watermark(MAX_WATERMARK)
    fast.process_watermark(MAX_WATERMARK)
    assert [(r["window_start"], r["n"]) for r in main.rows()] == [(0, 2), (60_000, 1)]


def test_pair_ranks_are_sql_rank_with_ties_and_nulls_last():
    values = np.array([5, 9, 9, 1, 7, 0, 3, 3], dtype=np.int64)
    missing = np.array([False, False, False, False, False, True, False, False])
    starts = np.array([0, 0, 0, 0, 0, 0, 10, 10], dtype=np.int64)
    assert pair_ranks(values, missing, starts, True).tolist() == [4, 1, 1, 5, 3, 6, 1, 1]
    assert pair_ranks(values, missing, starts, False).tolist() == [2, 4, 4, 1, 3, 6, 1, 1]
    floats = np.array([np.nan, 2.0, -1.0])
    assert pair_ranks(floats, np.isnan(floats), np.zeros(3, dtype=np.int64), True).tolist() == [3, 1, 2]


@pytest.mark.parametrize("assigner, n", [(W.TumblingEventTimeWindows.of(1), 1),
                                         (W.SlidingEventTimeWindows.of(2, 0.5), 3)])
def test_window_top_n_equals_rank_over_the_whole_window(assigner, n):
    ranking = Ranking(n, "value", True, "rank")
    global_op = WindowOperator(context("global"), WINDOW_ALL_KEY, assigner, assigner.default_trigger(), 0,
                               RankContents(ranking), RankedRows(ranking), "late", "ts")
    main, side = Sink(), Sink()
    global_op.output = Output([main], {"late": [side]})
    global_op.initialize_state()
    global_op.open()
    channels = Channels(global_op, SUBTASKS)
    locals_, seen = [], []
    for i in range(SUBTASKS):
        op = WindowTopNCandidatesOperator(context("local", i, SUBTASKS), assigner, 0, ranking, "ts")
        op.output = Output([channels.channel(i)])
        locals_.append(op)
    steps = [(i, [{**r, "value": None if r["value"] is None else r["value"] // 50} for r in rows], wm)
             for i, rows, wm in random_input(11)]      # coarse values: many ties
    met = run(steps, locals_, channels, global_op)
    seen = sum(len(rows) for rows, _ in met)

    windows, late = accepted(met, assigner, 0)
    expected = []
    for (start, end), members in windows.items():
        value = [(1, 0) if m["value"] is None else (0, -m["value"]) for m in members]
        for m, v in zip(members, value):
            rank = 1 + sum(o < v for o in value)
            if rank <= n:
                expected.append({**m, "window_start": start, "window_end": end, "rank": rank})
    key = lambda r: (r["window_start"], r["rank"], r["ts"], r["value"] or 0, r["x"] or 0)   # noqa: E731
    assert sorted(main.rows(), key=key) == sorted(expected, key=key)
    assert any(r["rank"] == 1 for r in expected if sum(e["window_start"] == r["window_start"] and e["rank"] == 1
                                                        for e in expected) > 1)     # ties kept
    key = lambda r: (r["ts"], r["value"] or 0, r["x"] or 0)   # noqa: E731
    assert sorted(side.rows(), key=key) == sorted(late, key=key) and late
    assert global_op.records_in < seen / 2      # the local stage pruned most rows


@pytest.mark.parametrize("descending", [True, False])
def test_best_pairs_equals_pair_ranks_within_one_window_and_across(descending):
    rng = np.random.default_rng(5)
    for n in (1, 2, 5, 40):
        for size in (1, 3, 30, 200):
            values = rng.integers(-5, 5, size)
            missing = rng.random(size) < 0.2
            for starts in (np.zeros(size, dtype=np.int64), rng.integers(0, 3, size) * 10):
                expected = pair_ranks(values, missing, starts, descending) <= n
                assert best_pairs(values, missing, starts, n, descending).tolist() == expected.tolist()
            floats = values.astype(float)
            one = np.zeros(size, dtype=np.int64)
            assert best_pairs(floats, missing, one, n, descending).tolist() == \
                (pair_ranks(floats, missing, one, descending) <= n).tolist()


def test_count_distinct_goes_through_unreduced_and_counts_exactly():
    assigner = W.TumblingEventTimeWindows.of(1)
    aggregates = (ColumnAggregate("n", "count", None), ColumnAggregate("names", "count_distinct", "name"))
    global_op = GlobalWindowAggregateOperator(context("global"), WINDOW_ALL_KEY, assigner, 0, aggregates, None, "ts")
    main = Sink()
    global_op.output = Output([main])
    global_op.initialize_state()
    channels = Channels(global_op, SUBTASKS)
    locals_ = []
    for i in range(SUBTASKS):
        op = LocalWindowAggregateOperator(context("local", i, SUBTASKS), assigner, 0, aggregates, "ts")
        op.output = Output([channels.channel(i)])
        locals_.append(op)
    windows, _ = accepted(run(random_input(3), locals_, channels, global_op), assigner, 0)
    got = {(r["window_start"], r["window_end"]): (r["n"], r["names"]) for r in main.rows()}
    assert got == {w: (len(m), len({r["name"] for r in m if r["name"] is not None})) for w, m in windows.items()}
    assert channels.partials == 0 and channels.raw > 0
