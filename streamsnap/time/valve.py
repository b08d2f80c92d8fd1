"""A task's watermark from its input channels (Flink's StatusWatermarkValve).

Each input channel carries its upstream subtask's watermarks and ACTIVE/IDLE status in band.
The task may only advance event time to the minimum over the channels that can still send
older data, so:

* an IDLE channel is excluded from the minimum (it would otherwise stall the task forever);
  its watermarks are ignored while it is idle;
* a channel that becomes ACTIVE again rejoins the minimum only once its watermark has caught up
  with the task's current watermark ("aligned"): until then it cannot drag the output back,
  because emitted watermarks never decrease;
* when the last active channel goes idle, the task goes IDLE; if that channel was the one
  holding the watermark, the highest channel watermark is flushed first, since no remaining
  channel can still deliver anything older;
* a channel that ended (end of partition) never sends again and no longer holds anything back.

Sans-I/O: each `input_*` call returns the events to forward downstream (a `Watermark` to
advance timers with, or a `WatermarkStatus`), in order; only strictly increasing watermarks.
"""

from __future__ import annotations

from streamsnap.runtime.events import Watermark
from streamsnap.time.watermarks import MIN_WATERMARK, WatermarkEvent, WatermarkStatus


class _Channel:
    __slots__ = ("aligned", "finished", "idle", "watermark")

    def __init__(self) -> None:
        self.watermark = MIN_WATERMARK
        self.idle = False
        self.aligned = True     # counted in the minimum: active and caught up
        self.finished = False

    @property
    def live_active(self) -> bool:
        return not (self.idle or self.finished)


class StatusWatermarkValve:
    """Combines the watermarks and statuses of `num_channels` input channels of one input."""

    def __init__(self, num_channels: int):
        if isinstance(num_channels, bool) or not isinstance(num_channels, int) \
                or num_channels < 1:
            raise ValueError(f"a valve needs at least one channel, got {num_channels!r}")
        self._channels = [_Channel() for _ in range(num_channels)]
        self.watermark = MIN_WATERMARK
        self.status = WatermarkStatus.ACTIVE

    @property
    def num_channels(self) -> int:
        return len(self._channels)

    @property
    def is_finished(self) -> bool:
        return all(c.finished for c in self._channels)

    def channel_watermark(self, channel: int) -> int:
        return self._channels[channel].watermark

    def input_watermark(self, channel: int, timestamp: int) -> list[WatermarkEvent]:
        c = self._channels[channel]
        if self.status.is_idle or not c.live_active or timestamp <= c.watermark:
            return []
        # Only the channel at the minimum, or one joining the minimum, can move it.
        was_min = c.aligned and c.watermark == self.watermark
        c.watermark = timestamp
        joins = not c.aligned and timestamp >= self.watermark
        if joins:
            c.aligned = True
        return self._advance_min() if was_min or joins else []

    def input_watermark_status(self, channel: int, status: WatermarkStatus
                               ) -> list[WatermarkEvent]:
        c = self._channels[channel]
        if c.finished or c.idle == status.is_idle:
            return []
        if status.is_idle:
            c.idle = True
            return self._leave(c)
        c.idle = False
        c.aligned = c.watermark >= self.watermark
        if self.status.is_idle:
            self.status = WatermarkStatus.ACTIVE
            return [WatermarkStatus.ACTIVE]
        return []

    def input_end_of_partition(self, channel: int) -> list[WatermarkEvent]:
        """The channel is closed; it stops holding back the watermark."""
        c = self._channels[channel]
        if c.finished:
            return []
        was_idle = c.idle
        c.finished = True
        if was_idle or all(x.finished for x in self._channels):
            return []
        return self._leave(c)

    def _leave(self, c: _Channel) -> list[WatermarkEvent]:
        """`c` stopped counting (idle or finished) while it was active."""
        held_back = c.aligned and c.watermark == self.watermark
        c.aligned = False
        if any(x.live_active for x in self._channels):
            return self._advance_min() if held_back else []
        out: list[WatermarkEvent] = []
        if c.watermark == self.watermark:
            highest = max(x.watermark for x in self._channels if not x.finished)
            if highest > self.watermark:
                self.watermark = highest
                out.append(Watermark(highest))
        self.status = WatermarkStatus.IDLE
        out.append(WatermarkStatus.IDLE)
        return out

    def _advance_min(self) -> list[WatermarkEvent]:
        low = min((c.watermark for c in self._channels if c.aligned), default=None)
        if low is None or low <= self.watermark:
            return []
        self.watermark = low
        return [Watermark(low)]
