"""Keep a task's per-batch numpy/Arrow temporaries on the heap (glibc).

With glibc's defaults, arrays of a few hundred KB (one column of a 64K-row batch) are mapped
fresh from the kernel and unmapped again for every batch; the page faults then cost more than
the arithmetic. Raising the mmap and trim thresholds once per task process keeps those blocks
on the heap for reuse. Measured on vectorized W1: see benchmarks/results.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_done = False


def tune_allocator(mmap_threshold: int = 32 << 20, trim_threshold: int = 256 << 20) -> bool:
    """Apply once per process; returns whether glibc accepted it (False elsewhere)."""
    global _done
    if _done:
        return True
    if os.environ.get("STREAMSNAP_ALLOCATOR_TUNING", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as exc:
        log.debug("no glibc mallopt here (%s); allocator left as it is", exc)
        return False
    _done = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold))
    return _done
