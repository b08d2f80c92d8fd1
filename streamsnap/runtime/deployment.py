"""What the driver ships to the Spark tasks of one deployment (Flink's TaskDeploymentDescriptor).

One `Deployment` travels in the barrier stage's closure; Spark task `i` (the partition id) is
slot `i` and runs the execution vertices `slots[i]` names. It carries the job graph with the user's functions,
the job secret every connection is authenticated with, the driver's control address, and the
state each subtask restores from.
"""

from __future__ import annotations

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

    def use_storage_options(self) -> None:
        """Open this job's checkpoint files with its storage options in this (executor) process."""
        from streamsnap.checkpoint import filesystem

        for directory, options in self.storage_options:
            filesystem.configure(directory, options)

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
