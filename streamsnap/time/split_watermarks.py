"""Per-split watermarks inside a source (FLIP-27's WatermarkOutputMultiplexer).

A source subtask reads several splits (partitions, files) whose data progress independently.
If it ran one generator over the interleaved records, a fast split would push the watermark
past events a slow split has yet to deliver, and those would all be late. So each split gets
its own generator (and idleness detector), and the source's watermark is the minimum over the
splits that are not idle: one slow split holds the source back, an empty one does not.
"""

from __future__ import annotations

from collections.abc import Hashable

from streamsnap.clock import Clock, SystemClock
from streamsnap.time.combined import CombinedWatermark
from streamsnap.time.watermarks import (Timestamps, WatermarkEvent, WatermarkGenerator,
                                        WatermarkStrategy)


class _SplitOutput:
    """A split's WatermarkOutput: writes into the combination, collecting what it emits."""

    __slots__ = ("_combined", "_split", "events")

    def __init__(self, combined: CombinedWatermark, split: Hashable, events: list):
        self._combined, self._split, self.events = combined, split, events

    def emit_watermark(self, timestamp: int) -> None:
        self.events += self._combined.set_idle(self._split, False)
        self.events += self._combined.update(self._split, timestamp)

    def mark_idle(self) -> None:
        self.events += self._combined.set_idle(self._split, True)

    def mark_active(self) -> None:
        self.events += self._combined.set_idle(self._split, False)


class SplitWatermarks:
    """The watermark of one source subtask over its splits; calls return downstream events.

    The shell calls `add_split` when a split is assigned, `on_batch` after emitting each batch
    read from a split (send the returned events after the batch), `on_periodic_emit` every
    watermark interval, and `finish_split` when a split is exhausted. With no split at all the
    source emits nothing (the shell decides about end of input).
    """

    def __init__(self, strategy: WatermarkStrategy, clock: Clock | None = None):
        self._strategy = strategy
        self._clock = clock or SystemClock()
        self._combined = CombinedWatermark()
        self._generators: dict[Hashable, WatermarkGenerator] = {}

    @property
    def watermark(self) -> int:
        return self._combined.watermark

    @property
    def is_idle(self) -> bool:
        return self._combined.is_idle

    @property
    def splits(self) -> list[Hashable]:
        return list(self._generators)

    def add_split(self, split: Hashable) -> None:
        if split in self._generators:
            raise ValueError(f"split {split!r} was already added")
        self._generators[split] = self._strategy.create_watermark_generator(self._clock)
        self._combined.add(split)

    def finish_split(self, split: Hashable) -> list[WatermarkEvent]:
        """The split has no more data: it stops holding the source's watermark back."""
        del self._generators[split]
        return self._combined.remove(split)

    def on_batch(self, split: Hashable, timestamps: Timestamps) -> list[WatermarkEvent]:
        """Records of `split` were emitted with these timestamps (vectorized, no per-row Python
        for the built-in generators). A split with records is active again at once, so the
        others cannot push the watermark past its data before the next periodic emit."""
        events: list[WatermarkEvent] = []
        output = _SplitOutput(self._combined, split, events)
        if len(timestamps):
            output.mark_active()
        self._generators[split].on_batch(timestamps, output)
        return events

    def on_event(self, split: Hashable, timestamp: int) -> list[WatermarkEvent]:
        """One record of `split` (per-row sources)."""
        events: list[WatermarkEvent] = []
        output = _SplitOutput(self._combined, split, events)
        output.mark_active()
        self._generators[split].on_event(timestamp, output)
        return events

    def on_periodic_emit(self) -> list[WatermarkEvent]:
        """The watermark interval elapsed: every split's generator may emit or go idle."""
        events: list[WatermarkEvent] = []
        for split, generator in self._generators.items():
            generator.on_periodic_emit(_SplitOutput(self._combined, split, events))
        return events
