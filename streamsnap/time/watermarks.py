"""Watermarks: how a stream says "no event older than t is still coming".

A watermark `t` promises that later events have timestamps > t, so event-time timers and
windows up to `t` may fire. It is produced by a `WatermarkGenerator` that watches the event
timestamps (Flink's WatermarkGenerator: `on_event` per event, `on_periodic_emit` on a timer),
and configured by an immutable `WatermarkStrategy` (which generator, how to read timestamps,
when an input counts as idle).

Event time is int epoch milliseconds. Generators also have a vectorized entry point,
`on_batch(timestamps)`: the built-in ones reduce a whole Arrow/numpy column with one `max`, so
the vectorized path never runs Python per row. Watermarks leaving an output only ever increase
(`MonotonicWatermarkOutput`): a generator may propose a lower one, it is simply not emitted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.clock import Clock, SystemClock
from streamsnap.errors import ConfigurationError
from streamsnap.runtime.events import Watermark, WatermarkStatus
from streamsnap.time.durations import to_millis

MIN_WATERMARK = -(2 ** 63)      # nothing is known yet
MAX_WATERMARK = 2 ** 63 - 1     # the end of time: every timer and window fires

Timestamps: TypeAlias = "np.ndarray | pa.Array | pa.ChunkedArray"


# What watermark logic hands to the runtime to send downstream, in order.
WatermarkEvent = Watermark | WatermarkStatus


class WatermarkOutput(Protocol):
    """Where a generator puts its decisions."""

    def emit_watermark(self, timestamp: int) -> None: ...
    def mark_idle(self) -> None: ...
    def mark_active(self) -> None: ...


def max_timestamp(timestamps: Timestamps) -> int | None:
    """The largest timestamp of a column (numpy or Arrow), None when it is empty."""
    if isinstance(timestamps, (pa.Array, pa.ChunkedArray)):
        value = pc.max(timestamps).as_py() if len(timestamps) else None
        return None if value is None else int(value)
    return int(timestamps.max()) if len(timestamps) else None


class WatermarkGenerator(ABC):
    """Turns event timestamps into watermarks (subclass it for a custom generator).

    `on_event` sees each event's timestamp and may emit at once (punctuated watermarks);
    `on_periodic_emit` is called on the source's watermark interval (periodic watermarks).
    `on_batch` is the vectorized entry point; its default calls `on_event` per row, so
    override it when the generator can reduce a whole column at once.
    """

    @abstractmethod
    def on_event(self, timestamp: int, output: WatermarkOutput) -> None:
        """One event's timestamp (ms)."""

    @abstractmethod
    def on_periodic_emit(self, output: WatermarkOutput) -> None:
        """The periodic watermark interval elapsed."""

    def on_batch(self, timestamps: Timestamps, output: WatermarkOutput) -> None:
        """A batch's timestamps (int64 ms); per-row fallback for custom generators."""
        values = timestamps.to_numpy() if isinstance(timestamps, (pa.Array, pa.ChunkedArray)) \
            else timestamps
        for ts in np.asarray(values, dtype=np.int64).tolist():
            self.on_event(ts, output)


class BoundedOutOfOrdernessWatermarks(WatermarkGenerator):
    """Events arrive at most `delay_ms` late: the watermark trails the max timestamp by it.

    Emits ``max_timestamp - delay - 1`` so an event exactly `delay` behind the maximum is still
    on time (a watermark t means "no more events with timestamp <= t").
    """

    def __init__(self, delay_ms: int):
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 0:
            raise ConfigurationError(f"delay_ms must be a non-negative int (milliseconds), got "
                                     f"{delay_ms!r}")
        self.delay_ms = delay_ms
        self._max = MIN_WATERMARK + delay_ms + 1    # emits MIN_WATERMARK until an event comes

    def on_event(self, timestamp: int, output: WatermarkOutput) -> None:
        self._max = max(self._max, timestamp)

    def on_batch(self, timestamps: Timestamps, output: WatermarkOutput) -> None:
        latest = max_timestamp(timestamps)
        if latest is not None and latest > self._max:
            self._max = latest

    def on_periodic_emit(self, output: WatermarkOutput) -> None:
        output.emit_watermark(self._max - self.delay_ms - 1)


class NoWatermarksGenerator(WatermarkGenerator):
    """For streams that use processing time only: event time never advances."""

    def on_event(self, timestamp: int, output: WatermarkOutput) -> None:
        """Timestamps are ignored: there is no event-time progress to report."""

    def on_batch(self, timestamps: Timestamps, output: WatermarkOutput) -> None:
        """No per-row fallback either: nothing would be emitted."""

    def on_periodic_emit(self, output: WatermarkOutput) -> None:
        """Never emits."""


class IdlenessDetector(WatermarkGenerator):
    """Wraps a generator: marks the output idle when no event came for `timeout_ms`.

    An idle input is excluded from the minimum downstream, so a split or partition without data
    does not hold back event time forever. It rejoins when it emits a watermark again. Time is
    read from the injected clock (monotonic seconds), once per batch, never per row.
    """

    def __init__(self, inner: WatermarkGenerator, timeout_ms: int, clock: Clock):
        self.inner = inner
        self.timeout_ms = timeout_ms
        self._clock = clock
        self._last_activity = self._now()

    def _now(self) -> int:
        return round(self._clock.monotonic() * 1000)

    def on_event(self, timestamp: int, output: WatermarkOutput) -> None:
        self.inner.on_event(timestamp, output)
        self._last_activity = self._now()

    def on_batch(self, timestamps: Timestamps, output: WatermarkOutput) -> None:
        self.inner.on_batch(timestamps, output)
        if len(timestamps):
            self._last_activity = self._now()

    def on_periodic_emit(self, output: WatermarkOutput) -> None:
        if self._now() - self._last_activity >= self.timeout_ms:
            output.mark_idle()
        else:
            self.inner.on_periodic_emit(output)


class MonotonicWatermarkOutput:
    """A `WatermarkOutput` that records what to send downstream: increasing watermarks only,
    status changes only; `drain()` hands the events over in order.

    A lower or equal watermark is dropped (and does not end idleness: it carries no progress).
    """

    def __init__(self) -> None:
        self.watermark = MIN_WATERMARK
        self.is_idle = False
        self._events: list[WatermarkEvent] = []

    def emit_watermark(self, timestamp: int) -> None:
        if timestamp <= self.watermark:
            return
        self.mark_active()
        self.watermark = timestamp
        self._events.append(Watermark(timestamp))

    def mark_idle(self) -> None:
        if not self.is_idle:
            self.is_idle = True
            self._events.append(WatermarkStatus.IDLE)

    def mark_active(self) -> None:
        if self.is_idle:
            self.is_idle = False
            self._events.append(WatermarkStatus.ACTIVE)

    def drain(self) -> list[WatermarkEvent]:
        events, self._events = self._events, []
        return events


TimestampAssigner = str | Callable[[dict], int]


@dataclass(frozen=True)
class WatermarkStrategy:
    """How a stream gets timestamps and watermarks; immutable, each `with_*` returns a copy.

    Build one with `for_bounded_out_of_orderness`, `for_monotonous_timestamps`,
    `no_watermarks` or `for_generator`, then add `with_timestamp_assigner(column or function)`
    and optionally `with_idleness(timeout)`. Durations are seconds or timedelta.
    """

    generator_factory: Callable[[], WatermarkGenerator]
    timestamp_assigner: TimestampAssigner | None = None
    idle_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        if not callable(self.generator_factory):
            raise ConfigurationError(
                f"WatermarkStrategy.for_generator: the factory must be a callable returning a "
                f"WatermarkGenerator (e.g. a WatermarkGenerator subclass), got "
                f"{self.generator_factory!r}")

    @classmethod
    def for_bounded_out_of_orderness(cls, max_out_of_orderness: Any) -> WatermarkStrategy:
        """Events may arrive up to `max_out_of_orderness` (seconds or timedelta) late."""
        delay = to_millis(max_out_of_orderness, "max_out_of_orderness")
        return cls(partial(BoundedOutOfOrdernessWatermarks, delay))

    @classmethod
    def for_monotonous_timestamps(cls) -> WatermarkStrategy:
        """Timestamps never decrease: the watermark is the latest timestamp minus 1 ms."""
        return cls(partial(BoundedOutOfOrdernessWatermarks, 0))

    @classmethod
    def no_watermarks(cls) -> WatermarkStrategy:
        """No event-time progress (processing-time pipelines)."""
        return cls(NoWatermarksGenerator)

    @classmethod
    def for_generator(cls, factory: Callable[[], WatermarkGenerator]) -> WatermarkStrategy:
        """A custom generator; `factory()` is called once per split or subtask."""
        return cls(factory)

    def with_timestamp_assigner(self, assigner: TimestampAssigner) -> WatermarkStrategy:
        """Read timestamps from a column (vectorized) or a function of the row (per row)."""
        if not callable(assigner) and not (isinstance(assigner, str) and assigner.strip()):
            raise ConfigurationError(
                f"with_timestamp_assigner: pass the name of an int64-milliseconds or timestamp "
                f"column, or a function of the row returning epoch milliseconds; got "
                f"{assigner!r}")
        return replace(self, timestamp_assigner=assigner)

    def with_idleness(self, timeout: Any) -> WatermarkStrategy:
        """Mark an input idle after `timeout` (seconds or timedelta) without events."""
        return replace(self, idle_timeout_ms=to_millis(timeout, "idle_timeout", minimum=1))

    def create_watermark_generator(self, clock: Clock | None = None) -> WatermarkGenerator:
        """A fresh generator (one per split or subtask), idleness-wrapped when configured."""
        generator = self.generator_factory()
        if not isinstance(generator, WatermarkGenerator):
            raise ConfigurationError(
                f"WatermarkStrategy.for_generator: the factory {self.generator_factory!r} "
                f"returned {type(generator).__name__}, not a WatermarkGenerator; return an "
                f"instance of a WatermarkGenerator subclass")
        if self.idle_timeout_ms is not None:
            generator = IdlenessDetector(generator, self.idle_timeout_ms, clock or SystemClock())
        return generator
