"""The windowed join: `a.join(b).where(k1).equal_to(k2).window(assigner).apply(fn)`.

Built on the WindowOperator rather than beside it, so assigners (session merging included),
triggers, lateness, window state in checkpoints and timers behave exactly as for one-input
windows. The operator has two inputs; each row is stored in its window as a `[side, row]`
pair, keyed by its own side's key selector and timed by its own side's timestamp assigner.
When a window fires, `fn(left, right)` runs for every pair of one left and one right row of
that key and window (an inner join: a window with rows of one side only emits nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamsnap.runtime.batches import Batch, rows_of
from streamsnap.runtime.operators.base import OperatorFactory, StreamOperator, _call_hook, _extend_results, user_error
from streamsnap.runtime.operators.keyed import current_millis, keys_of
from streamsnap.runtime.operators.timestamps_and_watermarks import batch_timestamps
from streamsnap.runtime.operators.windows import ListContents, WindowOperator
from streamsnap.time.lateness import is_element_late


class JoinWindowFunction:
    """Turns a fired window's [side, row] pairs into the user's join calls."""

    def __init__(self, join):
        self.join = join
        self._call = join if not callable(getattr(join, "join", None)) else join.join

    def open(self, ctx) -> None:
        _call_hook(self.join, "open", ctx)

    def close(self) -> None:
        _call_hook(self.join, "close")

    def process(self, key, context, elements: list) -> list:
        lefts = [row for side, row in elements if side == 0]
        rights = [row for side, row in elements if side == 1]
        out: list = []
        for left in lefts:
            for right in rights:
                _extend_results(out, self._call(left, right))
        return out


class WindowJoinOperator(WindowOperator):
    two_inputs = True

    def __init__(self, ctx, keys: tuple, timestamps: tuple, assigner, trigger, allowed_lateness: int, join):
        super().__init__(ctx, keys[0], assigner, trigger, allowed_lateness, ListContents(),
                         JoinWindowFunction(join), None, timestamps[0])
        self.keys = keys
        self.side_timestamps = timestamps

    def process_input(self, index: int, batch: Batch) -> None:
        rows, columns = rows_of(batch)
        n = len(rows)
        if not n:
            return
        self.records_in += n
        keys, groups = keys_of(self, batch, rows, self.keys[index], columns)
        if self.event_time:
            times = batch_timestamps(batch, self.side_timestamps[index], self.ctx.name).tolist()
        else:
            times = [None] * n
        now = current_millis(self.ctx.clock) if not self.event_time else None
        set_key = self.keyed_backend.set_current_key
        for row, key, group, ts in zip(rows, keys, groups, times):
            set_key(key, group)
            try:
                if not self._process_element([index, row], key, ts, now) and ts is not None and \
                        is_element_late(ts, self.allowed_lateness, self.timer_service.current_watermark,
                                        self.event_time):
                    self.num_late_records_dropped += 1
            except Exception as exc:
                raise user_error(self, row, exc) from None
        self._flush([])


@dataclass(frozen=True)
class WindowJoinOperatorFactory(OperatorFactory):
    keys: tuple
    timestamps: tuple
    assigner: Any
    trigger: Any
    allowed_lateness: int
    join: Any
    keyed = True

    def create(self, ctx) -> StreamOperator:
        return WindowJoinOperator(ctx, self.keys, self.timestamps, self.assigner, self.trigger,
                                  self.allowed_lateness, self.join)

    def describe(self) -> str:
        return f"window_join({type(self.assigner).__name__})"
