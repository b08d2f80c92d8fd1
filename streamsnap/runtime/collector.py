"""Keep Python's cyclic garbage collector off a running task's critical path.

A task imports pyarrow, numpy and the job's code and builds its operators before the first
record: hundreds of thousands of long-lived objects. Every full (generation 2) collection
walks all of them, a pause of tens of milliseconds that shows as latency tail. Collecting once
after set-up and then freezing what is left (`gc.freeze`) moves those objects out of the
collector's sight; objects made while the task runs are collected as usual. At teardown they
are unfrozen, so a reused Python worker does not keep a finished task's objects forever.
"""

from __future__ import annotations

import gc
import os

_ENV = "STREAMSNAP_GC_FREEZE"   # "0" turns it off (for comparisons)


def freeze_after_setup() -> bool:
    """Collect, then freeze every object alive now; returns whether it did."""
    if os.environ.get(_ENV, "1") == "0":
        return False
    gc.collect()
    gc.freeze()
    return True


def unfreeze_at_teardown() -> None:
    gc.unfreeze()
