import pytest

from streamsnap.time import (MIN_WATERMARK, CombinedWatermark, StatusWatermarkValve, Watermark,
                             WatermarkStatus)

IDLE, ACTIVE = WatermarkStatus.IDLE, WatermarkStatus.ACTIVE
W = Watermark


def test_single_channel_forwards_increasing_watermarks_only():
    valve = StatusWatermarkValve(1)
    assert valve.input_watermark(0, 5) == [W(5)]
    assert valve.input_watermark(0, 5) == []
    assert valve.input_watermark(0, 3) == []
    assert valve.input_watermark(0, 9) == [W(9)]


def test_minimum_over_channels():
    valve = StatusWatermarkValve(3)
    assert valve.input_watermark(0, 10) == []
    assert valve.input_watermark(1, 20) == []
    assert valve.input_watermark(2, 15) == [W(10)]
    assert valve.input_watermark(1, 30) == []              # not the minimum: no change
    assert valve.input_watermark(0, 40) == [W(15)]
    assert valve.input_watermark(2, 50) == [W(30)]
    assert valve.watermark == 30 and valve.channel_watermark(2) == 50


def test_idle_channel_is_excluded_and_rejoins_once_caught_up():
    valve = StatusWatermarkValve(2)
    valve.input_watermark(0, 10)
    assert valve.input_watermark(1, 5) == [W(5)]
    assert valve.input_watermark_status(1, IDLE) == [W(10)]
    assert valve.input_watermark(1, 7) == []               # idle: ignored
    assert valve.channel_watermark(1) == 5
    assert valve.input_watermark(0, 20) == [W(20)]
    assert valve.input_watermark_status(1, ACTIVE) == []   # at 5, behind 20: not aligned
    assert valve.input_watermark(0, 30) == [W(30)]         # channel 1 cannot hold it back
    assert valve.input_watermark(1, 25) == []              # still behind
    assert valve.input_watermark(1, 35) == []              # caught up: aligned, min is 30
    assert valve.input_watermark(0, 50) == [W(35)]         # now it holds the valve back


def test_all_idle_flushes_max_and_goes_idle():
    valve = StatusWatermarkValve(2)
    valve.input_watermark(0, 5)
    valve.input_watermark(1, 10)
    assert valve.watermark == 5
    assert valve.input_watermark_status(1, IDLE) == []     # 1 was not the minimum
    assert valve.input_watermark_status(0, IDLE) == [W(10), IDLE]
    assert valve.status is IDLE
    assert valve.input_watermark_status(0, IDLE) == []     # no change
    assert valve.input_watermark_status(1, ACTIVE) == [ACTIVE]
    assert valve.input_watermark(1, 11) == [W(11)]


def test_all_idle_without_flush_when_last_channel_was_behind():
    valve = StatusWatermarkValve(2)
    valve.input_watermark(0, 10)
    valve.input_watermark(1, 20)
    valve.input_watermark_status(0, IDLE)                  # -> 20
    valve.input_watermark_status(0, ACTIVE)                # at 10: unaligned
    assert valve.input_watermark_status(1, IDLE) == []     # 0 active, behind: no watermark
    assert valve.input_watermark_status(0, IDLE) == [IDLE]
    assert valve.watermark == 20


def test_end_of_partition_releases_the_watermark():
    valve = StatusWatermarkValve(3)
    valve.input_watermark(0, 10)
    valve.input_watermark(1, 20)
    valve.input_watermark(2, 30)
    assert valve.input_end_of_partition(0) == [W(20)]
    assert valve.input_watermark(0, 100) == []             # closed channels send nothing
    assert valve.input_watermark_status(0, ACTIVE) == []
    assert valve.input_end_of_partition(0) == []
    assert valve.input_watermark_status(2, IDLE) == []
    assert valve.input_end_of_partition(1) == [W(30), IDLE]  # only idle channels remain
    assert valve.input_end_of_partition(2) == []
    assert valve.is_finished


def test_all_channels_ending_leaves_end_of_input_to_the_task():
    valve = StatusWatermarkValve(2)
    valve.input_watermark(0, 10)
    valve.input_watermark(1, 20)
    assert valve.input_end_of_partition(1) == []
    assert valve.input_end_of_partition(0) == []
    assert valve.watermark == 10 and valve.status is ACTIVE and valve.is_finished


def test_initial_state_and_validation():
    valve = StatusWatermarkValve(2)
    assert valve.watermark == MIN_WATERMARK and valve.num_channels == 2
    with pytest.raises(ValueError, match="at least one channel"):
        StatusWatermarkValve(0)


def test_two_inputs_combine_their_valves():
    left, right = StatusWatermarkValve(2), StatusWatermarkValve(1)
    both = CombinedWatermark([1, 2])

    def feed(side, valve_events):
        return [e for event in valve_events for e in both.apply(side, event)]

    assert feed(1, left.input_watermark(0, 10)) == []
    assert feed(1, left.input_watermark(1, 12)) == []       # left = 10, right still MIN
    assert feed(2, right.input_watermark(0, 8)) == [W(8)]
    assert feed(2, right.input_watermark(0, 30)) == [W(10)]
    assert feed(1, left.input_watermark_status(0, IDLE)) == [W(12)]
    assert left.input_watermark_status(1, IDLE) == [IDLE]
    assert both.apply(1, IDLE) == [W(30)]                  # left idle: right alone counts
    assert feed(2, right.input_watermark_status(0, IDLE)) == [IDLE]
