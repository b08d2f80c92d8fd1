"""A task's event time from all its input channels, across its logical inputs.

One `StatusWatermarkValve` per logical input (a one-input task, unions included, has one; a
two-input operator has two) turns its channels' watermarks and statuses into the input's; with
several inputs a `CombinedWatermark` takes the minimum over the non-idle ones, as a two-input
operator's event time is. An input whose channels have all ended leaves the combination: it can
never deliver anything older, so it must not hold the other input back — even when it ended
without the end-of-time watermark (a source stopped without draining, say).

Sans-I/O: every call returns the events to hand to the operators, in order.
"""

from __future__ import annotations

from streamsnap.time.combined import CombinedWatermark
from streamsnap.time.valve import StatusWatermarkValve
from streamsnap.time.watermarks import WatermarkEvent, WatermarkStatus


class InputWatermarks:
    """`input_of[i]`: the logical input of channel i (inputs numbered from 0, none empty)."""

    def __init__(self, input_of: list[int]):
        num_inputs = max(input_of, default=-1) + 1
        sizes = [input_of.count(k) for k in range(num_inputs)]
        if not all(sizes):
            raise ValueError(f"input_of {input_of} leaves a logical input without channels")
        self.valves = [StatusWatermarkValve(n) for n in sizes]
        self._input_of = list(input_of)
        # Channel i is channel _index[i] of its input's valve.
        seen = [0] * num_inputs
        self._index: list[int] = []
        for k in input_of:
            self._index.append(seen[k])
            seen[k] += 1
        self._combined = CombinedWatermark(range(num_inputs)) if num_inputs > 1 else None

    def input_of(self, channel: int) -> int:
        return self._input_of[channel]

    def on_watermark(self, channel: int, timestamp: int) -> list[WatermarkEvent]:
        valve = self.valves[self._input_of[channel]]
        return self._combine(channel, valve.input_watermark(self._index[channel], timestamp))

    def on_status(self, channel: int, status: WatermarkStatus) -> list[WatermarkEvent]:
        valve = self.valves[self._input_of[channel]]
        return self._combine(channel, valve.input_watermark_status(self._index[channel], status))

    def on_end_of_partition(self, channel: int) -> list[WatermarkEvent]:
        part = self._input_of[channel]
        valve = self.valves[part]
        out = self._combine(channel, valve.input_end_of_partition(self._index[channel]))
        combined = self._combined
        if combined is not None and valve.is_finished and part in combined.parts and len(combined.parts) > 1:
            out += combined.remove(part)
        return out

    def _combine(self, channel: int, events: list[WatermarkEvent]) -> list[WatermarkEvent]:
        if self._combined is None or not events:
            return events
        part = self._input_of[channel]
        if part not in self._combined.parts:
            return []
        out: list[WatermarkEvent] = []
        for event in events:
            out += self._combined.apply(part, event)
        return out


__all__ = ["InputWatermarks"]
