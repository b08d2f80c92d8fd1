"""A task's event time over its channels and logical inputs (`InputWatermarks`), message by message."""

import pytest

from streamsnap.time import Watermark, WatermarkStatus
from streamsnap.time.input_watermarks import InputWatermarks

IDLE, ACTIVE = WatermarkStatus.IDLE, WatermarkStatus.ACTIVE
W = Watermark


def test_one_input_is_its_valve():
    time = InputWatermarks([0, 0])
    assert time.on_watermark(0, 10) == []
    assert time.on_watermark(1, 5) == [W(5)]
    assert time.on_end_of_partition(1) == [W(10)]       # the ended channel stops holding it back


def test_two_inputs_advance_by_their_minimum():
    time = InputWatermarks([0, 1, 1])                  # input 0: channel 0; input 1: channels 1, 2
    assert time.on_watermark(0, 50) == []
    assert time.on_watermark(1, 20) == []
    assert time.on_watermark(2, 30) == [W(20)]
    assert time.on_watermark(1, 60) == [W(30)]
    assert time.on_status(2, IDLE) == [W(50)]          # input 1 at 60 now, input 0 at 50


def test_an_input_that_ended_without_the_end_of_time_no_longer_holds_the_other_back():
    time = InputWatermarks([0, 1])
    assert time.on_watermark(0, 100) == []
    assert time.on_watermark(1, 10) == [W(10)]
    assert time.on_end_of_partition(1) == [W(100)]     # input 1 is done at 10: input 0 alone counts
    assert time.on_watermark(0, 200) == [W(200)]
    assert time.on_end_of_partition(0) == []           # the last input: nothing left to advance


def test_an_input_that_ended_before_sending_any_watermark_is_dropped_too():
    time = InputWatermarks([0, 1, 1])
    assert time.on_watermark(0, 7) == []
    assert time.on_end_of_partition(1) == []           # input 1 still has channel 2
    assert time.on_end_of_partition(2) == [W(7)]
    assert time.on_watermark(2, 99) == []              # a closed channel's late event changes nothing


def test_an_idle_input_and_an_ended_one_make_the_task_idle():
    time = InputWatermarks([0, 1])
    assert time.on_status(0, IDLE) == []               # input 1 is still active
    assert time.on_end_of_partition(1) == [IDLE]       # only the idle input is left
    assert time.on_status(0, ACTIVE) == [ACTIVE]
    assert time.on_watermark(0, 3) == [W(3)]


def test_a_logical_input_without_channels_is_refused():
    with pytest.raises(ValueError, match="without channels"):
        InputWatermarks([0, 2])
