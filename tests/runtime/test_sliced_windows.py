"""Sliding windows kept as slices (sliced_windows.py) against the per-window operator, through
out-of-order batches, late rows, snapshots, restores and rescaling, on the heap and RocksDB
(no Spark)."""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.errors import ConfigurationError
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.runtime.operators.keyed import current_millis
from streamsnap.runtime.operators.sliced_windows import SLICES, SlicedWindowOperator, sliceable
from streamsnap.runtime.operators.vectorized_windows import WINDOWS, ColumnAggregate, VectorizedWindowOperator
from streamsnap.state.assignment import assign_operator_state
from streamsnap.state.backends.rocksdb.config import RocksDBConfig
from streamsnap.state.key_groups import assign_key_groups
from streamsnap.time.watermarks import MAX_WATERMARK
from tests.runtime.support import RecordingState, Sink

W = ss.windows
AGGREGATES = (ColumnAggregate("n", "count", None), ColumnAggregate("total", "sum", "value"),
              ColumnAggregate("low", "min", "value"), ColumnAggregate("high", "max", "value"),
              ColumnAggregate("avg", "mean", "value"), ColumnAggregate("first", "min", "name"),
              ColumnAggregate("last", "max", "name"))
SCHEMA = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("value", pa.float64()),
                    ("name", pa.string())])


def build(kind, assigner, *, backend="hashmap", subtask=0, parallelism=1, restore=None, base=None,
          clock=None, late="late"):
    clock = clock or ManualScheduler()
    ctx = OperatorContext(name="w", uid="w", subtask_index=subtask, parallelism=parallelism,
                          max_parallelism=128, attempt=0, job_id="job",
                          task_name=f"w ({subtask + 1}/{parallelism})", timers=clock, clock=clock,
                          state_backend=backend, restore=restore, restore_base=base)
    op = kind(ctx, KeySelector.of("key"), assigner, 0, AGGREGATES, late, "ts")
    main, side = Sink(), Sink()
    op.output = Output([main], {"late": [side]})
    op.initialize_state()
    op.open()
    return op, main, side


def rows_of(sink, since=0):
    return Counter(tuple(sorted((k, round(v, 9) if isinstance(v, float) else v) for k, v in r.items()))
                   for r in sink.rows()[since:])


def random_rows(seed, count=2_000, keys=7):
    rng = random.Random(seed)
    return [{"key": rng.randrange(keys), "ts": i * 15 + rng.randrange(5_000),
             "value": None if rng.random() < 0.1 else float(rng.randrange(-100, 100)),
             "name": None if rng.random() < 0.2 else rng.choice(["ab", "b", "", "zz", "a\x00"])}
            for i in range(count)]


def backend_for(name, tmp_path):
    return "hashmap" if name == "hashmap" else RocksDBConfig(local_dir=str(tmp_path / "db"))


ASSIGNERS = [W.SlidingEventTimeWindows.of(2, 0.5), W.SlidingEventTimeWindows.of(3, 1, 0.25),
             W.SlidingEventTimeWindows.of(1, 0.25)]


@pytest.mark.parametrize("assigner", ASSIGNERS)
@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_random_out_of_order_batches_fire_as_the_per_window_operator_does(assigner, backend, tmp_path):
    """Same rows, same step, same late rows; every slice deleted at the end."""
    rows = random_rows(5)
    sliced, s_main, s_side = build(SlicedWindowOperator, assigner, backend=backend_for(backend, tmp_path))
    windows, w_main, w_side = build(VectorizedWindowOperator, assigner)
    seen = 0
    rng = random.Random(1)
    start = 0
    while start < len(rows):
        size = rng.randrange(1, 250)
        chunk = rows[start:start + size]
        start += size
        watermark = max(r["ts"] for r in rows[:start]) - rng.randrange(500, 3_000)
        for step in (lambda op: op.process(pa.RecordBatch.from_pylist(chunk, schema=SCHEMA)),
                     lambda op: op.process_watermark(watermark)):
            step(sliced)
            step(windows)
            assert rows_of(s_main, seen) == rows_of(w_main, seen)
            assert len(s_main.rows()) == len(w_main.rows())
            seen = len(s_main.rows())
    for op in (sliced, windows):
        op.process_watermark(MAX_WATERMARK)
    assert rows_of(s_main) == rows_of(w_main) and len(s_main.rows()) > 200
    assert Counter(map(str, s_side.rows())) == Counter(map(str, w_side.rows()))
    assert w_side.rows()                                 # the input does have late rows
    assert list(sliced.keyed_backend.iter_entries(SLICES)) == []
    assert len(sliced.index) == 0 and sliced.timer_service.num_event_time_timers() == 0


def test_a_batch_reads_and_writes_one_entry_per_key_and_slice_and_a_window_reads_its_slices():
    op, main, _ = build(SlicedWindowOperator, W.SlidingEventTimeWindows.of(2, 0.5))
    calls = []

    op.windows = RecordingState(op.windows, calls)
    rows = [{"key": i % 3, "ts": 600 + i % 300, "value": float(i), "name": "x"} for i in range(3_000)]
    op.process(pa.RecordBatch.from_pylist(rows, schema=SCHEMA))
    # 3 keys x one slice [500, 1000): the per-window layout would touch 3 x 4 windows
    assert calls == [("get", 3), ("put", 3, 0)]
    op.process_watermark(999)            # the window [-1 s, 1 s) ends: it reads the slice
    assert calls[2:] == [("get", 3)]
    assert [(r["key"], r["window_start"], r["n"]) for r in main.rows()] == [(k, -1_000, 1_000) for k in range(3)]
    op.process_watermark(MAX_WATERMARK)  # three more windows read it (once), then it is deleted
    assert calls[3:] == [("get", 3), ("put", 3, 3)]
    assert sorted((r["window_start"], r["n"]) for r in main.rows()[3:]) == \
        [(s, 1_000) for s in (-500, -500, -500, 0, 0, 0, 500, 500, 500)]


def test_processing_time_sliding_windows_fire_on_the_clock():
    op, main, _ = build(SlicedWindowOperator, W.SlidingProcessingTimeWindows.of(2, 1))
    clock = op.ctx.clock
    t0 = current_millis(clock)
    assert t0 % 2_000 == 0
    op.process(pa.RecordBatch.from_pylist([{"key": 1, "ts": 0, "value": 1.0, "name": "a"}], schema=SCHEMA))
    clock.advance(0.998)
    assert main.rows() == []
    clock.advance(0.002)                 # [t0 - 1 s, t0 + 1 s) ends
    op.process(pa.RecordBatch.from_pylist([{"key": 1, "ts": 0, "value": 2.0, "name": "b"}], schema=SCHEMA))
    clock.advance(3.0)
    assert [(r["window_start"] - t0, r["n"], r["total"]) for r in main.rows()] == \
        [(-1_000, 1, 1.0), (0, 2, 3.0), (1_000, 1, 2.0)]
    assert len(op.index) == 0 and op.timer_service.num_processing_time_timers() == 0


def _snapshot(op, tmp_path, checkpoint=1):
    return op.snapshot_state(checkpoint, 0.0, str(tmp_path)).run()


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_a_rescaled_restore_fires_each_window_once_even_from_subtasks_at_different_progress(backend, tmp_path):
    """Two subtasks whose watermarks differ are merged into one: the key groups that were
    ahead skip the windows they fired; the rest fire them; the output equals one uninterrupted run."""
    assigner = W.SlidingEventTimeWindows.of(4, 1)
    rows = [{"key": k, "ts": t, "value": float(k + t), "name": str(k)}
            for k in range(40) for t in range(100, 9_000, 700)]
    reference, ref_main, _ = build(VectorizedWindowOperator, assigner)
    reference.process(pa.RecordBatch.from_pylist(rows, schema=SCHEMA))
    reference.process_watermark(MAX_WATERMARK)

    states, before = {}, []
    for i, watermark in enumerate((2_999, 5_999)):
        op, main, _ = build(SlicedWindowOperator, assigner, backend=backend_for(backend, tmp_path / f"a{i}"),
                            subtask=i, parallelism=2)
        owned = op.keyed_backend.key_group_range
        mine = [r for r in rows if assign_key_groups([r["key"]], 128)[0] in owned]
        op.process(pa.RecordBatch.from_pylist(mine, schema=SCHEMA))
        op.process_watermark(watermark)
        before += main.rows()
        states[i] = _snapshot(op, tmp_path)
    restored = assign_operator_state(states, 128, 1)[0]
    op, main, _ = build(SlicedWindowOperator, assigner, backend=backend_for(backend, tmp_path / "b"),
                        restore=restored, base=str(tmp_path))
    assert op._ahead and op.index.progress == 2_999
    op.process_watermark(MAX_WATERMARK)
    assert Counter(map(str, before + main.rows())) == Counter(map(str, ref_main.rows()))
    # ...and once more through a checkpoint of the restored subtask before it caught up.
    op2, main2, _ = build(SlicedWindowOperator, assigner, backend=backend_for(backend, tmp_path / "c"),
                          restore=restored, base=str(tmp_path))
    op2.process_watermark(3_999)
    again = _snapshot(op2, tmp_path / "d", 2)
    op3, main3, _ = build(SlicedWindowOperator, assigner, backend=backend_for(backend, tmp_path / "e"),
                          restore=assign_operator_state({0: again}, 128, 1)[0], base=str(tmp_path / "d"))
    op3.process_watermark(MAX_WATERMARK)
    assert Counter(map(str, before + main2.rows() + main3.rows())) == Counter(map(str, ref_main.rows()))


def test_rows_replayed_after_a_restore_do_not_refire_windows_fired_before_it(tmp_path):
    """The watermark is not state; the progress is: a replayed row of a window that fired
    before the checkpoint counts only in the windows still to fire."""
    assigner = W.SlidingEventTimeWindows.of(2, 1)
    op, main, _ = build(SlicedWindowOperator, assigner)
    op.process(pa.RecordBatch.from_pylist([{"key": 1, "ts": 500, "value": 1.0, "name": "a"}], schema=SCHEMA))
    op.process_watermark(999)            # [-1 s, 1 s) fired
    assert [r["window_start"] for r in main.rows()] == [-1_000]
    restored, again, side = build(SlicedWindowOperator, assigner,
                                  restore=assign_operator_state({0: _snapshot(op, tmp_path)}, 128, 1)[0],
                                  base=str(tmp_path))
    restored.process(pa.RecordBatch.from_pylist([{"key": 1, "ts": 700, "value": 2.0, "name": "b"},
                                                 {"key": 1, "ts": -100, "value": 9.0, "name": "c"}],
                                                schema=SCHEMA))
    restored.process_watermark(MAX_WATERMARK)
    assert [(r["window_start"], r["n"], r["total"]) for r in again.rows()] == [(0, 2, 3.0)]
    assert [r["ts"] for r in side.rows()] == [-100]     # all its windows were done: late


def test_state_of_the_other_layout_is_refused_on_restore_not_dropped(tmp_path):
    assigner = W.SlidingEventTimeWindows.of(2, 1)
    row = pa.RecordBatch.from_pylist([{"key": 1, "ts": 500, "value": 1.0, "name": "a"}], schema=SCHEMA)
    for writer, reader, layout in ((VectorizedWindowOperator, SlicedWindowOperator, "one entry per window"),
                                   (SlicedWindowOperator, VectorizedWindowOperator, "as slices")):
        op, _, _ = build(writer, assigner)
        op.process(row)
        state = assign_operator_state({0: _snapshot(op, tmp_path / writer.__name__)}, 128, 1)[0]
        with pytest.raises(ConfigurationError, match=f"holds this window's contents {layout}"):
            build(reader, assigner, restore=state, base=str(tmp_path / writer.__name__))
    # Empty state of the other layout is no obstacle.
    op, _, _ = build(VectorizedWindowOperator, assigner)
    state = assign_operator_state({0: _snapshot(op, tmp_path / "empty")}, 128, 1)[0]
    build(SlicedWindowOperator, assigner, restore=state, base=str(tmp_path / "empty"))
    assert list(op.keyed_backend.iter_entries(WINDOWS)) == []


def test_which_windows_are_sliced():
    count = (ColumnAggregate("n", "count", None),)
    distinct = (ColumnAggregate("d", "count_distinct", "value"),)
    assert sliceable(W.SlidingEventTimeWindows.of(10, 2), 0, count)
    assert sliceable(W.SlidingProcessingTimeWindows.of(10, 2), 0, count)
    assert not sliceable(W.SlidingEventTimeWindows.of(10, 2), 1_000, count)     # lateness re-fires
    assert not sliceable(W.SlidingEventTimeWindows.of(10, 2), 0, distinct)      # sets do not add up
    assert not sliceable(W.SlidingEventTimeWindows.of(10, 3), 0, count)         # not a multiple
    assert not sliceable(W.TumblingEventTimeWindows.of(10), 0, count)


def test_the_api_picks_slices_for_a_sliding_aggregate_and_windows_otherwise():
    from tests.api.test_window_all import nodes, stream

    s = stream()
    keyed = s.key_by("name")
    sliding = W.SlidingEventTimeWindows.of(10, 2)
    keyed.window(sliding).count(name="sliced")
    keyed.window(sliding).allowed_lateness(1).count(name="late")
    keyed.window(sliding).aggregate_columns({"d": ("count_distinct", "price")}, name="distinct")
    keyed.window(W.SlidingEventTimeWindows.of(10, 3)).count(name="uneven")
    graph = nodes(s.env)
    assert "(sliced)" in graph["sliced"].operator.describe()
    assert [n for n in ("late", "distinct", "uneven") if "sliced" in graph[n].operator.describe()] == []
