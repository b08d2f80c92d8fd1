"""Turning a WatermarkStrategy into in-band watermarks where timestamps are assigned.

Two operators assign timestamps: a source given `watermark_strategy=` and the operator of
`assign_timestamps_and_watermarks`. Both hand their batches to a `WatermarkEmitter`, which
keeps one generator per split (`SplitWatermarks`; the assigner operator has a single part),
feeds it each batch's timestamps (vectorized), and emits what it decides through the
operator's output — after the batch, so a watermark never overtakes the records it covers.
Which splits exist is asked of the operator at start and before every periodic emission
(splits start and finish between batches; asking per batch would cost per batch).
Periodic emission (Flink's auto-watermark interval) runs from the task's timer queue, on the
mailbox thread, so generators are never touched by two threads.

The emitter also owns "end of time": `end_of_time()` emits the maximum watermark once and
stops all further emission (bounded input finished, or a draining stop-with-savepoint).
Downstream only ever sees strictly increasing watermarks, and a status only when it changes;
a part that sends data after being idle is announced ACTIVE again first.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from streamsnap.runtime.events import Watermark, WatermarkStatus
from streamsnap.runtime.operators.timestamps_and_watermarks import batch_timestamps
from streamsnap.time.split_watermarks import SplitWatermarks
from streamsnap.time.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    NoWatermarksGenerator,
    WatermarkStrategy,
)


def generates_watermarks(strategy: WatermarkStrategy | None) -> bool:
    """False for no strategy and for `WatermarkStrategy.no_watermarks()`."""
    return strategy is not None and strategy.generator_factory is not NoWatermarksGenerator


class WatermarkEmitter:
    """Watermarks of one operator subtask. `output` is the operator's chain Output.

    strategy: the WatermarkStrategy, or None (no event time: only `end_of_time` emits).
    timers / clock: the task's timer queue and clock (periodic emission); interval in seconds,
      0 disables periodic emission (generators then only emit from `on_batch`).
    splits: returns the ids of the parts (splits) read now; called at `start` and before each
      periodic emission.
    """

    def __init__(self, strategy: WatermarkStrategy | None, operator_name: str, output: Any,
                 timers: Any, clock: Any, interval: float,
                 splits: Callable[[], list[Hashable]] | None = None):
        self._enabled = generates_watermarks(strategy)
        self._assigner = strategy.timestamp_assigner if strategy is not None else None
        self._operator = operator_name
        self._output = output
        self._timers = timers
        self._interval = interval
        self._active_splits = splits
        self._splits = SplitWatermarks(strategy, clock) if self._enabled else None
        self.watermark = MIN_WATERMARK      # the last watermark emitted
        self._idle = False                  # the last status emitted downstream
        self.ended = False

    @property
    def enabled(self) -> bool:
        return self._enabled and not self.ended

    # ---------------------------------------------------------------- splits
    def sync_splits(self, active: list[Hashable]) -> None:
        """The parts currently read: new ones start holding the watermark back, finished ones
        stop; with no part at all the output goes idle (it would hold everyone back)."""
        if not self.enabled:
            return
        known = set(self._splits.splits)
        wanted = set(active)
        for split in active:
            if split not in known:
                self._splits.add_split(split)
        for split in known - wanted:
            self._emit(self._splits.finish_split(split))
        if not wanted:
            self._emit([WatermarkStatus.IDLE])

    # ---------------------------------------------------------------- records
    def timestamps(self, batch):
        """The batch's event timestamps (int64 ms), or None when no watermarks are generated.

        Call before emitting the batch, so bad timestamps fail before any of it leaves."""
        if not self.enabled:
            return None
        return batch_timestamps(batch, self._assigner, self._operator)

    def on_timestamps(self, split: Hashable, timestamps) -> None:
        """The batch with these timestamps (from `timestamps`) was emitted from `split`."""
        if timestamps is None or not self.enabled:
            return
        if split not in self._splits.splits:
            self._splits.add_split(split)
        if len(timestamps) and self._idle:
            self._emit([WatermarkStatus.ACTIVE])
        self._emit(self._splits.on_batch(split, timestamps))

    # ---------------------------------------------------------------- time
    def start(self) -> None:
        """Register the current splits and begin periodic emission (the operator is open)."""
        if not self.enabled:
            return
        if self._active_splits is not None:
            self.sync_splits(self._active_splits())
        if self._interval > 0:
            self._timers.call_later(self._interval, self._on_periodic)

    def _on_periodic(self) -> None:
        if not self.enabled:
            return
        if self._active_splits is not None:
            self.sync_splits(self._active_splits())
        self._emit(self._splits.on_periodic_emit())
        self._timers.call_later(self._interval, self._on_periodic)

    def end_of_time(self) -> None:
        """Emit the maximum watermark (every event-time timer fires) and stop emitting."""
        if self.ended:
            return
        self.ended = True
        if self._idle:
            self._idle = False
            self._output.emit_watermark_status(WatermarkStatus.ACTIVE)
        if self.watermark < MAX_WATERMARK:
            self.watermark = MAX_WATERMARK
            self._output.emit_watermark(MAX_WATERMARK)

    def _emit(self, events: list) -> None:
        output = self._output
        for event in events:
            if isinstance(event, Watermark):
                if event.timestamp <= self.watermark:
                    continue
                if self._idle:
                    self._idle = False
                    output.emit_watermark_status(WatermarkStatus.ACTIVE)
                self.watermark = event.timestamp
                output.emit_watermark(event.timestamp)
            elif event.is_idle != self._idle:
                self._idle = event.is_idle
                output.emit_watermark_status(event)
