"""The minimum of several partial watermarks, skipping idle ones (Flink's CombinedWatermarkStatus).

Used where a few independent inputs are combined without per-channel alignment bookkeeping:
the splits of one source (FLIP-27), and the two inputs of a connected stream (each of which
already went through its own `StatusWatermarkValve`). The combined watermark is the minimum
over the parts that are not idle; it only ever increases, so a part that rejoins behind the
others holds it where it is until it catches up; when every part is idle, the output is idle.
A removed part (a finished split, an ended input) no longer holds anything back.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from streamsnap.runtime.events import Watermark
from streamsnap.time.watermarks import MIN_WATERMARK, WatermarkEvent, WatermarkStatus


class CombinedWatermark:
    """Min over non-idle parts; each call returns the events to send downstream, in order."""

    def __init__(self, parts: Iterable[Hashable] = ()):
        self._watermarks: dict[Hashable, int] = {}
        self._idle: dict[Hashable, bool] = {}
        self.watermark = MIN_WATERMARK
        self.is_idle = False
        for part in parts:
            self.add(part)

    @property
    def parts(self) -> list[Hashable]:
        return list(self._watermarks)

    def add(self, part: Hashable) -> None:
        """A new active part, at the minimum watermark: it holds the combination back."""
        if part in self._watermarks:
            raise ValueError(f"watermark part {part!r} is already present")
        self._watermarks[part] = MIN_WATERMARK
        self._idle[part] = False

    def remove(self, part: Hashable) -> list[WatermarkEvent]:
        """The part ended: it no longer holds the watermark back."""
        del self._watermarks[part], self._idle[part]
        return self._combine()

    def update(self, part: Hashable, timestamp: int) -> list[WatermarkEvent]:
        """The part's watermark (a lower one than it had is ignored)."""
        self._watermarks[part] = max(self._watermarks[part], timestamp)
        return self._combine()

    def set_idle(self, part: Hashable, idle: bool) -> list[WatermarkEvent]:
        if self._idle[part] == idle:
            return []
        self._idle[part] = idle
        return self._combine()

    def apply(self, part: Hashable, event: WatermarkEvent) -> list[WatermarkEvent]:
        """Feed one upstream event (a valve's output) for `part`."""
        if isinstance(event, Watermark):
            return self.update(part, event.timestamp)
        return self.set_idle(part, event.is_idle)

    def _combine(self) -> list[WatermarkEvent]:
        if not self._watermarks:
            return []
        active = [wm for part, wm in self._watermarks.items() if not self._idle[part]]
        if not active:
            if self.is_idle:
                return []
            self.is_idle = True
            return [WatermarkStatus.IDLE]
        out: list[WatermarkEvent] = []
        if self.is_idle:
            self.is_idle = False
            out.append(WatermarkStatus.ACTIVE)
        low = min(active)
        if low > self.watermark:
            self.watermark = low
            out.append(Watermark(low))
        return out
