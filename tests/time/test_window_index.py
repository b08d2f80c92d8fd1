"""The index of aligned windows' implied timers (sans-I/O)."""

from __future__ import annotations

from streamsnap.time.watermarks import MAX_WATERMARK
from streamsnap.time.window_index import AlignedWindowIndex


def test_windows_are_due_at_their_end_and_keys_come_in_registration_order():
    index = AlignedWindowIndex(size=1_000, allowed_lateness=0)
    index.add(0, ["b", "a"], [2, 1])
    index.add(1_000, ["a"], [1])
    index.add(0, ["c"], [3])
    index.mark_pending([0, 1_000])
    assert len(index) == 4 and index.num_pending() == 4
    assert index.next_time() == 999
    assert not index.due(998)
    due = index.due(999)
    assert (due.fire, due.clean) == ([0], [0])
    assert (due.keys, due.key_groups, due.starts) == (["b", "a", "c"], [2, 1, 3], [0, 0, 0])
    index.retire(due)
    assert len(index) == 1 and index.next_time() == 1_999
    due = index.due(MAX_WATERMARK)
    assert (due.fire, due.clean, due.keys, due.starts) == ([1_000], [1_000], ["a"], [1_000])
    index.retire(due)
    assert len(index) == 0 and index.next_time() is None and not index.due(MAX_WATERMARK)


def test_with_lateness_a_window_fires_at_its_end_and_is_cleaned_up_later():
    index = AlignedWindowIndex(size=10, allowed_lateness=5)
    index.add(0, ["k"], [0])
    index.mark_pending([0])
    first = index.due(9)
    assert (first.fire, first.clean, first.keys) == ([0], [], ["k"])
    index.retire(first)
    assert index.num_pending() == 0 and len(index) == 1
    assert not index.due(13) and index.next_time() == 14
    index.add(0, ["late"], [1])          # a window created within the lateness: no trigger timer
    second = index.due(14)
    assert (second.fire, second.clean, second.keys) == ([], [0], ["k", "late"])
    index.retire(second)
    assert len(index) == 0


def test_cleanup_saturates_at_the_end_of_time():
    index = AlignedWindowIndex(size=10, allowed_lateness=MAX_WATERMARK)
    index.add(0, ["k"], [0])
    assert index.cleanup_time(0) == MAX_WATERMARK
    assert index.due(MAX_WATERMARK - 1).clean == []
    assert index.due(MAX_WATERMARK).clean == [0]


def test_every_due_start_lists_its_registrations_in_time_order():
    index = AlignedWindowIndex(size=10, allowed_lateness=0)
    index.add(5, ["j", "k"], [7, 4])
    index.add(0, ["k"], [4])
    index.add(20, ["x"], [1])
    index.mark_pending([0, 5, 20])
    due = index.due(100)
    assert due.fire == [0, 5, 20] and due.clean == [0, 5, 20]
    assert list(zip(due.keys, due.key_groups, due.starts)) == [
        ("k", 4, 0), ("j", 7, 5), ("k", 4, 5), ("x", 1, 20)]
    assert index.due(13).keys == ["k"] and index.due(14).keys == ["k", "j", "k"]
