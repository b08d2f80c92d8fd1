"""DataStream and KeyedStream: the fluent API that records a StreamGraph.

Every call adds a node (or, for `rebalance`/`broadcast`/`key_by`, sets how the next node is
connected) and checks what can be checked at build time: parallelism bounds, uids, and key
columns against the schema whenever the schema is known.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import pyarrow as pa

from streamsnap.errors import ConfigurationError
from streamsnap.graph.keys import KeySelector
from streamsnap.graph.partitioners import (
    BroadcastPartitioner, ForwardPartitioner, KeyGroupPartitioner, Partitioner, RebalancePartitioner,
)
from streamsnap.graph.stream_graph import NodeKind, StreamNode
from streamsnap.runtime.operators import FunctionOperatorFactory, KeyedProcessOperatorFactory

if TYPE_CHECKING:
    from streamsnap.api.environment import StreamEnvironment


def _check_callable(fn, what: str) -> None:
    if not callable(fn):
        raise ConfigurationError(f"{what} needs a function, got {fn!r}")


def _check_schema(schema, what: str) -> pa.Schema | None:
    if schema is None or isinstance(schema, pa.Schema):
        return schema
    raise ConfigurationError(f"{what}: output_schema must be a pyarrow.Schema, got {type(schema).__name__}")


class DataStream:
    """A stream of rows (dicts) produced by one or more upstream nodes."""

    def __init__(self, env: "StreamEnvironment", upstreams: tuple[StreamNode, ...],
                 partitioner: Partitioner | None = None):
        self._env = env
        self._upstreams = upstreams
        self._partitioner = partitioner

    # ------------------------------------------------------------------ properties
    @property
    def schema(self) -> pa.Schema | None:
        """The stream's schema when every upstream's is known and they agree."""
        schemas = [n.schema for n in self._upstreams]
        if any(s is None for s in schemas) or any(s != schemas[0] for s in schemas[1:]):
            return None
        return schemas[0]

    def _describe(self) -> str:
        return " + ".join(f"'{n.name}'" for n in self._upstreams)

    # ------------------------------------------------------------------ building
    def _add(self, kind: NodeKind, name: str, uid: str | None, operator, parallelism: int | None,
             schema: pa.Schema | None, partitioner: Partitioner | None = None) -> StreamNode:
        env = self._env
        if parallelism is None:
            parallelism = env.parallelism  # Flink's rule: the environment's default, not inherited
        env._check_parallelism(parallelism, f"parallelism of '{name}'")
        node = env._graph.add_node(kind, name, uid, operator, parallelism, env.max_parallelism, schema)
        for upstream in self._upstreams:
            env._graph.add_edge(upstream, node, partitioner if partitioner is not None else self._partitioner)
        return node

    def _transform(self, kind: str, fn: Callable, name: str | None, uid: str | None, parallelism: int | None,
                   schema: pa.Schema | None, input_format: str = "row") -> "DataStream":
        _check_callable(fn, kind)
        node = self._add(NodeKind.OPERATOR, name or kind.replace("_", " ").title().replace(" ", ""), uid,
                         FunctionOperatorFactory(kind, fn, input_format), parallelism, schema)
        return DataStream(self._env, (node,))

    def map(self, fn: Callable[[dict], dict], *, name: str | None = None, uid: str | None = None,
            parallelism: int | None = None, output_schema: pa.Schema | None = None) -> "DataStream":
        """One row in, one row out."""
        return self._transform("map", fn, name or "Map", uid, parallelism, _check_schema(output_schema, "map"))

    def filter(self, fn: Callable[[dict], bool], *, name: str | None = None, uid: str | None = None,
               parallelism: int | None = None) -> "DataStream":
        """Keep the rows for which `fn` is true."""
        return self._transform("filter", fn, name or "Filter", uid, parallelism, self.schema)

    def flat_map(self, fn: Callable[[dict], object], *, name: str | None = None, uid: str | None = None,
                 parallelism: int | None = None, output_schema: pa.Schema | None = None) -> "DataStream":
        """One row in, any number of rows out (return an iterable, a dict, or None)."""
        return self._transform("flat_map", fn, name or "FlatMap", uid, parallelism,
                               _check_schema(output_schema, "flat_map"))

    def map_batches(self, fn: Callable[[pa.RecordBatch], pa.RecordBatch], *, name: str | None = None,
                    uid: str | None = None, parallelism: int | None = None,
                    output_schema: pa.Schema | None = None) -> "DataStream":
        """Vectorized: a pyarrow.RecordBatch in, a RecordBatch (or Table, or dict of columns) out."""
        return self._transform("map_batches", fn, name or "MapBatches", uid, parallelism,
                               _check_schema(output_schema, "map_batches"), input_format="batch")

    def key_by(self, key) -> "KeyedStream":
        """Partition by key: a column name, a list of column names, or a function of the row."""
        selector = KeySelector.of(key)
        selector.validate(self.schema, self._describe())
        return KeyedStream(self._env, self._upstreams, selector)

    def union(self, *others: "DataStream") -> "DataStream":
        """All rows of this stream and of `others` (schemas should match)."""
        for other in others:
            if not isinstance(other, DataStream):
                raise ConfigurationError(f"union takes DataStreams, got {type(other).__name__}")
            if other._env is not self._env:
                raise ConfigurationError("union of streams from different StreamEnvironments")
        if any(s._partitioner is not None for s in (self, *others)):
            raise ConfigurationError("union the streams first, then call rebalance()/broadcast()/key_by()")
        by_id = {n.id: n for s in (self, *others) for n in s._upstreams}
        upstreams = tuple(by_id.values())
        return DataStream(self._env, upstreams)

    def rebalance(self) -> "DataStream":
        """Distribute batches round robin over the next operator's subtasks."""
        return DataStream(self._env, self._upstreams, RebalancePartitioner())

    def broadcast(self) -> "DataStream":
        """Send every row to every subtask of the next operator."""
        return DataStream(self._env, self._upstreams, BroadcastPartitioner())

    def forward(self) -> "DataStream":
        """One-to-one to the next operator (requires the same parallelism)."""
        return DataStream(self._env, self._upstreams, ForwardPartitioner())

    def sink_to(self, sink, *, name: str | None = None, uid: str | None = None,
                parallelism: int | None = None) -> "DataStreamSink":
        from streamsnap.connectors.base import Sink, SinkOperatorFactory

        if not isinstance(sink, Sink):
            raise ConfigurationError(
                f"sink_to takes a sink such as ss.sinks.Collect(), ss.sinks.Print() or "
                f"ss.sinks.FileSink(path), got {sink!r}")
        sink.validate(self.schema)
        node = self._add(NodeKind.SINK, name or type(sink).__name__, uid, SinkOperatorFactory(sink),
                         parallelism, None)
        return DataStreamSink(node)

    def print(self, prefix: str = "") -> "DataStreamSink":
        from streamsnap.connectors.sinks import Print

        return self.sink_to(Print(prefix), name="Print")


class KeyedStream(DataStream):
    """A stream partitioned by key: every key's rows go to the same subtask, with its state."""

    def __init__(self, env: "StreamEnvironment", upstreams: tuple[StreamNode, ...], key: KeySelector):
        super().__init__(env, upstreams, KeyGroupPartitioner(key, env.max_parallelism))
        self.key = key

    def process(self, function, *, name: str | None = None, uid: str | None = None,
                parallelism: int | None = None, output_schema: pa.Schema | None = None) -> DataStream:
        """Run a KeyedProcessFunction: per-row logic with per-key state."""
        if not callable(getattr(function, "process_element", None)):
            raise ConfigurationError(
                f"process takes a KeyedProcessFunction (an object with process_element(row, ctx)), "
                f"got {function!r}")
        node = self._add(NodeKind.OPERATOR, name or type(function).__name__, uid,
                         KeyedProcessOperatorFactory(function, self.key), parallelism,
                         _check_schema(output_schema, "process"))
        return DataStream(self._env, (node,))

    def process_batches(self, function, *, name: str | None = None, uid: str | None = None,
                        parallelism: int | None = None, output_schema: pa.Schema | None = None) -> DataStream:
        """Run a KeyedBatchFunction: vectorized, a whole Arrow batch per call (the fast path)."""
        if not callable(getattr(function, "process_batch", None)):
            raise ConfigurationError(
                f"process_batches takes a KeyedBatchFunction (an object with process_batch(batch, keys)), "
                f"got {function!r}")
        node = self._add(NodeKind.OPERATOR, name or type(function).__name__, uid,
                         KeyedProcessOperatorFactory(function, self.key, vectorized=True), parallelism,
                         _check_schema(output_schema, "process_batches"))
        return DataStream(self._env, (node,))

    def key_by(self, key) -> "KeyedStream":
        raise ConfigurationError("the stream is already keyed; call key_by once, on the unkeyed stream")


class DataStreamSink:
    def __init__(self, node: StreamNode):
        self.node = node

    @property
    def name(self) -> str:
        return self.node.name
