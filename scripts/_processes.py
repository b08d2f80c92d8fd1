"""What the scripts that start local servers share: free loopback ports and stopping the
process groups they started (each server is launched as the leader of its own session)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_recorded(directory: str, state_file: str, what: str) -> None:
    """Stop every process group whose leader's pid `directory/state_file` records under "pids"
    (SIGTERM, then SIGKILL after 10 s), then delete the file."""
    path = os.path.join(directory, state_file)
    if not os.path.exists(path):
        sys.exit(f"no {state_file} in {directory}: no {what} to stop")
    with open(path) as f:
        pids = json.load(f)["pids"]
    for pid in pids.values():
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for pid in pids.values():
        while _exists(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_group(pid, signal.SIGKILL)
    os.remove(path)


def _signal_group(pid: int, sig: int) -> None:
    """Signal the process group a started process leads (its children are in it)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass            # already gone: nothing to stop


def _exists(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass            # not our child (stop runs in a later process): ask the kernel instead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return re.search(r"\) (\S)", f.read()).group(1) != "Z"


def kill_tree(pid: int) -> list[int]:
    """SIGKILL `pid` and every process below it at once, as a lost host loses them: each is
    frozen (SIGSTOP) first, until no new child appears, so none sees another go and reacts.
    Returns the pids killed."""
    frozen: set[int] = set()
    while True:
        tree = {pid, *_descendants(pid)} - frozen
        if not tree:
            break
        for each in tree:
            _signal(each, signal.SIGSTOP)
        frozen |= tree
    for each in frozen:
        _signal(each, signal.SIGKILL)
    return sorted(frozen)


def _descendants(pid: int) -> list[int]:
    """Every process whose chain of parents leads to `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue        # exited while we looked
        children.setdefault(ppid, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass            # already gone
