"""Broadcast state: `stream.connect(rules.broadcast(descriptor)).process(BroadcastProcessFunction)`.

The broadcast input reaches every subtask (broadcast partitioning), and each subtask keeps the
same dict per descriptor as operator state of BROADCAST mode: every subtask checkpoints its
copy and, on restore at any parallelism, every subtask loads one copy (state/assignment.py).
Only the broadcast side may write it, which is what keeps the copies identical; the other
input (and `on_timer`) reads it through a read-only view. A keyed non-broadcast input adds
keyed state and timers, exactly as in KeyedProcessOperator, and lets the broadcast side visit
every key's state (`ctx.apply_to_keyed_state`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamsnap.errors import UsageError
from streamsnap.api.functions import Context
from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.batches import Batch, to_rows
from streamsnap.runtime.operators.base import OperatorFactory, StreamOperator
from streamsnap.runtime.operators.process import KeyedProcessOperator, ProcessOperator


class ReadOnlyBroadcastState:
    """What the non-broadcast input sees: reads only, so the subtasks' copies cannot diverge."""

    __slots__ = ("_state",)

    def __init__(self, state):
        self._state = state

    def get(self, key: Any, default: Any = None) -> Any:
        return self._state.get(key, default)

    def contains(self, key: Any) -> bool:
        return self._state.contains(key)

    def keys(self) -> list:
        return self._state.keys()

    def values(self) -> list:
        return self._state.values()

    def items(self) -> list:
        return self._state.items()

    def is_empty(self) -> bool:
        return self._state.is_empty()


def _lookup(states: dict, descriptor, operator_name: str):
    name = getattr(descriptor, "name", descriptor)
    state = states.get(name)
    if state is None:
        raise KeyError(f"operator '{operator_name}' has no broadcast state {name!r}; its broadcast "
                       f"stream declared {sorted(states)} (pass the descriptors to .broadcast(...))")
    return state


class ElementContext(Context):
    """`ctx` of `process_element` and `on_timer`: a Context plus read-only broadcast state."""

    __slots__ = ("_broadcast",)

    def get_broadcast_state(self, descriptor) -> ReadOnlyBroadcastState:
        return _lookup(self._broadcast, descriptor, self._runtime.operator_name)


class BroadcastSideContext(Context):
    """`ctx` of `process_broadcast_element`: writable broadcast state, no key (the row goes to
    every subtask, not to one key), side outputs and the row's timestamp."""

    __slots__ = ("_broadcast",)

    def get_broadcast_state(self, descriptor):
        return _lookup(self._broadcast, descriptor, self._runtime.operator_name)

    def get_state(self, descriptor):
        raise UsageError("process_broadcast_element has no current key, so no keyed state; keep "
                           "what every subtask needs in the broadcast state")

    def timer_service(self):
        raise UsageError("process_broadcast_element has no current key, so it cannot set timers; "
                           "set them in process_element")

    def apply_to_keyed_state(self, descriptor, function) -> None:
        """Call `function(key, state)` for every key of this subtask that has `descriptor`'s
        state, with that key current (Flink's applyToKeyedState): a new rule can update or clear
        what every key holds. Keyed broadcast functions only."""
        backend = self._runtime._keyed
        if backend is None:
            raise RuntimeError(
                f"operator '{self._runtime.operator_name}' is not keyed, so it has no keyed state to apply "
                f"to; connect a keyed stream (stream.key_by(k).connect(rules.broadcast(...)))")
        state = backend.get_state(descriptor)
        previous = (backend.current_key, backend.current_key_group)
        try:
            for key_group, key, _ in list(backend.iter_entries(descriptor.name)):
                backend.set_current_key(key, key_group)
                function(key, state)
        finally:
            backend.set_current_key(*previous)


class _BroadcastInputs:
    """Input 0: the function's `process_element` (the base operator's `process`); input 1:
    `process_broadcast_element` on every subtask."""

    two_inputs = True

    def _init_broadcast(self, descriptors: tuple, timestamps: tuple) -> None:
        self._descriptors = descriptors
        self.context = ElementContext(self.runtime_context, timestamps[0])
        self.broadcast_context = BroadcastSideContext(self.runtime_context, timestamps[1])

    def _open_broadcast_state(self) -> None:
        # After the operator backend restored: registering loads the restored copy.
        states = {d.name: self.operator_backend.get_broadcast_state(d.name, d.serializer)
                  for d in self._descriptors}
        self.context._broadcast = {name: ReadOnlyBroadcastState(s) for name, s in states.items()}
        self.broadcast_context._broadcast = states

    def process_input(self, index: int, batch: Batch) -> None:
        if index == 0:
            self.process(batch)
            return
        rows = to_rows(batch)
        if not rows:
            return
        self.records_in += len(rows)
        self._run_rows(self.function.process_broadcast_element, rows, self.broadcast_context)

    def _flush_side(self) -> None:
        for context in (self.context, self.broadcast_context):
            side = context._side
            if side:
                context._side = {}
                for tag, rows in side.items():
                    self.output.emit_side(tag, rows)


class BroadcastProcessOperator(_BroadcastInputs, ProcessOperator):
    def __init__(self, ctx, function, descriptors: tuple, timestamps: tuple = (None, None)):
        ProcessOperator.__init__(self, ctx, function, None)
        self._init_broadcast(descriptors, timestamps)

    def initialize_state(self) -> None:
        super().initialize_state()
        self._open_broadcast_state()


class KeyedBroadcastProcessOperator(_BroadcastInputs, KeyedProcessOperator):
    def __init__(self, ctx, function, key: KeySelector, descriptors: tuple, timestamps: tuple = (None, None)):
        KeyedProcessOperator.__init__(self, ctx, function, key, None)
        self._init_broadcast(descriptors, timestamps)

    def initialize_state(self) -> None:
        super().initialize_state()
        self._open_broadcast_state()


@dataclass(frozen=True)
class BroadcastProcessOperatorFactory(OperatorFactory):
    function: Any
    descriptors: tuple                 # the broadcast stream's MapStateDescriptors
    timestamps: tuple = (None, None)
    key: KeySelector | None = None     # the non-broadcast input's key, when it is keyed

    @property
    def keyed(self) -> bool:
        return self.key is not None

    def create(self, ctx) -> StreamOperator:
        if self.key is not None:
            return KeyedBroadcastProcessOperator(ctx, self.function, self.key, self.descriptors, self.timestamps)
        return BroadcastProcessOperator(ctx, self.function, self.descriptors, self.timestamps)

    def describe(self) -> str:
        return "broadcast_process"
