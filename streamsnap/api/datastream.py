"""DataStream and KeyedStream: the fluent API that records a StreamGraph.

Every call adds a node (or, for `rebalance`/`broadcast`/`key_by`, sets how the next node is
connected) and checks what can be checked at build time: parallelism bounds, uids, and key
columns against the schema whenever the schema is known.

Event time: each node records its output's timestamp assigner (set by a watermark strategy,
inherited by the operators downstream), so keyed process functions can answer
`ctx.timestamp()`. A stream made by `get_side_output(tag)` reads the named side output of its
node instead of the main one.
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
from streamsnap.runtime.schemas import StreamSchema
from streamsnap.runtime.operators.functions import FunctionOperatorFactory
from streamsnap.runtime.operators.process import KeyedProcessOperatorFactory, ProcessOperatorFactory
from streamsnap.runtime.operators.vectorized_windows import VectorizedWindowOperatorFactory
from streamsnap.runtime.operators.windows import WindowOperatorFactory
from streamsnap.time.watermarks import WatermarkStrategy

if TYPE_CHECKING:
    from streamsnap.api.environment import StreamEnvironment
    from streamsnap.api.all_windows import AllWindowedStream
    from streamsnap.api.windowing import WindowedStream


def _check_callable(fn, what: str) -> None:
    if not callable(fn):
        raise ConfigurationError(f"{what} needs a function, got {fn!r}")


def check_watermark_strategy(strategy, schema: pa.Schema | None, where: str) -> None:
    """Build-time checks of a watermark strategy against the stream it is applied to."""
    from streamsnap.runtime.operators.watermark_emitter import generates_watermarks

    if not isinstance(strategy, WatermarkStrategy):
        raise ConfigurationError(
            f"{where}: watermark_strategy must be an ss.WatermarkStrategy, e.g. "
            f"ss.WatermarkStrategy.for_bounded_out_of_orderness(5).with_timestamp_assigner('ts'); "
            f"got {type(strategy).__name__} {strategy!r}")
    assigner = strategy.timestamp_assigner
    if assigner is None:
        if generates_watermarks(strategy):
            raise ConfigurationError(
                f"{where}: the watermark strategy has no timestamp assigner, so its watermarks "
                f"would not follow the data; add .with_timestamp_assigner(column name or "
                f"function of the row)")
        return
    if isinstance(assigner, str) and schema is not None:
        if assigner not in schema.names:
            raise ConfigurationError(
                f"{where}: the timestamp column '{assigner}' is not in the stream's schema "
                f"(columns {schema.names}); fix the name given to with_timestamp_assigner")
        kind = schema.field(assigner).type
        if not (pa.types.is_integer(kind) or pa.types.is_timestamp(kind)):
            raise ConfigurationError(
                f"{where}: the timestamp column '{assigner}' has type {kind}; it must hold int64 "
                f"epoch milliseconds or be an Arrow timestamp — convert it first (e.g. with map)")


def _row_schema(schema, output_schema, what: str) -> StreamSchema:
    """`schema=` of a per-row operator (a pyarrow.Schema, "widen" or None); `output_schema=` is its
    older name. See runtime/schemas.py for the rule. A StreamSchema (the engine's own operators)
    is taken as it is."""
    if isinstance(schema, StreamSchema):
        return schema
    if schema is not None and output_schema is not None:
        raise ConfigurationError(f"{what}: pass schema= or output_schema= (the same thing), not both")
    return StreamSchema.of(schema if schema is not None else output_schema, what)


def _known_not_declared(schema: pa.Schema | None) -> StreamSchema:
    """A schema known at build time (for the checks downstream) that the tasks infer from the
    rows, as for a process function without schema=: with the schema declared, Nexmark q18 ran
    at 15 K instead of 34 K events/s per core (one pair of runs on a loaded machine; to be
    measured on a quiet one). These operators' rows are their input's rows, so nothing is lost."""
    return StreamSchema(schema, "inferred")


def _check_schema(schema, what: str) -> pa.Schema | None:
    if schema is None or isinstance(schema, pa.Schema):
        return schema
    raise ConfigurationError(f"{what}: output_schema must be a pyarrow.Schema, got {type(schema).__name__}")


class DataStream:
    """A stream of rows (dicts) produced by one or more upstream nodes."""

    def __init__(self, env: "StreamEnvironment", upstreams: tuple[StreamNode, ...],
                 partitioner: Partitioner | None = None, tag: str | None = None):
        self._env = env
        self._upstreams = upstreams
        self._partitioner = partitioner
        self._tag = tag   # side output name of the (single) upstream; None: its main output

    # ------------------------------------------------------------------ properties
    @property
    def env(self) -> "StreamEnvironment":
        """The environment this stream belongs to (Flink's `getExecutionEnvironment()`): a
        function that adds to a pipeline it was handed a stream of can add sources to it."""
        return self._env

    @property
    def schema(self) -> pa.Schema | None:
        """The stream's schema when every upstream's is known and they agree."""
        if self._tag is not None:
            return None   # side outputs are untyped rows
        schemas = [n.schema for n in self._upstreams]
        if any(s is None for s in schemas) or any(s != schemas[0] for s in schemas[1:]):
            return None
        return schemas[0]

    @property
    def timestamp_assigner(self):
        """How this stream's event timestamps are read (column or function), None without."""
        assigners = [n.timestamps for n in self._upstreams]
        first = assigners[0]
        return first if all(a is first or a == first for a in assigners[1:]) else None

    @property
    def _stream_schema(self) -> StreamSchema:
        """The schema and how it is known (declared, inferred, widen); see runtime/schemas.py."""
        if self._tag is not None:
            return StreamSchema()
        spec = StreamSchema.combine([n.stream_schema for n in self._upstreams])
        return StreamSchema(self.schema, spec.mode) if spec.mode == "inferred" else spec

    def _describe(self) -> str:
        return " + ".join(f"'{n.name}'" for n in self._upstreams)

    # ------------------------------------------------------------------ building
    def _add(self, kind: NodeKind, name: str, uid: str | None, operator, parallelism: int | None,
             schema: pa.Schema | StreamSchema | None, partitioner: Partitioner | None = None, *,
             stage: bool = False) -> StreamNode:
        env = self._env
        if parallelism is None:
            parallelism = env.parallelism  # Flink's rule: the environment's default, not inherited
        env._check_parallelism(parallelism, f"parallelism of '{name}'")
        spec = schema if isinstance(schema, StreamSchema) else StreamSchema.of(schema, name)
        node = env._graph.add_node(kind, name, uid, operator, parallelism, env.max_parallelism, spec.schema,
                                   stage=stage)
        node.schema_mode = spec.mode
        node.timestamps = self.timestamp_assigner
        for upstream in self._upstreams:
            env._graph.add_edge(upstream, node, partitioner if partitioner is not None else self._partitioner,
                                self._tag)
        return node

    def _transform(self, kind: str, fn: Callable, name: str | None, uid: str | None, parallelism: int | None,
                   schema: pa.Schema | StreamSchema | None, input_format: str = "row") -> "DataStream":
        _check_callable(fn, kind)
        input_schema = self._stream_schema if input_format == "batch" else None
        node = self._add(NodeKind.OPERATOR, name or kind.replace("_", " ").title().replace(" ", ""), uid,
                         FunctionOperatorFactory(kind, fn, input_format, input_schema), parallelism, schema)
        return DataStream(self._env, (node,))

    def map(self, fn: Callable[[dict], dict], *, name: str | None = None, uid: str | None = None,
            parallelism: int | None = None, schema=None, output_schema: pa.Schema | None = None) -> "DataStream":
        """One row in, one row out.

        schema: the output rows' pyarrow.Schema; "widen" to let an inferred schema grow; None
        (default) to infer it from the first batch. See the docs' Concepts › Streams and operators page (schemas).
        """
        return self._transform("map", fn, name or "Map", uid, parallelism, _row_schema(schema, output_schema, "map"))

    def filter(self, fn: Callable[[dict], bool], *, name: str | None = None, uid: str | None = None,
               parallelism: int | None = None) -> "DataStream":
        """Keep the rows for which `fn` is true."""
        return self._transform("filter", fn, name or "Filter", uid, parallelism, self._stream_schema)

    def flat_map(self, fn: Callable[[dict], object], *, name: str | None = None, uid: str | None = None,
                 parallelism: int | None = None, schema=None, output_schema: pa.Schema | None = None) -> "DataStream":
        """One row in, any number of rows out (return an iterable, a dict, or None); schema: as for map."""
        return self._transform("flat_map", fn, name or "FlatMap", uid, parallelism,
                               _row_schema(schema, output_schema, "flat_map"))

    def map_batches(self, fn: Callable[[pa.RecordBatch], pa.RecordBatch], *, name: str | None = None,
                    uid: str | None = None, parallelism: int | None = None,
                    output_schema: pa.Schema | None = None) -> "DataStream":
        """Vectorized: a pyarrow.RecordBatch in, a RecordBatch (or Table, or dict of columns) out."""
        return self._transform("map_batches", fn, name or "MapBatches", uid, parallelism,
                               _check_schema(output_schema, "map_batches"), input_format="batch")

    def key_by(self, key, *, allow_null_keys: bool = False) -> "KeyedStream":
        """Partition by key: a column name, a list of column names, or a function of the row.

        A row whose key is None fails the job (naming the operator, key field and row), as in
        Flink; allow_null_keys=True makes None one more key instead. Key columns are integers,
        booleans, floats, strings or binaries (or structs, dictionaries of those); another type
        (a date, a timestamp, a decimal) is refused here when the schema is known: cast it.
        """
        if not isinstance(allow_null_keys, bool):
            raise ConfigurationError(f"key_by: allow_null_keys must be True or False, got {allow_null_keys!r}")
        selector = KeySelector.of(key, allow_null=allow_null_keys)
        selector.validate(self.schema, self._describe())
        return KeyedStream(self._env, self._upstreams, selector, self._tag)

    def union(self, *others: "DataStream") -> "DataStream":
        """All rows of this stream and of `others` (schemas should match)."""
        for other in others:
            if not isinstance(other, DataStream):
                raise ConfigurationError(f"union takes DataStreams, got {type(other).__name__}")
            if other._env is not self._env:
                raise ConfigurationError("union of streams from different StreamEnvironments")
        if any(s._partitioner is not None for s in (self, *others)):
            raise ConfigurationError("union the streams first, then call rebalance()/broadcast()/key_by()")
        if any(s._tag is not None for s in (self, *others)):
            raise ConfigurationError(
                "union of a side output: apply an operator to the side output first (e.g. "
                ".map(lambda r: r)), then union its result")
        by_id = {n.id: n for s in (self, *others) for n in s._upstreams}
        upstreams = tuple(by_id.values())
        return DataStream(self._env, upstreams)

    def connect(self, other: "DataStream"):
        """Process this stream and `other` together: `.process(CoProcessFunction)`, or with both
        keyed (`a.key_by(k1).connect(b.key_by(k2))`) a KeyedCoProcessFunction (see `ss.ConnectedStreams`)."""
        from streamsnap.api.connected import connect

        return connect(self, other)

    def join(self, other: "DataStream"):
        """A windowed inner join: `.where(k1).equal_to(k2).window(assigner).apply(fn)`, where
        `fn(left, right)` runs for each pair of one key in one window. See runtime/operators/window_join.py."""
        from streamsnap.api.connected import join

        return join(self, other)

    def lookup_join(self, table, on, *, columns=None, how: str = "inner", name: str | None = None,
                    uid: str | None = None, parallelism: int | None = None,
                    max_table_bytes: int | None = None) -> "DataStream":
        """Enrich every row from a bounded `table` (a pyarrow Table or a batch Spark DataFrame,
        collected now): Flink's lookup join, Spark's stream-static join, vectorized per batch,
        no key_by, no state. on: a column name or list (same names on both sides) or a dict
        {stream column: table column}; columns: the table's columns to add (list, or dict
        {table column: output name}; default all but the keys); how: "inner" drops rows
        without a match, "left" keeps them with nulls. A key found k times in the table gives
        k rows, as in SQL. max_table_bytes: the largest table shipped to every subtask
        (default 64 MiB). See api/lookup.py."""
        from streamsnap.api.lookup import DEFAULT_MAX_TABLE_BYTES, lookup_join

        return lookup_join(self, table, on, columns=columns, how=how, name=name, uid=uid, parallelism=parallelism,
                           max_table_bytes=DEFAULT_MAX_TABLE_BYTES if max_table_bytes is None else max_table_bytes)

    def rebalance(self) -> "DataStream":
        """Distribute batches round robin over the next operator's subtasks."""
        return DataStream(self._env, self._upstreams, RebalancePartitioner(), self._tag)

    def broadcast(self, *descriptors):
        """Send every row to every subtask of the next operator.

        With MapStateDescriptors (`rules.broadcast(ss.MapStateDescriptor("rules"))`): a
        BroadcastStream to `connect` to another stream, whose BroadcastProcessFunction keeps
        those broadcast states (api/connected.py, runtime/operators/broadcast.py).
        """
        if descriptors:
            from streamsnap.api.connected import BroadcastStream

            return BroadcastStream(self, descriptors)
        return DataStream(self._env, self._upstreams, BroadcastPartitioner(), self._tag)

    def forward(self) -> "DataStream":
        """One-to-one to the next operator (requires the same parallelism)."""
        return DataStream(self._env, self._upstreams, ForwardPartitioner(), self._tag)

    def process(self, function, *, name: str | None = None, uid: str | None = None,
                parallelism: int | None = None, schema=None,
                output_schema: pa.Schema | None = None) -> "DataStream":
        """Run a ProcessFunction per row (side outputs via ctx.output; no keyed state or timers)."""
        from streamsnap.api.functions import KeyedProcessFunction

        if not callable(getattr(function, "process_element", None)):
            raise ConfigurationError(
                f"process takes a ProcessFunction (an object with process_element(row, ctx)), "
                f"got {function!r}")
        if isinstance(function, KeyedProcessFunction) or callable(getattr(function, "on_timer", None)):
            raise ConfigurationError(
                f"process({type(function).__name__}) on the non-keyed stream {self._describe()}: "
                f"timers and keyed state are per key, so they need a keyed stream; call "
                f".key_by(...) before .process(...)")
        node = self._add(NodeKind.OPERATOR, name or type(function).__name__, uid,
                         ProcessOperatorFactory(function, self.timestamp_assigner), parallelism,
                         _row_schema(schema, output_schema, "process"))
        return DataStream(self._env, (node,))

    def assign_timestamps_and_watermarks(self, strategy: WatermarkStrategy, *, name: str | None = None,
                                         uid: str | None = None,
                                         parallelism: int | None = None) -> "DataStream":
        """Event timestamps and watermarks from `strategy`, from here on.

        Watermarks from upstream are dropped (the new ones replace them), except the end of
        time when the input ends. Prefer `env.from_source(..., watermark_strategy=...)`: there
        each split of the source gets its own watermark.
        """
        from streamsnap.runtime.operators.timestamps_and_watermarks import TimestampsAndWatermarksFactory

        name = name or "Timestamps/Watermarks"
        check_watermark_strategy(strategy, self.schema, f"assign_timestamps_and_watermarks '{name}'")
        node = self._add(NodeKind.OPERATOR, name, uid,
                         TimestampsAndWatermarksFactory(strategy, self._env.auto_watermark_interval),
                         parallelism, self._stream_schema)
        if strategy.timestamp_assigner is not None:
            node.timestamps = strategy.timestamp_assigner
        return DataStream(self._env, (node,))

    def window(self, assigner) -> "WindowedStream":
        """Windows need a keyed stream: raises ConfigurationError saying to call `.key_by(...)` first."""
        raise ConfigurationError(
            f"window() on the non-keyed stream {self._describe()}: windows are per key; call "
            f".key_by(...) first, e.g. stream.key_by('user').window(assigner)")

    def window_all(self, assigner) -> "AllWindowedStream":
        """Windows over the whole stream, not per key (Flink's windowAll): one window per
        interval holding every row. Held at parallelism 1; `aggregate_columns` (sum, min, max,
        mean, count) and `top_n` pre-aggregate in parallel in front of it (local/global). See
        `ss.windows.AllWindowedStream`."""
        from streamsnap.api.all_windows import AllWindowedStream

        return AllWindowedStream(self, assigner)

    def window_top_n(self, n: int, *, by: str, descending: bool = True, rank_column: str | None = "rank",
                     name: str | None = None, uid: str | None = None) -> "DataStream":
        """Window Top-N over a window aggregate's results: per window (the rows' own
        ``window_start``/``window_end``), the rows ranked `n` or better by `by`, ties kept —
        Flink SQL's Window Top-N after a window aggregation, e.g. the auctions with the most
        bids per window: ``counts.window_top_n(1, by="count")``. Emitted when the window's
        results are complete (the watermark passes its end); ranks and candidates as
        `window_all(...).top_n`, whose local/global stages it runs on."""
        from streamsnap.time.timestamps import WindowEndTimestamps
        from streamsnap.time.windows import ResultWindows

        timestamps = self.timestamp_assigner
        if not isinstance(timestamps, WindowEndTimestamps):
            raise ConfigurationError(
                f"window_top_n on {self._describe()}: it ranks the results of a tumbling or sliding "
                f"window aggregate (.count(), .sum(...), .aggregate_columns(...)), by their own "
                f"window_start/window_end; put it right after one (map_batches between keeps them), "
                f"or rank raw rows per window with .window_all(assigner).top_n(...)")
        if timestamps.size_ms is None:
            raise ConfigurationError(
                f"window_top_n on {self._describe()}: session window results have no fixed window "
                f"size to partition by; rank them per key with .key_by(...).top_n(...) instead")
        if self.schema is not None:
            missing = [c for c in ("window_start", "window_end") if c not in self.schema.names]
            if missing:
                raise ConfigurationError(
                    f"window_top_n on {self._describe()}: the results lost their {missing} column(s), "
                    f"which say each row's window; keep them in what follows the window aggregate")
        return self.window_all(ResultWindows(timestamps.size_ms)).top_n(
            n, by=by, descending=descending, rank_column=rank_column,
            name=name or f"window_top_n({n}, by={by!r})", uid=uid)

    def get_side_output(self, tag) -> "DataStream":
        """The rows the process function before this stream sent to `ctx.output(tag, ...)`."""
        from streamsnap.api.functions import OutputTag
        from streamsnap.runtime.operators.co_process import CoProcessOperatorFactory, KeyedCoProcessOperatorFactory
        from streamsnap.runtime.operators.broadcast import BroadcastProcessOperatorFactory
        from streamsnap.runtime.operators.interval_join import IntervalJoinOperatorFactory

        if not isinstance(tag, OutputTag):
            raise ConfigurationError(f"get_side_output takes an ss.OutputTag, got {tag!r}")
        if self._tag is not None or self._partitioner is not None or len(self._upstreams) != 1 \
                or not isinstance(self._upstreams[0].operator,
                                  (ProcessOperatorFactory, KeyedProcessOperatorFactory,
                                   WindowOperatorFactory, VectorizedWindowOperatorFactory,
                                   CoProcessOperatorFactory, KeyedCoProcessOperatorFactory,
                                   IntervalJoinOperatorFactory, BroadcastProcessOperatorFactory)) \
                or getattr(self._upstreams[0].operator, "vectorized", False):
            raise ConfigurationError(
                f"get_side_output({tag.name!r}) on {self._describe()}: side outputs come from "
                f"process(...) with a (Keyed)ProcessFunction or from a window's reduce/aggregate/"
                f"process; call it on the stream that call returned")
        return DataStream(self._env, self._upstreams, None, tag.name)

    def sink_to(self, sink, *, name: str | None = None, uid: str | None = None,
                parallelism: int | None = None) -> "DataStreamSink":
        """Write the stream to `sink` (an `ss.sinks` object, e.g. `ss.sinks.Collect()`); `name` and
        `uid` name the sink operator (uid: its stable id across runs), `parallelism` its subtasks.

            stream.sink_to(ss.sinks.FileSink("/tmp/out", format="parquet"), name="files")
        """
        from streamsnap.connectors.base import Sink, SinkOperatorFactory

        if not isinstance(sink, Sink):
            raise ConfigurationError(
                f"sink_to takes a sink such as ss.sinks.Collect(), ss.sinks.Print() or "
                f"ss.sinks.FileSink(path), got {sink!r}")
        sink.validate(self.schema)
        factory = SinkOperatorFactory(sink, self._stream_schema, " + ".join(n.name for n in self._upstreams))
        node = self._add(NodeKind.SINK, name or type(sink).__name__, uid, factory, parallelism, None)
        return DataStreamSink(node)

    def print(self, prefix: str = "") -> "DataStreamSink":
        """Print each row on the driver, after `prefix` (`ss.sinks.Print`, at-least-once)."""
        from streamsnap.connectors.sinks import Print

        return self.sink_to(Print(prefix), name="Print")


class KeyedStream(DataStream):
    """A stream partitioned by key: every key's rows go to the same subtask, with its state."""

    def __init__(self, env: "StreamEnvironment", upstreams: tuple[StreamNode, ...], key: KeySelector,
                 tag: str | None = None):
        super().__init__(env, upstreams, KeyGroupPartitioner(key, env.max_parallelism), tag)
        self.key = key

    def process(self, function, *, name: str | None = None, uid: str | None = None,
                parallelism: int | None = None, schema=None,
                output_schema: pa.Schema | None = None) -> DataStream:
        """Run a KeyedProcessFunction: per-row logic with per-key state; schema: as for map."""
        if not callable(getattr(function, "process_element", None)):
            raise ConfigurationError(
                f"process takes a KeyedProcessFunction (an object with process_element(row, ctx)), "
                f"got {function!r}")
        name = name or type(function).__name__
        key = self.key.for_operator(name)
        node = self._add(NodeKind.OPERATOR, name, uid,
                         KeyedProcessOperatorFactory(function, key, timestamps=self.timestamp_assigner),
                         parallelism,
                         _row_schema(schema, output_schema, "process"),
                         # The receiver keys its rows by this key and max parallelism: the
                         # sender's key groups are its own (runtime/shipped_key_groups.py).
                         KeyGroupPartitioner(key, self._env.max_parallelism, ship_key_groups=True))
        return DataStream(self._env, (node,))

    def process_batches(self, function, *, name: str | None = None, uid: str | None = None,
                        parallelism: int | None = None, output_schema: pa.Schema | None = None) -> DataStream:
        """Run a KeyedBatchFunction: vectorized, a whole Arrow batch per call (the fast path)."""
        if not callable(getattr(function, "process_batch", None)):
            raise ConfigurationError(
                f"process_batches takes a KeyedBatchFunction (an object with process_batch(batch, keys)), "
                f"got {function!r}")
        name = name or type(function).__name__
        key = self.key.for_operator(name)
        node = self._add(NodeKind.OPERATOR, name, uid,
                         KeyedProcessOperatorFactory(function, key, vectorized=True), parallelism,
                         _check_schema(output_schema, "process_batches"),
                         KeyGroupPartitioner(key, self._env.max_parallelism))
        return DataStream(self._env, (node,))

    def key_by(self, key, *, allow_null_keys: bool = False) -> "KeyedStream":
        """Not on a keyed stream: raises ConfigurationError (key once, on the unkeyed stream)."""
        raise ConfigurationError("the stream is already keyed; call key_by once, on the unkeyed stream")

    def reduce(self, fn: Callable[[dict, dict], dict], *, name: str | None = None, uid: str | None = None,
               parallelism: int | None = None) -> DataStream:
        """Rolling reduce: `fn(running, row)` per row, emitting each key's running result."""
        from streamsnap.api.rolling import RollingReduce

        _check_callable(fn, "reduce")
        return self.process(RollingReduce(fn), name=name or "reduce", uid=uid, parallelism=parallelism)

    def _rolling(self, kind: str, field: str, name, uid, parallelism) -> DataStream:
        from streamsnap.api.rolling import RollingAggregate, check_field

        check_field(field, kind, self.schema)
        return self.process(RollingAggregate(kind, field), name=name or f"{kind}({field})", uid=uid,
                            parallelism=parallelism)

    def sum(self, field: str, *, name: str | None = None, uid: str | None = None,
            parallelism: int | None = None) -> DataStream:
        """Rolling sum of `field` per key (the other fields: the key's first row's), as Flink's."""
        return self._rolling("sum", field, name, uid, parallelism)

    def min(self, field: str, *, name: str | None = None, uid: str | None = None,
            parallelism: int | None = None) -> DataStream:
        """Rolling minimum of `field` per key (the other fields: the key's first row's)."""
        return self._rolling("min", field, name, uid, parallelism)

    def max(self, field: str, *, name: str | None = None, uid: str | None = None,
            parallelism: int | None = None) -> DataStream:
        """Rolling maximum of `field` per key (the other fields: the key's first row's)."""
        return self._rolling("max", field, name, uid, parallelism)

    def min_by(self, field: str, *, name: str | None = None, uid: str | None = None,
               parallelism: int | None = None) -> DataStream:
        """Per key, the row with the smallest `field` so far (the earliest on ties)."""
        return self._rolling("min_by", field, name, uid, parallelism)

    def max_by(self, field: str, *, name: str | None = None, uid: str | None = None,
               parallelism: int | None = None) -> DataStream:
        """Per key, the row with the largest `field` so far (the earliest on ties)."""
        return self._rolling("max_by", field, name, uid, parallelism)

    def deduplicate(self, keep: str = "first", *, order_by=None, ttl=None, name: str | None = None,
                    uid: str | None = None, parallelism: int | None = None) -> DataStream:
        """One row per key, the first or the last (Flink SQL's ROW_NUMBER() = 1 deduplication).

        order_by: a column (or list) deciding which row is first/last, e.g. the event time;
        None: arrival order. Emits each row that becomes its key's kept row: with keep="last"
        or an order_by the output is an upsert stream keyed by the key (its last row per key is
        the answer). ttl: seconds, a timedelta or an ss.StateTtlConfig after which a key is
        forgotten. See runtime/operators/deduplicate.py."""
        from streamsnap.runtime.operators.deduplicate import Deduplicate, DeduplicateBatches, check_keep, ttl_config
        from streamsnap.runtime.operators.row_order import RowOrder

        check_keep(keep)
        order = None if order_by is None else RowOrder.of(order_by, False, "deduplicate", "order_by", self.schema)
        if self.schema is not None:   # the batch path: state read once per key and batch
            return self.process_batches(DeduplicateBatches(keep, order, ttl_config(ttl, "deduplicate")),
                                        name=name or f"deduplicate(keep={keep})", uid=uid, parallelism=parallelism,
                                        output_schema=self.schema)
        return self.process(Deduplicate(keep, order, ttl_config(ttl, "deduplicate")),
                            name=name or f"deduplicate(keep={keep})", uid=uid, parallelism=parallelism,
                            schema=_known_not_declared(self.schema))

    def top_n(self, n: int, *, by, descending=True, rank_column: str = "rank", ttl=None,
              name: str | None = None, uid: str | None = None, parallelism: int | None = None) -> DataStream:
        """The `n` best rows per key by `by` (a column or list; descending: True/False or one
        per column), ranked 1..n in `rank_column` (Flink SQL's ROW_NUMBER() <= n Top-N).

        Emits the rows whose rank changed: an upsert stream keyed by (key, rank). ttl: as for
        deduplicate. See runtime/operators/top_n.py."""
        from streamsnap.runtime.operators.deduplicate import ttl_config
        from streamsnap.runtime.operators.row_order import RowOrder
        from streamsnap.runtime.operators.top_n import TopN, TopNBatches, check_n

        check_n(n)
        order = RowOrder.of(by, descending, "top_n", "by", self.schema)
        schema = self.schema
        if not isinstance(rank_column, str) or not rank_column:
            raise ConfigurationError(f"top_n: rank_column must be a column name, got {rank_column!r}")
        if schema is not None:
            if rank_column in schema.names:
                raise ConfigurationError(
                    f"top_n: the stream already has a column {rank_column!r}; pass another "
                    f"rank_column= name for the rank")
            schema = schema.append(pa.field(rank_column, pa.int64()))
        if schema is not None:        # the batch path: state read once per key and batch
            return self.process_batches(TopNBatches(n, order, rank_column, schema, ttl_config(ttl, "top_n")),
                                        name=name or f"top_n({n})", uid=uid, parallelism=parallelism,
                                        output_schema=schema)
        return self.process(TopN(n, order, rank_column, ttl_config(ttl, "top_n")),
                            name=name or f"top_n({n})", uid=uid, parallelism=parallelism,
                            schema=_known_not_declared(schema))

    def interval_join(self, other: "KeyedStream"):
        """Join rows of the same key whose event times are close: `.between(lower, upper)`
        then `.process(ProcessJoinFunction)`. See runtime/operators/interval_join.py."""
        from streamsnap.api.connected import interval_join

        return interval_join(self, other)

    def window(self, assigner) -> "WindowedStream":
        """Windows per key (`ss.windows.TumblingEventTimeWindows.of(60)`, ...); finish with
        `.reduce`, `.aggregate` or `.process` (see `ss.windows.WindowedStream`)."""
        from streamsnap.api.windowing import WindowedStream

        return WindowedStream(self, assigner)


class DataStreamSink:
    def __init__(self, node: StreamNode):
        self.node = node

    @property
    def name(self) -> str:
        return self.node.name
