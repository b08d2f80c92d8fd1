"""The index of slices of sliding windows (time/slice_index.py), message by message against a
brute-force model of which windows end and which slices they hold."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsnap.time.slice_index import SliceIndex
from streamsnap.time.watermarks import MAX_WATERMARK, MIN_WATERMARK


def test_the_geometry_of_slices_and_windows():
    index = SliceIndex(10_000, 2_000, 500)
    assert index.slice == 2_000
    assert index.slice_start(2_499) == 500 and index.slice_start(2_500) == 2_500
    # The slice [2.5 s, 4.5 s) is in the windows starting at -5.5 s .. 2.5 s: ends 4.5 .. 12.5 s.
    assert index.first_end(2_500) == 4_500 and index.last_end(2_500) == 12_500
    assert SliceIndex(6_000, 4_000).slice == 2_000      # gcd: windows of 3 slices every 2 slices


def test_time_over_empty_stretches_jumps_to_the_next_slice():
    index = SliceIndex(4_000, 1_000)
    index.add(0, [("a", 0)], [1])
    index.add(1_000_000, [("b", 1_000_000)], [2])
    assert index.next_time() == 999
    due = index.due(MAX_WATERMARK)
    assert due.ends == [1_000, 2_000, 3_000, 4_000, 1_001_000, 1_002_000, 1_003_000, 1_004_000]
    assert due.windows[0] == [0] and due.windows[-1] == [1_000_000]
    assert due.clean == [0, 1_000_000]
    index.retire(due)
    assert len(index) == 0 and index.next_time() is None and index.progress == MAX_WATERMARK


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="positive"):
        SliceIndex(0, 1_000)


@settings(max_examples=200, deadline=None)
@given(size_slides=st.integers(1, 5), slide=st.sampled_from([1, 2, 5]), offset=st.integers(0, 4),
       steps=st.lists(st.tuples(st.lists(st.integers(-40, 120), max_size=4), st.integers(0, 25)),
                      min_size=1, max_size=12))
def test_due_windows_and_clean_slices_equal_a_brute_force_model(size_slides, slide, offset, steps):
    size = size_slides * slide
    offset %= slide
    index = SliceIndex(size, slide, offset)
    live: set[int] = set()         # the model: slice starts with state
    time = MIN_WATERMARK
    fired: set[int] = set()
    for times, advance in steps:
        for t in times:
            start = index.slice_start(t)
            if index.last_end(start) - 1 <= time:
                continue           # every window of it is done: a late row
            if start not in live:
                live.add(start)
                index.add(start, [("k", start)], [0])
        target = (max(live) if live else 0) + advance - 30 if advance < 25 else MAX_WATERMARK
        if target <= time:
            continue
        due = index.due(target)
        ends = [e for e in range(min(live, default=0) - size, max(live, default=0) + 2 * size + slide)
                if (e - size - offset) % slide == 0 and time < e - 1 <= target
                and any(e - size <= s < e for s in live)]
        assert due.ends == ends
        assert due.windows == [sorted(s for s in live if e - size <= s < e) for e in ends]
        assert not fired & set(ends)                  # no window fires twice
        fired |= set(ends)
        assert due.clean == sorted(s for s in live if index.last_end(s) - 1 <= target)
        live -= set(due.clean)
        index.retire(due)
        time = target
        assert len(index) == len(live)
        if live:
            assert index.next_time() > time
