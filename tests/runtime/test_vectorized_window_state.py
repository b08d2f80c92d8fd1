"""The vectorized window aggregation against the per-row window operator, and its state
through snapshots, restores and rescaling (no Spark)."""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.operators import partial_rows, vectorized_windows
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.runtime.operators.vectorized_windows import (WINDOWS, ColumnAggregate,
                                                   VectorizedWindowOperator)
from streamsnap.runtime.operators.windows import AggregateContents
from streamsnap.state.assignment import assign_operator_state
from streamsnap.state.key_groups import assign_key_groups
from streamsnap.time.watermarks import MAX_WATERMARK
from tests.runtime.support import RecordingState, older_layout_encode
from tests.runtime.test_window_operator import Sink, window_operator

W = ss.windows
AGGREGATES = (ColumnAggregate("n", "count", None), ColumnAggregate("total", "sum", "value"),
              ColumnAggregate("low", "min", "value"), ColumnAggregate("high", "max", "value"))
SCHEMA = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("value", pa.int64())])
FIELDS = ("key", "window_start", "window_end", "n", "total", "low", "high")


def vectorized(assigner, lateness=0, *, subtask=0, parallelism=1, restore=None, base=None):
    clock = ManualScheduler()
    ctx = OperatorContext(name="vwindow", uid="vwindow", subtask_index=subtask,
                          parallelism=parallelism, max_parallelism=128, attempt=0, job_id="job",
                          task_name=f"vwindow ({subtask + 1}/{parallelism})", timers=clock,
                          clock=clock, restore=restore, restore_base=base)
    op = VectorizedWindowOperator(ctx, KeySelector.of("key"), assigner, lateness, AGGREGATES,
                                  "late", "ts")
    main, side = Sink(), Sink()
    op.output = Output([main], {"late": [side]})
    op.initialize_state()
    op.open()
    return op, main, side


class Stats(ss.AggregateFunction):
    """count/sum/min/max of `value` (nulls skipped), as the vectorized path computes them."""

    def create_accumulator(self):
        return [0, None, None, None]

    def add(self, row, acc):
        v = row["value"]
        n, total, low, high = acc
        if v is None:
            return [n + 1, total, low, high]
        return [n + 1, v if total is None else total + v, v if low is None else min(low, v),
                v if high is None else max(high, v)]

    def get_result(self, acc):
        return acc

    def merge(self, a, b):
        raise AssertionError("not a merging assigner")


class AsRow(ss.ProcessWindowFunction):
    def process(self, key, context, elements):
        (n, total, low, high), = elements
        yield {"key": key, "window_start": context.window.start, "window_end": context.window.end,
               "n": n, "total": total, "low": low, "high": high}


def rows_of(sink, since=0):
    return Counter(tuple(r[f] for f in FIELDS) for r in sink.rows()[since:])


def random_rows(seed, count=1_500, keys=6):
    rng = random.Random(seed)
    return [{"key": rng.randrange(keys), "ts": i * 20 + rng.randrange(6_000),
             "value": None if rng.random() < 0.1 else rng.randrange(-100, 100)}
            for i in range(count)]


@pytest.mark.parametrize("assigner", [W.TumblingEventTimeWindows.of(1),
                                      W.SlidingEventTimeWindows.of(2, 0.5)])
@pytest.mark.parametrize("lateness", [0, 700])
def test_out_of_order_batches_fire_like_the_per_row_window_operator(assigner, lateness):
    """Same windows, same values, fired at the same step (element or watermark), re-fired
    within the allowed lateness, and the same rows late."""
    rows = random_rows(11)
    vec, vec_main, vec_side = vectorized(assigner, lateness)
    ref, ref_main, ref_side = window_operator(assigner, AggregateContents(Stats()), AsRow(),
                                              lateness=lateness, late="late")
    seen = vec_seen = 0
    for start in range(0, len(rows), 120):
        chunk = rows[start:start + 120]
        watermark = max(r["ts"] for r in rows[:start + 120]) - 1_000
        for step in (lambda op: op.process(pa.RecordBatch.from_pylist(chunk, schema=SCHEMA)),
                     lambda op: op.process_watermark(watermark)):
            step(vec)
            step(ref)
            # A batch's late rows of one window re-fire it once, with all of them (the per-row
            # operator fires after each): compare with its last firing of each window.
            last = {r[:3]: r for r in (tuple(x[f] for f in FIELDS) for x in ref_main.rows()[seen:])}
            assert rows_of(vec_main, vec_seen) == Counter(last.values())
            seen, vec_seen = len(ref_main.rows()), len(vec_main.rows())
    vec.process_watermark(MAX_WATERMARK)
    ref.process_watermark(MAX_WATERMARK)
    assert set(rows_of(vec_main)) <= set(rows_of(ref_main))
    assert Counter(map(str, vec_side.rows())) == Counter(map(str, ref_side.rows()))
    assert ref_side.rows()                          # the input does have late rows
    # Everything fired and was cleaned up: no window state and no timers remain.
    assert list(vec.keyed_backend.iter_entries(WINDOWS)) == []
    assert vec.timer_service.num_event_time_timers() == 0 and len(vec.index) == 0


@pytest.mark.parametrize("older_layout", [False, True])
def test_a_restore_at_another_parallelism_keeps_pending_windows_and_fires_each_once(tmp_path, monkeypatch,
                                                                                    older_layout):
    """Windows fired but kept for the allowed lateness must not fire again when the restored
    operators see the watermark rise again; pending ones fire once; late rows re-fire. Also
    from state stored as msgpack lists (streamsnap before `partial_rows`)."""
    assigner = W.SlidingEventTimeWindows.of(10, 5)
    rows = [{"key": k, "ts": t, "value": k + t} for k in range(30) for t in (1_000, 8_000, 13_000)]
    late = [{"key": k, "ts": 9_000, "value": 1} for k in range(0, 30, 3)]
    batch = pa.RecordBatch.from_pylist(rows, schema=SCHEMA)

    reference, ref_main, _ = vectorized(assigner, 5_000)
    reference.process(batch)
    reference.process_watermark(10_000)
    reference.process(pa.RecordBatch.from_pylist(late, schema=SCHEMA))
    reference.process_watermark(MAX_WATERMARK)

    encode = partial_rows.encode
    if older_layout:
        monkeypatch.setattr(partial_rows, "encode", older_layout_encode)
    op, main, _ = vectorized(assigner, 5_000)
    op.process(batch)
    op.process_watermark(10_000)            # [-5 s, 5 s) and [0, 10 s) fired, kept until 15 s
    fired = len(main.rows())
    assert fired == 60
    timers = op.timer_service.num_event_time_timers()
    state = op.snapshot_state(1, 0.0, str(tmp_path)).run()
    if older_layout:
        assert all(type(v) is list for _, _, v in op.keyed_backend.iter_entries(WINDOWS))
        monkeypatch.setattr(partial_rows, "encode", encode)
    monkeypatch.setattr(vectorized_windows, "RESTORE_CHUNK", 7)    # restored in several chunks
    restored = assign_operator_state({0: state}, 128, 2)
    out, restored_timers = [], 0
    for i in range(2):
        new, new_main, _ = vectorized(assigner, 5_000, subtask=i, parallelism=2,
                                      restore=restored[i], base=str(tmp_path))
        restored_timers += new.timer_service.num_event_time_timers()
        new.process_watermark(10_000)       # the watermark is not state: it rises again
        assert new_main.rows() == []        # nothing fires twice
        owned = new.keyed_backend.key_group_range
        mine = [r for r in late if assign_key_groups([r["key"]], 128)[0] in owned]
        assert 0 < len(mine) < len(late)
        new.process(pa.RecordBatch.from_pylist(mine, schema=SCHEMA))
        new.process_watermark(MAX_WATERMARK)
        out += new_main.rows()
    assert restored_timers == timers
    assert Counter(map(str, main.rows() + out)) == Counter(map(str, ref_main.rows()))


def test_a_snapshot_holds_the_windows_of_its_moment_while_batches_keep_arriving(tmp_path):
    op, live, _ = vectorized(W.TumblingEventTimeWindows.of(10))
    op.process(pa.RecordBatch.from_pylist([{"key": 1, "ts": 1, "value": 1},
                                           {"key": 2, "ts": 2, "value": 5}], schema=SCHEMA))
    pending = op.snapshot_state(1, 0.0, str(tmp_path))      # synchronous part only
    op.process(pa.RecordBatch.from_pylist([{"key": 1, "ts": 3, "value": 4},
                                           {"key": 3, "ts": 4, "value": 7}], schema=SCHEMA))
    state = pending.run()
    restored, main, _ = vectorized(W.TumblingEventTimeWindows.of(10),
                                   restore=assign_operator_state({0: state}, 128, 1)[0],
                                   base=str(tmp_path))
    restored.process_watermark(MAX_WATERMARK)
    assert sorted((r["key"], r["n"], r["total"]) for r in main.rows()) == [(1, 1, 1), (2, 1, 5)]
    op.process_watermark(MAX_WATERMARK)
    assert sorted((r["key"], r["n"], r["total"]) for r in live.rows()) == \
        [(1, 2, 5), (2, 1, 5), (3, 1, 7)]


def test_each_batch_reads_and_writes_state_once_per_key_and_window():
    """The batch's rows are reduced with numpy: state sees (key, window) groups, not rows."""
    op, main, _ = vectorized(W.SlidingEventTimeWindows.of(2, 1))
    calls = []

    op.windows = RecordingState(op.windows, calls)
    rows = [{"key": i % 3, "ts": 500 + i % 500, "value": i} for i in range(3_000)]
    op.process(pa.RecordBatch.from_pylist(rows, schema=SCHEMA))
    assert calls == [("get", 6), ("put", 6, 0)]        # 3 keys x windows [-1 s, 1 s), [0, 2 s)
    op.process_watermark(10_000)
    assert calls[2:] == [("get", 6), ("put", 6, 6)]      # fired and dropped: read once, deleted once
    later = [dict(r, ts=r["ts"] + 20_000) for r in rows]
    op.process(pa.RecordBatch.from_pylist(later, schema=SCHEMA))
    op.process_watermark(MAX_WATERMARK)
    # the end of the input: every window fires and goes, the state is taken whole
    assert calls[4:] == [("get", 6), ("put", 6, 0), ("take", 6)]
    assert sorted((r["key"], r["window_start"], r["n"]) for r in main.rows()) == \
        [(k, s, 1_000) for k in range(3) for s in (-1_000, 0, 19_000, 20_000)]


def test_a_row_for_a_window_the_watermark_just_reached_refires_it_at_once():
    op, main, side = vectorized(W.TumblingEventTimeWindows.of(10), 5_000)
    op.process(pa.RecordBatch.from_pylist([{"key": 1, "ts": 1_000, "value": 2}], schema=SCHEMA))
    op.process_watermark(9_998)
    assert main.rows() == []
    op.process_watermark(9_999)              # the window's last millisecond: it fires
    op.process(pa.RecordBatch.from_pylist([{"key": 1, "ts": 9_999, "value": 3},
                                           {"key": 1, "ts": 10_000, "value": 4}], schema=SCHEMA))
    assert [(r["window_start"], r["n"], r["total"]) for r in main.rows()] == [(0, 1, 2), (0, 2, 5)]
    op.process_watermark(14_998)
    # [0, 10 s): its cleanup timer; [10 s, 20 s): its trigger and its cleanup timer
    assert op.timer_service.num_event_time_timers() == 3
    op.process_watermark(14_999)             # cleaned up: later rows of it are late
    op.process(pa.RecordBatch.from_pylist([{"key": 1, "ts": 9_000, "value": 9}], schema=SCHEMA))
    assert side.rows() == [{"key": 1, "ts": 9_000, "value": 9}]
    op.process_watermark(MAX_WATERMARK)
    assert [(r["window_start"], r["n"]) for r in main.rows()] == [(0, 1), (0, 2), (10_000, 1)]
