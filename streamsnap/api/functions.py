"""What user code implements and what it is handed: functions and their contexts.

Plain callables work for `map`/`filter`/`flat_map`. A class gains lifecycle hooks by defining
them (duck typing, as Python users expect): `open(ctx)`/`close()`; Flink's CheckpointedFunction
(`initialize_state(ctx)`/`snapshot_state(ctx)`) to keep operator state; CheckpointListener
(`notify_checkpoint_complete(id)`/`notify_checkpoint_aborted(id)`) to act on completed
checkpoints. `KeyedProcessFunction` is the stateful per-key function; its state lives in the
keyed state backend, scoped to the current key and snapshotted by key group, and so do its
timers (`ctx.timer_service()`, `on_timer(timestamp, ctx)`), which is why only keyed streams
have them. `ctx.output(tag, row)` sends a row to a side output (`OutputTag`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable

from streamsnap.errors import UsageError
from streamsnap.state.descriptors import (
    ListStateDescriptor, MapStateDescriptor, ReducingStateDescriptor, ValueStateDescriptor,
)


class RuntimeContext:
    """Where a function runs: its operator, subtask and (for keyed functions) keyed state."""

    def __init__(self, *, operator_name: str, operator_uid: str, subtask_index: int,
                 parallelism: int, max_parallelism: int, attempt: int, job_id: str,
                 keyed_backend=None, operator_backend=None):
        self.operator_name = operator_name
        self.operator_uid = operator_uid
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.attempt = attempt
        self.job_id = job_id
        self._keyed = keyed_backend
        self._operator = operator_backend
        self._batch_timers = None   # set by the operator of a KeyedBatchFunction

    def timer_service(self):
        """A KeyedBatchFunction's timers (api/batch_timers.py): register arrays of times for the
        batch's keys; due ones come back in `on_timers(timers, ctx)`. Per-row functions use the
        `ctx.timer_service()` of `process_element` instead."""
        if self._batch_timers is None:
            raise RuntimeError(
                f"operator '{self.operator_name}': the runtime context has timers only for a KeyedBatchFunction "
                f"(keyed.process_batches); a KeyedProcessFunction registers them with ctx.timer_service() in "
                f"process_element, for the current key")
        return self._batch_timers

    def get_state(self, descriptor: ValueStateDescriptor | ListStateDescriptor | MapStateDescriptor
                  | ReducingStateDescriptor):
        """Keyed state for `descriptor`, scoped to the key of the record being processed."""
        if self._keyed is None:
            raise RuntimeError(
                f"operator '{self.operator_name}' is not keyed, so it has no keyed state; "
                f"call key_by(...) before process(...) to use get_state")
        return self._keyed.get_state(descriptor)

    def get_list_state(self, name: str, serializer=None):
        """Operator list state: on rescale its elements are split evenly over the subtasks."""
        return self._operator_backend().get_list_state(name, serializer)

    def get_union_list_state(self, name: str, serializer=None):
        """Operator list state that every subtask receives whole on restore."""
        return self._operator_backend().get_union_list_state(name, serializer)

    def _operator_backend(self):
        if self._operator is None:
            raise RuntimeError(f"operator '{self.operator_name}' has no operator state backend")
        return self._operator


@dataclass(frozen=True)
class FunctionSnapshotContext:
    """Given to `CheckpointedFunction.snapshot_state`: the checkpoint's id and its trigger time
    (`checkpoint_timestamp`, epoch seconds).
    """
    checkpoint_id: int
    checkpoint_timestamp: float


class FunctionInitializationContext:
    """Given to `initialize_state`: whether state was restored, and the state stores."""

    def __init__(self, is_restored: bool, runtime: RuntimeContext, restored_checkpoint_id: int | None = None):
        self.is_restored = is_restored
        self.restored_checkpoint_id = restored_checkpoint_id
        self._runtime = runtime

    def get_list_state(self, name: str, serializer=None):
        """Operator list state `name`: on rescale its elements are split evenly over the subtasks."""
        return self._runtime.get_list_state(name, serializer)

    def get_union_list_state(self, name: str, serializer=None):
        """Operator list state `name` that every subtask receives whole on restore."""
        return self._runtime.get_union_list_state(name, serializer)

    def get_state(self, descriptor):
        """Keyed state for `descriptor` (keyed operators only), as `RuntimeContext.get_state`."""
        return self._runtime.get_state(descriptor)


@dataclass(frozen=True)
class OutputTag:
    """Names a side output: `ctx.output(tag, row)` emits to it, `stream.get_side_output(tag)`
    reads it as a stream of its own."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            from streamsnap.errors import ConfigurationError
            raise ConfigurationError(f"OutputTag needs a non-empty name, e.g. OutputTag('late'), "
                                     f"got {self.name!r}")


class TimerService:
    """`ctx.timer_service()` of a keyed function: event-time and processing-time timers of the
    current key. Times are int epoch milliseconds; registering a time twice keeps one timer.
    """

    __slots__ = ("_internal", "_on_processing_timer", "_clock")

    def __init__(self, internal, on_processing_timer, clock=None):
        self._internal = internal                        # time.timers.InternalTimerService
        self._on_processing_timer = on_processing_timer  # makes the task wake up in time
        self._clock = clock      # the task's clock (a manual one in a test harness); None: wall

    def current_watermark(self) -> int:
        """The operator's event time: the last watermark it received (ms)."""
        return self._internal.current_watermark

    def current_processing_time(self) -> int:
        """Wall-clock time now, epoch milliseconds (the task's clock, which its processing-time
        timers fire by)."""
        return int((self._clock.wall() if self._clock is not None else time.time()) * 1000)

    def register_event_time_timer(self, timestamp: int) -> None:
        """Call `on_timer` once the watermark reaches `timestamp`."""
        self._internal.register_event_time_timer(timestamp)

    def register_processing_time_timer(self, timestamp: int) -> None:
        """Call `on_timer` once the wall clock reaches `timestamp` (epoch ms)."""
        self._internal.register_processing_time_timer(timestamp)
        self._on_processing_timer(int(timestamp))

    def delete_event_time_timer(self, timestamp: int) -> None:
        """Delete the current key's event-time timer at `timestamp` (epoch ms), if registered."""
        self._internal.delete_event_time_timer(timestamp)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        """Delete the current key's processing-time timer at `timestamp` (epoch ms), if registered."""
        self._internal.delete_processing_time_timer(timestamp)


class Context:
    """Per-record context of a (Keyed)ProcessFunction, also handed to `on_timer`.

    `current_key`: the key of the row (or of the firing timer). `timestamp()`: the row's event
    timestamp (ms) — evaluated from the stream's timestamp assigner — or the firing timer's
    time in `on_timer`; None when the stream has no timestamps. `time_domain()`: the firing
    timer's TimeDomain in `on_timer`, None in `process_element`.
    """

    __slots__ = ("current_key", "subtask_index", "_runtime", "_assigner", "_row", "_timer",
                 "_timers", "_side")

    def __init__(self, runtime: RuntimeContext, timestamps=None):
        self.current_key: Any = None
        self.subtask_index = runtime.subtask_index
        self._runtime = runtime
        self._assigner = timestamps   # column name or function of the row, or None
        self._row: dict | None = None
        self._timer = None            # time.timers.Timer while on_timer runs
        self._timers: TimerService | None = None
        self._side: dict[str, list] = {}

    def get_state(self, descriptor):
        """Keyed state for `descriptor`, scoped to the current key (as `RuntimeContext.get_state`)."""
        return self._runtime.get_state(descriptor)

    def timer_service(self) -> TimerService:
        """The current key's timers (keyed streams only): register and delete event- and processing-time timers."""
        if self._timers is None:
            raise RuntimeError(
                f"operator '{self._runtime.operator_name}' is not keyed, and timers are keyed "
                f"state: call key_by(...) before process(...) to use ctx.timer_service()")
        return self._timers

    def timestamp(self) -> int | None:
        """The row's event timestamp (int epoch ms) from the stream's timestamp assigner, or the
        firing timer's time in `on_timer`; None when the stream has no timestamps.
        """
        if self._timer is not None:
            return self._timer.timestamp
        assigner, row = self._assigner, self._row
        if assigner is None or row is None:
            return None
        from streamsnap.time.timestamps import assign_timestamp, epoch_millis
        if isinstance(assigner, str):
            value = row.get(assigner)
            if value is None:
                return None
            millis = epoch_millis(value)
            if millis is None:
                raise TypeError(f"timestamp field '{assigner}' is {value!r} "
                                f"({type(value).__name__}), not int epoch milliseconds or a datetime")
            return millis
        return assign_timestamp(assigner, row, self._runtime.operator_name)

    def time_domain(self):
        """In `on_timer`: the firing timer's `ss.TimeDomain` (EVENT_TIME or PROCESSING_TIME); None in `process_element`."""
        return self._timer.domain if self._timer is not None else None

    def output(self, tag: OutputTag, row: dict) -> None:
        """Emit `row` to the side output `tag` (read it with `stream.get_side_output(tag)`)."""
        if not isinstance(tag, OutputTag):
            raise UsageError(f"ctx.output takes an ss.OutputTag, got {tag!r}")
        if type(row) is not dict:
            raise UsageError(f"ctx.output({tag.name!r}, ...) takes a row (dict), got "
                            f"{type(row).__name__}")
        self._side.setdefault(tag.name, []).append(row)


class Function:
    """Optional base class for functions with lifecycle hooks (all hooks are optional)."""

    def open(self, ctx: RuntimeContext) -> None:
        """Called once per subtask before the first record (and after state is initialized)."""

    def close(self) -> None:
        """Called once when the subtask ends."""


class ProcessFunction(Function):
    """Processes each row of a (non-keyed) stream; may emit to side outputs via `ctx.output`.

    `process_element` may return None, a row (dict), or an iterable of rows (e.g. `yield`).
    """

    def process_element(self, row: dict, ctx: Context) -> Iterable[dict] | dict | None:
        """Process one `row`; return None, a row (dict) or an iterable of rows (e.g. `yield`)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement process_element(self, row, ctx)")


class KeyedProcessFunction(ProcessFunction):
    """Processes each row of a keyed stream with access to that key's state and timers.

    Define `on_timer(timestamp, ctx)` to be called when a timer registered through
    `ctx.timer_service()` fires; `ctx.current_key` is the timer's key, its state is current,
    and like `process_element` it may return or yield rows.
    """


class KeyedBatchFunction(Function):
    """Vectorized keyed processing: a whole Arrow batch per call, state per distinct key.

    `process_batch(batch, keys)` gets a `pyarrow.RecordBatch` and its factorized keys
    (`keys.unique`, `keys.index` per row, `keys.key_groups`); read and write keyed state in bulk
    with `state.get_many(keys)` / `state.put_many(keys, values)` (ValueState). Return a
    RecordBatch, a Table, a dict of columns, or None.

    Timers: `ctx.timer_service()` in `open(ctx)` registers one time per distinct key
    (`register_event_time_timers(keys, times)`, processing-time too); due timers arrive in
    `on_timers(timers, ctx)` — `timers.keys` (BatchKeys, each key once), `timers.timestamps`,
    `timers.domain` — which returns rows like `process_batch`.
    """

    def process_batch(self, batch, keys):
        """Process a `pyarrow.RecordBatch` with its factorized keys (`ss.BatchKeys`); return a
        RecordBatch, Table, dict of columns or None.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement process_batch(self, batch, keys)")


class CheckpointedFunction:
    """Flink's CheckpointedFunction: a function that keeps its own operator state."""

    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        """Called before the first record: get operator state from `ctx` (`ctx.get_list_state(name)`)
        and, when `ctx.is_restored`, read what the checkpoint held.
        """
        raise NotImplementedError

    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        """Called at each checkpoint (`ctx.checkpoint_id`): put what must survive a failure into the state."""
        raise NotImplementedError


class CheckpointListener:
    """Flink's CheckpointListener: hear when checkpoints complete or are aborted."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint `checkpoint_id` completed: effects staged for it may be made visible."""
        raise NotImplementedError

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint `checkpoint_id` was aborted: what was staged for it stays pending."""
        raise NotImplementedError


class CoProcessFunction(Function):
    """Processes the rows of two connected streams (`a.connect(b).process(fn)`).

    `process_element1(row, ctx)` gets the rows of the first stream, `process_element2(row, ctx)`
    those of the second; both may return or yield rows and use `ctx.output(tag, row)`. The two
    inputs interleave in arrival order: nothing orders one input before the other.
    """

    def process_element1(self, row: dict, ctx: Context) -> Iterable[dict] | dict | None:
        """Process a row of the first input; return or yield rows."""
        raise NotImplementedError(f"{type(self).__name__} must implement process_element1(self, row, ctx)")

    def process_element2(self, row: dict, ctx: Context) -> Iterable[dict] | dict | None:
        """Process a row of the second input; return or yield rows."""
        raise NotImplementedError(f"{type(self).__name__} must implement process_element2(self, row, ctx)")


class KeyedCoProcessFunction(CoProcessFunction):
    """A CoProcessFunction on two keyed streams: both inputs share the keyed state and timers of
    the current key (`ctx.current_key`), and `on_timer(timestamp, ctx)` fires as in
    KeyedProcessFunction."""


class KeyedCoBatchFunction(Function):
    """Vectorized KeyedCoProcessFunction (`a.key_by(k1).connect(b.key_by(k2)).process_batches(fn)`):
    a whole Arrow batch of either input per call, keyed state and timers shared by both inputs.

    `process_batch1(batch, keys)` gets the first input's batches, `process_batch2(batch, keys)`
    the second's, each with its keys factorized (`ss.BatchKeys`, by that input's key selector);
    state and timers work as in KeyedBatchFunction (`get_many`/`put_many`,
    `ctx.timer_service()` from `open(ctx)`, due timers in `on_timers(timers, ctx)`). Each may
    return a RecordBatch, a Table, a dict of columns or None. The inputs interleave in arrival
    order; wait for an event-time timer for results that must not depend on it.
    """

    def process_batch1(self, batch, keys):
        """Process a batch of the first input; return a RecordBatch, Table, dict of columns or None."""
        raise NotImplementedError(f"{type(self).__name__} must implement process_batch1(self, batch, keys)")

    def process_batch2(self, batch, keys):
        """Process a batch of the second input; return a RecordBatch, Table, dict of columns or None."""
        raise NotImplementedError(f"{type(self).__name__} must implement process_batch2(self, batch, keys)")


class ProcessJoinFunction(Function):
    """Called for each pair an interval join matches: `process_element(left, right, ctx)`.

    `ctx.timestamp()` is the larger of the two rows' timestamps; `ctx.left_timestamp()` and
    `ctx.right_timestamp()` give each one; `ctx.output(tag, row)` emits to a side output.
    """

    def process_element(self, left: dict, right: dict, ctx) -> Iterable[dict] | dict | None:
        """Called for each matched (`left`, `right`) pair; return or yield joined rows."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement process_element(self, left, right, ctx)")


class BroadcastProcessFunction(Function):
    """Processes a stream connected to a broadcast stream (`a.connect(b.broadcast(desc))`).

    `process_broadcast_element(row, ctx)` runs on every subtask for every broadcast row and may
    change the broadcast state (`ctx.get_broadcast_state(desc)`); it must change it the same way
    everywhere (no dependence on the subtask), since every subtask holds one identical copy.
    `process_element(row, ctx)` sees that state read-only. Both may return or yield rows.
    """

    def process_element(self, row: dict, ctx) -> Iterable[dict] | dict | None:
        """Process a row of the non-broadcast input (broadcast state read-only); return or yield rows."""
        raise NotImplementedError(f"{type(self).__name__} must implement process_element(self, row, ctx)")

    def process_broadcast_element(self, row: dict, ctx) -> Iterable[dict] | dict | None:
        """Process a broadcast row on every subtask; may update the broadcast state (identically everywhere)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement process_broadcast_element(self, row, ctx)")


class KeyedBroadcastProcessFunction(BroadcastProcessFunction):
    """A BroadcastProcessFunction whose non-broadcast input is keyed: `process_element` (and
    `on_timer`) also have the key's state and timers, as in KeyedProcessFunction."""
