"""Lifecycle states of a job and of each task execution (Flink's JobStatus/ExecutionState)."""

from __future__ import annotations

import enum


class JobStatus(enum.Enum):
    CREATED = "CREATED"
    RUNNING = "RUNNING"
    FAILING = "FAILING"
    RESTARTING = "RESTARTING"
    CANCELLING = "CANCELLING"
    CANCELED = "CANCELED"
    FAILED = "FAILED"
    FINISHED = "FINISHED"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.CANCELED, JobStatus.FAILED, JobStatus.FINISHED)


class ExecutionState(enum.Enum):
    CREATED = "CREATED"
    DEPLOYING = "DEPLOYING"
    INITIALIZING = "INITIALIZING"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    CANCELED = "CANCELED"
    FAILED = "FAILED"
