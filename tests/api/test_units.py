"""Units at the API level: durations are seconds (int/float) or timedelta, event timestamps
epoch milliseconds — and a window assigner's constructor means what its builder means.

Each test would fail if a unit changed: a constructor read as milliseconds would make the
30-second gap 30 ms (nothing merges), one read as minutes would merge the 31-second pair.
"""

from datetime import timedelta

import pytest

import streamsnap as ss
from streamsnap.testing import harness

W = ss.windows
SECOND = 1_000      # event timestamps are epoch milliseconds


def add_values(a, b):
    return {"key": a["key"], "value": a["value"] + b["value"]}


def sessions(assigner, gaps_s):
    """The session sums of rows of value 1 at the given seconds apart, through the public API."""
    h = harness(add_values, key_by="key", window=assigner, timestamps="ts")
    t = 1_700_000_000_000
    h.process({"key": "k", "value": 1, "ts": t})
    for gap in gaps_s:
        t += gap * SECOND
        h.process({"key": "k", "value": 1, "ts": t})
    h.advance_watermark(t + 3600 * SECOND)
    return [row["value"] for row in h.output]


@pytest.mark.parametrize("build", [
    lambda: W.EventTimeSessionWindows(30),
    lambda: W.EventTimeSessionWindows.with_gap(30),
    lambda: W.EventTimeSessionWindows(timedelta(seconds=30)),
    lambda: W.EventTimeSessionWindows(30.0),
], ids=["constructor", "with_gap", "timedelta", "float"])
def test_a_30_second_session_gap_merges_29_s_apart_and_splits_31_s_apart(build):
    assert sessions(build(), [29]) == [2]
    assert sessions(build(), [31]) == [1, 1]
    assert sessions(build(), [29, 29, 31, 10]) == [3, 2]


@pytest.mark.parametrize("build", [
    lambda: W.TumblingEventTimeWindows(60), lambda: W.TumblingEventTimeWindows.of(60),
    lambda: W.TumblingEventTimeWindows(timedelta(minutes=1)),
])
def test_a_60_second_tumbling_window_spans_60_000_ms_of_event_time(build):
    h = harness(add_values, key_by="key", window=build(), timestamps="ts")
    for ts in (0, 59_999, 60_000):
        h.process({"key": "k", "value": 1, "ts": ts})
    h.advance_watermark(200_000)
    assert [r["value"] for r in h.output] == [2, 1]


def test_sliding_constructor_and_builder_agree_in_seconds():
    a, b = W.SlidingEventTimeWindows(60, 10), W.SlidingEventTimeWindows.of(60, 10)
    assert a == b and a.size == timedelta(seconds=60) and a.slide == timedelta(seconds=10)
    assert a.assign_windows(65 * SECOND)[0] == W.TimeWindow(60 * SECOND, 120 * SECOND)


def test_assigners_read_and_print_their_durations_in_seconds():
    assert W.EventTimeSessionWindows(30).gap == timedelta(seconds=30)
    assert repr(W.EventTimeSessionWindows(30)) == "EventTimeSessionWindows(gap=30)"
    assert repr(W.SlidingEventTimeWindows(0.5, 0.25)) == "SlidingEventTimeWindows(size=0.5, slide=0.25)"
    assert repr(W.TumblingEventTimeWindows(timedelta(days=1), timedelta(hours=-8))) == \
        "TumblingEventTimeWindows(size=86400, offset=-28800)"


def test_assigners_are_immutable_and_say_so():
    gap = W.EventTimeSessionWindows(30)
    with pytest.raises(AttributeError, match="immutable"):
        gap.gap_ms = 1


def test_a_duration_of_the_wrong_type_names_the_assigner_and_the_units():
    with pytest.raises(ss.ConfigurationError) as err:
        W.EventTimeSessionWindows("30s")
    message = str(err.value)
    assert "EventTimeSessionWindows" in message and "seconds" in message and "timedelta" in message
