"""JobGraph -> ExecutionGraph: every job vertex expanded to its parallel subtasks and channels.

Each execution vertex (subtask) becomes one Spark barrier task; its global `task_index` is the
Spark partition id. Channels are concrete (upstream subtask -> downstream subtask) pairs: one
per subtask pair on all-to-all edges, one per index on forward edges.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streamsnap.graph.ids import SubtaskId
from streamsnap.graph.job_graph import JobGraph, JobVertex
from streamsnap.graph.partitioners import Partitioner
from streamsnap.network.channels import ChannelId


@dataclass(frozen=True)
class OutputGate:
    """One network output of a subtask: an edge, fanned out over its channels."""

    edge: int
    source_node: int
    partitioner: Partitioner
    channels: tuple[ChannelId, ...]
    target_tasks: tuple[int, ...]
    tag: str | None = None     # the side output sent on this gate; None: the main output


@dataclass
class ExecutionVertex:
    vertex_id: str
    index: int
    parallelism: int
    task_index: int
    inputs: list[ChannelId] = field(default_factory=list)
    input_tasks: list[int] = field(default_factory=list)
    input_of: list[int] = field(default_factory=list)   # logical input of each channel in `inputs`
    outputs: list[OutputGate] = field(default_factory=list)

    @property
    def subtask(self) -> SubtaskId:
        return SubtaskId(self.vertex_id, self.index)

    def __str__(self) -> str:
        return f"{self.vertex_id}#{self.index}"


@dataclass
class ExecutionGraph:
    job_graph: JobGraph
    vertices: list[ExecutionVertex]

    @property
    def num_tasks(self) -> int:
        return len(self.vertices)

    def subtasks(self, vertex_id: str) -> list[ExecutionVertex]:
        return [v for v in self.vertices if v.vertex_id == vertex_id]

    def job_vertex(self, vertex_id: str) -> JobVertex:
        return self.job_graph.vertices[vertex_id]


def build_execution_graph(job_graph: JobGraph) -> ExecutionGraph:
    vertices: list[ExecutionVertex] = []
    by_subtask: dict[tuple[str, int], ExecutionVertex] = {}
    for job_vertex in job_graph.vertices.values():
        for i in range(job_vertex.parallelism):
            ev = ExecutionVertex(job_vertex.id, i, job_vertex.parallelism, len(vertices))
            vertices.append(ev)
            by_subtask[(job_vertex.id, i)] = ev
    for edge in job_graph.edges:
        source = job_graph.vertices[edge.source_vertex]
        target = job_graph.vertices[edge.target_vertex]
        for i in range(source.parallelism):
            upstream = by_subtask[(source.id, i)]
            targets = range(target.parallelism) if edge.partitioner.all_to_all else [i]
            channels = []
            for j in targets:
                downstream = by_subtask[(target.id, j)]
                channel = ChannelId(edge.index, source.id, i, target.id, j)
                channels.append(channel)
                downstream.inputs.append(channel)
                downstream.input_tasks.append(upstream.task_index)
                downstream.input_of.append(edge.input_index)
            upstream.outputs.append(OutputGate(edge.index, edge.source_node, edge.partitioner,
                                               tuple(channels),
                                               tuple(by_subtask[(target.id, j)].task_index for j in targets),
                                               edge.tag))
    return ExecutionGraph(job_graph, vertices)
