"""What the driver ships to the Spark tasks of one deployment (Flink's TaskDeploymentDescriptor).

One `Deployment` travels in the barrier stage's closure; Spark task `i` (the partition id) is
slot `i` and runs the execution vertices `slots[i]` names. It carries the job graph with the user's functions,
the job secret every connection is authenticated with, the driver's control address, and the
state each subtask restores from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from streamsnap.api.config import NetworkConfig
from streamsnap.graph.execution_graph import ExecutionGraph, ExecutionVertex
from streamsnap.graph.ids import ExecutionAttemptId


@dataclass
class Deployment:
    job_id: str
    job_name: str
    attempt: int
    execution_graph: ExecutionGraph
    secret: bytes
    driver_address: tuple[str, int]
    bind_host: str
    network: NetworkConfig
    run_id: str = ""  # this run of the job (a restarted driver starts a new run)
    state_backend: str = "hashmap"
    checkpointing: bool = False
    exactly_once: bool = True
    unaligned_checkpoints: bool = False
    # (operator uid, subtask index) -> state.assignment.SubtaskRestoreState
    restore: dict[tuple[str, int], Any] = field(default_factory=dict)
    restore_base: str | None = None  # directory the restored checkpoint's handle paths are relative to
    restored_operators: frozenset[str] = frozenset()  # uids the restored checkpoint had
    restored_checkpoint_id: int | None = None
    # The restored snapshot is a stop-with-savepoint that drained: commit what it covers, then
    # finish without reading or firing anything (the job must not run past its drain).
    finish_at_restore: bool = False
    log_level: str = "WARNING"
    # Whether a task's own stderr handlers also print what is relayed to the driver: not on a
    # local master, whose workers' stderr is the driver's terminal (runtime/log_relay.py).
    echo_logs: bool = True
    # Task-local recovery (state.local_recovery): keep keyed snapshots on the task's disk too.
    local_recovery: bool = False
    local_recovery_dir: str | None = None
    # Slot s runs these task indices, the first in the Spark task's own process (graph/slot_sharing.py).
    slots: tuple[tuple[int, ...], ...] = ()
    # Test hooks: environment flags the task honours (e.g. slow down a subtask); never set by users.
    test_hooks: dict = field(default_factory=dict)
    # (checkpoint directory, fsspec storage options) the executors open checkpoint files with
    # (CheckpointConfig.storage_options: credentials, so never logged).
    storage_options: tuple = field(default=(), repr=False)
    # Keep state of operators the job no longer has when restoring (JobSettings' option).
    allow_non_restored_state: bool = False
    # The slot outlives its subtasks: it connects to the JobMaster itself and restarts them in
    # place on its word (runtime/slot_supervisor.py), instead of ending with them.
    supervised_slots: bool = False

    def use_storage_options(self) -> None:
        """Open this job's checkpoint files with its storage options in this (executor) process."""
        from streamsnap.checkpoint import filesystem

        for directory, options in self.storage_options:
            filesystem.configure(directory, options)

    def for_attempt(self, attempt: int, restore: dict | None, **changes) -> "Deployment":
        """This deployment made attempt `attempt`'s, restoring `restore` ({"metadata": its
        `_metadata` URL, "base": its directory, "finish_at_restore": bool}, or None for a fresh
        start). The restore plan is derived here, from the checkpoint's `_metadata`, exactly as
        the JobMaster derives it: what travels is where the checkpoint is, never state objects."""
        changes.update(attempt=attempt, restore={}, restore_base=None, restored_operators=frozenset(),
                       restored_checkpoint_id=None, finish_at_restore=False)
        if restore is not None:
            from streamsnap.checkpoint.metadata import read_metadata
            from streamsnap.checkpoint.restore import plan_restore

            plan = plan_restore(read_metadata(restore["metadata"]), restore["base"], self.execution_graph.job_graph,
                                self.allow_non_restored_state)
            changes.update(restore=plan.states, restore_base=plan.base_location,
                           restored_operators=plan.restored_operators, restored_checkpoint_id=plan.checkpoint_id,
                           finish_at_restore=bool(restore["finish_at_restore"]))
        return dataclasses.replace(self, **changes)

    def vertex(self, task_index: int) -> ExecutionVertex:
        return self.execution_graph.vertices[task_index]

    def attempt_id(self, task_index: int) -> ExecutionAttemptId:
        v = self.vertex(task_index)
        return ExecutionAttemptId(v.vertex_id, v.index, self.attempt)


def slot_runner(deployment: Deployment):
    """The function each barrier task runs: `run(slot, host)` runs the slot's subtasks to their
    end (host: the address other executors reach this one at, as Spark knows it)."""

    def run(slot: int, host: str):
        from streamsnap.runtime.slot import run_slot

        return run_slot(deployment, slot, host)

    return run
