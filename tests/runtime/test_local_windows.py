"""Keyed window aggregates in two phases (runtime/operators/local_windows.py) against the same
aggregate in one phase, message by message (no Spark): two local subtasks whose watermarks
advance apart, the global stage seeing their minimum, rows late at either stage, refirings
within the allowed lateness and the late side output."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.runtime.operators.local_windows import (KeyedGlobalSessionAggregateOperator,
                                                        KeyedGlobalWindowAggregateOperator,
                                                        LocalKeyedWindowAggregateOperator,
                                                        LocalSessionAggregateOperator, key_codes, splits)
from streamsnap.runtime.operators.vectorized_sessions import VectorizedSessionOperator
from streamsnap.runtime.operators.vectorized_windows import ColumnAggregate, VectorizedWindowOperator
from streamsnap.time.watermarks import MAX_WATERMARK, MIN_WATERMARK
from tests.runtime.support import Sink

W = ss.windows
AGGREGATES = (ColumnAggregate("n", "count", None), ColumnAggregate("total", "sum", "value"),
              ColumnAggregate("low", "min", "value"), ColumnAggregate("high", "max", "value"),
              ColumnAggregate("avg", "mean", "x"), ColumnAggregate("first", "min", "name"))
SESSION_AGGREGATES = AGGREGATES[:-1]     # (sessions take numeric columns)
SCHEMA = pa.schema([("k", pa.string()), ("j", pa.int64()), ("ts", pa.int64()), ("value", pa.int64()),
                    ("x", pa.float64()), ("name", pa.string())])


def ctx(name: str, index: int = 0, parallelism: int = 1) -> OperatorContext:
    clock = ManualScheduler()
    return OperatorContext(name=name, uid=name, subtask_index=index, parallelism=parallelism, max_parallelism=128,
                           attempt=0, job_id="job", task_name=f"{name} ({index + 1}/{parallelism})", timers=clock,
                           clock=clock)


class Batches:
    """A chain target that keeps what it is sent as it is (batches, not rows)."""

    def __init__(self):
        self.batches = []

    def process(self, batch):
        self.batches.append(batch)

    def process_watermark(self, timestamp):
        pass

    def process_watermark_status(self, status):
        pass


def classes(assigner):
    """(one-phase, local, global) operator classes and the aggregates they compute."""
    if isinstance(assigner, W.EventTimeSessionWindows):
        return (VectorizedSessionOperator, LocalSessionAggregateOperator, KeyedGlobalSessionAggregateOperator,
                SESSION_AGGREGATES)
    return (VectorizedWindowOperator, LocalKeyedWindowAggregateOperator, KeyedGlobalWindowAggregateOperator,
            AGGREGATES)


def windows(cls, key, assigner, lateness):
    op = cls(ctx("window"), key, assigner, lateness, classes(assigner)[3], "late", "ts")
    main, side = Sink(), Sink()
    op.output = Output([main], {"late": [side]})
    op.initialize_state()
    op.open()
    return op, main, side


def local(index, key, assigner, lateness):
    _, cls, _, aggregates = classes(assigner)
    op = cls(ctx("window (local)", index, 2), key, assigner, lateness, aggregates, "ts")
    sent = Batches()
    op.output = Output([sent], {})
    op.open()
    return op, sent


def run_both(steps, key, assigner, lateness):
    """`steps`: ("rows", subtask, rows) or ("watermark", subtask, t). The one-phase operator
    gets every batch and the minimum of the subtasks' watermarks; the two-phase one gets each
    batch through its subtask's local stage. Returns both operators' outputs."""
    one_phase, _, global_phase, _ = classes(assigner)
    one, one_main, one_side = windows(one_phase, key, assigner, lateness)
    two, two_main, two_side = windows(global_phase, key, assigner, lateness)
    locals_ = [local(i, key, assigner, lateness) for i in range(2)]
    marks = [MIN_WATERMARK, MIN_WATERMARK]
    for kind, subtask, value in steps:
        if kind == "rows":
            batch = pa.RecordBatch.from_pylist(value, schema=SCHEMA)
            one.process(batch)
            op, sent = locals_[subtask]
            op.process(batch)
            for part in sent.batches:
                two.process(part)
            sent.batches.clear()
            continue
        before = min(marks)
        marks[subtask] = max(marks[subtask], value)
        locals_[subtask][0].process_watermark(marks[subtask])
        if min(marks) > before:
            one.process_watermark(min(marks))
            two.process_watermark(min(marks))
    for op in (one, two):
        op.process_watermark(MAX_WATERMARK)
    return (one_main.rows(), one_side.rows(), one.num_late_records_dropped), \
           (two_main.rows(), two_side.rows(), two.num_late_records_dropped)


def multiset(rows):
    return Counter(tuple(sorted(r.items())) for r in rows)


def random_steps(rng: random.Random, count: int, keys: int):
    steps, clock = [], [0, 0]
    for _ in range(count):
        subtask = rng.randrange(2)
        if rng.random() < 0.3:
            clock[subtask] += rng.randrange(0, 3_000)
            steps.append(("watermark", subtask, clock[subtask]))
            continue
        rows = [{"k": rng.choice([None, *map(str, range(keys))]) if rng.random() < 0.05 else str(rng.randrange(keys)),
                 "j": rng.randrange(2),
                 "ts": clock[subtask] + rng.randrange(-4_000, 3_000),
                 "value": None if rng.random() < 0.1 else rng.randrange(-50, 50),
                 "x": None if rng.random() < 0.1 else float(rng.randrange(8)),
                 "name": None if rng.random() < 0.2 else rng.choice("pqrs")}
                for _ in range(rng.randrange(1, 40))]
        steps.append(("rows", subtask, rows))
    return steps


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1),
       assigner=st.sampled_from([W.TumblingEventTimeWindows.of(2), W.SlidingEventTimeWindows.of(3, 2),
                                 W.EventTimeSessionWindows.with_gap(0.5)]),
       lateness=st.sampled_from([0, 1_500]), keys=st.sampled_from([2, 50]),
       key=st.sampled_from([("k",), ("k", "j")]))
def test_two_phases_equal_one_phase_through_skewed_watermarks_and_late_rows(seed, assigner, lateness, keys, key):
    selector = KeySelector.of(list(key), allow_null=True)
    one, two = run_both(random_steps(random.Random(seed), 60, keys), selector, assigner, lateness)
    assert multiset(two[0]) == multiset(one[0])
    assert multiset(two[1]) == multiset(one[1])
    assert two[2] == one[2]


def test_rows_late_at_their_subtask_but_not_at_the_global_stage_are_judged_there():
    """Subtask 0's watermark passed the window; the global one (subtask 1 behind) did not:
    the row counts, as it would have in one phase; a later row past both is dropped."""
    key = KeySelector.of("k")
    row = {"k": "a", "j": 0, "value": 1, "x": 1.0, "name": "p"}
    steps = [("rows", 0, [dict(row, ts=500), dict(row, ts=600)]), ("watermark", 0, 5_000),
             ("rows", 0, [dict(row, ts=700)]), ("watermark", 1, 5_000), ("rows", 0, [dict(row, ts=800)])]
    one, two = run_both(steps, key, W.TumblingEventTimeWindows.of(2), 0)
    assert [(r["k"], r["n"]) for r in two[0]] == [("a", 3)] and two == one
    assert two[1] == [dict(row, ts=800)]


def test_a_batch_of_repeating_keys_leaves_as_one_partial_per_key_and_window():
    op, sent = local(0, KeySelector.of("k"), W.TumblingEventTimeWindows.of(1), 0)
    rows = [{"k": "ab"[i % 2], "j": 0, "ts": i * 100, "value": i, "x": 1.0, "name": "s"} for i in range(40)]
    op.process(pa.RecordBatch.from_pylist(rows, schema=SCHEMA))
    [partials] = sent.batches
    assert sorted(zip(partials.column("__window_all.start").to_pylist(), partials.column("k").to_pylist())) == \
        [(s, k) for s in (0, 1_000, 2_000, 3_000) for k in "ab"]
    assert partials.column("__window_all.rows").to_pylist() == [5] * 8


def test_a_batch_whose_keys_do_not_repeat_is_sent_as_it_is():
    op, sent = local(0, KeySelector.of("k"), W.TumblingEventTimeWindows.of(1), 0)
    rows = [{"k": str(i), "j": 0, "ts": i, "value": i, "x": 1.0, "name": "s"} for i in range(40)]
    batch = pa.RecordBatch.from_pylist(rows, schema=SCHEMA)
    op.process(batch)
    assert sent.batches == [batch]


def test_after_a_batch_that_does_not_reduce_the_next_ones_go_on_untried_for_a_growing_while():
    op, sent = local(0, KeySelector.of("k"), W.TumblingEventTimeWindows.of(1), 0)
    row = {"j": 0, "ts": 5, "value": 1, "x": 1.0, "name": "s"}
    distinct = pa.RecordBatch.from_pylist([dict(row, k=str(i)) for i in range(10)], schema=SCHEMA)
    repeating = pa.RecordBatch.from_pylist([dict(row, k="a") for _ in range(10)], schema=SCHEMA)
    for batch in (distinct, repeating, repeating, distinct, distinct, distinct, repeating, repeating, repeating):
        op.process(batch)
    reduced = ["__window_all.start" in b.schema.names for b in sent.batches]
    # a miss skips 1 batch; a hit resets that; a miss after the skipped one skips 2
    assert reduced == [False, False, True, False, False, False, False, False, True]
    assert op.records_in == 90


def test_key_codes_are_equal_exactly_for_equal_keys_over_several_columns():
    batch = pa.RecordBatch.from_pylist([{"k": k, "j": j} for k, j in
                                        [("a", 1), ("b", 1), ("a", 1), (None, 1), ("a", 2), (None, 1)]])
    codes = key_codes(batch, ("k", "j"))
    assert codes.dtype == np.int64
    pairs = list(zip(batch.column("k").to_pylist(), batch.column("j").to_pylist()))
    assert all((codes[a] == codes[b]) == (pairs[a] == pairs[b]) for a in range(6) for b in range(6))


@pytest.mark.parametrize("key, assigner, aggregates, expected", [
    (KeySelector.of("k"), W.TumblingEventTimeWindows.of(1), AGGREGATES, True),
    (KeySelector.of(lambda r: r["k"]), W.TumblingEventTimeWindows.of(1), AGGREGATES, False),
    (KeySelector.of("k"), W.TumblingProcessingTimeWindows.of(1), AGGREGATES, False),
    (KeySelector.of("k"), W.TumblingEventTimeWindows.of(1),
     AGGREGATES + (ColumnAggregate("d", "count_distinct", "value"),), False)])
def test_which_aggregates_split(key, assigner, aggregates, expected):
    assert splits(key, assigner, aggregates) is expected
