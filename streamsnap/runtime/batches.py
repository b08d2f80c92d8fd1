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

from streamsnap.errors import UsageError
from streamsnap.runtime.schemas import RowSchema

Batch = Union[list, pa.RecordBatch]


def num_rows(batch: Batch) -> int:
    return batch.num_rows if isinstance(batch, pa.RecordBatch) else len(batch)


def to_rows(batch: Batch) -> list:
    if not isinstance(batch, pa.RecordBatch):
        return batch
    return rows_and_columns(batch)[0]


def rows_of(batch: Batch) -> tuple[list, list | None]:
    """`batch`'s rows and, for an Arrow batch, its columns as Python lists when the rows were
    built from them (see `rows_and_columns`): a keyed operator reads its key column from them."""
    if isinstance(batch, pa.RecordBatch):
        return rows_and_columns(batch)
    return batch, None


def rows_and_columns(batch: pa.RecordBatch) -> tuple[list, list | None]:
    """An Arrow batch's rows as dicts — equal to `batch.to_pylist()` — and, when they were built
    from them, its columns as Python lists (callers reuse a key column instead of converting it
    again), else None."""
    builder = _row_builder(tuple(batch.schema.names))
    if builder is None:
        return batch.to_pylist(), None
    columns = [column.to_pylist() for column in batch.columns]
    return builder(*columns), columns


# Rows are built by a comprehension made for the batch's field names, `{'a': v0, 'b': v1}` per
# row: a dict display is the fastest dict Python builds (RecordBatch.to_pylist builds each row
# with a loop over the names). One builder per distinct list of names, cached.
_ROW_BUILDERS: dict = {}
_MAX_BUILDER_FIELDS = 64
_MAX_BUILDERS = 1024


def _row_builder(names: tuple):
    try:
        return _ROW_BUILDERS[names]
    except KeyError:
        pass
    builder = None
    k = len(names)
    # Duplicate names (the last would win in a dict) and very wide rows: Arrow's own conversion.
    if 0 < k <= _MAX_BUILDER_FIELDS and len(set(names)) == k and all(type(n) is str for n in names):
        values = [f"v{i}" for i in range(k)]
        row = "{" + ", ".join(f"{name!r}: {v}" for name, v in zip(names, values)) + "}"
        if k == 1:
            source = f"lambda c0: [{row} for v0 in c0]"
        else:
            columns = ", ".join(f"c{i}" for i in range(k))
            source = f"lambda {columns}: [{row} for {', '.join(values)} in zip({columns})]"
        # Field names enter only as string literals (repr), so no name can inject code.
        builder = eval(source, {"__builtins__": {}, "zip": zip})  # noqa: S307
    if len(_ROW_BUILDERS) < _MAX_BUILDERS:
        _ROW_BUILDERS[names] = builder
    return builder


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
    raise UsageError(f"{what} must return a pyarrow.RecordBatch, pyarrow.Table or dict of columns, "
                    f"got {type(result).__name__}")
