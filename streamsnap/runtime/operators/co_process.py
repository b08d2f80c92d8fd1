"""Two-input operators: `connect(...).process(CoProcessFunction / KeyedCoProcessFunction)`.

The task tells a two-input head which logical input each batch came from
(`process_input(index, batch)`; the index comes from the channel, see runtime/input.py). Event
time is already combined over both inputs by the task's input (minimum of the two valves), so
watermarks, timers and checkpoints work exactly as in the one-input operators these extend.
Each input keeps its own timestamp assigner, so `ctx.timestamp()` reads the right field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.batches import Batch, rows_of, to_rows
from streamsnap.runtime.operators.base import OperatorFactory, StreamOperator
from streamsnap.runtime.operators.process import KeyedProcessOperator, ProcessOperator


class CoProcessOperator(ProcessOperator):
    """Runs a CoProcessFunction: `process_element1` for input 0, `process_element2` for input 1."""

    two_inputs = True

    def __init__(self, ctx, function, timestamps: tuple = (None, None)):
        super().__init__(ctx, function, None)
        self._timestamps = timestamps
        self._elements = (function.process_element1, function.process_element2)

    def process_input(self, index: int, batch: Batch) -> None:
        rows = to_rows(batch)
        if not rows:
            return
        self.records_in += len(rows)
        self.context._assigner = self._timestamps[index]
        self._run_rows(self._elements[index], rows, self.context)


class KeyedCoProcessOperator(KeyedProcessOperator):
    """Runs a KeyedCoProcessFunction: each input keyed by its own selector, one keyed state (and
    one timer service) shared by both for the same key."""

    two_inputs = True

    def __init__(self, ctx, function, keys: tuple[KeySelector, KeySelector], timestamps: tuple = (None, None)):
        super().__init__(ctx, function, keys[0], None)
        self.keys = keys
        self._timestamps = timestamps
        self._elements = (function.process_element1, function.process_element2)

    def process_input(self, index: int, batch: Batch) -> None:
        rows, columns = rows_of(batch)
        if not rows:
            return
        self.records_in += len(rows)
        self.context._assigner = self._timestamps[index]
        self._run_keyed_rows(self._elements[index], batch, rows, self.keys[index], columns)

    def _fire_timers(self, timers) -> None:
        # A timer has no input row, so no input's assigner applies (ctx.timestamp() is the timer's).
        self.context._assigner = None
        super()._fire_timers(timers)


@dataclass(frozen=True)
class CoProcessOperatorFactory(OperatorFactory):
    function: Any
    timestamps: tuple = (None, None)   # each input's timestamp assigner

    def create(self, ctx) -> StreamOperator:
        return CoProcessOperator(ctx, self.function, self.timestamps)

    def describe(self) -> str:
        return "co_process"


@dataclass(frozen=True)
class KeyedCoProcessOperatorFactory(OperatorFactory):
    function: Any
    keys: tuple                        # (KeySelector of input 0, KeySelector of input 1)
    timestamps: tuple = (None, None)
    keyed = True

    def create(self, ctx) -> StreamOperator:
        return KeyedCoProcessOperator(ctx, self.function, self.keys, self.timestamps)

    def describe(self) -> str:
        return "keyed_co_process"
