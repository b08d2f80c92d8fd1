"""Triggers: when a window's contents are emitted (FIRE) and/or dropped (PURGE).

A trigger is consulted for every element added to a window and for every timer it registered,
and answers with a `TriggerResult`. It talks to the window operator only through a small
`TriggerContext`: the current times, timer (de)registration for the window at hand, and state
scoped to the current key and window. That keeps triggers plain objects, testable with a
dict-backed context, while the operator binds the context to its timer service and backend.

Merging windows (sessions) need triggers that can merge: `on_merge` re-registers timers for
the merged window and merges the trigger's own state (`merge_partitioned_state`).
"""

from __future__ import annotations

import enum
import operator
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol

from streamsnap.errors import ConfigurationError
from streamsnap.state.descriptors import ReducingStateDescriptor, StateDescriptor

if TYPE_CHECKING:
    from streamsnap.time.windows import Window


class TriggerResult(enum.Enum):
    """(fire, purge): emit the window's contents, and/or clear them."""

    CONTINUE = (False, False)
    FIRE = (True, False)
    PURGE = (False, True)
    FIRE_AND_PURGE = (True, True)

    @property
    def is_fire(self) -> bool:
        return self.value[0]

    @property
    def is_purge(self) -> bool:
        return self.value[1]


class TriggerContext(Protocol):
    """What the window operator offers a trigger, for the current key and window."""

    def current_watermark(self) -> int:
        """The operator's current event-time watermark (epoch ms)."""

    def current_processing_time(self) -> int:
        """The operator's clock (epoch ms)."""

    def register_event_time_timer(self, time: int) -> None:
        """Call `on_event_time` when the watermark passes `time` (epoch ms)."""

    def register_processing_time_timer(self, time: int) -> None:
        """Call `on_processing_time` when the clock reaches `time` (epoch ms)."""

    def delete_event_time_timer(self, time: int) -> None:
        """Delete the event-time timer at `time` (epoch ms) for this key and window."""

    def delete_processing_time_timer(self, time: int) -> None:
        """Delete the processing-time timer at `time` (epoch ms) for this key and window."""

    def get_partitioned_state(self, descriptor: StateDescriptor) -> Any:
        """Keyed state of the trigger, scoped to the current key and window."""
        ...


class OnMergeContext(TriggerContext, Protocol):
    def merge_partitioned_state(self, descriptor: StateDescriptor) -> None:
        """Fold the merged windows' state of `descriptor` into the result window's."""
        ...


class Trigger(ABC):
    """Decides, per window, when to emit and when to drop its contents."""

    @abstractmethod
    def on_element(self, element: Any, timestamp: int | None, window: Window,
                   ctx: TriggerContext) -> TriggerResult:
        """An element with event `timestamp` (epoch ms, None by processing time) entered `window`:
        register timers through `ctx` and say whether to fire/purge now.
        """

    @abstractmethod
    def on_event_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        """An event-time timer this trigger registered for `window` is due."""

    @abstractmethod
    def on_processing_time(self, time: int, window: Window, ctx: TriggerContext
                           ) -> TriggerResult:
        """A processing-time timer this trigger registered for `window` is due."""

    @abstractmethod
    def clear(self, window: Window, ctx: TriggerContext) -> None:
        """The window is gone: delete its timers and trigger state."""

    def can_merge(self) -> bool:
        """Whether this trigger supports merging (session) windows (then it implements `on_merge`)."""
        return False

    def on_merge(self, window: Window, ctx: OnMergeContext) -> None:
        """Windows merged into `window`: re-register the timers it needs (merging triggers only)."""
        raise ConfigurationError(
            f"{type(self).__name__} cannot be used with merging (session) windows; use a "
            f"trigger that supports merging, e.g. EventTimeTrigger or CountTrigger")


class EventTimeTrigger(Trigger):
    """Fires once the watermark passes the end of the window (the event-time default)."""

    def on_element(self, element, timestamp, window, ctx):
        if window.max_timestamp <= ctx.current_watermark():
            return TriggerResult.FIRE       # a late element within the allowed lateness
        ctx.register_event_time_timer(window.max_timestamp)
        return TriggerResult.CONTINUE

    def on_event_time(self, time, window, ctx):
        return TriggerResult.FIRE if time == window.max_timestamp else TriggerResult.CONTINUE

    def on_processing_time(self, time, window, ctx):
        return TriggerResult.CONTINUE

    def clear(self, window, ctx):
        ctx.delete_event_time_timer(window.max_timestamp)

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window, ctx):
        # No timer for a merged window the watermark already passed: it fires on its elements.
        if window.max_timestamp > ctx.current_watermark():
            ctx.register_event_time_timer(window.max_timestamp)


class ProcessingTimeTrigger(Trigger):
    """Fires when the operator's clock passes the end of the window."""

    def on_element(self, element, timestamp, window, ctx):
        ctx.register_processing_time_timer(window.max_timestamp)
        return TriggerResult.CONTINUE

    def on_event_time(self, time, window, ctx):
        return TriggerResult.CONTINUE

    def on_processing_time(self, time, window, ctx):
        return TriggerResult.FIRE

    def clear(self, window, ctx):
        ctx.delete_processing_time_timer(window.max_timestamp)

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window, ctx):
        if window.max_timestamp > ctx.current_processing_time():
            ctx.register_processing_time_timer(window.max_timestamp)


class NeverTrigger(Trigger):
    """Never fires (the default of GlobalWindows, which need a trigger of their own)."""

    def on_element(self, element, timestamp, window, ctx):
        return TriggerResult.CONTINUE

    def on_event_time(self, time, window, ctx):
        return TriggerResult.CONTINUE

    def on_processing_time(self, time, window, ctx):
        return TriggerResult.CONTINUE

    def clear(self, window, ctx):
        """Registers nothing, so there is nothing to clear."""

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window, ctx):
        """Nothing to merge."""


class CountTrigger(Trigger):
    """Fires every `count` elements of a window (the count is trigger state, checkpointed)."""

    COUNT = ReducingStateDescriptor("_trigger.count", operator.add)

    def __init__(self, count: int):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigurationError(f"CountTrigger.of(count): count must be an int >= 1, got "
                                     f"{count!r}")
        self.count = count

    @classmethod
    def of(cls, count: int) -> CountTrigger:
        """Fire when a window holds `count` elements (int >= 1), e.g. `CountTrigger.of(100)`."""
        return cls(count)

    def on_element(self, element, timestamp, window, ctx):
        seen = ctx.get_partitioned_state(self.COUNT)
        seen.add(1)
        if seen.get() >= self.count:
            seen.clear()
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def on_event_time(self, time, window, ctx):
        return TriggerResult.CONTINUE

    def on_processing_time(self, time, window, ctx):
        return TriggerResult.CONTINUE

    def clear(self, window, ctx):
        ctx.get_partitioned_state(self.COUNT).clear()

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window, ctx):
        ctx.merge_partitioned_state(self.COUNT)


class PurgingTrigger(Trigger):
    """Another trigger whose every FIRE also purges the window."""

    def __init__(self, inner: Trigger):
        if not isinstance(inner, Trigger):
            raise ConfigurationError(f"PurgingTrigger.of(trigger): trigger must be a Trigger, "
                                     f"got {inner!r}")
        self.inner = inner

    @classmethod
    def of(cls, inner: Trigger) -> PurgingTrigger:
        """`inner`, with each FIRE turned into FIRE_AND_PURGE (the window's contents are dropped after firing)."""
        return cls(inner)

    @staticmethod
    def _purging(result: TriggerResult) -> TriggerResult:
        return TriggerResult.FIRE_AND_PURGE if result.is_fire else result

    def on_element(self, element, timestamp, window, ctx):
        return self._purging(self.inner.on_element(element, timestamp, window, ctx))

    def on_event_time(self, time, window, ctx):
        return self._purging(self.inner.on_event_time(time, window, ctx))

    def on_processing_time(self, time, window, ctx):
        return self._purging(self.inner.on_processing_time(time, window, ctx))

    def clear(self, window, ctx):
        self.inner.clear(window, ctx)

    def can_merge(self) -> bool:
        return self.inner.can_merge()

    def on_merge(self, window, ctx):
        self.inner.on_merge(window, ctx)
