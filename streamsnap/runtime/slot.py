"""One Spark task slot running its share of the pipeline (graph/slot_sharing.py).

The Spark barrier task is the slot, and every subtask it hosts keeps a process (and a GIL) of
its own. Children die with the slot: they ask the kernel for SIGKILL when their parent dies
(Linux prctl PR_SET_PDEATHSIG), so a killed Python worker or a Spark task kill takes the
whole slot down, as a lost TaskManager does in Flink.

With a JobMaster in the client (`Deployment.supervised_slots`) the slot runs no subtask itself:
it forks them all and supervises them (runtime/slot_supervisor.py), so a subtask that dies
alone is restarted in the slots that survived, without a new Spark stage. Otherwise (a
JobMaster inside the stage, cluster/in_cluster.py, whose attempts are Spark's stage retries)
the slot runs its first subtask itself and forks the others; a child that dies alone is
noticed by the driver (its control connection drops), which fails the attempt and cancels the rest.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys

from streamsnap.runtime.deployment import Deployment

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def run_slot(deployment: Deployment, slot_index: int, host: str | None = None) -> list[tuple]:
    """Run every subtask of slot `slot_index` to its end; one outcome per subtask.

    host: the address other executors reach this one at (Spark's name for the executor).
    """
    from streamsnap.runtime.task import run_task

    deployment.use_storage_options()   # before the forks: every subtask process inherits them
    if deployment.supervised_slots:
        from streamsnap.runtime.slot_supervisor import SlotSupervisor

        return SlotSupervisor(deployment, slot_index, host).run()
    first, *others = deployment.slots[slot_index]
    context = multiprocessing.get_context("fork")
    children = []
    try:
        # Fork before this process starts any thread of its own (the task's network and
        # checkpoint threads), so no child inherits a lock held by a thread it does not have.
        for task_index in others:
            receiver, sender = context.Pipe(duplex=False)
            child = context.Process(target=_run_child, args=(deployment, task_index, host, sender, os.getpid()),
                                    name=f"streamsnap-subtask-{task_index}", daemon=False)
            child.start()
            sender.close()
            children.append((task_index, child, receiver))
        outcomes = [run_task(deployment, first, host)]
        for task_index, child, receiver in children:
            outcomes.append(child_outcome(deployment, task_index, child, receiver))
    except BaseException:
        # The slot is going away (Spark interrupted it, or a fork failed): its subtasks go with it.
        for _, child, _ in children:
            if child.is_alive():
                child.kill()
        raise
    return outcomes


def child_outcome(deployment: Deployment, task_index: int, child, receiver) -> tuple:
    try:
        outcome = receiver.recv()
    except EOFError:        # the child died before reporting (SIGKILL); the driver saw it go
        outcome = None
    child.join()
    receiver.close()
    if outcome is None:
        outcome = (task_index, str(deployment.vertex(task_index)), f"KILLED (exit code {child.exitcode})")
    return outcome


def _run_child(deployment: Deployment, task_index: int, host: str | None, sender, parent_pid: int) -> None:
    from streamsnap.runtime.task import run_task

    _die_with_parent(parent_pid)
    sender.send(run_task(deployment, task_index, host))
    sender.close()


def _die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal this process (SIGKILL) when the slot's process dies (Linux); elsewhere the driver cancels it."""
    if not sys.platform.startswith("linux"):
        log.debug("no parent-death signal on %s; an orphaned subtask ends when the driver cancels it",
                  sys.platform)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")
    if os.getppid() != parent_pid:      # the parent died before the signal was armed
        os._exit(1)
