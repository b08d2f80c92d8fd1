"""The vectorized two-input keyed operator: `a.key_by(k1).connect(b.key_by(k2)).process_batches(fn)`.

What `process_batches` is to `process` on one keyed stream, this is to a
KeyedCoProcessFunction: the function (a KeyedCoBatchFunction) is called once per Arrow batch of
either input — `process_batch1(batch, keys)` for input 0, `process_batch2(batch, keys)` for
input 1 — with the batch's keys factorized by that input's own key selector. Both inputs are
partitioned into the same key groups, so they share one keyed state backend and one timer
service (batch timers, api/batch_timers.py): state written for a key by one input is read by
the other, checkpointed, restored and rescaled by key group as for the one-input operator.
Event time is the minimum over both inputs (the task's input), so event-time timers fire only
once both inputs' watermarks passed them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamsnap.graph.keys import KeySelector
from streamsnap.runtime.batches import Batch
from streamsnap.runtime.operators.base import OperatorFactory, StreamOperator
from streamsnap.runtime.operators.process import KeyedBatchProcessOperator

CALLS = ("process_batch1", "process_batch2")


class KeyedCoBatchProcessOperator(KeyedBatchProcessOperator):
    """Runs a KeyedCoBatchFunction: each input's batches keyed by its own selector, one keyed
    state and one batch timer service shared by both."""

    two_inputs = True

    def __init__(self, ctx, function, keys: tuple[KeySelector, KeySelector]):
        super().__init__(ctx, function, keys[0])
        self.keys = keys
        self._calls = (function.process_batch1, function.process_batch2)

    def process(self, batch: Batch) -> None:
        raise RuntimeError(f"operator '{self.ctx.name}' has two inputs: the task calls process_input")

    def process_input(self, index: int, batch: Batch) -> None:
        self._run_batch(self._calls[index], batch, self.keys[index], CALLS[index])


@dataclass(frozen=True)
class KeyedCoBatchProcessOperatorFactory(OperatorFactory):
    function: Any
    keys: tuple                        # (KeySelector of input 0, KeySelector of input 1)
    keyed = True

    def create(self, ctx) -> StreamOperator:
        return KeyedCoBatchProcessOperator(ctx, self.function, self.keys)

    def describe(self) -> str:
        return "keyed_co_process_batches"


__all__ = ["KeyedCoBatchProcessOperator", "KeyedCoBatchProcessOperatorFactory"]
