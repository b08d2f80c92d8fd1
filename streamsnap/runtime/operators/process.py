"""Process-function operators: `process(ProcessFunction)`, `process(KeyedProcessFunction)`
and `process_batches(KeyedBatchFunction)`.

`ProcessOperator` runs a function per row with a Context (side outputs, element timestamps);
`KeyedProcessOperator` adds keyed state scoped to each row's key and timers (event time fired
by the watermark before it is forwarded, processing time from the task's timer queue);
`KeyedBatchProcessOperator` calls its function once per batch and fires its timers in
batches. The two-input, broadcast, window and join operators build on these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from streamsnap.api.functions import Context, TimerService
from streamsnap.errors import UsageError
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime import shipped_key_groups
from streamsnap.runtime.batches import Batch, as_record_batch, rows_of, to_record_batch, to_rows
from streamsnap.runtime.operators.base import (OperatorContext, OperatorFactory, StreamOperator, _extend_results,
                                               user_error)
from streamsnap.runtime.operators.keyed import ProcessingTimeWakeups, keys_of
from streamsnap.state.backends.hashmap import HashMapKeyedStateBackend
from streamsnap.time.timers import InternalTimerService, Timer


class ProcessOperator(StreamOperator):
    """Runs a ProcessFunction per row with a Context (side outputs, element timestamps).

    `timestamps` is the stream's timestamp assigner (column name or function of the row, see
    `runtime/operators/timestamps_and_watermarks.py`); `ctx.timestamp()` evaluates it on the current row only
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
                        raise UsageError(f"function produced {type(item).__name__}; rows must be dicts")
                    append(item)
            except Exception as exc:
                raise user_error(self, row, exc) from None
        context._row = None
        self.output.emit(out)
        self._flush_side()


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
        self.context._timers = TimerService(self.timer_service, self._schedule_wakeup, self.ctx.clock)
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
                            raise UsageError(f"function produced {type(item).__name__}; rows must be dicts")
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
                    raise UsageError(f"{type(self.function).__name__} registered a timer but has no "
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
                raise user_error(self, "<timers>", UsageError(
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
        self._run_batch(self.function.process_batch, batch, self.key, "process_batch")

    def _run_batch(self, fn, batch: Batch, key: KeySelector, what: str) -> None:
        """`fn(record_batch, keys)` once for the batch, its result emitted — the call of every
        keyed batch operator (one input or two, runtime/operators/co_batch_process.py)."""
        record_batch = to_record_batch(batch)
        n = record_batch.num_rows
        self.records_in += n
        if not n:
            return
        try:
            keys = key.batch_keys(record_batch, self.ctx.max_parallelism)
            result = fn(record_batch, keys)
            if result is None:
                return
            result = as_record_batch(result, f"{what} of '{self.ctx.name}'")
        except Exception as exc:
            raise user_error(self, f"<RecordBatch of {n} rows, first row "
                                   f"{record_batch.slice(0, 1).to_pylist()}>", exc) from None
        self.output.emit(result)


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


__all__ = ["KeyedProcessOperatorFactory", "ProcessOperatorFactory"]
