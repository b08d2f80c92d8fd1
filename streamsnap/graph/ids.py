"""Identifiers of vertices, subtasks and their execution attempts.

A subtask is one parallel instance of a job vertex; every (re)deployment gives it a new
attempt number, so acknowledgements from a previous attempt are recognised as UNKNOWN.
"""

from __future__ import annotations

from dataclasses import dataclass


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
