"""The unit of data inside a task: a batch of rows, either Arrow or Python dicts.

Per-row operators work on lists of dicts and vectorized ones on `pyarrow.RecordBatch`; a chain
of per-row operators passes lists along without converting, and conversion happens only where
a vectorized operator or the network needs Arrow. Helpers here convert lazily, once.

Every conversion of rows to Arrow goes through `to_record_batch`; given a
`runtime.schemas.RowSchema` (what the engine passes) it applies the schema rule — a field the
schema lacks, a missing field or a value of another type is an error naming the operator, the
row and the fix, never a silent drop or fill. A bare `pyarrow.Schema` (or None) is the
unchecked conversion, for callers that built the rows themselves.
"""

from __future__ import annotations

from typing import Union

import pyarrow as pa

from streamsnap.runtime.schemas import RowSchema

Batch = Union[list, pa.RecordBatch]


def num_rows(batch: Batch) -> int:
    return batch.num_rows if isinstance(batch, pa.RecordBatch) else len(batch)


def to_rows(batch: Batch) -> list:
    return batch.to_pylist() if isinstance(batch, pa.RecordBatch) else batch


def to_record_batch(batch: Batch, schema=None) -> pa.RecordBatch:
    """`batch` as Arrow. schema: a RowSchema (checked, see module docstring), a pa.Schema or None."""
    if isinstance(batch, pa.RecordBatch):
        return batch
    if isinstance(schema, RowSchema):
        return schema.to_batch(batch)
    if schema is None and batch:
        # Unchecked, but never lossy: pyarrow would take the field names of the first row only.
        return RowSchema(None, "rows").to_batch(batch)
    return pa.RecordBatch.from_pylist(batch, schema=schema)


def as_record_batch(result, what: str) -> pa.RecordBatch:
    """Accept what a vectorized user function may reasonably return, as one RecordBatch."""
    if isinstance(result, pa.RecordBatch):
        return result
    if isinstance(result, pa.Table):
        return result.combine_chunks().to_batches()[0] if result.num_rows else pa.RecordBatch.from_pylist([], schema=result.schema)
    if isinstance(result, dict):
        return pa.RecordBatch.from_pydict(result)
    raise TypeError(f"{what} must return a pyarrow.RecordBatch, pyarrow.Table or dict of columns, "
                    f"got {type(result).__name__}")
