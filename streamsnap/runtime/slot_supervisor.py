"""A slot that outlives its subtasks, so a failed subtask does not cost a new Spark stage.

Flink restarts the tasks of a failed region in the TaskManagers that survived; a new barrier
stage, by contrast, costs Spark's scheduling of every task, a Python worker per slot and the
deployment of the closure again. Here the Spark barrier task (the slot) runs no subtask itself:
it forks one child per subtask and supervises them over its own authenticated control
connection to the JobMaster (cluster/slot_restart.py decides):

* ``stop`` (attempt n): SIGKILL every child of attempt n and reap it — nothing of the old
  attempt runs once the slot answers ``stopped``, the fence the next attempt relies on;
* ``deploy`` (attempt n + 1, where its checkpoint is): fork the attempt's children, which derive
  their restore plan from the checkpoint's ``_metadata`` exactly as the JobMaster did;
* ``release``: the job ends without them: return what the children reported.

The slot returns by itself once every child FINISHED. If the slot process dies, its children
die with it (parent-death signal) and the JobMaster falls back to a new Spark stage; if the
JobMaster's connection drops, the slot kills its children and fails its Spark task.

No thread runs in this process: the loop waits on the connection and the children's pipes with
`multiprocessing.connection.wait`, so forking a new attempt's children is safe at any time.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import socket
import time
from multiprocessing.connection import wait

from streamsnap.network import auth
from streamsnap.network.addresses import advertised_host, source_address
from streamsnap.network.frames import FrameDecoder, FrameKind, decode_message, encode_message
from streamsnap.runtime.deployment import Deployment

log = logging.getLogger(__name__)

# Seconds a slot whose subtasks all ended, not all FINISHED, waits for the JobMaster's word
# (a restart in place, or release) before it returns anyway and lets the Spark stage end.
ORPHAN_WAIT = 120.0
# Seconds a released slot's cancelled subtasks have to end before they are killed.
RELEASE_GRACE = 5.0


class JobMasterLost(ConnectionError):
    """The slot's connection to the JobMaster dropped: the job cannot go on with this slot."""


class SlotSupervisor:
    """Slot `slot_index` of a Spark barrier stage, across in-place attempts of its subtasks."""

    def __init__(self, deployment: Deployment, slot_index: int, host: str | None):
        self.deployment = deployment
        self.slot_index = slot_index
        self.host = host or advertised_host(socket.gethostname())
        self.tasks = tuple(deployment.slots[slot_index])
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder()
        self._children: dict[int, tuple] = {}   # task index -> (process, receiver) of the live attempt
        self._outcomes: dict[int, tuple] = {}

    # ------------------------------------------------------------------ the loop
    def run(self) -> list[tuple]:
        """Run the slot's subtasks, restarted in place on the JobMaster's word, to the job's end."""
        d = self.deployment
        # The first attempt forks before the connection exists; later forks close it in the child.
        self._fork(d)
        try:
            self._sock = auth.connect(d.driver_address, d.secret, source=source_address(self.host),
                                      peer_timeout=d.network.peer_timeout)
            self._send({"type": "slot", "slot": self.slot_index, "stage": d.attempt, "pid": os.getpid(),
                        "host": self.host})
            ended_at = None
            while True:
                sources = [self._sock] + [receiver for _, receiver in self._children.values()]
                for ready in wait(sources, timeout=1.0):
                    if ready is self._sock:
                        if self._on_data():
                            return self._ordered()
                        break   # a stop or deploy replaced the children `sources` named
                    self._on_child_report(ready)
                if not self._children and len(self._outcomes) == len(self.tasks):
                    if all(o[2] == "FINISHED" for o in self._outcomes.values()):
                        self._send({"type": "slot_done", "slot": self.slot_index})   # an end, not a loss
                        return self._ordered()
                    ended_at = ended_at or time.monotonic()
                    if time.monotonic() - ended_at > ORPHAN_WAIT:
                        log.warning("slot %d: its subtasks ended (%s) and the JobMaster said nothing for %.0f s; "
                                    "the slot ends", self.slot_index, self._ordered(), ORPHAN_WAIT)
                        return self._ordered()
                else:
                    ended_at = None
        except BaseException:
            self._kill_children()
            raise
        finally:
            if self._sock is not None:
                self._sock.close()

    def _on_data(self) -> bool:
        """Read from the JobMaster; True once it released the slot."""
        assert self._sock is not None
        data = self._sock.recv(1 << 16)
        if not data:
            raise JobMasterLost(f"slot {self.slot_index}: the connection to the JobMaster at "
                                f"{self.deployment.driver_address} dropped; its subtasks are stopped")
        for kind, payload in self._decoder.feed(data):
            if kind is not FrameKind.MESSAGE:
                raise JobMasterLost(f"slot {self.slot_index}: unexpected {kind.name} frame from the JobMaster")
            if self._on_message(decode_message(payload)):
                return True
        return False

    def _on_message(self, message: dict) -> bool:
        kind = message.get("type")
        if kind == "stop":
            started = time.monotonic()
            self._kill_children()
            self._outcomes.clear()
            self._send({"type": "slot_stopped", "slot": self.slot_index, "attempt": int(message["attempt"])})
            log.info("slot %d: attempt %s stopped in %.3f s", self.slot_index, message["attempt"],
                     time.monotonic() - started)
        elif kind == "deploy":
            self._kill_children()   # a deploy without a stop: nothing of an older attempt may run on
            self._outcomes.clear()
            self._fork(self.deployment.for_attempt(int(message["attempt"]), message.get("restore")))
        elif kind == "release":
            # The JobMaster cancelled the subtasks; one that does not end within RELEASE_GRACE is killed.
            deadline = time.monotonic() + RELEASE_GRACE
            for process, _ in list(self._children.values()):
                process.join(max(0.0, deadline - time.monotonic()))
                if process.is_alive():
                    process.kill()
            for task_index in list(self._children):
                self._collect(task_index)
            return True
        else:
            log.warning("slot %d: unknown message %r from the JobMaster ignored", self.slot_index, kind)
        return False

    # ------------------------------------------------------------------ children
    def _fork(self, deployment: Deployment) -> None:
        context = multiprocessing.get_context("fork")
        # Frozen across the fork, what a child inherits (the interpreter, pyspark, pyarrow,
        # numpy, streamsnap) stays out of its collections: the full collection a subtask runs
        # after its set-up (runtime/collector.py) walks only what it built itself, and never
        # writes to the inherited pages (Python's advice for fork without exec).
        gc.freeze()
        try:
            for task_index in self.tasks:
                receiver, sender = context.Pipe(duplex=False)
                child = context.Process(target=_run_child,
                                        args=(deployment, task_index, self.host, sender, os.getpid(), self._sock),
                                        name=f"streamsnap-subtask-{task_index}", daemon=False)
                child.start()
                sender.close()
                self._children[task_index] = (child, receiver)
        finally:
            gc.unfreeze()     # (the slot's own objects are collected as before)

    def _on_child_report(self, receiver) -> None:
        task_index = next(i for i, (_, r) in self._children.items() if r is receiver)
        self._collect(task_index)

    def _collect(self, task_index: int) -> None:
        from streamsnap.runtime.slot import child_outcome

        child, receiver = self._children.pop(task_index)
        self._outcomes[task_index] = child_outcome(self.deployment, task_index, child, receiver)

    def _kill_children(self) -> None:
        for child, receiver in self._children.values():
            if child.is_alive():
                child.kill()
        for child, receiver in self._children.values():
            child.join()
            receiver.close()
        self._children.clear()

    def _ordered(self) -> list[tuple]:
        return [self._outcomes[i] for i in self.tasks if i in self._outcomes]

    def _send(self, message: dict) -> None:
        assert self._sock is not None
        self._sock.sendall(encode_message(message))


def _run_child(deployment: Deployment, task_index: int, host: str, sender, parent_pid: int,
               inherited: socket.socket | None) -> None:
    from streamsnap.runtime.slot import _die_with_parent
    from streamsnap.runtime.task import run_task

    _die_with_parent(parent_pid)
    if inherited is not None:
        inherited.close()   # the slot's connection stays the slot's (close, never shutdown: shared)
    sender.send(run_task(deployment, task_index, host))
    sender.close()


__all__ = ["SlotSupervisor", "JobMasterLost", "ORPHAN_WAIT"]
