"""The stream operator contract: what runs inside a task's chain, wrapping user functions and state.

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
from typing import Any

from streamsnap.api.functions import FunctionInitializationContext, FunctionSnapshotContext, RuntimeContext
from streamsnap.checkpoint.handles import OperatorSubtaskState
from streamsnap.errors import DataError, UsageError, UserFunctionError
from streamsnap.runtime.batches import Batch, num_rows
from streamsnap.state.backends.hashmap import HashMapKeyedStateBackend
from streamsnap.state.key_groups import KeyGroupRange, key_group_range_for_subtask
from streamsnap.state.operator_state import OperatorStateBackend
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


def user_error(operator: "StreamOperator", record, exc: BaseException) -> UserFunctionError | DataError:
    """A UserFunctionError with the user's traceback, without our own frames in front.

    A DataError raised through the user's function (a state value the serializer cannot keep,
    a missing timestamp) stays one — a restart would replay it — located at this operator,
    its subtask, the record and the line of the user's code that raised it."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_globals.get("__name__", "").startswith("streamsnap."):
        tb = tb.tb_next
    if isinstance(exc, DataError):
        frame = None
        while tb is not None:
            if not tb.tb_frame.f_globals.get("__name__", "").startswith("streamsnap."):
                code = tb.tb_frame.f_code
                frame = f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"
            tb = tb.tb_next
        return exc.located(operator=operator.ctx.name, subtask=operator.ctx.task_name, row=record,
                           user_frame=frame)
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
        from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
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

    def prepare_stop(self, checkpoint_id: int) -> None:
        """Checkpoint `checkpoint_id` is a stop-with-savepoint's: the job ends after it (called
        before `snapshot_state`; sinks make visible what must be when the job stops)."""

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


def _extend_results(out: list, result) -> None:
    if result is None:
        return
    if type(result) is dict:
        out.append(result)
        return
    for item in result:
        if type(item) is not dict:
            raise UsageError(f"function produced {type(item).__name__}; rows must be dicts")
        out.append(item)


__all__ = ["OperatorContext", "OperatorFactory", "StreamOperator", "Output", "SnapshotInProgress",
           "user_error"]
