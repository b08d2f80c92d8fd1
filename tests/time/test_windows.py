from datetime import timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.properties import examples

from streamsnap.errors import ConfigurationError
from streamsnap.time import (GLOBAL_WINDOW, MAX_WATERMARK, EventTimeSessionWindows,
                             EventTimeTrigger, GlobalWindows, NeverTrigger,
                             ProcessingTimeSessionWindows, ProcessingTimeTrigger,
                             SlidingEventTimeWindows, SlidingProcessingTimeWindows, TimestampError,
                             TimeWindow, TumblingEventTimeWindows, TumblingProcessingTimeWindows,
                             merge_time_windows, window_start)


def test_time_window_basics():
    w = TimeWindow(0, 10)
    assert w.max_timestamp == 9
    assert w.intersects(TimeWindow(10, 20)) and w.intersects(TimeWindow(5, 6))
    assert not w.intersects(TimeWindow(11, 20))
    assert w.cover(TimeWindow(15, 30)) == TimeWindow(0, 30)
    assert sorted([TimeWindow(5, 6), TimeWindow(0, 10)]) == [TimeWindow(0, 10), TimeWindow(5, 6)]
    assert GLOBAL_WINDOW.max_timestamp == MAX_WATERMARK


@pytest.mark.parametrize("ts, offset, size, start", [
    (0, 0, 10, 0), (9, 0, 10, 0), (10, 0, 10, 10), (-1, 0, 10, -10), (-10, 0, 10, -10),
    (-11, 0, 10, -20), (7, 3, 10, 3), (2, 3, 10, -7), (2, -3, 10, -3), (-4, -3, 10, -13),
])
def test_window_start_with_offset_and_negative_timestamps(ts, offset, size, start):
    assert window_start(ts, offset, size) == start
    assert start <= ts < start + size and (start - offset) % size == 0


def test_tumbling_assigners():
    event = TumblingEventTimeWindows.of(10)
    assert event.size == timedelta(seconds=10) and event.size_ms == 10_000 and event.is_event_time and not event.is_merging
    assert event.assign_windows(12_345) == [TimeWindow(10_000, 20_000)]
    assert event.assign_windows(-1) == [TimeWindow(-10_000, 0)]
    assert isinstance(event.default_trigger(), EventTimeTrigger)
    hourly = TumblingEventTimeWindows.of(timedelta(hours=1), offset=timedelta(minutes=15))
    assert hourly.assign_windows(0) == [TimeWindow(-45 * 60_000, 15 * 60_000)]
    processing = TumblingProcessingTimeWindows.of(1)
    assert not processing.is_event_time
    assert processing.assign_windows(None, processing_time=2500) == [TimeWindow(2000, 3000)]
    assert isinstance(processing.default_trigger(), ProcessingTimeTrigger)


def test_sliding_assigners():
    sliding = SlidingEventTimeWindows.of(10, 5)
    assert sliding.assign_windows(12_000) == [TimeWindow(10_000, 20_000),
                                              TimeWindow(5_000, 15_000)]
    uneven = SlidingEventTimeWindows.of(0.010, 0.004)      # 10 ms every 4 ms
    assert uneven.assign_windows(9) == [TimeWindow(8, 18), TimeWindow(4, 14), TimeWindow(0, 10)]
    assert uneven.assign_windows(10) == [TimeWindow(8, 18), TimeWindow(4, 14)]
    processing = SlidingProcessingTimeWindows.of(2, 1)
    assert processing.assign_windows(5, processing_time=1500) == [
        TimeWindow(1000, 3000), TimeWindow(0, 2000)]


def test_session_and_global_assigners():
    sessions = EventTimeSessionWindows.with_gap(timedelta(seconds=3))
    assert sessions.is_merging and sessions.gap == timedelta(seconds=3) and sessions.gap_ms == 3000
    assert sessions.assign_windows(100) == [TimeWindow(100, 3100)]
    assert ProcessingTimeSessionWindows.with_gap(1).assign_windows(None, 7) == [TimeWindow(7, 1007)]
    everything = GlobalWindows.create()
    assert everything.assign_windows(5) == [GLOBAL_WINDOW] and not everything.is_event_time
    assert isinstance(everything.default_trigger(), NeverTrigger)
    assert everything == GlobalWindows.create()


def test_event_time_assigner_without_timestamp():
    with pytest.raises(TimestampError, match="without an event timestamp.*with_timestamp_assigner"):
        TumblingEventTimeWindows.of(1).assign_windows(None)


@pytest.mark.parametrize("build, names", [
    (lambda: TumblingEventTimeWindows.of(0), "size"),
    (lambda: TumblingEventTimeWindows.of(-5), "size"),
    (lambda: TumblingProcessingTimeWindows.of("10s"), "size"),
    (lambda: TumblingEventTimeWindows.of(10, offset=10), "offset"),
    (lambda: TumblingEventTimeWindows.of(10, offset=-11), "offset"),
    (lambda: SlidingEventTimeWindows.of(10, 0), "slide"),
    (lambda: SlidingEventTimeWindows.of(0, 5), "size"),
    (lambda: SlidingProcessingTimeWindows.of(10, 5, offset=5), "offset"),
    (lambda: EventTimeSessionWindows.with_gap(0), "gap"),
    (lambda: EventTimeSessionWindows.with_gap(timedelta(0)), "gap"),
    (lambda: ProcessingTimeSessionWindows.with_gap(-1), "gap"),
    (lambda: TumblingEventTimeWindows("10"), "size"),
    (lambda: EventTimeSessionWindows(0), "gap"),
])
def test_bad_assigner_arguments_fail_at_build(build, names):
    with pytest.raises(ConfigurationError) as err:
        build()
    assert names in str(err.value)


def test_bad_argument_messages_say_what_to_do():
    with pytest.raises(ConfigurationError) as err:
        TumblingEventTimeWindows.of(10, offset=12)
    assert "-size < offset < size" in str(err.value) and "offset=12000 ms" in str(err.value)
    with pytest.raises(ConfigurationError) as err:
        EventTimeSessionWindows.with_gap(0)
    assert "at least 1 ms" in str(err.value) and "with_gap(30)" in str(err.value)


times = st.lists(st.integers(-10 ** 6, 10 ** 6), max_size=40)


@settings(max_examples=examples(150), deadline=None)
@given(times, st.integers(1, 1000), st.integers(1, 1000), st.data())
def test_vectorized_assignment_matches_per_row(ts, size_ms, slide_ms, data):
    offset = data.draw(st.integers(-slide_ms + 1, slide_ms - 1))
    column = np.array(ts, dtype=np.int64)
    ms = lambda n: timedelta(milliseconds=n)  # noqa: E731
    for assigner in (TumblingEventTimeWindows(ms(size_ms), ms(offset % size_ms)),
                     SlidingEventTimeWindows(ms(size_ms), ms(slide_ms), ms(offset))):
        rows, starts = assigner.assign_window_starts(column)
        expected = [(i, w.start) for i, t in enumerate(ts) for w in assigner.assign_windows(t)]
        assert list(zip(rows.tolist(), starts.tolist())) == expected
        for i, s in zip(rows.tolist(), starts.tolist()):
            assert s <= ts[i] < s + assigner.size_ms


def test_merge_time_windows_reports_only_real_merges():
    calls = []
    merge_time_windows([TimeWindow(20, 30), TimeWindow(0, 10), TimeWindow(5, 12),
                        TimeWindow(40, 50), TimeWindow(12, 15), TimeWindow(40, 50)],
                       lambda merged, result: calls.append((merged, result)))
    assert calls == [([TimeWindow(0, 10), TimeWindow(5, 12), TimeWindow(12, 15)],
                      TimeWindow(0, 15))]
