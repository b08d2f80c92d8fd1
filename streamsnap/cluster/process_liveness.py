"""Whether a process is alive, and when this one started (Linux /proc, with a fallback).

The JobMaster in the cluster (cluster/in_cluster.py) is a child of task 0's Python worker: on
SIGTERM it must tell its parent's death apart from a stop request, and a recovery's timeline
tells the worker's start-up apart from the task's own work. Both need the process facts here.
"""

from __future__ import annotations

import os
import time


def parent_gone(parent_pid: int, wait: float = 0.5) -> bool:
    """Whether the process that forked us died. The parent-death signal is sent while the
    parent exits, so it may still look alive for a moment (and being reparented is not always
    visible at once): give it `wait` seconds before deciding the signal came from elsewhere."""
    deadline = time.monotonic() + wait
    while True:
        if os.getppid() != parent_pid or not running(parent_pid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def running(pid: int) -> bool:
    """Alive and not a zombie (a SIGKILLed process stays one until its parent reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:       # no /proc: whether the pid exists at all
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def process_start_time() -> float | None:
    """Wall-clock start of this Python worker process (Linux /proc), to tell worker start-up
    apart from the task's own work in a recovery's timeline; None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


__all__ = ["parent_gone", "running", "process_start_time"]
