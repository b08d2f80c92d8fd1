from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.properties import examples

from streamsnap.time import (EventTimeSessionWindows, MergingWindowSet, TimeWindow,
                             TumblingEventTimeWindows)

GAP = 10
SESSIONS = EventTimeSessionWindows(timedelta(milliseconds=GAP))


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, result, merged, state_window, merged_state_windows):
        self.calls.append((result, merged, state_window, merged_state_windows))


def add(windows, ts, merge=None):
    return windows.add_window(TimeWindow(ts, ts + GAP), merge or Recorder())


def test_new_window_without_merge_is_its_own_state_window():
    windows, merges = MergingWindowSet(SESSIONS), Recorder()
    assert add(windows, 0, merges) == TimeWindow(0, 10)
    assert add(windows, 30, merges) == TimeWindow(30, 40)
    assert merges.calls == []
    assert windows.state_window(TimeWindow(30, 40)) == TimeWindow(30, 40)


def test_extending_a_window_keeps_its_state_window():
    windows, merges = MergingWindowSet(SESSIONS), Recorder()
    add(windows, 0, merges)
    assert add(windows, 5, merges) == TimeWindow(0, 15)
    assert merges.calls == [(TimeWindow(0, 15), [TimeWindow(0, 10)], TimeWindow(0, 10), [])]
    assert windows.to_pairs() == [(TimeWindow(0, 15), TimeWindow(0, 10))]


def test_element_inside_a_window_merges_nothing():
    windows, merges = MergingWindowSet(SESSIONS), Recorder()
    add(windows, 0, merges)
    add(windows, 5, merges)
    merges.calls.clear()
    assert windows.add_window(TimeWindow(2, 12), merges) == TimeWindow(0, 15)
    assert windows.add_window(TimeWindow(0, 15), merges) == TimeWindow(0, 15)
    assert merges.calls == []
    assert windows.to_pairs() == [(TimeWindow(0, 15), TimeWindow(0, 10))]


def test_out_of_order_element_bridges_two_sessions():
    windows, merges = MergingWindowSet(SESSIONS), Recorder()
    add(windows, 1, merges)
    add(windows, 20, merges)
    assert add(windows, 10, merges) == TimeWindow(1, 30)   # [10, 20) touches both
    (result, merged, state_window, folded), = merges.calls
    assert result == TimeWindow(1, 30)
    assert merged == [TimeWindow(1, 11), TimeWindow(20, 30)]
    assert state_window == TimeWindow(1, 11) and folded == [TimeWindow(20, 30)]
    assert windows.to_pairs() == [(TimeWindow(1, 30), TimeWindow(1, 11))]


def test_persisted_pairs_restore_and_retire():
    windows = MergingWindowSet(SESSIONS)
    add(windows, 0)
    add(windows, 5)
    restored = MergingWindowSet(SESSIONS, windows.to_pairs())
    assert restored.windows == [TimeWindow(0, 15)]
    assert add(restored, 12) == TimeWindow(0, 22)
    assert restored.state_window(TimeWindow(0, 22)) == TimeWindow(0, 10)
    restored.retire_window(TimeWindow(0, 22))
    assert restored.windows == []
    with pytest.raises(KeyError, match="not in flight"):
        restored.retire_window(TimeWindow(0, 22))


def test_needs_a_merging_assigner():
    with pytest.raises(TypeError, match="merging window assigner"):
        MergingWindowSet(TumblingEventTimeWindows.of(1))


def reference_sessions(timestamps, gap):
    """Sort, then merge windows [t, t + gap) that overlap or touch."""
    sessions = []
    for t in sorted(timestamps):
        if sessions and t <= sessions[-1][1]:
            sessions[-1] = (sessions[-1][0], max(sessions[-1][1], t + gap),
                            sessions[-1][2] + [t])
        else:
            sessions.append((t, t + gap, [t]))
    return {TimeWindow(s, e): sorted(members) for s, e, members in sessions}


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.integers(-100, 300), min_size=1, max_size=40), st.integers(1, 30),
       st.randoms(use_true_random=False))
def test_any_arrival_order_gives_the_sorted_sessions(timestamps, gap, rng):
    """Contents live under state windows and move only through the merge function; the end
    result must be the sessions of a plain sort-and-merge, whatever the arrival order."""
    order = list(timestamps)
    rng.shuffle(order)
    windows = MergingWindowSet(EventTimeSessionWindows(timedelta(milliseconds=gap)))
    contents: dict[TimeWindow, list[int]] = {}

    def merge(result, merged, state_window, merged_state_windows):
        assert windows.state_window(result) == state_window
        assert state_window not in merged_state_windows
        for gone in merged_state_windows:
            contents[state_window] += contents.pop(gone)

    for t in order:
        window = windows.add_window(TimeWindow(t, t + gap), merge)
        assert window.start <= t < window.end
        contents.setdefault(windows.state_window(window), []).append(t)

    expected = reference_sessions(timestamps, gap)
    assert sorted(windows.windows) == sorted(expected)
    assert {w: sorted(contents[windows.state_window(w)]) for w in windows.windows} == expected
    assert set(contents) == {windows.state_window(w) for w in windows.windows}
