"""StreamGraph -> JobGraph: operators chained into tasks (Flink's operator chaining).

A node joins its upstream's chain when the edge between them is forward (explicit or by
default), both have the same parallelism, and the node has no other input. Chains may branch
(one operator feeding several chained operators), so a chain is a tree rooted at its head.
Every other edge becomes a network JobEdge between two job vertices. Side-output edges chain
and cross the network like any other; they keep their tag so the task wires them to the
operator's side output of that name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streamsnap.errors import ConfigurationError
from streamsnap.graph.partitioners import ForwardPartitioner, Partitioner, RebalancePartitioner
from streamsnap.graph.stream_graph import NodeKind, StreamGraph, StreamNode


@dataclass
class JobEdge:
    index: int
    source_vertex: str
    source_node: int       # the operator inside the source vertex that emits on this edge
    target_vertex: str
    partitioner: Partitioner
    tag: str | None = None     # side output carried by this edge; None: the main output
    input_index: int = 0       # the target's logical input this edge feeds (two-input operators)


@dataclass
class JobVertex:
    id: str
    head: int
    parallelism: int
    max_parallelism: int
    nodes: list[int] = field(default_factory=list)          # topological, head first
    chained: dict[int, list[int]] = field(default_factory=dict)  # node -> chained successors
    chained_tags: dict[int, str] = field(default_factory=dict)   # successor fed by a side output
    inputs: list[JobEdge] = field(default_factory=list)
    outputs: list[JobEdge] = field(default_factory=list)
    name: str = ""

    @property
    def is_source(self) -> bool:
        return not self.inputs


@dataclass
class JobGraph:
    job_name: str
    stream_graph: StreamGraph
    vertices: dict[str, JobVertex]
    edges: list[JobEdge]

    def node(self, node_id: int) -> StreamNode:
        return self.stream_graph.nodes[node_id]

    def vertex_of_node(self, node_id: int) -> JobVertex:
        for vertex in self.vertices.values():
            if node_id in vertex.nodes:
                return vertex
        raise KeyError(node_id)

    def operators(self) -> list[StreamNode]:
        return [self.node(n) for v in self.vertices.values() for n in v.nodes]


def _resolve_partitioner(graph: StreamGraph, source: StreamNode, target: StreamNode,
                         partitioner: Partitioner | None) -> Partitioner:
    if partitioner is None:
        return ForwardPartitioner() if source.parallelism == target.parallelism else RebalancePartitioner()
    if isinstance(partitioner, ForwardPartitioner) and source.parallelism != target.parallelism:
        raise ConfigurationError(
            f"forward() from {source} to {target}: forward partitioning needs equal parallelism; "
            f"use rebalance() or give both the same parallelism")
    return partitioner


def build_job_graph(graph: StreamGraph) -> JobGraph:
    graph.validate()
    vertices: dict[str, JobVertex] = {}
    vertex_of: dict[int, JobVertex] = {}
    edges: list[JobEdge] = []
    for node in sorted(graph.nodes.values(), key=lambda n: n.id):
        in_edges = node.in_edges
        resolved = [(e, _resolve_partitioner(graph, graph.nodes[e.source], node, e.partitioner)) for e in in_edges]
        chain_to = None
        if node.kind is not NodeKind.SOURCE and len(resolved) == 1:
            edge, partitioner = resolved[0]
            upstream = graph.nodes[edge.source]
            if isinstance(partitioner, ForwardPartitioner) and upstream.parallelism == node.parallelism:
                chain_to = vertex_of[upstream.id]
        if chain_to is not None:
            chain_to.nodes.append(node.id)
            chain_to.chained.setdefault(resolved[0][0].source, []).append(node.id)
            if resolved[0][0].tag is not None:
                chain_to.chained_tags[node.id] = resolved[0][0].tag
            vertex_of[node.id] = chain_to
            continue
        vertex = JobVertex(id=node.uid, head=node.id, parallelism=node.parallelism,
                           max_parallelism=node.max_parallelism, nodes=[node.id])
        vertices[vertex.id] = vertex
        vertex_of[node.id] = vertex
        for edge, partitioner in resolved:
            upstream_vertex = vertex_of[edge.source]
            job_edge = JobEdge(len(edges), upstream_vertex.id, edge.source, vertex.id, partitioner, edge.tag,
                               edge.input_index)
            edges.append(job_edge)
            upstream_vertex.outputs.append(job_edge)
            vertex.inputs.append(job_edge)
    for vertex in vertices.values():
        names = [graph.nodes[n].name for n in vertex.nodes]
        vertex.name = " -> ".join(names)
    return JobGraph(graph.job_name, graph, vertices, edges)
