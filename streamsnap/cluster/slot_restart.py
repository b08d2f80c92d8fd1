"""Restarts in the slots that survived: a failed subtask costs its attempt, not the Spark stage.

Flink restarts a failed region's tasks in the TaskManagers still there. Here the slots are the
tasks of one Spark barrier stage; each supervises its subtasks (runtime/slot_supervisor.py)
and keeps a control connection to the JobMaster. When an attempt fails and every slot of the
running stage is still connected, the JobMaster asks each slot to stop the attempt (SIGKILL and
reap its subtasks), waits for all of them to confirm — nothing of the old attempt runs after
that — and deploys the next attempt into the same slots with where its checkpoint is. The
restart strategy, backoff and root-cause rules are the same as for any restart.

A lost slot (its process died, its host went, a partition cut it off) cannot be restarted in:
then, or when a slot does not confirm within SLOT_STOP_TIMEOUT, the JobMaster falls back to
cancelling the Spark stage and deploying a new one, as without supervised slots.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from streamsnap.cluster.status import JobStatus
from streamsnap.network.control import ControlConnection

log = logging.getLogger("streamsnap.cluster.jobmaster")   # the JobMaster's log

SLOT_STOP_TIMEOUT = 5.0     # seconds the slots have to confirm an attempt stopped, else a new Spark stage


@dataclass
class SlotRecord:
    """A connected slot of the running stage (the connection's context)."""

    index: int
    stage: int        # the attempt that launched the stage the slot belongs to
    pid: int
    host: str
    done: bool = False   # its subtasks all finished: its connection closing is the job's end, not a loss


class SlotRestart:
    """Mixin of the JobMaster: the slots' connections, in-place stops and deploys."""

    def _init_slot_restart(self) -> None:
        self._slot_conns: dict[int, ControlConnection] = {}
        self._stage_attempt: int | None = None    # the attempt whose Spark stage runs
        self._stage_usable = False                # its slots may take a new attempt
        self._slots_stopping: set[int] | None = None
        self._slot_stop_timer = None

    # ------------------------------------------------------------------ messages
    def _handle_slot_message(self, conn: ControlConnection, message: dict) -> None:
        kind = message.get("type")
        if kind == "slot":
            record = SlotRecord(int(message["slot"]), int(message["stage"]), int(message["pid"]), str(message["host"]))
            if record.stage != self._stage_attempt or not self._stage_usable or self.status.is_terminal:
                conn.send({"type": "release"})   # a slot of a stage being cancelled: nothing to run
                return
            conn.context = record
            self._slot_conns[record.index] = conn
        elif kind == "slot_done":
            if isinstance(conn.context, SlotRecord):
                conn.context.done = True
        elif kind == "slot_stopped":
            record = conn.context
            if self._slots_stopping is None or not isinstance(record, SlotRecord) or \
                    int(message["attempt"]) != self._attempt:
                return
            self._slots_stopping.discard(record.index)
            if not self._slots_stopping:
                self._slots_stopping = None
                if self._slot_stop_timer is not None:
                    self._slot_stop_timer.cancel()
                self._after_attempt_stopped()

    def _slot_closed(self, conn: ControlConnection, error) -> None:
        record = conn.context
        if self._slot_conns.get(record.index) is conn:
            del self._slot_conns[record.index]
        if record.stage == self._stage_attempt and self._stage_usable and not record.done:
            self._stage_usable = False
            if not self.status.is_terminal and self.status is not JobStatus.CANCELLING:
                log.info("slot %d (pid %d on %s) of job '%s' is gone%s: the next attempt needs a new Spark stage",
                         record.index, record.pid, record.host, self.settings.job_name, f" ({error})" if error else "")
            if self._slots_stopping is not None:
                self._fall_back_to_new_stage(f"slot {record.index} was lost while the attempt stopped")
            elif not (self._failing or self.status.is_terminal or self.status is JobStatus.CANCELLING):
                # Its subtasks' connections drop too, unless it died between attempts (deploying):
                # then this is the only sign of it.
                self._handle_failure(
                    f"lost slot {record.index} (pid {record.pid} on {record.host}): its connection to the driver "
                    f"dropped — the Spark task's Python worker died or was killed" + (f" ({error})" if error else ""),
                    "TASK_LOST", self._attempt, f"slot {record.index}")

    # ------------------------------------------------------------------ the attempt
    def _can_restart_in_place(self) -> bool:
        return (self._stage_usable and self._spark_running and not self._cancel_requested
                and len(self._slot_conns) == len(self.slots))

    def _stop_in_place(self) -> bool:
        """Stop the failing attempt through the slots, keeping the Spark stage; False if that
        cannot be (a slot is gone, the job is being cancelled): then the stage is cancelled."""
        if not (self._failing and self._can_restart_in_place()):
            if self._failing and self._stage_attempt is not None:
                log.info("job '%s' attempt %d restarts with a new Spark stage (stage usable: %s, slots connected: "
                         "%d of %d)", self.settings.job_name, self._attempt, self._stage_usable,
                         len(self._slot_conns), len(self.slots))
            self._stage_usable = False
            self._release_slot_conns()
            return False
        attempt = self._attempt
        self._slots_stopping = set(self._slot_conns)
        for conn in list(self._slot_conns.values()):
            if not conn.send({"type": "stop", "attempt": attempt}):
                self._fall_back_to_new_stage("a slot's connection was gone")
                return True
        self._slot_stop_timer = self._timers.call_later(SLOT_STOP_TIMEOUT, lambda: self._slots_stop_overdue(attempt))
        return True

    def _slots_stop_overdue(self, attempt: int) -> None:
        if self._slots_stopping is not None and self._attempt == attempt:
            self._fall_back_to_new_stage(f"slots {sorted(self._slots_stopping)} did not stop attempt {attempt} "
                                         f"within {SLOT_STOP_TIMEOUT:.0f} s")

    def _fall_back_to_new_stage(self, why: str) -> None:
        log.warning("job '%s': %s; restarting with a new Spark stage", self.settings.job_name, why)
        self._slots_stopping = None
        self._stage_usable = False
        if self._slot_stop_timer is not None:
            self._slot_stop_timer.cancel()
        self._send_all({"type": "cancel"})
        self._release_slot_conns()
        self._cancel_spark()

    def _release_slot_conns(self) -> None:
        """The stage is ending: its slots return once their subtasks have (the JobMaster cancels
        them), freeing their Spark cores for the next stage at once instead of when Spark kills
        the Python workers."""
        for conn in list(self._slot_conns.values()):
            conn.send({"type": "release"})
        self._slot_conns.clear()

    def _deploy_in_place(self, deployment) -> bool:
        """Deploy the attempt into the running stage's slots; False: it needs a new Spark stage
        (the caller launches it, and its slots take later attempts if they are supervised)."""
        recovering = bool(self.recovery_log) and "running_at" not in self.recovery_log[-1]
        if self._can_restart_in_place():
            message = {"type": "deploy", "attempt": self._attempt, "restore": self._restore_entry()}
            for conn in list(self._slot_conns.values()):
                conn.send(dict(message))
            if recovering:
                self.recovery_log[-1]["restart"] = "in place"
            return True
        if recovering:
            self.recovery_log[-1]["restart"] = "new stage"
        self._slot_conns.clear()
        self._stage_attempt = self._attempt
        self._stage_usable = deployment.supervised_slots
        return False

    def _stage_ended_attempt(self, attempt: int) -> int:
        """The attempt a Spark job's end concerns: the stage launched by `attempt` may have run
        later attempts in place, and ends with the current one."""
        return self._attempt if attempt == self._stage_attempt else attempt

    def _release_slots(self) -> None:
        """The job ends while its slots wait for a next attempt (no restart left, a data error):
        let them go, so the stage ends cleanly instead of by cancellation."""
        if self._spark_running and self._stage_usable:
            self._release_slot_conns()
            self._stage_usable = False


__all__ = ["SlotRestart", "SlotRecord", "SLOT_STOP_TIMEOUT"]
