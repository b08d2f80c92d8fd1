"""The StreamGraph: one node per user operation, as the DataStream API records it.

Each node carries an operator factory (what to run), its name, stable `uid` (the key its state
is stored under, so it must not change between versions of a job), parallelism, output
schema when known, and the timestamp assigner of its output (column name or function, see
`runtime/operators/timestamps_and_watermarks.py`). Edges carry a partitioner; `None` means "the default":
forward when the parallelism matches, rebalance otherwise (Flink's rule). An edge with a `tag`
carries the source node's side output of that name instead of its main output.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from streamsnap.errors import ConfigurationError
from streamsnap.graph.partitioners import Partitioner


class NodeKind(enum.Enum):
    SOURCE = "source"
    OPERATOR = "operator"
    SINK = "sink"


@dataclass
class StreamNode:
    id: int
    kind: NodeKind
    name: str
    uid: str
    operator: Any  # runtime.operators.base.OperatorFactory
    parallelism: int
    max_parallelism: int
    schema: pa.Schema | None = None
    timestamps: Any = None   # how the output's event timestamps are read (None: no event time)
    in_edges: list["StreamEdge"] = field(default_factory=list)
    out_edges: list["StreamEdge"] = field(default_factory=list)
    # How the rows' schema is known at run time (runtime/schemas.py): "declared" (`schema` is
    # the user's), "inferred" from the first batch (`schema` is at most a build-time sample,
    # for checking column names), or "widen".
    schema_mode: str = "inferred"

    def __str__(self) -> str:
        return f"{self.name} (uid {self.uid!r}, parallelism {self.parallelism})"

    @property
    def stream_schema(self):
        from streamsnap.runtime.schemas import StreamSchema

        return StreamSchema(self.schema if self.schema_mode == "declared" else None, self.schema_mode)


@dataclass
class StreamEdge:
    source: int
    target: int
    partitioner: Partitioner | None = None
    tag: str | None = None   # side output name; None: the main output
    input_index: int = 0     # which input of a two-input target (0: first / only, 1: second)


class StreamGraph:
    def __init__(self, job_name: str = "streamsnap job"):
        self.job_name = job_name
        self.nodes: dict[int, StreamNode] = {}
        self.edges: list[StreamEdge] = []
        self._uids: set[str] = set()
        self._numbered = 0    # nodes the job's code added: what an operator's default uid counts

    def add_node(self, kind: NodeKind, name: str, uid: str | None, operator, parallelism: int,
                 max_parallelism: int, schema: pa.Schema | None = None, *, stage: bool = False) -> StreamNode:
        """`stage`: a node the build adds to serve the next one (a local aggregate); it does not
        count towards default uids, so the operators after it keep the uids (and the
        savepoint state) they had when the job ran without it."""
        node_id = len(self.nodes)
        if uid is None:
            base = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name.lower()) or "op"
            uid = f"{base}-{self._numbered}"
            while uid in self._uids:
                uid += "_"
        elif not isinstance(uid, str) or not uid or any(ch in uid for ch in "/\\\n\r\t "):
            raise ConfigurationError(
                f"uid of '{name}' must be a non-empty string without spaces or slashes, got {uid!r}")
        if uid in self._uids:
            raise ConfigurationError(f"uid {uid!r} is used by two operators; each operator needs its own uid")
        self._uids.add(uid)
        self._numbered += not stage
        node = StreamNode(node_id, kind, name, uid, operator, parallelism, max_parallelism, schema)
        self.nodes[node_id] = node
        return node

    def add_edge(self, source: StreamNode, target: StreamNode, partitioner: Partitioner | None,
                 tag: str | None = None, input_index: int = 0) -> StreamEdge:
        edge = StreamEdge(source.id, target.id, partitioner, tag, input_index)
        self.edges.append(edge)
        source.out_edges.append(edge)
        target.in_edges.append(edge)
        return edge

    def sources(self) -> list[StreamNode]:
        return [n for n in self.nodes.values() if n.kind is NodeKind.SOURCE]

    def validate(self) -> None:
        if not self.sources():
            raise ConfigurationError("the job has no source; add one with env.from_source(...) or env.from_collection(...)")
        if not any(n.kind is NodeKind.SINK for n in self.nodes.values()):
            raise ConfigurationError(
                "the job has no sink, so it would compute nothing visible; end a stream with "
                ".sink_to(ss.sinks.Collect()) or another sink")
        for node in self.nodes.values():
            if node.kind is not NodeKind.SINK and not node.out_edges:
                raise ConfigurationError(
                    f"the output of {node} goes nowhere; connect it to a sink with .sink_to(...)")
