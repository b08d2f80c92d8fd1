"""Helpers for vectorized keyed functions: per-key running aggregates over a batch in numpy.

A KeyedBatchFunction sees a whole batch and its factorized keys (`BatchKeys`); these helpers do
the per-key arithmetic without a Python loop over rows.
"""

from __future__ import annotations

import numpy as np

from streamsnap.graph.partitioners import sort_key


def group_cumsum(values, index, initial) -> tuple[np.ndarray, np.ndarray]:
    """Running sums per key, in row order, continuing from each key's `initial` value.

    values: one number per row; index: per row, its key's position (`BatchKeys.index`);
    initial: per distinct key, the running sum before this batch (e.g. from state).
    Returns (running sum after each row, final sum per distinct key).
    """
    values = np.asarray(values)
    index = np.asarray(index, dtype=np.int64)
    initial = np.asarray(initial)
    if values.shape != index.shape:
        raise ValueError(f"group_cumsum: {values.shape[0]} values but {index.shape[0]} key positions")
    groups = initial.shape[0]
    if index.size and (index.min() < 0 or index.max() >= groups):
        raise ValueError(f"group_cumsum: key positions must lie in 0..{groups - 1}")
    dtype = np.result_type(values, initial)
    key = sort_key(index, groups)
    order = np.argsort(key, kind="stable")          # rows grouped by key, row order kept
    prefix = np.empty(values.shape[0] + 1, dtype=dtype)
    prefix[0] = 0
    np.cumsum(values[order], dtype=dtype, out=prefix[1:])
    counts = np.bincount(key, minlength=groups)
    ends = np.cumsum(counts)
    starts = ends - counts
    # Each group's prefix restarts at the key's initial value: shift its run by one constant.
    running_sorted = prefix[1:] + np.repeat(initial - prefix[starts], counts)
    running = np.empty_like(running_sorted)
    running[order] = running_sorted
    return running, initial + (prefix[ends] - prefix[starts])
