import numpy as np
import pyarrow as pa

from streamsnap.clock import ManualScheduler
from streamsnap.time import (CombinedWatermark, SplitWatermarks, Watermark, WatermarkGenerator,
                             WatermarkStatus, WatermarkStrategy)

IDLE, ACTIVE = WatermarkStatus.IDLE, WatermarkStatus.ACTIVE
W = Watermark


def ts(*values):
    return np.array(values, dtype=np.int64)


def test_combined_is_min_over_non_idle_parts():
    combined = CombinedWatermark(["a", "b"])
    assert combined.update("a", 10) == []                  # b still at MIN
    assert combined.update("b", 7) == [W(7)]
    assert combined.update("b", 20) == [W(10)]
    assert combined.update("a", 5) == []                   # lower than before: ignored
    assert combined.set_idle("a", True) == [W(20)]
    assert combined.set_idle("b", True) == [IDLE]
    assert combined.is_idle
    assert combined.set_idle("a", False) == [ACTIVE]       # a (at 10) holds at 20
    assert combined.update("a", 15) == []
    assert combined.update("a", 30) == [W(30)]
    assert combined.remove("a") == [IDLE]                  # only idle b is left
    assert combined.is_idle and combined.watermark == 30


def test_combined_removed_part_stops_holding_back():
    combined = CombinedWatermark([1, 2])
    combined.update(1, 50)
    assert combined.update(2, 40) == [W(40)]
    assert combined.remove(2) == [W(50)]
    assert combined.apply(1, W(60)) == [W(60)]
    assert combined.apply(1, IDLE) == [IDLE]
    assert combined.apply(1, ACTIVE) == [ACTIVE]


def test_slow_split_holds_back_the_source():
    source = SplitWatermarks(WatermarkStrategy.for_bounded_out_of_orderness(0))
    source.add_split("fast")
    source.add_split("slow")
    assert source.on_batch("fast", pa.array([1000, 2000])) == []
    assert source.on_batch("slow", ts(100)) == []
    assert source.on_periodic_emit() == [W(99)]
    source.on_batch("fast", ts(5000))
    assert source.on_periodic_emit() == []                 # still the slow split's 99
    source.on_batch("slow", ts(3000))
    assert source.on_periodic_emit() == [W(2999)]
    assert source.finish_split("slow") == [W(4999)]
    assert source.splits == ["fast"] and source.watermark == 4999


def test_idle_split_is_excluded_and_all_idle_makes_the_source_idle():
    clock = ManualScheduler()
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(0).with_idleness(10)
    source = SplitWatermarks(strategy, clock)
    for split in ("a", "b"):
        source.add_split(split)
    source.on_batch("a", ts(500))
    source.on_batch("b", ts(100))
    assert source.on_periodic_emit() == [W(99)]
    clock.advance(6)
    source.on_batch("a", ts(900))                          # b gets nothing
    assert source.on_periodic_emit() == []
    clock.advance(4)                                       # b: 10 s without events
    assert source.on_periodic_emit() == [W(899)]
    clock.advance(10)
    assert source.on_periodic_emit() == [IDLE]
    assert source.is_idle
    # records on b: active at once, its old watermark (99) holds the source at 899
    assert source.on_batch("b", ts(950)) == [ACTIVE]
    assert source.on_periodic_emit() == [W(949)]           # a still idle: b alone counts


class EveryEvent(WatermarkGenerator):
    def on_event(self, timestamp, output):
        output.emit_watermark(timestamp)

    def on_periodic_emit(self, output):
        output.emit_watermark(-5)


def test_punctuated_generators_emit_from_batches_and_events():
    source = SplitWatermarks(WatermarkStrategy.for_generator(EveryEvent))
    source.add_split(0)
    assert source.on_batch(0, ts(4, 9, 6)) == [W(4), W(9)]
    assert source.on_event(0, 12) == [W(12)]
    assert source.on_periodic_emit() == []


def test_no_splits_emits_nothing():
    source = SplitWatermarks(WatermarkStrategy.for_monotonous_timestamps())
    assert source.on_periodic_emit() == [] and not source.is_idle
    source.add_split("x")
    source.on_batch("x", ts(10))
    assert source.on_periodic_emit() == [W(9)]
