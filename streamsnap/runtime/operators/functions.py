"""Operators of one function per row or per batch: `map`, `filter`, `flat_map`, `map_batches`.

The per-row ones (`RowFunctionOperator`) hold no loop of their own: a run of them chained one
after the other is fused into one loop (`row_chain.py`); `map_batches` calls its function
once per Arrow batch. `FunctionOperatorFactory` is their description on the stream graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from streamsnap.runtime.batches import Batch, as_record_batch, to_record_batch
from streamsnap.runtime.operators.base import OperatorContext, OperatorFactory, StreamOperator, user_error
from streamsnap.runtime.operators.row_chain import RowRun
from streamsnap.runtime.schemas import RowSchema


class RowFunctionOperator(StreamOperator):
    """`map`, `filter` and `flat_map`: a function per row. The loop lives in runtime/operators/row_chain.py:
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


__all__ = ["FunctionOperatorFactory"]
