from datetime import timedelta

import numpy as np
import pyarrow as pa
import pytest

from streamsnap.clock import ManualScheduler
from streamsnap.errors import ConfigurationError
from streamsnap.time import (MAX_WATERMARK, MIN_WATERMARK, BoundedOutOfOrdernessWatermarks,
                             MonotonicWatermarkOutput, Watermark, WatermarkGenerator,
                             WatermarkStatus, WatermarkStrategy)
from streamsnap.time.watermarks import IdlenessDetector, max_timestamp

IDLE, ACTIVE = WatermarkStatus.IDLE, WatermarkStatus.ACTIVE


def test_constants_span_int64():
    assert MIN_WATERMARK == -(2 ** 63) and MAX_WATERMARK == 2 ** 63 - 1


def test_bounded_out_of_orderness_emits_max_minus_delay_minus_one():
    generator = WatermarkStrategy.for_bounded_out_of_orderness(2).create_watermark_generator()
    out = MonotonicWatermarkOutput()
    generator.on_periodic_emit(out)
    assert out.drain() == []                                   # MIN: nothing to say yet
    for ts in (10_000, 13_000, 11_000):
        generator.on_event(ts, out)
    assert out.drain() == []                                   # periodic, not per event
    generator.on_periodic_emit(out)
    assert out.drain() == [Watermark(13_000 - 2_000 - 1)]


def test_monotonous_timestamps_trail_by_one_millisecond():
    generator = WatermarkStrategy.for_monotonous_timestamps().create_watermark_generator()
    out = MonotonicWatermarkOutput()
    generator.on_batch(np.array([5, 7, 9], dtype=np.int64), out)
    generator.on_periodic_emit(out)
    assert out.drain() == [Watermark(8)]


@pytest.mark.parametrize("column", [
    np.array([3, 900, 17], dtype=np.int64),
    pa.array([3, 900, 17], type=pa.int64()),
    pa.chunked_array([[3], [900, 17]], type=pa.int64()),
])
def test_on_batch_takes_numpy_and_arrow_columns(column):
    generator = BoundedOutOfOrdernessWatermarks(100)
    out = MonotonicWatermarkOutput()
    generator.on_batch(column, out)
    generator.on_batch(column[:0], out)                        # empty batches change nothing
    generator.on_periodic_emit(out)
    assert out.drain() == [Watermark(799)]


def test_vectorized_path_calls_no_per_row_python(monkeypatch):
    generator = BoundedOutOfOrdernessWatermarks(0)
    monkeypatch.setattr(generator, "on_event", lambda *a: pytest.fail("per-row call"))
    generator.on_batch(np.arange(100_000, dtype=np.int64), MonotonicWatermarkOutput())
    assert max_timestamp(pa.array([], type=pa.int64())) is None


def test_output_never_goes_back_and_reports_status_changes_once():
    out = MonotonicWatermarkOutput()
    out.emit_watermark(10)
    out.emit_watermark(5)
    out.emit_watermark(10)
    out.mark_idle()
    out.mark_idle()
    out.emit_watermark(9)                  # no progress: stays idle
    out.emit_watermark(12)                 # progress: active again, then the watermark
    assert out.drain() == [Watermark(10), IDLE, ACTIVE, Watermark(12)]
    assert out.drain() == []


def test_no_watermarks_never_emits():
    generator = WatermarkStrategy.no_watermarks().create_watermark_generator()
    out = MonotonicWatermarkOutput()
    generator.on_event(100, out)
    generator.on_batch(np.array([1, 2, 3]), out)
    generator.on_periodic_emit(out)
    assert out.drain() == [] and out.watermark == MIN_WATERMARK


class Punctuated(WatermarkGenerator):
    """Emits on marker events (timestamps divisible by 10); nothing periodically."""

    def on_event(self, timestamp, output):
        if timestamp % 10 == 0:
            output.emit_watermark(timestamp)

    def on_periodic_emit(self, output):
        output.emit_watermark(-1)


def test_custom_generator_uses_per_row_fallback_for_batches():
    generator = WatermarkStrategy.for_generator(Punctuated).create_watermark_generator()
    out = MonotonicWatermarkOutput()
    generator.on_batch(pa.array([3, 20, 7, 10, 30, 31]), out)
    generator.on_periodic_emit(out)
    assert out.drain() == [Watermark(20), Watermark(30)]


def test_idleness_after_timeout_without_events_and_back():
    clock = ManualScheduler()
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(0).with_idleness(timedelta(seconds=5))
    generator = strategy.create_watermark_generator(clock)
    assert isinstance(generator, IdlenessDetector)
    out = MonotonicWatermarkOutput()
    generator.on_batch(np.array([100]), out)
    clock.advance(4.999)
    generator.on_periodic_emit(out)
    assert out.drain() == [Watermark(99)]
    clock.advance(0.001)
    generator.on_periodic_emit(out)
    assert out.drain() == [IDLE]
    generator.on_batch(np.array([], dtype=np.int64), out)     # an empty batch is no activity
    generator.on_periodic_emit(out)
    assert out.drain() == []
    generator.on_event(200, out)
    generator.on_periodic_emit(out)
    assert out.drain() == [ACTIVE, Watermark(199)]


def test_strategy_is_immutable():
    base = WatermarkStrategy.for_bounded_out_of_orderness(1)
    with_ts = base.with_timestamp_assigner("ts")
    idle = with_ts.with_idleness(3)
    assert base.timestamp_assigner is None and base.idle_timeout_ms is None
    assert with_ts.timestamp_assigner == "ts" and with_ts.idle_timeout_ms is None
    assert idle.timestamp_assigner == "ts" and idle.idle_timeout_ms == 3000
    with pytest.raises(AttributeError):
        base.idle_timeout_ms = 5  # type: ignore[misc]
    fn = lambda row: row["t"]
    assert base.with_timestamp_assigner(fn).timestamp_assigner is fn


def test_negative_out_of_orderness_fails_at_build():
    with pytest.raises(ConfigurationError) as err:
        WatermarkStrategy.for_bounded_out_of_orderness(-1)
    assert "max_out_of_orderness must not be negative" in str(err.value)
    assert "timedelta" in str(err.value)


@pytest.mark.parametrize("timeout", [0, -3, "5s"])
def test_bad_idleness_fails_at_build(timeout):
    with pytest.raises(ConfigurationError, match="idle_timeout"):
        WatermarkStrategy.for_monotonous_timestamps().with_idleness(timeout)


@pytest.mark.parametrize("assigner", ["", "  ", 5, None])
def test_bad_timestamp_assigner_fails_at_build(assigner):
    with pytest.raises(ConfigurationError, match="column.*function of the row"):
        WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(assigner)


def test_generator_factory_is_validated():
    with pytest.raises(ConfigurationError, match="callable returning a WatermarkGenerator"):
        WatermarkStrategy.for_generator(42)
    strategy = WatermarkStrategy.for_generator(lambda: "not a generator")
    with pytest.raises(ConfigurationError, match="returned str, not a WatermarkGenerator"):
        strategy.create_watermark_generator()


def test_each_generator_is_fresh():
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(0)
    a, b = strategy.create_watermark_generator(), strategy.create_watermark_generator()
    out_a, out_b = MonotonicWatermarkOutput(), MonotonicWatermarkOutput()
    a.on_event(50, out_a)
    a.on_periodic_emit(out_a)
    b.on_periodic_emit(out_b)
    assert out_a.drain() == [Watermark(49)] and out_b.drain() == []
