"""Lateness: when an element or a window is too late to matter, and when a window's state goes.

An event-time window keeps its state until the watermark passes its end plus the allowed
lateness (its *cleanup time*); elements arriving for it until then re-fire it, elements after
it are late (dropped, or sent to the late-data side output). Processing-time windows are never
late: their time is the operator's own clock. All times are int milliseconds; the vectorized
variant works on numpy columns of window ends for the vectorized aggregation path.
"""

from __future__ import annotations

import numpy as np

from streamsnap.time.watermarks import MAX_WATERMARK
from streamsnap.time.windows import Window


def cleanup_time(window: Window, allowed_lateness: int, is_event_time: bool) -> int:
    """When the window's state and timers are dropped (saturating at the end of time)."""
    if not is_event_time:
        return window.max_timestamp
    return min(window.max_timestamp + allowed_lateness, MAX_WATERMARK)


def is_window_late(window: Window, allowed_lateness: int, watermark: int,
                   is_event_time: bool = True) -> bool:
    """The watermark passed the window's cleanup time: it no longer accepts elements."""
    return is_event_time and cleanup_time(window, allowed_lateness, True) <= watermark


def is_element_late(timestamp: int, allowed_lateness: int, watermark: int,
                    is_event_time: bool = True) -> bool:
    """An element older than watermark - allowed lateness (what a late side output gets)."""
    return is_event_time and timestamp + allowed_lateness <= watermark


def late_windows(window_ends: np.ndarray, allowed_lateness: int, watermark: int) -> np.ndarray:
    """Vectorized `is_window_late` for event-time windows given by their (exclusive) ends."""
    ends = np.asarray(window_ends, dtype=np.int64)
    return ends - 1 <= watermark - allowed_lateness
