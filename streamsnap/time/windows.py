"""Windows and window assigners: which windows an element belongs to.

A `TimeWindow(start, end)` covers ``start <= t < end``; its last instant, `max_timestamp`
(``end - 1``), is when an event-time window fires. Tumbling windows tile time, sliding windows
overlap (an element is in ``ceil(size / slide)`` or fewer of them), session windows start as
``[t, t + gap)`` per element and merge when they touch or overlap. Window starts follow
Flink's formula, aligned to the epoch plus `offset`; it uses floor modulo, so it is right for
negative timestamps too. Tumbling and sliding assigners also assign whole numpy columns at
once (`assign_window_starts`), for the vectorized windowed aggregation path.

Sizes, slides, gaps and offsets are given in seconds or as timedelta and validated when the
assigner is built; internally everything is integer milliseconds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from streamsnap.errors import ConfigurationError
from streamsnap.time.durations import to_millis
from streamsnap.time.timers import NamespaceCodec
from streamsnap.time.timestamps import TimestampError
from streamsnap.time.triggers import (EventTimeTrigger, NeverTrigger, ProcessingTimeTrigger,
                                      Trigger)
from streamsnap.time.watermarks import MAX_WATERMARK


class Window(ABC):
    """A finite or infinite span of time elements are grouped into."""

    @property
    @abstractmethod
    def max_timestamp(self) -> int:
        """The largest timestamp that still belongs to the window."""


@dataclass(frozen=True, order=True)
class TimeWindow(Window):
    """``[start, end)`` in epoch milliseconds."""

    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        return self.end - 1

    def intersects(self, other: TimeWindow) -> bool:
        """Overlapping or touching (so adjacent sessions merge)."""
        return self.start <= other.end and self.end >= other.start

    def cover(self, other: TimeWindow) -> TimeWindow:
        """The smallest window containing both."""
        return TimeWindow(min(self.start, other.start), max(self.end, other.end))


@dataclass(frozen=True)
class GlobalWindow(Window):
    """The one window of all elements (fires only through a custom trigger)."""

    @property
    def max_timestamp(self) -> int:
        return MAX_WATERMARK


GLOBAL_WINDOW = GlobalWindow()

# Windows as timer namespaces / state keys: plain tuples in the keyed backend.
TIME_WINDOW_NAMESPACE = NamespaceCodec(lambda w: (w.start, w.end), lambda k: TimeWindow(*k))
GLOBAL_WINDOW_NAMESPACE = NamespaceCodec(lambda w: None, lambda k: GLOBAL_WINDOW)


def window_start(timestamp: int, offset: int, size: int) -> int:
    """Start of the `size`-long window (aligned to epoch + `offset`) containing `timestamp`."""
    return timestamp - (timestamp - offset) % size     # Python's % floors: right for t < 0


def window_starts(timestamps: np.ndarray, offset: int, size: int) -> np.ndarray:
    """Vectorized `window_start` (int64)."""
    ts = np.asarray(timestamps, dtype=np.int64)
    return ts - np.mod(ts - offset, size)


def merge_time_windows(windows: Iterable[TimeWindow],
                       callback: Callable[[list[TimeWindow], TimeWindow], None]) -> None:
    """Merge intersecting windows: `callback(merged, result)` for each group of two or more."""
    groups: list[tuple[TimeWindow, list[TimeWindow]]] = []
    for window in sorted(dict.fromkeys(windows)):
        if groups and groups[-1][0].intersects(window):
            groups[-1] = (groups[-1][0].cover(window), groups[-1][1] + [window])
        else:
            groups.append((window, [window]))
    for result, merged in groups:
        if len(merged) > 1:
            callback(merged, result)


class WindowAssigner(ABC):
    """Assigns an element (by its timestamp, or by processing time) to windows."""

    is_event_time: ClassVar[bool]
    is_merging: ClassVar[bool] = False

    @abstractmethod
    def assign_windows(self, timestamp: int | None, processing_time: int | None = None
                       ) -> list[Window]:
        """The windows of an element with event `timestamp`, at `processing_time` (ms)."""

    @abstractmethod
    def default_trigger(self) -> Trigger:
        """When windows fire unless the user sets a trigger."""

    def _time(self, timestamp: int | None, processing_time: int | None) -> int:
        if self.is_event_time:
            if timestamp is None:
                raise TimestampError(
                    f"{type(self).__name__} got an element without an event timestamp; give "
                    f"the stream a WatermarkStrategy with with_timestamp_assigner(...) or use "
                    f"a processing-time window assigner")
            return timestamp
        if processing_time is None:
            raise ValueError(f"{type(self).__name__} needs the current processing time")
        return processing_time


def _check_offset(cls: type, offset: int, period: int, period_name: str) -> None:
    if abs(offset) >= period:
        raise ConfigurationError(
            f"{cls.__name__}: offset must satisfy -{period_name} < offset < {period_name} "
            f"(got offset={offset} ms, {period_name}={period} ms); use an offset smaller than "
            f"the {period_name}, e.g. timedelta(hours=-8) for daily windows in UTC+8")


def _check_ms(cls: type, name: str, value: Any, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or \
            (minimum is not None and value < minimum):
        raise ConfigurationError(f"{cls.__name__}: {name} must be an int of milliseconds "
                                 f">= {minimum}, got {value!r}; build it with .of(...)")


@dataclass(frozen=True)
class _Tumbling(WindowAssigner):
    size: int          # ms
    offset: int = 0    # ms

    def __post_init__(self) -> None:
        _check_ms(type(self), "size", self.size, 1)
        _check_ms(type(self), "offset", self.offset, None)
        _check_offset(type(self), self.offset, self.size, "size")

    @classmethod
    def of(cls, size: Any, offset: Any = 0):
        """Windows of `size` (seconds or timedelta), aligned to the epoch plus `offset`."""
        return cls(to_millis(size, "size", minimum=1), to_millis(offset, "offset", minimum=None))

    def assign_windows(self, timestamp: int | None, processing_time: int | None = None
                       ) -> list[Window]:
        start = window_start(self._time(timestamp, processing_time), self.offset, self.size)
        return [TimeWindow(start, start + self.size)]

    def assign_window_starts(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row indices, window starts) for a column of times; a window ends at start + size."""
        starts = window_starts(times, self.offset, self.size)
        return np.arange(len(starts), dtype=np.int64), starts


@dataclass(frozen=True)
class _Sliding(WindowAssigner):
    size: int
    slide: int
    offset: int = 0

    def __post_init__(self) -> None:
        _check_ms(type(self), "size", self.size, 1)
        _check_ms(type(self), "slide", self.slide, 1)
        _check_ms(type(self), "offset", self.offset, None)
        _check_offset(type(self), self.offset, self.slide, "slide")

    @classmethod
    def of(cls, size: Any, slide: Any, offset: Any = 0):
        """Windows of `size` starting every `slide` (seconds or timedelta), plus `offset`."""
        return cls(to_millis(size, "size", minimum=1), to_millis(slide, "slide", minimum=1),
                   to_millis(offset, "offset", minimum=None))

    def assign_windows(self, timestamp: int | None, processing_time: int | None = None
                       ) -> list[Window]:
        t = self._time(timestamp, processing_time)
        last = window_start(t, self.offset, self.slide)
        return [TimeWindow(s, s + self.size) for s in range(last, t - self.size, -self.slide)]

    def assign_window_starts(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row indices, window starts): each row once per window it is in, latest first."""
        ts = np.asarray(times, dtype=np.int64)
        per_row = -(-self.size // self.slide)
        candidates = window_starts(ts, self.offset, self.slide)[:, None] \
            - self.slide * np.arange(per_row, dtype=np.int64)[None, :]
        inside = candidates > (ts - self.size)[:, None]
        rows, _ = np.nonzero(inside)
        return rows.astype(np.int64, copy=False), candidates[inside]


@dataclass(frozen=True)
class _Session(WindowAssigner):
    gap: int

    is_merging: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_ms(type(self), "gap", self.gap, 1)

    @classmethod
    def with_gap(cls, gap: Any):
        """Sessions that close after `gap` (seconds or timedelta) without elements."""
        millis = to_millis(gap, "gap")
        if millis == 0:
            raise ConfigurationError(
                f"{cls.__name__}.with_gap: the session gap must be at least 1 ms, got {gap!r}; "
                f"a gap of 0 would make every element its own session; give seconds or a "
                f"timedelta, e.g. with_gap(30)")
        return cls(millis)

    def assign_windows(self, timestamp: int | None, processing_time: int | None = None
                       ) -> list[Window]:
        t = self._time(timestamp, processing_time)
        return [TimeWindow(t, t + self.gap)]

    def merge_windows(self, windows: Iterable[TimeWindow],
                      callback: Callable[[list[TimeWindow], TimeWindow], None]) -> None:
        merge_time_windows(windows, callback)


class TumblingEventTimeWindows(_Tumbling):
    """Fixed-size, non-overlapping windows by event time."""

    is_event_time = True

    def default_trigger(self) -> Trigger:
        return EventTimeTrigger()


class TumblingProcessingTimeWindows(_Tumbling):
    """Fixed-size, non-overlapping windows by the operator's clock."""

    is_event_time = False

    def default_trigger(self) -> Trigger:
        return ProcessingTimeTrigger()


class SlidingEventTimeWindows(_Sliding):
    """Fixed-size windows every `slide`, by event time."""

    is_event_time = True

    def default_trigger(self) -> Trigger:
        return EventTimeTrigger()


class SlidingProcessingTimeWindows(_Sliding):
    """Fixed-size windows every `slide`, by the operator's clock."""

    is_event_time = False

    def default_trigger(self) -> Trigger:
        return ProcessingTimeTrigger()


class EventTimeSessionWindows(_Session):
    """Per-key sessions by event time, closed by a gap of inactivity."""

    is_event_time = True

    def default_trigger(self) -> Trigger:
        return EventTimeTrigger()


class ProcessingTimeSessionWindows(_Session):
    """Per-key sessions by the operator's clock, closed by a gap of inactivity."""

    is_event_time = False

    def default_trigger(self) -> Trigger:
        return ProcessingTimeTrigger()


class GlobalWindows(WindowAssigner):
    """Every element in the one `GlobalWindow`; nothing fires without a custom trigger."""

    is_event_time = False

    @classmethod
    def create(cls) -> GlobalWindows:
        return cls()

    def assign_windows(self, timestamp: int | None, processing_time: int | None = None
                       ) -> list[Window]:
        return [GLOBAL_WINDOW]

    def default_trigger(self) -> Trigger:
        return NeverTrigger()

    def __eq__(self, other: object) -> bool:
        return type(other) is GlobalWindows

    def __hash__(self) -> int:
        return hash(GlobalWindows)
