"""Timers of a KeyedBatchFunction, the operator driven directly (real heap backend, manual
clock): arrays of times per distinct key, due timers back in rounds of distinct keys, in
checkpoints, and errors that name the fix."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.runtime.operators.process import KeyedBatchProcessOperator

from tests.runtime.support import Sink


TOTAL = ss.ValueStateDescriptor("total", default=0)


class SessionTotals(ss.KeyedBatchFunction):
    """Adds each key's values; emits a key's total when event time passes its last row + 10."""

    def open(self, ctx):
        self.total = ctx.get_state(TOTAL)
        self.timers = ctx.timer_service()

    def process_batch(self, batch, keys):
        values = batch.column("v").to_numpy()
        ts = batch.column("ts").to_numpy()
        sums = np.zeros(len(keys), dtype=np.int64)
        np.add.at(sums, keys.index, values)
        last = np.full(len(keys), np.iinfo(np.int64).min)
        np.maximum.at(last, keys.index, ts)
        self.total.put_many(keys, np.array(self.total.get_many(keys)) + sums)
        self.timers.register_event_time_timers(keys, last + 10)
        if "wall" in batch.schema.names:
            self.timers.register_processing_time_timers(keys, int(batch.column("wall")[0].as_py()))

    def on_timers(self, timers, ctx):
        totals = self.total.get_many(timers.keys)
        return {"key": timers.keys.unique, "at": timers.timestamps, "total": totals,
                "domain": [timers.domain.value] * len(timers)}


def operator(function, clock=None, restore=None, base=None):
    clock = clock or ManualScheduler()
    ctx = OperatorContext(name="totals", uid="totals", subtask_index=0, parallelism=1, max_parallelism=128,
                          attempt=0, job_id="job", task_name="totals (1/1)", timers=clock, clock=clock)
    op = KeyedBatchProcessOperator(ctx, function, KeySelector.of("k"))
    op.output = Output([sink := Sink()])
    if restore is not None:
        op.keyed_backend.restore(restore, base)
    op.initialize_state()
    op.open()
    return op, sink


def batch(**columns):
    return pa.RecordBatch.from_pydict(columns)


def rows(sink):
    return sink.items


def test_event_time_timers_fire_per_distinct_key_before_the_watermark_is_forwarded():
    op, sink = operator(SessionTotals())
    op.process(batch(k=["a", "b", "a"], v=[1, 2, 3], ts=[100, 105, 120]))
    op.process(batch(k=["b"], v=[5], ts=[110]))      # b's timer moves to 120, a second one
    op.process_watermark(119)
    assert rows(sink) == [{"key": "b", "at": 115, "total": 7, "domain": "event_time"}, ("watermark", 119)]
    op.process_watermark(200)
    assert rows(sink)[2:] == [{"key": "b", "at": 120, "total": 7, "domain": "event_time"},
                              {"key": "a", "at": 130, "total": 4, "domain": "event_time"}, ("watermark", 200)]
    assert op.timer_service.num_event_time_timers() == 0


def test_two_due_timers_of_one_key_come_in_two_rounds_so_state_access_stays_per_key():
    seen = []

    class Rounds(SessionTotals):
        def on_timers(self, timers, ctx):
            seen.append((list(timers.keys.unique), timers.timestamps.tolist()))

    op, _ = operator(Rounds())
    op.process(batch(k=["a", "b"], v=[1, 1], ts=[0, 0]))
    op.process(batch(k=["a"], v=[1], ts=[5]))
    op.process_watermark(100)
    assert seen == [(["a", "b"], [10, 10]), (["a"], [15])]


def test_processing_time_timers_fire_from_the_timer_queue():
    clock = ManualScheduler()
    op, sink = operator(SessionTotals(), clock)
    now = int(clock.wall() * 1000)
    op.process(batch(k=["x", "y"], v=[1, 2], ts=[0, 0], wall=[now + 200, now + 200]))
    clock.advance(0.1)
    assert rows(sink) == []
    clock.advance(0.15)
    assert sorted((r["key"], r["domain"]) for r in rows(sink)) == [("x", "processing_time"), ("y", "processing_time")]


def test_batch_timers_are_in_the_checkpoint(tmp_path):
    op, _ = operator(SessionTotals())
    op.process(batch(k=["a"], v=[4], ts=[50]))
    location = f"file://{tmp_path}"
    handles = op.snapshot_state(1, 0.0, location).run()
    restored, sink = operator(SessionTotals(), restore=list(handles.keyed), base=location)
    restored.process_watermark(100)
    assert rows(sink) == [{"key": "a", "at": 60, "total": 4, "domain": "event_time"}, ("watermark", 100)]


def test_misuse_names_the_fix():
    class NoHandler(ss.KeyedBatchFunction):
        def open(self, ctx):
            self.timers = ctx.timer_service()

        def process_batch(self, batch, keys):
            self.timers.register_event_time_timers(keys, 5)

    op, _ = operator(NoHandler())
    op.process(batch(k=["a"]))
    with pytest.raises(ss.UsageError, match="has no on_timers"):
        op.process_watermark(10)

    class BadTimes(SessionTotals):
        def process_batch(self, batch, keys):
            self.timers.register_event_time_timers(keys, [1.5] * len(keys))

    op, _ = operator(BadTimes())
    with pytest.raises(ss.UserFunctionError, match="one integer time .* per distinct key"):
        op.process(batch(k=["a", "b"], v=[1, 1], ts=[0, 0]))

    class PerRow(ss.KeyedProcessFunction):
        def open(self, ctx):
            ctx.timer_service()

    from tests.runtime.test_keyed_timers import operator as row_operator
    with pytest.raises(Exception, match="has timers only for a KeyedBatchFunction"):
        row_operator(PerRow(), ManualScheduler())


def test_rounds_keep_each_timers_key_group_across_many_keys_and_buckets():
    """The Spark test's vectorized bucket sums, driven directly: every (key, bucket) equals the
    reference. Found a bug: a round's key group was read after the previous round's on_timers
    ran, when the backend's current key group may belong to another key."""
    from tests.integration.test_event_time import BatchBucketSums, event, reference_buckets

    op, sink = operator(BatchBucketSums())
    op.key = KeySelector.of("key")
    events = [event(i) for i in range(4000)]
    for lo in range(0, len(events), 40):
        op.process(pa.RecordBatch.from_pylist(events[lo:lo + 40]))
        op.process_watermark(max(0, min(e["ts"] for e in events[lo:lo + 40]) - 2000))
    op.process_watermark(2 ** 62)
    fired = [(r["key"], r["bucket"]) for r in rows(sink) if isinstance(r, dict)]
    assert len(fired) == len(set(fired))
    assert {(r["key"], r["bucket"]): r["sum"] for r in rows(sink) if isinstance(r, dict)} == reference_buckets(4000)


def test_a_batch_registers_its_new_timers_in_one_state_write_and_keeps_one_per_key_and_time():
    """Registration is in bulk (`put_all_many` of the batch's new timers, no current key set
    per timer); a timer registered again is not written again; the current key is untouched."""
    op, sink = operator(SessionTotals())
    timers = op.timer_service._event
    writes = []

    class Counting:
        def __init__(self, state):
            self.state = state

        def __getattr__(self, name):
            return getattr(self.state, name)

        def put_all_many(self, keys, mappings):
            writes.append(sorted(keys.unique))
            return self.state.put_all_many(keys, mappings)

    timers._state = Counting(timers._state)
    op.keyed_backend.set_current_key("z", 7)
    op.process(batch(k=["a", "b", "c"], v=[1, 1, 1], ts=[10, 10, 10]))
    op.process(batch(k=["a", "b"], v=[1, 1], ts=[10, 20]))          # a: the same timer again
    assert writes == [["a", "b", "c"], ["b"]]
    assert (op.keyed_backend.current_key, op.keyed_backend.current_key_group) == ("z", 7)
    assert op.timer_service.num_event_time_timers() == 4
    op.process_watermark(100)
    assert sorted((r["key"], r["at"]) for r in rows(sink) if isinstance(r, dict)) == \
        [("a", 20), ("b", 20), ("b", 30), ("c", 20)]
    assert op.timer_service.num_event_time_timers() == 0
