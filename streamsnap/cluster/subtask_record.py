"""What the JobMaster knows of one subtask of the current attempt (cluster/jobmaster.py).

Its control connection, where it runs, its state and its latest reports: kept per task index on
the JobMaster's event loop, read by the failover logic (cluster/failover.py) and the job's result.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamsnap.cluster.status import ExecutionState
from streamsnap.graph.ids import ExecutionAttemptId
from streamsnap.network.control import ControlConnection


@dataclass
class SubtaskRecord:
    attempt_id: ExecutionAttemptId
    task_index: int
    state: ExecutionState = ExecutionState.DEPLOYING
    connection: ControlConnection | None = None
    pid: int | None = None
    host: str | None = None
    data_address: tuple | None = None
    end_of_data: bool = False
    metrics: dict | None = None
    local_recovery: dict | None = None   # the task-local store's metrics when it ran (restore)


__all__ = ["SubtaskRecord"]
