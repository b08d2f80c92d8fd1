"""Identifiers of jobs, vertices, subtasks and their execution attempts.

A subtask is one parallel instance of a job vertex; every (re)deployment gives it a new
attempt number, so acknowledgements from a previous attempt are recognised as UNKNOWN.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from streamsnap.errors import ConfigurationError


@dataclass(frozen=True, order=True)
class SubtaskId:
    vertex_id: str
    index: int

    def __str__(self) -> str:
        return f"{self.vertex_id}#{self.index}"


@dataclass(frozen=True, order=True)
class ExecutionAttemptId:
    vertex_id: str
    index: int
    attempt: int

    @property
    def subtask(self) -> SubtaskId:
        return SubtaskId(self.vertex_id, self.index)

    def to_wire(self) -> list:
        return [self.vertex_id, self.index, self.attempt]

    @classmethod
    def from_wire(cls, data: list) -> "ExecutionAttemptId":
        vertex_id, index, attempt = data
        return cls(str(vertex_id), int(index), int(attempt))

    def __str__(self) -> str:
        return f"{self.vertex_id}#{self.index}(attempt {self.attempt})"


def job_id_for_name(job_name: str) -> str:
    """A job's stable id when none is given: readable, path-safe, and the same on every run of
    the same name — so a job started again after its driver died finds its own checkpoints."""
    slug = re.sub(r"[^A-Za-z0-9_.]+", "-", job_name).strip("-.")[:40] or "job"
    return f"{slug}-{hashlib.sha256(job_name.encode()).hexdigest()[:8]}"


def check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", job_id):
        raise ConfigurationError(
            f"job_id must be 1-100 letters, digits, '_', '.' or '-' (it names the job's checkpoint "
            f"directory), got {job_id!r}")
    return job_id
