"""Key groups computed by a keyed edge's sender, shipped with the rows to the keyed receiver.

Why: a hash edge's writer computes every row's key group to pick its channel, and the per-row
keyed operator on the other side needs the same key groups to scope its state — computing them
there again (a dict lookup or a hash per row) is a per-row cost the receiver can skip. The
sender appends them to each Arrow batch it routes as one more column, so they follow the rows
through the wire, the input's merges and slices and a checkpoint's channel state; the receiver
takes the column off before it builds the rows, so user functions never see it.

Only edges whose receiver is a one-input per-row keyed `process` with the partitioner's own key
selector and max parallelism carry the column (`KeyGroupPartitioner.ship_key_groups`, set where
that edge is built): the key groups are then exactly the ones the receiver would compute. A
batch without the column (rows routed as lists, a frame written by an older build) is keyed by
the receiver as before. The column is recognized by its field metadata, not its name alone, so
a user field of the same name is never taken for it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

KEY_GROUP_COLUMN = "__streamsnap_key_group"
_MARK = {b"streamsnap": b"key_group"}
_FIELD = pa.field(KEY_GROUP_COLUMN, pa.int16(), nullable=False, metadata=_MARK)
_WIDE_FIELD = pa.field(KEY_GROUP_COLUMN, pa.int32(), nullable=False, metadata=_MARK)


def attach(batch: pa.RecordBatch, key_groups: np.ndarray, max_parallelism: int) -> pa.RecordBatch:
    """`batch` with `key_groups` (one per row, each < max_parallelism) as its last column."""
    field = _FIELD if max_parallelism <= 1 << 15 else _WIDE_FIELD
    values = pa.array(key_groups.astype(field.type.to_pandas_dtype(), copy=False), type=field.type)
    return batch.append_column(field, values)


def detach(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, list | None]:
    """`batch` without the shipped key-group column and the key groups as Python ints, or
    (`batch`, None) when it carries none."""
    schema = batch.schema
    if not schema.names or schema.names[-1] != KEY_GROUP_COLUMN or schema.field(-1).metadata != _MARK:
        return batch, None
    last = batch.num_columns - 1
    return batch.remove_column(last), batch.column(last).to_numpy().tolist()
