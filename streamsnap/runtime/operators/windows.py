"""The window operator of `keyed.window(assigner)`: Flink's WindowOperator on keyed state.

Per element: the assigner names its windows, the element is folded into each window's contents,
the trigger decides whether the window fires (emit) and/or purges (drop contents). Timers —
the trigger's and the cleanup timer at the end of the window plus the allowed lateness — run
through an `InternalTimerService` whose namespace is the window.

Everything lives in the keyed state backend, so windows and their timers are part of every
checkpoint and savepoint and move with their key group on rescale. The backend has no
namespaces, so per key:

* ``_window.contents`` (MapState): encoded window → contents (a reduced row, an accumulator,
  or the list of rows for a ProcessWindowFunction without pre-aggregation);
* ``_window.sessions`` (ValueState, merging assigners only): the key's `MergingWindowSet` as
  ``[start, end, state start, state end]`` quadruples;
* ``_window.trigger.<name>`` (MapState): a trigger's own state, per window;
* the timers, in the timer service's MapStates.

A stored value may still be read by a snapshot whose asynchronous part is running, so `add`
(which may change it in place: appending to a window's rows stays O(1), and user functions
change their accumulators) gets a copy while such a snapshot exists, and the result is always
put back — which is also what a backend that serializes on write needs.
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass
from typing import Any


from streamsnap.errors import ConfigurationError, UsageError
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.batches import Batch, rows_of
from streamsnap.runtime.operators.base import OperatorContext, OperatorFactory, _call_hook, user_error
from streamsnap.runtime.operators.keyed import ProcessingTimeWakeups, current_millis, keys_of
from streamsnap.runtime.operators.process import ProcessOperator
from streamsnap.runtime.operators.timestamps_and_watermarks import batch_timestamps
from streamsnap.state.descriptors import (ListStateDescriptor, MapStateDescriptor,
                                          ReducingStateDescriptor, StateDescriptor,
                                          ValueStateDescriptor)
from streamsnap.time.lateness import cleanup_time, is_element_late, is_window_late
from streamsnap.time.merging import MergingWindowSet
from streamsnap.time.timers import InternalTimerService, Timer, TimeDomain
from streamsnap.time.triggers import Trigger, TriggerResult
from streamsnap.time.watermarks import MAX_WATERMARK
from streamsnap.time.windows import (GLOBAL_WINDOW_NAMESPACE, TIME_WINDOW_NAMESPACE,
                                     GlobalWindows, TimeWindow, Window, WindowAssigner)

CONTENTS = "_window.contents"
SESSIONS = "_window.sessions"
TIMERS = "window-timers"


# ---------------------------------------------------------------------------- window contents
class WindowContents:
    """How elements accumulate in a window: `add` and `merge` return the contents to store
    (and may change what they are given, see the module docstring); `elements` is what a
    ProcessWindowFunction sees, `result` the row emitted without one."""

    kind = ""
    function: Any = None     # the user's reduce function or AggregateFunction (lifecycle hooks)

    def add(self, contents: Any, row: dict) -> Any:
        raise NotImplementedError

    def copy(self, contents: Any) -> Any:
        """A copy `add` may change without touching `contents`."""
        return deepcopy(contents)

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def elements(self, contents: Any) -> list:
        raise NotImplementedError

    def result(self, contents: Any) -> dict:
        """The row emitted when there is no window function."""
        raise NotImplementedError


class ReduceContents(WindowContents):
    kind = "reduce"

    def __init__(self, fn):
        self.fn = self.function = fn

    def add(self, contents, row):
        return dict(row) if contents is None else self.fn(contents, row)

    def merge(self, a, b):
        return self.fn(a, b)

    def elements(self, contents):
        return [contents]

    def result(self, contents):
        if type(contents) is not dict:
            raise UsageError(f"the reduce function returned {type(contents).__name__}; it must "
                            f"return a row (dict)")
        return dict(contents)    # the stored row stays in state until purged: emit a copy


class AggregateContents(WindowContents):
    kind = "aggregate"

    def __init__(self, aggregate):
        self.aggregate = self.function = aggregate

    def add(self, contents, row):
        acc = self.aggregate.create_accumulator() if contents is None else contents
        return self.aggregate.add(row, acc)

    def merge(self, a, b):
        return self.aggregate.merge(a, b)

    def elements(self, contents):
        return [self.aggregate.get_result(contents)]

    def result(self, contents):
        out = self.aggregate.get_result(contents)
        if type(out) is not dict:
            raise UsageError(f"{type(self.aggregate).__name__}.get_result returned "
                            f"{type(out).__name__}; return a row (dict), or pass a "
                            f"ProcessWindowFunction to turn the result into rows")
        return out


class ListContents(WindowContents):
    kind = "list"

    def add(self, contents, row):
        # In place: appending stays O(1); the operator hands in a copy while a snapshot runs.
        if contents is None:
            return [row]
        contents.append(row)
        return contents

    def copy(self, contents):
        return list(contents)   # the rows themselves are never changed, only the list

    def merge(self, a, b):
        return a + b

    def elements(self, contents):
        return list(contents)

    def result(self, contents):
        raise TypeError("a window holding all its rows needs a ProcessWindowFunction")


# ---------------------------------------------------------------------------- contexts
class WindowContext:
    """What a ProcessWindowFunction gets: the window (start/end), the key, the times, and
    side outputs (`output(tag, row)`)."""

    __slots__ = ("window", "current_key", "_operator")

    def __init__(self, operator: "WindowOperator"):
        self._operator = operator
        self.window: Window | None = None
        self.current_key: Any = None

    def current_watermark(self) -> int:
        return self._operator.timer_service.current_watermark

    def current_processing_time(self) -> int:
        return current_millis(self._operator.ctx.clock)

    def output(self, tag, row: dict) -> None:
        self._operator.context.output(tag, row)


class _WindowState:
    """A trigger's state for the current key and one window: an entry of a per-key MapState."""

    def __init__(self, store, descriptor: StateDescriptor, namespace):
        self._store = store
        self._descriptor = descriptor
        self._ns = namespace

    def _get(self, default=None):
        return self._store.get(self._ns, default)

    def _put(self, value) -> None:
        if value is None:
            self._store.remove(self._ns)
        else:
            self._store.put(self._ns, value)

    def clear(self) -> None:
        self._store.remove(self._ns)


class _WindowValueState(_WindowState):
    def value(self):
        return self._get(deepcopy(self._descriptor.default))

    def update(self, value) -> None:
        self._put(value)


class _WindowReducingState(_WindowState):
    def get(self):
        return self._get()

    def add(self, value) -> None:
        current = self._get()
        self._put(value if current is None else self._descriptor.reduce_function(current, value))


class _WindowListState(_WindowState):
    def get(self) -> list:
        return list(self._get(()))

    def add(self, value) -> None:
        self._put(list(self._get(())) + [value])

    def update(self, values) -> None:
        self._put(list(values) or None)


_WINDOW_STATES = {ValueStateDescriptor: _WindowValueState,
                  ReducingStateDescriptor: _WindowReducingState,
                  ListStateDescriptor: _WindowListState}


class WindowTriggerContext:
    """Binds a trigger to the operator for one (key, window): timers of the window's
    namespace, and trigger state scoped to the window (`TriggerContext` / `OnMergeContext`)."""

    def __init__(self, operator: "WindowOperator"):
        self._op = operator
        self.window: Window | None = None
        self.merged_windows: list[Window] = []

    def current_watermark(self) -> int:
        return self._op.timer_service.current_watermark

    def current_processing_time(self) -> int:
        return current_millis(self._op.ctx.clock)

    def register_event_time_timer(self, time: int) -> None:
        self._op.timer_service.register_event_time_timer(time, self.window)

    def register_processing_time_timer(self, time: int) -> None:
        self._op.timer_service.register_processing_time_timer(time, self.window)
        self._op._schedule_wakeup(time)

    def delete_event_time_timer(self, time: int) -> None:
        self._op.timer_service.delete_event_time_timer(time, self.window)

    def delete_processing_time_timer(self, time: int) -> None:
        self._op.timer_service.delete_processing_time_timer(time, self.window)

    def _store(self, descriptor: StateDescriptor):
        kind = _WINDOW_STATES.get(type(descriptor))
        if kind is None:
            raise ConfigurationError(
                f"trigger state '{descriptor.name}': window triggers may use Value, Reducing or "
                f"List state descriptors, got {type(descriptor).__name__}")
        store = self._op.keyed_backend.get_state(MapStateDescriptor(
            f"_window.trigger.{descriptor.name}", getattr(descriptor, "serializer", None)))
        return kind, store

    def get_partitioned_state(self, descriptor: StateDescriptor):
        kind, store = self._store(descriptor)
        return kind(store, descriptor, self._op.codec.encode(self.window))

    def merge_partitioned_state(self, descriptor: StateDescriptor) -> None:
        """Fold the merged windows' trigger state into the current (merge result) window's."""
        kind, store = self._store(descriptor)
        encode = self._op.codec.encode
        target = kind(store, descriptor, encode(self.window))
        for window in self.merged_windows:
            if window == self.window:
                continue
            source = kind(store, descriptor, encode(window))
            value = source._get()
            if value is None:
                continue
            if kind is _WindowReducingState:
                target.add(value)
            elif kind is _WindowListState:
                target._put(target.get() + list(value))
            else:
                raise ConfigurationError(
                    f"trigger state '{descriptor.name}' is a ValueState, which cannot be merged "
                    f"when session windows merge; use a ReducingStateDescriptor")
            source.clear()


# ---------------------------------------------------------------------------- the operator
class WindowOperator(ProcessingTimeWakeups, ProcessOperator):
    """Windows per key: contents, trigger, lateness and timers, all in keyed state."""

    def __init__(self, ctx: OperatorContext, key: KeySelector, assigner: WindowAssigner,
                 trigger: Trigger, allowed_lateness: int, contents: WindowContents,
                 window_function=None, late_tag: str | None = None, timestamps=None,
                 serializer=None):
        super().__init__(ctx, window_function, timestamps, keyed=True)
        self.key = key
        self.assigner = assigner
        self.trigger = trigger
        self.event_time = assigner.is_event_time
        self.allowed_lateness = allowed_lateness if self.event_time else 0
        self.contents_kind = contents
        self.window_function = window_function
        self.late_tag = late_tag
        self.codec = (GLOBAL_WINDOW_NAMESPACE if isinstance(assigner, GlobalWindows)
                      else TIME_WINDOW_NAMESPACE)
        self.timestamps = timestamps
        self.num_late_records_dropped = 0
        self.serializer = serializer
        self.timer_service: InternalTimerService | None = None
        self.contents = None
        self.sessions = None
        self.trigger_context = WindowTriggerContext(self)
        self.window_context = WindowContext(self)
        self._out: list = []

    def initialize_state(self) -> None:
        super().initialize_state()
        backend = self.keyed_backend
        self.contents = backend.get_state(MapStateDescriptor(CONTENTS, self.serializer))
        if self.assigner.is_merging:
            self.sessions = backend.get_state(ValueStateDescriptor(SESSIONS))
        # The restored backend already holds the timers: the service indexes them.
        self.timer_service = InternalTimerService(self.keyed_backend, TIMERS, self.codec)
        self._schedule_wakeup(self.timer_service.next_processing_time())

    def open(self) -> None:
        super().open()
        if self.contents_kind is not None:
            _call_hook(self.contents_kind.function, "open", self.runtime_context)

    def close(self) -> None:
        if self.contents_kind is not None:
            _call_hook(self.contents_kind.function, "close")
        super().close()

    # ------------------------------------------------------------------ elements
    def process(self, batch: Batch) -> None:
        rows, columns = rows_of(batch)
        n = len(rows)
        self.records_in += n
        if not n:
            return
        keys, key_groups = keys_of(self, batch, rows, columns=columns)
        if self.event_time:     # processing-time windows do not read event timestamps
            times = batch_timestamps(batch, self.timestamps, self.ctx.name).tolist()
        else:
            times = [None] * n
        now = current_millis(self.ctx.clock) if not self.event_time else None
        set_key = self.keyed_backend.set_current_key
        late: list = []
        for row, key, key_group, ts in zip(rows, keys, key_groups, times):
            set_key(key, key_group)
            try:
                if not self._process_element(row, key, ts, now) and ts is not None and \
                        is_element_late(ts, self.allowed_lateness,
                                        self.timer_service.current_watermark, self.event_time):
                    if self.late_tag is None:
                        self.num_late_records_dropped += 1
                    else:
                        late.append(row)
            except Exception as exc:
                raise user_error(self, row, exc) from None
        self._flush(late)

    def _process_element(self, row: dict, key, ts: int | None, now: int | None) -> bool:
        """Add `row` to its windows; False when every window was already late (skipped)."""
        windows = self.assigner.assign_windows(ts, now)
        watermark = self.timer_service.current_watermark
        accepted = False
        sessions = self._load_sessions() if self.sessions is not None else None
        for window in windows:
            if sessions is not None:
                window = sessions.add_window(window, self._merge)
                if is_window_late(window, self.allowed_lateness, watermark, self.event_time):
                    sessions.retire_window(window)
                    continue
                state_window = sessions.state_window(window)
            else:
                if is_window_late(window, self.allowed_lateness, watermark, self.event_time):
                    continue
                state_window = window
            accepted = True
            ns = self.codec.encode(state_window)
            contents = self.contents_kind.add(self._private(self.contents.get(ns)), row)
            self.contents.put(ns, contents)
            self.trigger_context.window = window
            result = self.trigger.on_element(row, ts, window, self.trigger_context)
            self._act(result, key, window, ns, contents)
            self._register_cleanup_timer(window)
        if sessions is not None:
            self._save_sessions(sessions)
        return accepted

    def _private(self, value):
        """A stored container handed to a user function that may change it in place: a copy
        while a snapshot may still be reading the stored one."""
        if value is None or value.__class__ in (int, float, str, bytes, bool):
            return value
        if getattr(self.keyed_backend, "_required_epoch", -1) >= 0:
            return self.contents_kind.copy(value)
        return value

    def _act(self, result: TriggerResult, key, window: Window, ns, contents) -> None:
        if result.is_fire and contents is not None:
            self._emit(key, window, contents)
        if result.is_purge:
            self.contents.remove(ns)

    def _emit(self, key, window: Window, contents) -> None:
        if self.window_function is None:
            self._out.append(self.contents_kind.result(contents))
            return
        context = self.window_context
        context.window, context.current_key = window, key
        result = self.window_function.process(key, context, self.contents_kind.elements(contents))
        if result is None:
            return
        if type(result) is dict:
            self._out.append(result)
            return
        for item in result:
            if type(item) is not dict:
                raise UsageError(f"{type(self.window_function).__name__}.process produced "
                                f"{type(item).__name__}; rows must be dicts")
            self._out.append(item)

    def _flush(self, late: list) -> None:
        out, self._out = self._out, []
        self.output.emit(out)
        if late:
            self.output.emit_side(self.late_tag, late)
        self._flush_side()

    # ------------------------------------------------------------------ merging windows
    def _load_sessions(self) -> MergingWindowSet:
        stored = self.sessions.value() or ()
        return MergingWindowSet(self.assigner, [(TimeWindow(a, b), TimeWindow(c, d))
                                                for a, b, c, d in stored])

    def _save_sessions(self, sessions: MergingWindowSet) -> None:
        pairs = [[w.start, w.end, s.start, s.end] for w, s in sessions.to_pairs()]
        self.sessions.update(pairs or None)

    def _merge(self, result: TimeWindow, merged: list[TimeWindow], state_window: TimeWindow,
               merged_state_windows: list[TimeWindow]) -> None:
        """Windows merged into `result`: move trigger state and timers, fold the contents."""
        if self.event_time and cleanup_time(result, self.allowed_lateness, True) <= \
                self.timer_service.current_watermark:
            raise RuntimeError(f"merging windows {merged} into {result} would create a window "
                               f"the watermark already passed")
        context = self.trigger_context
        context.window, context.merged_windows = result, merged
        self.trigger.on_merge(result, context)
        context.merged_windows = []
        for window in merged:
            if window == result:
                continue
            context.window = window
            self.trigger.clear(window, context)
            self._delete_cleanup_timer(window)
        target = self.codec.encode(state_window)
        folded = self._private(self.contents.get(target))
        for source in merged_state_windows:
            ns = self.codec.encode(source)
            contents = self.contents.get(ns)
            if contents is not None:
                folded = self._private(contents) if folded is None else \
                    self.contents_kind.merge(folded, contents)
                self.contents.remove(ns)
        if folded is not None:
            self.contents.put(target, folded)

    # ------------------------------------------------------------------ timers
    def _register_cleanup_timer(self, window: Window) -> None:
        at = cleanup_time(window, self.allowed_lateness, self.event_time)
        if at == MAX_WATERMARK:
            return      # a global window: kept until its trigger purges it
        if self.event_time:
            self.timer_service.register_event_time_timer(at, window)
        else:
            self.timer_service.register_processing_time_timer(at, window)
            self._schedule_wakeup(at)

    def _delete_cleanup_timer(self, window: Window) -> None:
        at = cleanup_time(window, self.allowed_lateness, self.event_time)
        if at == MAX_WATERMARK:
            return
        if self.event_time:
            self.timer_service.delete_event_time_timer(at, window)
        else:
            self.timer_service.delete_processing_time_timer(at, window)

    def _on_timer(self, timer: Timer) -> None:
        """A timer for (timer.key, timer.namespace): ask the trigger, clean up when due."""
        window = timer.namespace
        sessions = self._load_sessions() if self.sessions is not None else None
        if sessions is not None:
            state_window = sessions.state_window(window)
            if state_window is None:
                return      # the window merged into another one meanwhile
        else:
            state_window = window
        ns = self.codec.encode(state_window)
        context = self.trigger_context
        context.window = window
        if timer.domain is TimeDomain.EVENT_TIME:
            result = self.trigger.on_event_time(timer.timestamp, window, context)
        else:
            result = self.trigger.on_processing_time(timer.timestamp, window, context)
        self._act(result, timer.key, window, ns, self.contents.get(ns))
        if timer.timestamp == cleanup_time(window, self.allowed_lateness, self.event_time) and \
                (timer.domain is TimeDomain.EVENT_TIME) == self.event_time:
            self.contents.remove(ns)
            if sessions is not None:
                sessions.retire_window(window)
            context.window = window
            self.trigger.clear(window, context)
        if sessions is not None:
            self._save_sessions(sessions)

    def _fire_timers(self, timers) -> None:
        timer = None
        try:
            for timer in timers:
                self._on_timer(timer)
        except Exception as exc:
            raise user_error(self, f"<{timer.domain.value} timer {timer.timestamp} of window "
                                   f"{timer.namespace} of key {timer.key!r}>"
                             if timer is not None else "<timer>", exc) from None
        self._flush([])

    def process_watermark(self, timestamp: int) -> None:
        self._fire_timers(self.timer_service.advance_watermark(timestamp))
        self.output.emit_watermark(timestamp)


@dataclass(frozen=True)
class WindowOperatorFactory(OperatorFactory):
    """Picklable description of a window operator (built per subtask)."""

    key: KeySelector
    assigner: WindowAssigner
    trigger: Trigger
    allowed_lateness: int
    contents: WindowContents
    window_function: Any = None
    late_tag: str | None = None
    timestamps: Any = None
    serializer: Any = None
    keyed = True

    def create(self, ctx: OperatorContext) -> WindowOperator:
        return WindowOperator(ctx, self.key, self.assigner, self.trigger, self.allowed_lateness,
                              self.contents, self.window_function, self.late_tag,
                              self.timestamps, self.serializer)

    def describe(self) -> str:
        return f"window({type(self.assigner).__name__}).{self.contents.kind}"


__all__ = ["WindowOperator", "WindowOperatorFactory", "WindowContext", "WindowContents",
           "ReduceContents", "AggregateContents", "ListContents", "WindowTriggerContext"]
