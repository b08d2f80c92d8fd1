"""The vectorized session aggregate (no Spark): session merging against a plain-Python
reference on random out-of-order batches with late rows, its state through a snapshot restored
at another parallelism, and the build-time refusals."""

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
from streamsnap.runtime.operators import partial_rows, vectorized_windows
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.runtime.operators.vectorized_sessions import SESSIONS, VectorizedSessionOperator
from streamsnap.runtime.operators.vectorized_windows import ColumnAggregate
from streamsnap.state.assignment import assign_operator_state
from streamsnap.state.key_groups import assign_key_groups
from streamsnap.time.session_merge import merge_sessions
from streamsnap.time.session_timers import SessionTimers
from streamsnap.time.watermarks import MAX_WATERMARK
from tests.runtime.support import older_layout_encode
from tests.runtime.test_window_operator import Sink

W = ss.windows
GAP = 500
AGGREGATES = (ColumnAggregate("n", "count", None), ColumnAggregate("total", "sum", "value"),
              ColumnAggregate("low", "min", "value"), ColumnAggregate("high", "max", "value"),
              ColumnAggregate("avg", "mean", "x"))
SCHEMA = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("value", pa.int64()), ("x", pa.float64())])
FIELDS = ("key", "window_start", "window_end", "n", "total", "low", "high", "avg")


def sessions_operator(lateness=0, *, subtask=0, parallelism=1, restore=None, base=None):
    clock = ManualScheduler()
    ctx = OperatorContext(name="vsessions", uid="vsessions", subtask_index=subtask,
                          parallelism=parallelism, max_parallelism=128, attempt=0, job_id="job",
                          task_name=f"vsessions ({subtask + 1}/{parallelism})", timers=clock,
                          clock=clock, restore=restore, restore_base=base)
    op = VectorizedSessionOperator(ctx, KeySelector.of("key"), W.EventTimeSessionWindows.with_gap(GAP / 1000),
                                   lateness, AGGREGATES, "late", "ts")
    main, side = Sink(), Sink()
    op.output = Output([main], {"late": [side]})
    op.initialize_state()
    op.open()
    return op, main, side


# ---------------------------------------------------------------------------- the reference
def _components(items: list[tuple[int, int]]) -> list[list[int]]:
    """Indices of `items` (start, end) grouped by transitive overlap-or-touch (union-find)."""
    parent = list(range(len(items)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, (a, b) in enumerate(items):
        for j in range(i):
            c, d = items[j]
            if a <= d and c <= b:
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(items)):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


class Reference:
    """Session windows of Flink's WindowOperator + EventTimeTrigger, in plain Python, taking a
    batch as a set (see vectorized_sessions.py): key -> [start, end, rows, pending]."""

    def __init__(self, lateness: int):
        self.lateness, self.watermark, self.sessions = lateness, -(2 ** 63), {}

    @staticmethod
    def result(key, start, end, rows) -> tuple:
        values = [r["value"] for r in rows if r["value"] is not None]
        xs = [r["x"] for r in rows if r["x"] is not None]
        return (key, start, end, len(rows), sum(values) if values else None, min(values, default=None),
                max(values, default=None), sum(xs) / len(xs) if xs else None)

    def process(self, batch: list[dict]) -> tuple[list, list]:
        fired, late = [], []
        for key in {r["key"] for r in batch}:
            stored = self.sessions.pop(key, [])
            rows = [r for r in batch if r["key"] == key]
            items = [(s[0], s[1]) for s in stored] + [(r["ts"], r["ts"] + GAP) for r in rows]
            kept = []
            for group in _components(items):
                old = [stored[i] for i in group if i < len(stored)]
                new = [rows[i - len(stored)] for i in group if i >= len(stored)]
                start, end = min(items[i][0] for i in group), max(items[i][1] for i in group)
                if not old and end - 1 + self.lateness <= self.watermark:
                    late += new
                    continue
                members = [r for s in old for r in s[2]] + new
                pending = any(s[3] for s in old)
                if new:
                    pending = end - 1 > self.watermark
                    if not pending:
                        fired.append(self.result(key, start, end, members))
                kept.append([start, end, members, pending])
            if kept:
                self.sessions[key] = kept
        return fired, late

    def advance(self, watermark: int) -> list:
        self.watermark = watermark
        fired = []
        for key in list(self.sessions):
            kept = []
            for start, end, members, pending in self.sessions[key]:
                if pending and end - 1 <= watermark:
                    fired.append(self.result(key, start, end, members))
                    pending = False
                if min(end - 1 + self.lateness, MAX_WATERMARK) > watermark:
                    kept.append([start, end, members, pending])
            self.sessions[key] = kept
            if not kept:
                del self.sessions[key]
        return fired


def as_tuples(rows) -> Counter:
    return Counter(tuple(round(r[f], 9) if f == "avg" and r[f] is not None else r[f] for f in FIELDS)
                   for r in rows)


def random_rows(seed: int, count: int = 2_400, keys: int = 6) -> list[dict]:
    """A row every ~25 ms, keys at random (sessions of a key break where it is quiet for more
    than the gap, and every 300 rows), up to 2.5 s out of order, and 3 % up to 8 s: more than
    the watermark's 1 s bound, so some rows are late."""
    rng = random.Random(seed)
    return [{"key": rng.randrange(keys),
             "ts": i * 25 + rng.randrange(2_500) + (i // 300) * 1_000 - (rng.randrange(8_000) if rng.random() < 0.03 else 0),
             "value": None if rng.random() < 0.1 else rng.randrange(-100, 100),
             "x": None if rng.random() < 0.1 else rng.random()} for i in range(count)]


# ---------------------------------------------------------------------------- pure parts
def test_merge_sessions_equals_a_union_find_of_touching_intervals():
    rng = np.random.default_rng(5)
    for span in (1_000, 10 ** 17):       # the second makes the offset trick overflow: per-key path
        keys = rng.integers(0, 40, 3_000)
        starts = rng.integers(0, span, 3_000)
        ends = starts + rng.integers(1, max(2, span // 500), 3_000)
        merged = merge_sessions(keys, starts, ends)
        session = merged.session_of()
        for k in range(40):
            mine = np.flatnonzero(keys == k).tolist()
            expected = {frozenset(mine[i] for i in g)
                        for g in _components([(int(starts[i]), int(ends[i])) for i in mine])}
            assert {frozenset(np.flatnonzero((session == s)).tolist())
                    for s in set(session[mine].tolist())} == expected
        assert (merged.start == [starts[session == s].min() for s in range(len(merged))]).all()
        assert (merged.end == [ends[session == s].max() for s in range(len(merged))]).all()
        assert (np.diff(merged.key) >= 0).all()


def test_session_timers_pop_each_key_once_at_its_latest_scheduled_time():
    timers = SessionTimers()

    def schedule(key, key_group, time, sessions, pending):
        timers.schedule_many([key], [key_group], *(np.array([v], dtype=np.int64) for v in (time, sessions, pending)))

    schedule("a", 1, 100, 2, 1)
    schedule("b", 2, 50, 1, 1)
    schedule("a", 1, 200, 3, 2)               # moved later: the entry at 100 is stale
    assert (len(timers), timers.num_pending(), timers.next_time()) == (4, 3, 50)
    assert timers.pop_due(150) == (["b"], [2])
    assert timers.next_time() == 200
    schedule("a", 1, 0, 0, 0)                 # no sessions left: forgotten
    assert (timers.pop_due(MAX_WATERMARK), len(timers), timers.next_time()) == (([], []), 0, None)


_STEPS = st.lists(st.one_of(
    st.tuples(st.just("schedule"), st.dictionaries(st.integers(0, 40), st.tuples(
        st.integers(0, 60), st.integers(0, 3), st.integers(0, 3)), max_size=25)),
    st.tuples(st.just("pop"), st.integers(0, 70)),
    st.tuples(st.just("pop"), st.just(MAX_WATERMARK))), max_size=40)


@settings(max_examples=300, deadline=None)
@given(_STEPS)
def test_session_timers_agree_with_a_dict_of_each_keys_earliest_time(steps):
    """Batches of keys rescheduled (sessions 0 forgets a key) and due keys popped, against a
    plain dict: the same keys due (earliest first), counts, next time; a small capacity makes
    the slots grow and be reused."""
    timers, model = SessionTimers(capacity=2), {}
    for step in steps:
        if step[0] == "schedule":
            keys = list(step[1])
            times, sessions, pending = (np.array([step[1][k][i] for k in keys], dtype=np.int64) for i in range(3))
            pending = np.minimum(pending, sessions)
            timers.schedule_many([f"k{k}" for k in keys], [k % 7 for k in keys], times, sessions, pending)
            for k, t, n, p in zip(keys, times.tolist(), sessions.tolist(), pending.tolist()):
                model.pop(f"k{k}", None)
                if n:
                    model[f"k{k}"] = (t, n, p, int(k) % 7)
        else:
            keys, groups = timers.pop_due(step[1])
            due = {k: v for k, v in model.items() if v[0] <= step[1]}
            assert sorted(keys) == sorted(due) and len(keys) == len(set(keys))
            assert [model[k][0] for k in keys] == sorted(model[k][0] for k in keys)
            assert groups == [model[k][3] for k in keys]
            for k in keys:
                del model[k]
        assert len(timers) == sum(v[1] for v in model.values())
        assert timers.num_pending() == sum(v[2] for v in model.values())
        assert timers.next_time() == min((v[0] for v in model.values()), default=None)


# ---------------------------------------------------------------------------- the operator
@pytest.mark.parametrize("lateness", [0, 800])
def test_random_out_of_order_batches_fire_like_the_reference(lateness):
    """Sessions bridging batches, rows late for their own window but joining an open session,
    late rows to the side output, re-fires within the allowed lateness: the same sessions at
    the same step (batch or watermark) as the reference."""
    rows = random_rows(7)
    op, main, side = sessions_operator(lateness)
    ref = Reference(lateness)
    late_expected, seen = [], 0
    for start in range(0, len(rows), 150):
        chunk = rows[start:start + 150]
        op.process(pa.RecordBatch.from_pylist(chunk, schema=SCHEMA))
        fired, late = ref.process(chunk)
        late_expected += late
        assert as_tuples(main.rows()[seen:]) == as_tuples(dict(zip(FIELDS, f)) for f in fired)
        seen = len(main.rows())
        watermark = max(r["ts"] for r in rows[:start + 150]) - 1_000
        op.process_watermark(watermark)
        assert as_tuples(main.rows()[seen:]) == \
            as_tuples(dict(zip(FIELDS, f)) for f in ref.advance(watermark))
        seen = len(main.rows())
    op.process_watermark(MAX_WATERMARK)
    assert as_tuples(main.rows()[seen:]) == as_tuples(dict(zip(FIELDS, f)) for f in ref.advance(MAX_WATERMARK))
    assert Counter(map(str, side.rows())) == Counter(map(str, late_expected)) and late_expected
    assert len({(r["key"], r["window_start"]) for r in main.rows()}) > 100   # many sessions
    # Everything fired and was cleaned up: no session state and no timers remain.
    assert list(op.keyed_backend.iter_entries(SESSIONS)) == []
    assert op.timer_service.num_event_time_timers() == 0


def test_a_late_row_within_the_allowed_lateness_refires_a_longer_session_at_once():
    op, main, side = sessions_operator(2_000)
    op.process(pa.RecordBatch.from_pylist([{"key": 1, "ts": 1_000, "value": 1, "x": None}], schema=SCHEMA))
    op.process_watermark(1_499)                  # [1 s, 1.5 s): max_timestamp 1 499 passed
    op.process(pa.RecordBatch.from_pylist([{"key": 1, "ts": 900, "value": 2, "x": None},    # [0.9 s, 1.5 s)
                                           {"key": 1, "ts": 5_000, "value": 4, "x": None}],  # a session of its own
                                          schema=SCHEMA))
    assert [(r["window_start"], r["window_end"], r["n"], r["total"]) for r in main.rows()] == \
        [(1_000, 1_500, 1, 1), (900, 1_500, 2, 3)]
    assert op.timer_service.num_event_time_timers() == 3   # 1.5 s: cleanup; 5.5 s: trigger + cleanup
    op.process(pa.RecordBatch.from_pylist([{"key": 1, "ts": 1_200, "value": 1, "x": None}], schema=SCHEMA))
    assert len(main.rows()) == 2                 # [0.9 s, 1.7 s) ends after the watermark: it waits
    op.process_watermark(3_699)                  # fired at 1 699, cleaned up at 1 699 + 2 000
    assert [(r["window_start"], r["window_end"], r["n"]) for r in main.rows()][2:] == [(900, 1_700, 3)]
    op.process(pa.RecordBatch.from_pylist([{"key": 1, "ts": 1_000, "value": 9, "x": None}], schema=SCHEMA))
    assert side.rows() == [{"key": 1, "ts": 1_000, "value": 9, "x": None}]
    op.process_watermark(MAX_WATERMARK)
    assert [(r["window_start"], r["n"]) for r in main.rows()][3:] == [(5_000, 1)]


@pytest.mark.parametrize("older_layout", [False, True])
def test_a_restore_at_another_parallelism_fires_each_open_session_once(tmp_path, monkeypatch, older_layout):
    """Sessions open at the snapshot (pending or fired and kept for the allowed lateness) move
    with their key groups; the restored operators fire them once, with the rows that follow.
    Also from state stored as msgpack lists (streamsnap before `partial_rows`)."""
    encode = partial_rows.encode
    if older_layout:
        monkeypatch.setattr(partial_rows, "encode", older_layout_encode)
    rows = random_rows(3, count=1_200, keys=12)
    batches = [rows[i:i + 200] for i in range(0, len(rows), 200)]
    reference, ref_main, ref_side = sessions_operator(600)
    op, main, side = sessions_operator(600)
    for i, batch in enumerate(batches):
        for o in (reference, op) if i < 3 else (reference,):
            o.process(pa.RecordBatch.from_pylist(batch, schema=SCHEMA))
            o.process_watermark(max(r["ts"] for b in batches[:i + 1] for r in b) - 1_000)
    reference.process_watermark(MAX_WATERMARK)
    timers = op.timer_service.num_event_time_timers()
    assert timers > 0
    state = op.snapshot_state(1, 0.0, str(tmp_path)).run()
    if older_layout:
        assert all(type(v) is list for _, _, v in op.keyed_backend.iter_entries(SESSIONS))
        monkeypatch.setattr(partial_rows, "encode", encode)
    monkeypatch.setattr(vectorized_windows, "RESTORE_CHUNK", 7)    # restored in several chunks
    restored = assign_operator_state({0: state}, 128, 2)
    out, late, restored_timers = list(main.rows()), list(side.rows()), 0
    for subtask in range(2):
        new, new_main, new_side = sessions_operator(600, subtask=subtask, parallelism=2,
                                                    restore=restored[subtask], base=str(tmp_path))
        restored_timers += new.timer_service.num_event_time_timers()
        new.process_watermark(max(r["ts"] for b in batches[:3] for r in b) - 1_000)   # not state: it rises again
        owned = new.keyed_backend.key_group_range
        for i, batch in enumerate(batches[3:], start=3):
            mine = [r for r in batch if assign_key_groups([r["key"]], 128)[0] in owned]
            new.process(pa.RecordBatch.from_pylist(mine, schema=SCHEMA))
            new.process_watermark(max(r["ts"] for b in batches[:i + 1] for r in b) - 1_000)
        new.process_watermark(MAX_WATERMARK)
        out += new_main.rows()
        late += new_side.rows()
    assert restored_timers == timers
    assert as_tuples(out) == as_tuples(ref_main.rows())
    assert Counter(map(str, late)) == Counter(map(str, ref_side.rows()))


def test_build_time_checks_of_session_aggregates():
    env = ss.StreamEnvironment()
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    source = ss.sources.Generator(lambda i: {"key": i % 2, "ts": i, "value": i, "name": "a"}, count=10)
    keyed = env.from_source(source, watermark_strategy=strategy).key_by("key")
    sessions = keyed.window(W.EventTimeSessionWindows.with_gap(1))
    with pytest.raises(ss.ConfigurationError, match="count_distinct is not vectorized on session windows"):
        sessions.aggregate_columns({"users": ("count_distinct", "value")})
    with pytest.raises(ss.ConfigurationError, match="on session windows min takes integer, float or boolean"):
        sessions.min("name")
    with pytest.raises(ss.ConfigurationError, match="'nope' is not in the stream's schema"):
        sessions.sum("nope")
    with pytest.raises(ss.ConfigurationError, match="ProcessingTimeSessionWindows is not vectorized"):
        keyed.window(W.ProcessingTimeSessionWindows.with_gap(1)).count()
    with pytest.raises(ss.ConfigurationError, match="default trigger"):
        sessions.trigger(W.CountTrigger.of(2)).count()
    assert sessions.side_output_late_data(ss.OutputTag("late")).count() \
        .get_side_output(ss.OutputTag("late")) is not None
