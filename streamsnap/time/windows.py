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
from datetime import timedelta
from typing import ClassVar, Self

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


Duration = int | float | timedelta
"""A span of time in the API: seconds (int or float) or a `datetime.timedelta`."""


def _check_offset(cls: type, offset: int, period: int, period_name: str) -> None:
    if abs(offset) >= period:
        raise ConfigurationError(
            f"{cls.__name__}: offset must satisfy -{period_name} < offset < {period_name} "
            f"(got offset={offset} ms, {period_name}={period} ms); use an offset smaller than "
            f"the {period_name}, e.g. timedelta(hours=-8) for daily windows in UTC+8")


def _seconds(millis: int) -> int | float:
    """Milliseconds as seconds for reprs: an int when whole (60000 -> 60), else a float."""
    return millis // 1000 if millis % 1000 == 0 else millis / 1000


def _millis(cls: type, name: str, value: object, minimum: int | None) -> int:
    """`value` (seconds or timedelta) in ms, with errors that name the assigner."""
    try:
        return to_millis(value, name, minimum=minimum)
    except ConfigurationError as e:
        raise ConfigurationError(f"{cls.__name__}: {e}") from None


class _Durations(WindowAssigner):
    """Assigners defined by durations: given in seconds or timedelta, kept as int ms
    (`<name>_ms` attributes, read by the runtime); equal when their class and durations are."""

    _fields: ClassVar[tuple[str, ...]] = ()

    def _key(self) -> tuple:
        return (type(self),) + tuple(getattr(self, f"{f}_ms") for f in self._fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Durations) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        args = ", ".join(f"{f}={_seconds(getattr(self, f'{f}_ms'))!r}" for f in self._fields
                         if f != "offset" or getattr(self, "offset_ms"))
        return f"{type(self).__name__}({args})"

    def __setattr__(self, name: str, value: object) -> None:
        if getattr(self, "_frozen", False):
            raise AttributeError(f"{type(self).__name__} is immutable; build a new assigner")
        object.__setattr__(self, name, value)


class _Tumbling(_Durations):
    _fields = ("size", "offset")

    def __init__(self, size: Duration, offset: Duration = 0) -> None:
        """Windows of `size` (seconds or timedelta), aligned to the epoch plus `offset`
        (seconds or timedelta, -size < offset < size; e.g. `timedelta(hours=-8)` for days in UTC+8)."""
        self.size_ms = _millis(type(self), "size", size, 1)
        self.offset_ms = _millis(type(self), "offset", offset, None)
        self._frozen = True
        _check_offset(type(self), self.offset_ms, self.size_ms, "size")

    @classmethod
    def of(cls, size: Duration, offset: Duration = 0) -> Self:
        """Windows of `size` (seconds or timedelta), aligned to the epoch plus `offset`; the
        same as the constructor (Flink's spelling), e.g. `TumblingEventTimeWindows.of(60)`."""
        return cls(size, offset)

    @property
    def size(self) -> timedelta:
        """The window length."""
        return timedelta(milliseconds=self.size_ms)

    @property
    def offset(self) -> timedelta:
        """How far window starts are shifted from multiples of the size since the epoch."""
        return timedelta(milliseconds=self.offset_ms)

    def assign_windows(self, timestamp: int | None, processing_time: int | None = None
                       ) -> list[Window]:
        """The one window containing the element's time (epoch ms)."""
        start = window_start(self._time(timestamp, processing_time), self.offset_ms, self.size_ms)
        return [TimeWindow(start, start + self.size_ms)]

    def assign_window_starts(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row indices, window starts) for a column of times; a window ends at start + size."""
        starts = window_starts(times, self.offset_ms, self.size_ms)
        return np.arange(len(starts), dtype=np.int64), starts


class _Sliding(_Durations):
    _fields = ("size", "slide", "offset")

    def __init__(self, size: Duration, slide: Duration, offset: Duration = 0) -> None:
        """Windows of `size` starting every `slide`, aligned to the epoch plus `offset` (all in
        seconds or timedelta; -slide < offset < slide)."""
        self.size_ms = _millis(type(self), "size", size, 1)
        self.slide_ms = _millis(type(self), "slide", slide, 1)
        self.offset_ms = _millis(type(self), "offset", offset, None)
        self._frozen = True
        _check_offset(type(self), self.offset_ms, self.slide_ms, "slide")

    @classmethod
    def of(cls, size: Duration, slide: Duration, offset: Duration = 0) -> Self:
        """Windows of `size` starting every `slide` (seconds or timedelta), plus `offset`; the
        same as the constructor, e.g. `SlidingEventTimeWindows.of(60, 10)`."""
        return cls(size, slide, offset)

    @property
    def size(self) -> timedelta:
        """The window length."""
        return timedelta(milliseconds=self.size_ms)

    @property
    def slide(self) -> timedelta:
        """How often a window starts."""
        return timedelta(milliseconds=self.slide_ms)

    @property
    def offset(self) -> timedelta:
        """How far window starts are shifted from multiples of the slide since the epoch."""
        return timedelta(milliseconds=self.offset_ms)

    def assign_windows(self, timestamp: int | None, processing_time: int | None = None
                       ) -> list[Window]:
        """The windows containing the element's time (epoch ms), latest first."""
        t = self._time(timestamp, processing_time)
        last = window_start(t, self.offset_ms, self.slide_ms)
        return [TimeWindow(s, s + self.size_ms) for s in range(last, t - self.size_ms, -self.slide_ms)]

    def assign_window_starts(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row indices, window starts): each row once per window it is in, latest first."""
        ts = np.asarray(times, dtype=np.int64)
        per_row = -(-self.size_ms // self.slide_ms)
        candidates = window_starts(ts, self.offset_ms, self.slide_ms)[:, None] \
            - self.slide_ms * np.arange(per_row, dtype=np.int64)[None, :]
        inside = candidates > (ts - self.size_ms)[:, None]
        rows, _ = np.nonzero(inside)
        return rows.astype(np.int64, copy=False), candidates[inside]


class _Session(_Durations):
    _fields = ("gap",)
    is_merging: ClassVar[bool] = True

    def __init__(self, gap: Duration) -> None:
        """Sessions that close after `gap` (seconds or timedelta) without elements."""
        millis = _millis(type(self), "gap", gap, 0)
        if millis == 0:
            raise ConfigurationError(
                f"{type(self).__name__}: the session gap must be at least 1 ms, got {gap!r}; "
                f"a gap of 0 would make every element its own session; give seconds or a "
                f"timedelta, e.g. with_gap(30)")
        self.gap_ms = millis
        self._frozen = True

    @classmethod
    def with_gap(cls, gap: Duration) -> Self:
        """Sessions that close after `gap` (seconds or timedelta) without elements; the same as
        the constructor, e.g. `EventTimeSessionWindows.with_gap(timedelta(minutes=30))`."""
        return cls(gap)

    @property
    def gap(self) -> timedelta:
        """The inactivity that closes a session."""
        return timedelta(milliseconds=self.gap_ms)

    def assign_windows(self, timestamp: int | None, processing_time: int | None = None
                       ) -> list[Window]:
        """`[t, t + gap)` for the element's time t (epoch ms); touching windows merge."""
        t = self._time(timestamp, processing_time)
        return [TimeWindow(t, t + self.gap_ms)]

    def merge_windows(self, windows: Iterable[TimeWindow],
                      callback: Callable[[list[TimeWindow], TimeWindow], None]) -> None:
        """Merge intersecting session windows: `callback(merged, result)` per group."""
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


class ResultWindows(_Durations):
    """The window a window aggregate's result row came from: ``[t + 1 - size, t + 1)`` for its
    event time ``t = window_end - 1``, one window per row. It is how `window_top_n` partitions
    window results by their own window_start/window_end (Flink SQL's Window Top-N after a window
    aggregation), and not an assigner to window raw events with."""

    _fields = ("size",)
    is_event_time = True

    def __init__(self, size_ms: int) -> None:
        self.size_ms = int(size_ms)
        self._frozen = True

    def assign_windows(self, timestamp: int | None, processing_time: int | None = None
                       ) -> list[Window]:
        end = self._time(timestamp, processing_time) + 1
        return [TimeWindow(end - self.size_ms, end)]

    def assign_window_starts(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ends = np.asarray(times, dtype=np.int64) + 1
        return np.arange(len(ends), dtype=np.int64), ends - self.size_ms

    def default_trigger(self) -> Trigger:
        return EventTimeTrigger()


class GlobalWindows(WindowAssigner):
    """Every element in the one `GlobalWindow`; nothing fires without a custom trigger."""

    is_event_time = False

    @classmethod
    def create(cls) -> GlobalWindows:
        """The assigner of the one global window (Flink's `GlobalWindows.create()`); add a trigger."""
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
