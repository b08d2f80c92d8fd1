"""Watermarks where timestamps are assigned: per-split in sources, the assigner operator,
end of time — driven on a manual clock, the task's timer queue run by hand."""

from __future__ import annotations

import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.connectors.base import SourceOperator
from streamsnap.connectors.sources import Generator, GeneratorReader
from streamsnap.runtime.events import WatermarkStatus
from streamsnap.runtime.operators.base import OperatorContext
from streamsnap.runtime.operators.timestamps_and_watermarks import (
    TimestampsAndWatermarksOperator,
    batch_timestamps,
)
from streamsnap.time import MAX_WATERMARK, TimestampError
from streamsnap.time.timestamps import WindowEndTimestamps

STRATEGY = ss.WatermarkStrategy.for_bounded_out_of_orderness(2.0).with_timestamp_assigner("ts")


class Recorder:
    """The end of a chain: counts rows that arrive at or behind the watermark already sent."""

    def __init__(self):
        self.events, self.late, self.watermark = [], 0, -(2 ** 63)

    def emit(self, batch):
        rows = batch.to_pylist() if isinstance(batch, pa.RecordBatch) else batch
        self.late += sum(1 for r in rows if r["ts"] <= self.watermark)
        self.events.append(len(rows))

    def emit_watermark(self, timestamp):
        assert timestamp > self.watermark
        self.watermark = timestamp
        self.events.append(timestamp)

    def emit_watermark_status(self, status):
        self.events.append(status)


def context(clock, name="src"):
    return OperatorContext(name=name, uid=name, subtask_index=0, parallelism=1, max_parallelism=128,
                           attempt=0, job_id="job", task_name=f"{name} (1/1)", timers=clock, clock=clock)


def two_speed(i: int) -> dict:
    """Split 0 runs 40 ms of event time per row, split 1 only 10 ms."""
    split, position = i % 2, i // 2
    return {"ts": position * (40 if split == 0 else 10) + (i * 31) % 1000}


class SplitBlindReader(GeneratorReader):
    """A reader that does not report its splits: one generator over the interleaved splits."""

    def active_splits(self):
        return None

    def current_split(self):
        return None


class SplitBlindGenerator(Generator):
    def create_reader(self, ctx):
        return SplitBlindReader(self, ctx)


def run_source(source, strategy=STRATEGY, interval=0.05):
    clock = ManualScheduler()
    op = SourceOperator(context(clock), source, strategy, interval)
    op.output = Recorder()
    op.initialize_state()
    op.open()
    while op.emit_next():
        clock.advance(0.02)     # periodic emissions run between batches, as in the mailbox
    op.advance_to_end_of_time()
    return op.output


def test_the_slow_split_holds_the_source_watermark_back():
    kwargs = dict(count=2000, splits=2, batch_size=20)
    per_split = run_source(Generator(two_speed, **kwargs))
    assert per_split.late == 0
    assert sum(1 for e in per_split.events if isinstance(e, int) and not isinstance(e, bool)) > 2
    blind = run_source(SplitBlindGenerator(two_speed, **kwargs))
    assert blind.late > 500      # the fast split's progress made the slow split's rows late


def test_end_of_time_is_emitted_once_and_stops_periodic_emission():
    clock = ManualScheduler()
    op = SourceOperator(context(clock), Generator(two_speed, count=10, splits=1), STRATEGY, 0.05)
    op.output = out = Recorder()
    op.initialize_state()
    op.open()
    op.emit_next()
    op.advance_to_end_of_time()
    op.advance_to_end_of_time()
    clock.advance(1.0)
    watermarks = [e for e in out.events if isinstance(e, int) and e > 1000]
    assert watermarks == [MAX_WATERMARK] and out.events[-1] == MAX_WATERMARK


def test_without_a_strategy_only_the_end_of_time_is_emitted():
    out = run_source(Generator(two_speed, count=100, splits=2), strategy=None)
    assert [e for e in out.events if not isinstance(e, int) or e > 1000] == [MAX_WATERMARK]


def test_a_subtask_without_splits_is_idle_and_becomes_active_with_data():
    clock = ManualScheduler()
    op = SourceOperator(context(clock), Generator(two_speed, splits=1), STRATEGY, 0.05)   # unbounded
    op.output = out = Recorder()
    op.initialize_state()
    op.reader.assign_splits([])
    op.open()
    clock.advance(0.2)
    assert out.events == [WatermarkStatus.IDLE]
    op.reader.assign_splits([[0, 1, 0]])
    assert op.emit_next()
    clock.advance(0.06)
    # the batch, then at once ACTIVE (with its data the split joins the minimum), then watermarks
    assert out.events[1:3] == [1024, WatermarkStatus.ACTIVE] and out.events[-1] > 0


def test_the_assigner_operator_replaces_upstream_watermarks_but_passes_the_end_of_time():
    clock = ManualScheduler()
    op = TimestampsAndWatermarksOperator(context(clock, "assign"), STRATEGY, 0.05)
    op.output = out = Recorder()
    op.open()
    op.process([{"ts": 10_000}, {"ts": 9_000}])
    op.process_watermark(50_000)                      # upstream's: dropped
    op.process_watermark_status(WatermarkStatus.IDLE)  # upstream's: dropped
    clock.advance(0.05)
    assert out.events == [2, 10_000 - 2_000 - 1]
    op.process_watermark(MAX_WATERMARK)
    assert out.events[-1] == MAX_WATERMARK


def test_row_timestamps_are_vectorized_when_clean_and_name_the_row_when_not():
    rows = [{"ts": 5}, {"ts": 7}]
    assert batch_timestamps(rows, "ts", "op").tolist() == [5, 7]
    assert batch_timestamps(pa.RecordBatch.from_pylist(rows), "ts", "op").tolist() == [5, 7]
    assert batch_timestamps(rows, lambda r: r["ts"] * 2, "op").tolist() == [10, 14]
    with pytest.raises(TimestampError, match=r"operator 'op'.*'ts'.*\n  row: \{'ts': 7.5\}") as err:
        batch_timestamps([{"ts": 5}, {"ts": 7.5}], "ts", "op")
    assert err.value.batch_index == 1
    with pytest.raises(TimestampError, match=r"operator 'op'.*'ts' is missing\n  row: \{'x': 1\}"):
        batch_timestamps([{"ts": 5}, {"x": 1}], "ts", "op")


def test_window_result_rows_are_stamped_at_their_window_end_minus_one():
    results = [{"window_end": 2_000, "n": 1}, {"window_end": 4_000, "n": 2}]
    assert batch_timestamps(results, WindowEndTimestamps(2_000), "op").tolist() == [1_999, 3_999]
    assert batch_timestamps(pa.RecordBatch.from_pylist(results), WindowEndTimestamps(), "op").tolist() == [1_999, 3_999]
    with pytest.raises(TimestampError, match=r"no 'window_end' column.*\n  row: \{'n': 3\}"):
        batch_timestamps(results + [{"n": 3}], WindowEndTimestamps(), "op")


class FilterThenTimestamps:
    """A chained filter, maybe a map that makes new rows, and a timestamp check on what passes:
    its batch index is not the source's."""

    def __init__(self, new_rows: bool):
        self.new_rows = new_rows

    def emit(self, batch):
        kept = [dict(r) if self.new_rows else r for r in batch if r["i"] % 4 == 3]
        batch_timestamps(kept, "ts", "stamp")

    def emit_watermark(self, timestamp):
        pass

    def emit_watermark_status(self, status):
        pass


def without_ts_at(bad: int):
    return lambda i: {"i": i, "ts": None if i == bad else i}


EXACT = "source position: split 1 of 2, offset 21 (index 43 of the Generator)"


@pytest.mark.parametrize("chained, position", [
    (None, EXACT),                         # the source's own check knows the row's index
    ("filter", EXACT),                     # a chained filter passed the source's row itself on
    ("map", "source position: in the source batch from split 1 of 2, offset 20 (index 41 of the Generator) "
            "to split 1 of 2, offset 29 (index 59 of the Generator)"),   # a new row: the batch's range
])
def test_a_bad_timestamp_names_its_source_position_never_an_index_in_a_batch(chained, position):
    clock = ManualScheduler()
    source = Generator(without_ts_at(43), count=100, splits=2, batch_size=10)
    op = SourceOperator(context(clock), source, None if chained else STRATEGY, 0.05)
    op.output = FilterThenTimestamps(new_rows=chained == "map") if chained else Recorder()
    op.initialize_state()
    op.open()
    with pytest.raises(TimestampError) as info:
        while op.emit_next():
            pass
    message = str(info.value)
    assert position in message and "row: {'i': 43, 'ts': None}" in message
    assert "subtask: src (1/1)" in message
