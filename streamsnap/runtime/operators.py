"""Stream operators: what runs inside a task's chain, wrapping user functions and state.

A StreamNode holds an `OperatorFactory` (picklable description); each subtask builds its own
`StreamOperator` from it. Operators receive batches (`process`), emit batches to their chain
output, and take part in checkpoints: `prepare_snapshot_pre_barrier` before the barrier is
sent downstream, `snapshot_state` for the synchronous part (returning the asynchronous part to
run on another thread), and `notify_checkpoint_complete/aborted` afterwards (Flink's
AbstractStreamOperator lifecycle).

Event time flows through the chain like records: a task hands the head operator each new
watermark of its input (`process_watermark`) and status (`process_watermark_status`); the
default forwards them to the operator's output, a keyed process operator first fires the
event-time timers the watermark passed, so their output precedes the watermark downstream.
Watermarks reach every output, side outputs included.

Per-row operators loop over plain dicts with the user call inside a `try` (free in Python 3.11
until something raises); a failure becomes a UserFunctionError naming operator, subtask and row.
"""

from __future__ import annotations

import traceback
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.api.functions import (
    Context, FunctionInitializationContext, FunctionSnapshotContext, RuntimeContext, TimerService,
)
from streamsnap.checkpoint.handles import OperatorSubtaskState
from streamsnap.errors import DataError, UserFunctionError
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime import shipped_key_groups
from streamsnap.runtime.batches import Batch, as_record_batch, num_rows, rows_of, to_record_batch, to_rows
from streamsnap.runtime.row_chain import RowRun
from streamsnap.runtime.schemas import RowSchema
from streamsnap.state.backends.hashmap import HashMapKeyedStateBackend
from streamsnap.state.key_groups import KeyGroupRange, assign_key_groups, key_group_range_for_subtask
from streamsnap.state.operator_state import OperatorStateBackend
from streamsnap.time.timers import InternalTimerService, Timer
from streamsnap.time.watermarks import MIN_WATERMARK


@dataclass
class OperatorContext:
    """Everything a subtask's operator needs to know about where it runs."""

    name: str
    uid: str
    subtask_index: int
    parallelism: int
    max_parallelism: int
    attempt: int
    job_id: str
    task_name: str
    run_id: str = ""                    # this run of the job (names things no other run may reuse)
    state_backend: str = "hashmap"
    restore: Any = None                 # state.assignment.SubtaskRestoreState for this uid
    restore_base: str | None = None     # the restored checkpoint's directory
    restored_operator: bool = False     # the restored checkpoint had this operator (maybe stateless)
    restored_checkpoint_id: int | None = None
    driver: Any = None                  # runtime.task.DriverLink: messages to the JobMaster
    extra: dict = field(default_factory=dict)
    # The task's processing-time timers (clock.TimerQueue), run by its mailbox thread; None
    # outside a task (unit tests of readers and writers).
    timers: Any = None
    clock: Any = None
    # The task's state.local_recovery.LocalRecoveryStore (None: local recovery is off).
    local_store: Any = None


class OperatorFactory(ABC):
    """Picklable description of an operator; `create` builds the per-subtask instance."""

    #: "row" operators get lists of dicts, "batch" operators get Arrow record batches.
    input_format = "row"
    keyed = False

    @abstractmethod
    def create(self, ctx: OperatorContext) -> "StreamOperator": ...

    def describe(self) -> str:
        return type(self).__name__.replace("Factory", "")


class Output:
    """Where an operator's results go: chained operators and/or network record writers.

    `side` maps an OutputTag's name to the targets of that side output; watermarks and
    statuses go to every target, main and side.
    """

    __slots__ = ("_targets", "_side", "_all", "records_out", "watermark")

    def __init__(self, targets: list, side: dict[str, list] | None = None):
        self._targets = targets
        self._side = side or {}
        self._all = list(targets) + [t for ts in self._side.values() for t in ts]
        self.records_out = 0
        self.watermark = MIN_WATERMARK   # the last one emitted: the operator's currentOutputWatermark

    def emit_side(self, tag: str, rows: list) -> None:
        """Rows for the side output named `tag`; dropped when nothing consumes it (as Flink)."""
        targets = self._side.get(tag)
        if not targets or not rows:
            return
        self.records_out += len(rows)
        for i, target in enumerate(targets):
            target.process([dict(r) for r in rows] if i < len(targets) - 1 else rows)

    def emit_watermark(self, timestamp: int) -> None:
        self.watermark = timestamp
        for target in self._all:
            target.process_watermark(timestamp)

    def emit_watermark_status(self, status) -> None:
        for target in self._all:
            target.process_watermark_status(status)

    def emit(self, batch: Batch) -> None:
        n = num_rows(batch)
        if not n:
            return
        self.records_out += n
        targets = self._targets
        if len(targets) == 1:
            targets[0].process(batch)
            return
        for i, target in enumerate(targets):
            # Siblings must not see each other's in-place edits of row dicts.
            if isinstance(batch, list) and i < len(targets) - 1:
                target.process([dict(r) for r in batch])
            else:
                target.process(batch)


def user_error(operator: "StreamOperator", record, exc: BaseException) -> UserFunctionError:
    """A UserFunctionError with the user's traceback, without our own frames in front."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_globals.get("__name__", "").startswith("streamsnap."):
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return UserFunctionError(operator.ctx.name, operator.ctx.task_name, record, text)


def _call_hook(obj, name: str, *args):
    hook = getattr(obj, name, None)
    if callable(hook):
        return hook(*args)
    return None


class SnapshotInProgress:
    """The asynchronous part of one operator's snapshot (run on the async checkpoint thread)."""

    def __init__(self, uid: str, parts: list):
        self.uid = uid
        self._parts = parts  # objects with run() -> handle | None, and discard()

    def run(self) -> OperatorSubtaskState:
        keyed, operator = [], []
        for part in self._parts:
            handle = part.run()
            if handle is None:
                continue
            (keyed if hasattr(handle, "key_group_start") else operator).append(handle)
        return OperatorSubtaskState(tuple(keyed), tuple(operator))

    def discard(self) -> None:
        for part in self._parts:
            part.discard()


class StreamOperator:
    """Base operator: state backends, user-function hooks and the checkpoint callbacks."""

    #: The operator loops over rows in Python (its cost is per row): as a task's head it gets
    #: its input in chunks (runtime/input.py), so its results leave a chunk at a time.
    row_input = False

    def __init__(self, ctx: OperatorContext, function: Any = None, keyed: bool = False):
        self.ctx = ctx
        self.function = function
        self.output: Output | None = None
        self.records_in = 0
        self.keyed_backend: HashMapKeyedStateBackend | None = None
        if keyed:
            key_groups = key_group_range_for_subtask(ctx.max_parallelism, ctx.parallelism, ctx.subtask_index)
            self.keyed_backend = self._create_keyed_backend(key_groups)
        self.operator_backend = OperatorStateBackend(ctx.uid)
        self.runtime_context = RuntimeContext(
            operator_name=ctx.name, operator_uid=ctx.uid, subtask_index=ctx.subtask_index,
            parallelism=ctx.parallelism, max_parallelism=ctx.max_parallelism, attempt=ctx.attempt,
            job_id=ctx.job_id, keyed_backend=self.keyed_backend, operator_backend=self.operator_backend)

    def _create_keyed_backend(self, key_groups: KeyGroupRange):
        # State TTL counts processing time on the task's clock (the wall clock in a task).
        if self.ctx.state_backend == "hashmap":
            return HashMapKeyedStateBackend(self.ctx.uid, self.ctx.max_parallelism, key_groups,
                                            clock=self.ctx.clock, local_store=self.ctx.local_store)
        from streamsnap.state.backends.rocksdb import RocksDBKeyedStateBackend
        return RocksDBKeyedStateBackend(self.ctx.uid, self.ctx.max_parallelism, key_groups,
                                        self.ctx.state_backend, clock=self.ctx.clock,
                                        local_store=self.ctx.local_store)

    # ---------------------------------------------------------------- lifecycle
    def initialize_state(self) -> None:
        """Restore backends from the assigned checkpoint state, then the user's hook."""
        restore = self.ctx.restore
        if restore is not None:
            if self.keyed_backend is not None:
                self.keyed_backend.restore(restore, self.ctx.restore_base)
            self.operator_backend.restore(restore, self.ctx.restore_base)
        if self.function is not None and hasattr(self.function, "initialize_state"):
            init = FunctionInitializationContext(restore is not None and restore.is_restored,
                                                 self.runtime_context, self.ctx.restored_checkpoint_id)
            self.function.initialize_state(init)

    def open(self) -> None:
        if self.function is not None:
            _call_hook(self.function, "open", self.runtime_context)

    def process(self, batch: Batch) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not take input")

    def end_input(self) -> None:
        """All inputs reached end of data; operators that buffer emit what they hold."""

    def process_watermark(self, timestamp: int) -> None:
        """Event time of the input advanced to `timestamp` (called only when it changes)."""
        self.output.emit_watermark(timestamp)

    def process_watermark_status(self, status) -> None:
        """The input went idle or active again (WatermarkStatus)."""
        self.output.emit_watermark_status(status)

    def close(self) -> None:
        if self.function is not None:
            _call_hook(self.function, "close")
        if self.keyed_backend is not None:
            self.keyed_backend.dispose()

    # ---------------------------------------------------------------- checkpoints
    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        """Last chance to emit records that belong before the barrier."""

    def snapshot_state(self, checkpoint_id: int, timestamp: float, location: str) -> SnapshotInProgress:
        if self.function is not None and hasattr(self.function, "snapshot_state"):
            self.function.snapshot_state(FunctionSnapshotContext(checkpoint_id, timestamp))
        parts = []
        if self.keyed_backend is not None:
            parts.append(self.keyed_backend.snapshot(checkpoint_id, location))
        parts.append(self.operator_backend.snapshot(checkpoint_id, location))
        return SnapshotInProgress(self.ctx.uid, parts)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.keyed_backend is not None:
            self.keyed_backend.notify_checkpoint_complete(checkpoint_id)
        if self.function is not None:
            _call_hook(self.function, "notify_checkpoint_complete", checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        if self.keyed_backend is not None and hasattr(self.keyed_backend, "notify_checkpoint_aborted"):
            self.keyed_backend.notify_checkpoint_aborted(checkpoint_id)
        if self.function is not None:
            _call_hook(self.function, "notify_checkpoint_aborted", checkpoint_id)


# ==================================================================== per-row operators
class RowFunctionOperator(StreamOperator):
    """`map`, `filter` and `flat_map`: a function per row. The loop lives in runtime/row_chain.py:
    a run of these chained one after the other is fused into one loop, headed by its first
    operator (`run`); an operator not fused runs as a run of one."""

    row_input = True
    kind = ""

    def __init__(self, ctx: OperatorContext, function: Any = None):
        super().__init__(ctx, function)
        self.run: RowRun | None = None

    def process(self, batch: Batch) -> None:
        run = self.run
        if run is None:
            run = self.run = RowRun([self])
        run.process(batch)


class MapOperator(RowFunctionOperator):
    kind = "map"


class FilterOperator(RowFunctionOperator):
    kind = "filter"


def _extend_results(out: list, result) -> None:
    if result is None:
        return
    if type(result) is dict:
        out.append(result)
        return
    for item in result:
        if type(item) is not dict:
            raise TypeError(f"function produced {type(item).__name__}; rows must be dicts")
        out.append(item)


class FlatMapOperator(RowFunctionOperator):
    kind = "flat_map"


class MapBatchesOperator(StreamOperator):
    """Vectorized: a pyarrow.RecordBatch in, a RecordBatch (or Table / dict of columns) out."""

    #: Converts rows a chained per-row operator hands over (schemas.RowSchema, set by the factory).
    input_rows = None

    def process(self, batch: Batch) -> None:
        record_batch = to_record_batch(batch, self.input_rows)
        self.records_in += record_batch.num_rows
        try:
            result = as_record_batch(self.function(record_batch), f"map_batches function of '{self.ctx.name}'")
        except Exception as exc:
            raise user_error(self, f"<RecordBatch of {record_batch.num_rows} rows, "
                                   f"first row {record_batch.slice(0, 1).to_pylist()}>", exc) from None
        self.output.emit(result)


class ProcessOperator(StreamOperator):
    """Runs a ProcessFunction per row with a Context (side outputs, element timestamps).

    `timestamps` is the stream's timestamp assigner (column name or function of the row, see
    `runtime/timestamps_operator.py`); `ctx.timestamp()` evaluates it on the current row only
    when asked, so rows carry no extra column and unused timestamps cost nothing.
    """

    row_input = True

    def __init__(self, ctx: OperatorContext, function, timestamps=None, keyed: bool = False):
        super().__init__(ctx, function, keyed=keyed)
        self.context = Context(self.runtime_context, timestamps)

    def _flush_side(self) -> None:
        side = self.context._side
        if side:
            self.context._side = {}
            for tag, rows in side.items():
                self.output.emit_side(tag, rows)

    def process(self, batch: Batch) -> None:
        rows = to_rows(batch)
        n = len(rows)
        self.records_in += n
        if not n:
            return
        self._run_rows(self.function.process_element, rows, self.context)

    def _run_rows(self, fn, rows: list, context) -> None:
        """`fn(row, context)` for each row (context._row set for ctx.timestamp()), results and
        side outputs emitted — the per-row loop of every process-function operator."""
        out: list = []
        append = out.append
        for row in rows:
            context._row = row
            try:
                result = fn(row, context)
                if result is None:
                    continue
                if type(result) is dict:
                    append(result)
                    continue
                for item in result:
                    if type(item) is not dict:
                        raise TypeError(f"function produced {type(item).__name__}; rows must be dicts")
                    append(item)
            except Exception as exc:
                raise user_error(self, row, exc) from None
        context._row = None
        self.output.emit(out)
        self._flush_side()


def keys_of(op: "StreamOperator", batch: Batch, rows: list, key: KeySelector | None = None,
            columns: list | None = None, key_groups: list | None = None) -> tuple[list, list]:
    """The keys and key groups of a batch's rows for a keyed operator (`key`, default `op.key`):
    column-wise for Arrow batches (one to_pylist, key groups hashed vectorized), per row for row
    lists. columns: the batch's columns as Python lists, when the caller has them already
    (`batches.rows_of`), so a key column is not converted twice. key_groups: the rows' key
    groups as the sender computed them (runtime/shipped_key_groups.py): only the keys are read."""
    key, max_parallelism = key or op.key, op.ctx.max_parallelism
    try:
        # A one-column key whose values the caller already has as a Python list.
        position = -1
        if columns is not None and key.function is None and len(key.columns) == 1 \
                and isinstance(batch, pa.RecordBatch):
            position = batch.schema.get_field_index(key.columns[0])
        if key_groups is not None:
            return (columns[position] if position >= 0 else key.keys_of_batch(batch, rows)), key_groups
        if isinstance(batch, pa.RecordBatch):
            if position >= 0:
                cache = op.__dict__.get("_key_group_cache")
                if cache is None:
                    cache = op._key_group_cache = {}
                return _column_keys(key, batch, position, columns[position], max_parallelism, cache)
            keys = key.keys_of_batch(batch, rows)
            groups = key.key_groups(batch, max_parallelism, keys=keys if key.function is not None else None)
        else:
            keys = key.keys_of_rows(rows)
            groups = key.key_groups(rows, max_parallelism, keys=keys)
    except DataError:
        raise   # a null key: the data's fault, not the function's (as where a hash edge routes it)
    except Exception as exc:
        raise user_error(op, rows[0], exc) from None
    return keys, groups.tolist()


# Distinct string/binary keys whose key group an operator remembers (words, user ids, ...),
# and the longest key remembered: together they bound the cache (~20 MB at most), however
# long the keys of a job are; longer keys are hashed with their batch every time.
KEY_GROUP_CACHE_ENTRIES = 1 << 16
KEY_GROUP_CACHE_KEY_LENGTH = 64


def _column_keys(key: KeySelector, batch: pa.RecordBatch, position: int, values: list,
                 max_parallelism: int, cache: dict) -> tuple[list, list]:
    """Keys and key groups of a one-column key whose values are already Python objects.

    A string or binary key is hashed once per distinct key: from the operator's `cache` of
    key → key group when every key of the batch is in it (a dict lookup per row, a third of
    hashing the batch's dictionary in Arrow), else dictionary-encoded and hashed in Arrow, the
    new keys up to KEY_GROUP_CACHE_KEY_LENGTH long remembered until the cache holds
    KEY_GROUP_CACHE_ENTRIES."""
    column = batch.column(position)
    if column.null_count and not key.allow_null:
        key._check_columns(batch)   # raises NullKeyError naming the row
    t = column.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t):
        try:
            return values, [cache[v] for v in values]
        except KeyError:
            groups = assign_key_groups(pc.dictionary_encode(column), max_parallelism).tolist()
            if len(cache) < KEY_GROUP_CACHE_ENTRIES:
                longest = KEY_GROUP_CACHE_KEY_LENGTH
                cache.update((v, g) for v, g in zip(values, groups) if v is None or len(v) <= longest)
            return values, groups
    return values, assign_key_groups(column, max_parallelism).tolist()


class ProcessingTimeWakeups:
    """Fires an operator's processing-time timers from the task's mailbox thread: one wake-up on
    the task's timer queue for the earliest timer, re-armed after each firing. The operator
    provides `timer_service`, `ctx` and `_fire_timers(timers)`."""

    _wakeup_at: int | None = None   # earliest processing-time wake-up scheduled

    def _schedule_wakeup(self, timestamp: int | None) -> None:
        if timestamp is None or (self._wakeup_at is not None and self._wakeup_at <= timestamp):
            return
        timers = self.ctx.timers
        if timers is None:
            raise RuntimeError(f"operator '{self.ctx.name}' runs outside a task: processing-time "
                               f"timers need the task's timer queue")
        self._wakeup_at = timestamp
        delay = (timestamp - current_millis(self.ctx.clock)) / 1000.0
        timers.call_later(delay, lambda: self._on_processing_time(timestamp))

    def _on_processing_time(self, scheduled: int) -> None:
        if self._wakeup_at == scheduled:
            self._wakeup_at = None
        # The queue may wake us a little early (monotonic vs wall clock): never fire early.
        now = max(current_millis(self.ctx.clock), scheduled)
        self._fire_timers(self.timer_service.advance_processing_time(now))
        self._schedule_wakeup(self.timer_service.next_processing_time())


class KeyedProcessOperator(ProcessingTimeWakeups, ProcessOperator):
    """Runs a KeyedProcessFunction with the keyed state backend scoped to each row's key.

    Timers live in an InternalTimerService over the keyed backend, so they are checkpointed,
    restored and rescaled with the key groups. Event-time timers fire in `process_watermark`
    before the watermark is forwarded; processing-time timers fire from a wake-up on the
    task's timer queue (the mailbox thread), scheduled for the earliest pending timer.
    """

    def __init__(self, ctx: OperatorContext, function, key: KeySelector, timestamps=None):
        super().__init__(ctx, function, timestamps, keyed=True)
        self.key = key
        self.timer_service: InternalTimerService | None = None

    def initialize_state(self) -> None:
        super().initialize_state()
        # After the backend restored: the service indexes the restored timers.
        self.timer_service = InternalTimerService(self.keyed_backend)
        self.context._timers = TimerService(self.timer_service, self._schedule_wakeup)
        self._schedule_wakeup(self.timer_service.next_processing_time())

    def process(self, batch: Batch) -> None:
        key_groups = None
        if type(batch) is pa.RecordBatch:
            # The hash edge's sender may have shipped the key groups (runtime/shipped_key_groups.py).
            batch, key_groups = shipped_key_groups.detach(batch)
        rows, columns = rows_of(batch)
        n = len(rows)
        self.records_in += n
        if not n:
            return
        self._run_keyed_rows(self.function.process_element, batch, rows, self.key, columns, key_groups)

    def _run_keyed_rows(self, fn, batch: Batch, rows: list, key: KeySelector, columns: list | None = None,
                        key_groups: list | None = None) -> None:
        """`fn(row, context)` for each row with the row's key current — the per-row keyed loop of
        every keyed process-function operator (one input or two). key_groups: the rows' key
        groups when the sender shipped them."""
        keys, key_groups = keys_of(self, batch, rows, key, columns, key_groups)
        backend = self.keyed_backend
        context = self.context
        out: list = []
        append = out.append
        if type(backend).set_current_key is HashMapKeyedStateBackend.set_current_key:
            # The heap backend's set_current_key only stores the two: set them here, without
            # a method call per row.
            for row, key, key_group in zip(rows, keys, key_groups):
                backend._current_key = key
                backend._current_key_group = key_group
                context.current_key = key
                context._row = row
                try:
                    result = fn(row, context)
                    if result is None:
                        continue
                    if type(result) is dict:
                        append(result)
                        continue
                    for item in result:
                        if type(item) is not dict:
                            raise TypeError(f"function produced {type(item).__name__}; rows must be dicts")
                        append(item)
                except Exception as exc:
                    raise user_error(self, row, exc) from None
        else:
            set_key = backend.set_current_key
            for row, key, key_group in zip(rows, keys, key_groups):
                set_key(key, key_group)
                context.current_key = key
                context._row = row
                try:
                    result = fn(row, context)
                    if result is None:
                        continue
                    if type(result) is dict:
                        append(result)
                    else:
                        _extend_results(out, result)
                except Exception as exc:
                    raise user_error(self, row, exc) from None
        context._row = None
        self.output.emit(out)
        self._flush_side()

    # ---------------------------------------------------------------- timers
    def _fire_timers(self, timers) -> None:
        """Run `on_timer` for each due timer (its key is already current), then emit."""
        on_timer = getattr(self.function, "on_timer", None)
        context = self.context
        out: list = []
        timer: Timer | None = None
        try:
            for timer in timers:
                if on_timer is None:
                    raise TypeError(f"{type(self.function).__name__} registered a timer but has no "
                                    f"on_timer(timestamp, ctx) method to call when it fires")
                context.current_key = timer.key
                context._timer = timer
                _extend_results(out, on_timer(timer.timestamp, context))
        except Exception as exc:
            raise user_error(self, f"<{timer.domain.value} timer {timer.timestamp} of key {timer.key!r}>"
                             if timer is not None else "<timer>", exc) from None
        finally:
            context._timer = None
        self.output.emit(out)
        self._flush_side()

    def process_watermark(self, timestamp: int) -> None:
        self._fire_timers(self.timer_service.advance_watermark(timestamp))
        self.output.emit_watermark(timestamp)



def current_millis(clock) -> int:
    """Processing time: wall-clock epoch milliseconds."""
    return int(clock.wall() * 1000)


class KeyedBatchProcessOperator(ProcessingTimeWakeups, StreamOperator):
    """Runs a KeyedBatchFunction: one call per batch, keyed state accessed per distinct key;
    its timers fire in batches (`on_timers`, see api/batch_timers.py)."""

    def __init__(self, ctx: OperatorContext, function, key: KeySelector):
        super().__init__(ctx, function, keyed=True)
        self.key = key
        self.timer_service: InternalTimerService | None = None

    def initialize_state(self) -> None:
        super().initialize_state()
        from streamsnap.api.batch_timers import BatchTimerService

        self.timer_service = InternalTimerService(self.keyed_backend)
        self.runtime_context._batch_timers = BatchTimerService(
            self.timer_service, self.keyed_backend, self._schedule_wakeup, self.ctx.name)
        self._schedule_wakeup(self.timer_service.next_processing_time())

    def _fire_timers(self, timers) -> None:
        from streamsnap.api.batch_timers import rounds

        on_timers = getattr(self.function, "on_timers", None)
        for fired in rounds(timers, self.keyed_backend):
            if on_timers is None:
                raise user_error(self, "<timers>", TypeError(
                    f"{type(self.function).__name__} registered timers but has no on_timers(timers, ctx) "
                    f"method to call when they fire"))
            try:
                result = on_timers(fired, self.runtime_context)
                if result is None:
                    continue
                result = as_record_batch(result, f"on_timers of '{self.ctx.name}'")
            except Exception as exc:
                raise user_error(self, f"<{len(fired)} {fired.domain.value} timers, first: key "
                                       f"{fired.keys.unique[0]!r} at {int(fired.timestamps[0])}>", exc) from None
            self.output.emit(result)

    def process_watermark(self, timestamp: int) -> None:
        self._fire_timers(self.timer_service.advance_watermark(timestamp))
        self.output.emit_watermark(timestamp)

    def process(self, batch: Batch) -> None:
        record_batch = to_record_batch(batch)
        n = record_batch.num_rows
        self.records_in += n
        if not n:
            return
        try:
            keys = self.key.batch_keys(record_batch, self.ctx.max_parallelism)
            result = self.function.process_batch(record_batch, keys)
            if result is None:
                return
            result = as_record_batch(result, f"process_batch of '{self.ctx.name}'")
        except Exception as exc:
            raise user_error(self, f"<RecordBatch of {n} rows, first row "
                                   f"{record_batch.slice(0, 1).to_pylist()}>", exc) from None
        self.output.emit(result)


# ==================================================================== factories
@dataclass(frozen=True)
class FunctionOperatorFactory(OperatorFactory):
    kind: str
    function: Callable
    input_format: str = "row"
    input_schema: Any = None    # vectorized: the input stream's schemas.StreamSchema

    _OPERATORS = {"map": MapOperator, "filter": FilterOperator, "flat_map": FlatMapOperator,
                  "map_batches": MapBatchesOperator}

    def create(self, ctx: OperatorContext) -> StreamOperator:
        operator = self._OPERATORS[self.kind](ctx, self.function)
        if self.input_format == "batch":
            operator.input_rows = RowSchema(self.input_schema, ctx.name, ctx.task_name, role="input")
        return operator

    def describe(self) -> str:
        return self.kind


@dataclass(frozen=True)
class KeyedProcessOperatorFactory(OperatorFactory):
    function: Any
    key: KeySelector
    vectorized: bool = False
    timestamps: Any = None      # the input stream's timestamp assigner (for ctx.timestamp())
    keyed = True

    def create(self, ctx: OperatorContext) -> StreamOperator:
        if self.vectorized:
            return KeyedBatchProcessOperator(ctx, self.function, self.key)
        return KeyedProcessOperator(ctx, self.function, self.key, self.timestamps)

    def describe(self) -> str:
        return "process_batches" if self.vectorized else "process"


@dataclass(frozen=True)
class ProcessOperatorFactory(OperatorFactory):
    """A ProcessFunction on a non-keyed stream: per row, side outputs, no state or timers."""

    function: Any
    timestamps: Any = None

    def create(self, ctx: OperatorContext) -> StreamOperator:
        return ProcessOperator(ctx, self.function, self.timestamps)

    def describe(self) -> str:
        return "process"


__all__ = ["OperatorContext", "OperatorFactory", "StreamOperator", "Output", "SnapshotInProgress",
           "FunctionOperatorFactory", "KeyedProcessOperatorFactory", "ProcessOperatorFactory",
           "user_error"]
