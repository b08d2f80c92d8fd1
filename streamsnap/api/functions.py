"""What user code implements and what it is handed: functions and their contexts.

Plain callables work for `map`/`filter`/`flat_map`. A class gains lifecycle hooks by defining
them (duck typing, as Python users expect): `open(ctx)`/`close()`; Flink's CheckpointedFunction
(`initialize_state(ctx)`/`snapshot_state(ctx)`) to keep operator state; CheckpointListener
(`notify_checkpoint_complete(id)`/`notify_checkpoint_aborted(id)`) to act on completed
checkpoints. `KeyedProcessFunction` is the stateful per-key function; its state lives in the
keyed state backend, scoped to the current key and snapshotted by key group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

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
    checkpoint_id: int
    checkpoint_timestamp: float


class FunctionInitializationContext:
    """Given to `initialize_state`: whether state was restored, and the state stores."""

    def __init__(self, is_restored: bool, runtime: RuntimeContext, restored_checkpoint_id: int | None = None):
        self.is_restored = is_restored
        self.restored_checkpoint_id = restored_checkpoint_id
        self._runtime = runtime

    def get_list_state(self, name: str, serializer=None):
        return self._runtime.get_list_state(name, serializer)

    def get_union_list_state(self, name: str, serializer=None):
        return self._runtime.get_union_list_state(name, serializer)

    def get_state(self, descriptor):
        return self._runtime.get_state(descriptor)


class Context:
    """Per-record context of a KeyedProcessFunction."""

    __slots__ = ("current_key", "subtask_index", "_runtime")

    def __init__(self, runtime: RuntimeContext):
        self.current_key: Any = None
        self.subtask_index = runtime.subtask_index
        self._runtime = runtime

    def get_state(self, descriptor):
        return self._runtime.get_state(descriptor)


class Function:
    """Optional base class for functions with lifecycle hooks (all hooks are optional)."""

    def open(self, ctx: RuntimeContext) -> None:
        """Called once per subtask before the first record (and after state is initialized)."""

    def close(self) -> None:
        """Called once when the subtask ends."""


class KeyedProcessFunction(Function):
    """Processes each row of a keyed stream with access to that key's state.

    `process_element` may return None, a row (dict), or an iterable of rows (e.g. `yield`).
    """

    def process_element(self, row: dict, ctx: Context) -> Iterable[dict] | dict | None:
        raise NotImplementedError(
            f"{type(self).__name__} must implement process_element(self, row, ctx)")


class KeyedBatchFunction(Function):
    """Vectorized keyed processing: a whole Arrow batch per call, state per distinct key.

    `process_batch(batch, keys)` gets a `pyarrow.RecordBatch` and its factorized keys
    (`keys.unique`, `keys.index` per row, `keys.key_groups`); read and write keyed state in bulk
    with `state.get_many(keys)` / `state.put_many(keys, values)` (ValueState). Return a
    RecordBatch, a Table, a dict of columns, or None.
    """

    def process_batch(self, batch, keys):
        raise NotImplementedError(
            f"{type(self).__name__} must implement process_batch(self, batch, keys)")


class CheckpointedFunction:
    """Flink's CheckpointedFunction: a function that keeps its own operator state."""

    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        raise NotImplementedError

    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        raise NotImplementedError


class CheckpointListener:
    """Flink's CheckpointListener: hear when checkpoints complete or are aborted."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        raise NotImplementedError

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        raise NotImplementedError
