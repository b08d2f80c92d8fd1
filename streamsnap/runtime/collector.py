"""Keep Python's cyclic garbage collector off a running task's critical path.

A task imports pyarrow, numpy and the job's code and builds its operators before the first
record: hundreds of thousands of long-lived objects. Every full (generation 2) collection
walks all of them, a pause of tens of milliseconds that shows as latency tail. Collecting once
after set-up and then freezing what is left (`gc.freeze`) moves those objects out of the
collector's sight; objects made while the task runs are collected as usual. A subtask forked by
its slot inherits the slot's objects already frozen (runtime/slot_supervisor.py), so that
collection walks only what the subtask built: a child of a process that imported pyspark,
pyarrow, numpy, pandas and streamsnap collects in 0.2 ms instead of ~60 ms.

A per-row task also makes two dicts per row (the input row and the result) that live until
their batch is done: with Python's default first-generation threshold (700 allocations) a
collection runs every few hundred rows and walks the batch's live rows again each time, about
5 % of a per-row keyed operator's time (measured: 766 -> 725 ns/row with a threshold of 10,000
on 2048-row batches). A task raises the threshold while it runs; a collection then walks at
most that many young objects, well under a millisecond.

At teardown the objects are unfrozen and the threshold restored, so a reused Python worker does
not keep a finished task's objects or settings.
"""

from __future__ import annotations

import gc
import os

_ENV = "STREAMSNAP_GC_FREEZE"   # "0" turns it off (for comparisons)
YOUNG_THRESHOLD = 10_000
_saved_thresholds: tuple | None = None


def freeze_after_setup() -> bool:
    """Collect, then freeze every object alive now and raise the first-generation threshold;
    returns whether it did."""
    global _saved_thresholds
    if os.environ.get(_ENV, "1") == "0":
        return False
    gc.collect()
    gc.freeze()
    if _saved_thresholds is None:
        _saved_thresholds = gc.get_threshold()
        gc.set_threshold(max(YOUNG_THRESHOLD, _saved_thresholds[0]), *_saved_thresholds[1:])
    return True


def unfreeze_at_teardown() -> None:
    global _saved_thresholds
    gc.unfreeze()
    if _saved_thresholds is not None:
        gc.set_threshold(*_saved_thresholds)
        _saved_thresholds = None
