"""Windows on real Spark: event-time tumbling and session windows against plain-Python
references (per row and vectorized), allowed lateness and late data to a side output,
processing-time windows, exactly-once after a SIGKILL of the window task, and a savepoint
restored at another parallelism."""

from __future__ import annotations

import os
import signal
from collections import defaultdict

import pytest

import streamsnap as ss
from streamsnap.time.watermarks import MAX_WATERMARK
from tests.integration.support import HeldGenerator, both_backends, release, wait_completed, wait_held, wait_status
from tests.integration.test_event_time import read_parquet_rows

pytestmark = pytest.mark.spark

W = ss.windows
SIZE = 10_000            # ms: tumbling window size
KEYS = 5
SPLITS = 4               # splits 0, 1 are fast in event time, 2, 3 slow
LATE = ss.OutputTag("late")


def event(i: int) -> dict:
    split, position = i % SPLITS, i // SPLITS
    step = 400 if split < 2 else 200      # ms of event time per row: ~20 windows per run
    jitter = (i * 7919) % 1_500           # out of order within the 2 s bound
    return {"key": i % KEYS, "value": i, "ts": position * step + jitter}


def reference_windows(rows) -> dict:
    sums = defaultdict(lambda: [0, 0])
    for e in rows:
        window = sums[(e["key"], e["ts"] // SIZE * SIZE)]
        window[0] += 1
        window[1] += e["value"]
    return {k: tuple(v) for k, v in sums.items()}


class CountSum(ss.AggregateFunction):
    def create_accumulator(self):
        return [0, 0]

    def add(self, row, acc):
        return [acc[0] + 1, acc[1] + row["value"]]

    def get_result(self, acc):
        return acc

    def merge(self, a, b):
        return [a[0] + b[0], a[1] + b[1]]


class WithWindow(ss.ProcessWindowFunction):
    def process(self, key, context, elements):
        count, total = elements[0]
        yield {"key": key, "start": context.window.start, "end": context.window.end,
               "count": count, "sum": total, "watermark": context.current_watermark()}


def tumbling_pipeline(env, n, rate, *, sink=None, vectorized=False, gate=None, hold_at=None):
    """With a `gate`, the source's splits hold before their row `hold_at` (default: half-way)
    until released (HeldGenerator)."""
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(2.0).with_timestamp_assigner("ts")
    source = (ss.sources.Generator(event, count=n, rate=rate, splits=SPLITS, batch_size=40) if gate is None else
              HeldGenerator(event, count=n, rate=rate, splits=SPLITS, batch_size=40, gate=gate,
                            hold_at=hold_at or n // SPLITS // 2))
    keyed = (env.from_source(source, name="events", uid="events", watermark_strategy=strategy)
             .key_by("key"))
    windows = (keyed.window(W.TumblingEventTimeWindows.of(SIZE / 1000))
               .side_output_late_data(LATE)
               .aggregate(CountSum(), WithWindow(), name="windows", uid="windows"))
    windows.sink_to(sink or ss.sinks.Collect(), name="out", uid="out")
    if vectorized:
        (keyed.window(W.TumblingEventTimeWindows.of(SIZE / 1000))
            .aggregate_columns({"count": "count", "sum": ("sum", "value")}, name="columns")
            .sink_to(ss.sinks.Collect(), name="vectorized"))
    return windows


def assert_exact_windows(rows, n):
    fired = [(r["key"], r["start"]) for r in rows]
    assert len(fired) == len(set(fired)), "a window fired twice"
    assert all(r["end"] - r["start"] == SIZE for r in rows)
    assert {(r["key"], r["start"]): (r["count"], r["sum"]) for r in rows} == \
        reference_windows(event(i) for i in range(n))


def test_out_of_order_tumbling_windows_equal_a_reference_per_row_and_vectorized(spark):
    n = 4000
    env = ss.StreamEnvironment(parallelism=2, spark=spark, auto_watermark_interval=0.05)
    windows = tumbling_pipeline(env, n, rate=2500, vectorized=True)
    windows.get_side_output(LATE).sink_to(ss.sinks.Collect(), name="late")
    result = env.execute("tumbling windows")
    rows = result.rows("out")
    assert_exact_windows(rows, n)
    # The vectorized path (Arrow batches, aggregate_columns) computes the same windows.
    columns = result.rows("vectorized")
    assert sorted((r["key"], r["window_start"], r["window_end"], r["count"], r["sum"])
                  for r in columns) == \
        sorted((r["key"], r["start"], r["end"], r["count"], r["sum"]) for r in rows)
    # Windows fired on watermarks while the input ran, the tail at the end of input; the
    # disorder stays within the bound, so nothing was late.
    assert sum(1 for r in rows if r["watermark"] < MAX_WATERMARK) >= KEYS
    assert any(r["watermark"] == MAX_WATERMARK for r in rows)
    assert result.rows("late") == []


class EveryBatch(ss.WatermarkGenerator):
    """Bounded out-of-orderness emitted after every batch: with one source subtask and one
    split, a row's lateness then depends on the data alone, not on timing."""

    def __init__(self):
        self.max_ts = None

    def on_event(self, timestamp, output):
        self.max_ts = timestamp if self.max_ts is None else max(self.max_ts, timestamp)

    def on_batch(self, timestamps, output):
        super().on_batch(timestamps, output)
        output.emit_watermark(self.max_ts - 2_001)

    def on_periodic_emit(self, output):
        """Everything is emitted per batch."""


def lateness_event(i: int) -> dict:
    nominal = i * 100 + (i * 7919) % 1_500
    if i >= 1_000 and i % 97 == 0:
        ts = 1_234                      # the first window was cleaned up ~85 s earlier
    elif i % 13 == 0:
        ts = i * 100 - 5_000            # behind the watermark, within the allowed lateness
    else:
        ts = nominal
    return {"key": i % 3, "value": i, "ts": ts}


def test_allowed_lateness_refires_and_later_rows_go_to_the_side_output(spark):
    n = 1_500
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    strategy = ss.WatermarkStrategy.for_generator(EveryBatch).with_timestamp_assigner("ts")
    source = ss.sources.Generator(lateness_event, count=n, splits=1, batch_size=20)
    windows = (env.from_source(source, name="events", watermark_strategy=strategy, parallelism=1)
               .key_by("key").window(W.TumblingEventTimeWindows.of(SIZE / 1000))
               .allowed_lateness(5).side_output_late_data(LATE)
               .aggregate(CountSum(), WithWindow(), name="windows"))
    windows.sink_to(ss.sinks.Collect(), name="out")
    windows.get_side_output(LATE).sink_to(ss.sinks.Collect(), name="late")
    result = env.execute("allowed lateness")
    too_late = [i for i in range(n) if i >= 1_000 and i % 97 == 0]
    assert sorted(r["value"] for r in result.rows("late")) == too_late
    final, firings = {}, defaultdict(int)
    for r in result.rows("out"):
        window = (r["key"], r["start"])
        firings[window] += 1
        final[window] = max(final.get(window, (0, 0)), (r["count"], r["sum"]))
    # Rows behind the watermark but within the lateness re-fired their windows, and every
    # window's last firing holds all of its rows.
    assert sum(1 for c in firings.values() if c > 1) >= 10
    assert final == reference_windows(lateness_event(i) for i in range(n) if i not in too_late)


def session_events() -> list[dict]:
    """Per key, bursts of events 2 s apart (sessions with a 3 s gap), bursts 10 s apart.

    Every second event of a burst arrives 2.5 s late, after its successor: the windows of its
    neighbours, 4 s apart, are separate sessions until it arrives and bridges them. The
    disorder (2.5 s) stays within the watermark's bound, so nothing is late.
    """
    rows, arrival = [], []
    for key in range(3):
        t = key * 700
        for burst in range(6):
            for position in range(2 + (key + burst) % 4):
                rows.append({"key": key, "ts": t, "value": len(rows)})
                arrival.append(t + 2_500 * (position % 2))
                t += 2_000
            t += 10_000
    return [row for _, row in sorted(zip(arrival, rows), key=lambda pair: pair[0])]


def reference_sessions(rows: list[dict], gap: int) -> set:
    sessions = set()
    by_key = defaultdict(list)
    for r in rows:
        by_key[r["key"]].append(r)
    for key, events in by_key.items():
        events.sort(key=lambda r: r["ts"])
        current = [events[0]]
        for e in events[1:]:
            if e["ts"] < current[-1]["ts"] + gap:
                current.append(e)
            else:
                sessions.add((key, current[0]["ts"], current[-1]["ts"] + gap,
                              tuple(sorted(x["value"] for x in current))))
                current = [e]
        sessions.add((key, current[0]["ts"], current[-1]["ts"] + gap,
                      tuple(sorted(x["value"] for x in current))))
    return sessions


class SessionRows(ss.ProcessWindowFunction):
    def process(self, key, context, elements):
        yield {"key": key, "start": context.window.start, "end": context.window.end,
               "values": sorted(e["value"] for e in elements)}


def test_session_windows_merge_across_out_of_order_arrivals(spark):
    rows = session_events()
    arrival = [r["ts"] for r in rows]
    assert any(b < a for a, b in zip(arrival, arrival[1:]))   # really out of order
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(3.0).with_timestamp_assigner("ts")
    (env.from_collection(rows).assign_timestamps_and_watermarks(strategy)
        .key_by("key").window(W.EventTimeSessionWindows.with_gap(3))
        .process(SessionRows(), name="sessions").sink_to(ss.sinks.Collect()))
    got = {(r["key"], r["start"], r["end"], tuple(r["values"])) for r in env.execute("sessions").rows()}
    expected = reference_sessions(rows, 3_000)
    assert got == expected
    assert len(expected) == 18 and all(len(s[3]) >= 2 for s in expected)


class Fired(ss.ProcessWindowFunction):
    def process(self, key, context, elements):
        yield {"key": key, "start": context.window.start, "end": context.window.end,
               "count": len(elements), "fired_at": context.current_processing_time()}


def test_processing_time_windows_fire_on_the_clock(spark, tmp_path):
    """The source holds its first row until every subtask runs: rows sent while a slow window
    subtask still starts would wait in its input and all land in one window at once."""
    n = 450
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    source = HeldGenerator(lambda i: {"key": i % 3, "value": i}, gate=tmp_path / "gate", hold_at=0, count=n,
                           rate=150, batch_size=10)
    (env.from_source(source, name="slow")
        .key_by("key").window(W.TumblingProcessingTimeWindows.of(0.5))
        .process(Fired(), name="windows").sink_to(ss.sinks.Collect()))
    client = env.execute_async("processing-time windows")
    wait_status(client, "RUNNING")
    wait_held(tmp_path / "gate", 2, client)
    release(tmp_path / "gate")   # at most 1 s of rows at once (the rate's burst), then 150/s
    rows = client.wait(120).rows()
    fired = [(r["key"], r["start"]) for r in rows]
    assert len(fired) == len(set(fired))
    assert len({r["start"] for r in rows}) >= 3           # ~2 s of paced input, 0.5 s windows
    for r in rows:
        assert r["end"] - r["start"] == 500 and r["start"] % 500 == 0
        assert r["end"] - 1 <= r["fired_at"] < r["end"] + 2_000      # never early
    # Windows still open when the input ended do not fire (processing time stops there).
    assert n // 2 <= sum(r["count"] for r in rows) <= n


def test_windows_survive_a_sigkill_failover_exactly_once(spark, tmp_path):
    n = 4000
    out = tmp_path / "out"
    env = ss.StreamEnvironment(
        parallelism=2, spark=spark, auto_watermark_interval=0.05,
        checkpointing=ss.CheckpointConfig(interval=0.3, mode="exactly_once",
                                          directory=str(tmp_path / "ckpt")),
        restart=ss.RestartStrategy.fixed_delay(attempts=2, delay=0.1))
    # The splits hold at 80% of the input until the kill: on a slow machine it cannot end first.
    tumbling_pipeline(env, n, rate=1000, sink=ss.sinks.FileSink(str(out), format="parquet"), gate=tmp_path / "gate",
                      hold_at=n // SPLITS * 4 // 5)
    client = env.execute_async("windows with a kill")
    wait_status(client, "RUNNING")
    wait_completed(client, 2)
    victim = next(s for s in client.subtasks() if s.vertex.startswith("windows"))
    os.kill(victim.pid, signal.SIGKILL)
    release(tmp_path / "gate")
    result = client.wait(120)
    assert result.restarts == 1
    rows = read_parquet_rows(out)
    assert any(r["watermark"] < MAX_WATERMARK for r in rows)   # some fired before the kill
    assert_exact_windows(rows, n)


@both_backends
def test_a_savepoint_restored_at_another_parallelism_keeps_pending_windows(spark, tmp_path, state_backend):
    n = 6000
    config = ss.CheckpointConfig(interval=None, directory=str(tmp_path / "ckpt"))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, state_backend=state_backend,
                               auto_watermark_interval=0.05)
    tumbling_pipeline(env, n, rate=1500, gate=tmp_path / "gate")
    client = env.execute_async("windows, first part")
    wait_held(tmp_path / "gate", SPLITS, client)   # half the input: the earliest windows fired, most are open
    savepoint = client.stop_with_savepoint(str(tmp_path / "savepoints"))   # no drain
    first = client.wait(10).rows("out")
    assert 0 < len(first) < len(reference_windows(event(i) for i in range(n)))

    env2 = ss.StreamEnvironment(parallelism=3, spark=spark, checkpointing=config, state_backend=state_backend,
                                auto_watermark_interval=0.05)
    tumbling_pipeline(env2, n, rate=None)
    second = env2.execute("windows at parallelism 3", restore_from=savepoint).rows("out")
    # Windows half-filled before the savepoint fire after the restore with all their rows:
    # contents and timers moved to the three new subtasks with their key groups.
    assert_exact_windows(first + second, n)


def test_a_draining_stop_fires_every_window_into_the_savepoint(spark, tmp_path):
    n = 6000
    out = tmp_path / "out"
    config = ss.CheckpointConfig(interval=None, directory=str(tmp_path / "ckpt"))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               auto_watermark_interval=0.05)
    tumbling_pipeline(env, n, rate=1500, sink=ss.sinks.FileSink(str(out), format="parquet"), gate=tmp_path / "gate")
    client = env.execute_async("windows, drained")
    wait_held(tmp_path / "gate", SPLITS, client)
    savepoint = client.stop_with_savepoint(str(tmp_path / "savepoints"), drain=True)
    first = read_parquet_rows(out)          # committed by the savepoint (two-phase commit)
    assert any(r["watermark"] == MAX_WATERMARK for r in first), "the drain fired no window"

    env2 = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                                auto_watermark_interval=0.05)
    tumbling_pipeline(env2, n, rate=None, sink=ss.sinks.FileSink(str(out), format="parquet"))
    env2.execute("windows after the drain", restore_from=savepoint)
    rows = read_parquet_rows(out)
    # Every row counted once: a window the drain cut in two fired in both runs, with parts
    # that add up; no window fired twice within a run.
    totals = defaultdict(lambda: [0, 0])
    for r in rows:
        totals[(r["key"], r["start"])][0] += r["count"]
        totals[(r["key"], r["start"])][1] += r["sum"]
    assert {k: tuple(v) for k, v in totals.items()} == \
        reference_windows(event(i) for i in range(n))
    assert len({(r["key"], r["start"]) for r in first}) == len(first)
