"""Windows on keyed streams: `keyed.window(assigner)` → `WindowedStream`, and its functions.

A WindowedStream only collects configuration (trigger, allowed lateness, late-data tag); the
terminal `reduce` / `aggregate` / `process` adds the window operator (runtime/operators/windows.py)
to the graph. Everything checkable is checked here, at build time, so a job with an event-time
window but no timestamps, or a trigger that cannot merge sessions, never reaches Spark.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable

import pyarrow as pa

from streamsnap.api.functions import Function, OutputTag
from streamsnap.errors import ConfigurationError
from streamsnap.time.durations import to_millis
from streamsnap.time.triggers import Trigger
from streamsnap.time.windows import WindowAssigner

if TYPE_CHECKING:
    from streamsnap.api.datastream import DataStream, KeyedStream
    from streamsnap.runtime.schemas import StreamSchema


class AggregateFunction(Function):
    """Incremental window aggregation: one accumulator per key and window.

    The accumulator is keyed state, so it must be msgpack-encodable (numbers, str, lists,
    dicts, tuples) unless a `serializer=` is given to `aggregate`. `add` and `merge` return the
    new accumulator (they may change the one they are given). `merge` is needed for session
    windows, whose windows merge.
    """

    def create_accumulator(self) -> Any:
        """A new, empty accumulator for a window (any value the state serializer keeps)."""
        raise NotImplementedError(f"{type(self).__name__} must implement create_accumulator(self)")

    def add(self, row: dict, accumulator: Any) -> Any:
        """Fold `row` into `accumulator`; return the new accumulator."""
        raise NotImplementedError(f"{type(self).__name__} must implement add(self, row, accumulator)")

    def get_result(self, accumulator: Any) -> Any:
        """The window's result from its accumulator: a row (dict), or a value for a ProcessWindowFunction."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_result(self, accumulator)")

    def merge(self, a: Any, b: Any) -> Any:
        """Combine two accumulators into one (needed by session windows, whose windows merge)."""
        raise NotImplementedError(f"{type(self).__name__} must implement merge(self, a, b) to be "
                                  f"used with session (merging) windows")


class ProcessWindowFunction(Function):
    """Called when a window fires: `process(key, context, elements)` returns or yields rows.

    `context.window` has `start` and `end` (epoch ms, end exclusive) and `max_timestamp`;
    `context.current_watermark()`, `context.current_processing_time()`, `context.current_key`
    and `context.output(tag, row)` (side outputs) are there too. `elements` are the window's
    rows, or the single pre-aggregated value when used with `reduce`/`aggregate`.
    """

    def process(self, key: Any, context, elements: list) -> Iterable[dict] | dict | None:
        """Called when a window of `key` fires, with `elements` (its rows, or the aggregate's result);
        `context.window.start` / `.end` are epoch ms. Return or yield rows.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement process(self, key, context, elements)")


@dataclass(frozen=True)
class _WindowSpec:
    assigner: WindowAssigner
    trigger: Trigger
    allowed_lateness: int = 0        # ms
    late_tag: OutputTag | None = None


class WindowedStream:
    """A keyed stream cut into windows; finish it with reduce, aggregate or process."""

    def __init__(self, keyed: "KeyedStream", assigner: WindowAssigner):
        if not isinstance(assigner, WindowAssigner):
            raise ConfigurationError(
                f"window() takes a window assigner such as "
                f"ss.windows.TumblingEventTimeWindows.of(60), got {assigner!r}")
        if assigner.is_event_time and keyed.timestamp_assigner is None:
            raise ConfigurationError(
                f"window({type(assigner).__name__}) on {keyed._describe()}: event-time windows "
                f"need event timestamps, and this stream has none; give the source a "
                f"watermark_strategy=ss.WatermarkStrategy...with_timestamp_assigner(...), call "
                f".assign_timestamps_and_watermarks(strategy) before key_by, or use a "
                f"processing-time assigner")
        self._keyed = keyed
        self._spec = _WindowSpec(assigner, assigner.default_trigger())

    def _with(self, **changes) -> "WindowedStream":
        copy = object.__new__(WindowedStream)
        copy._keyed = self._keyed
        copy._spec = replace(self._spec, **changes)
        return copy

    def trigger(self, trigger: Trigger) -> "WindowedStream":
        """Replace the assigner's default trigger (e.g. ss.windows.CountTrigger.of(100))."""
        if not isinstance(trigger, Trigger):
            raise ConfigurationError(f"trigger() takes a Trigger such as "
                                     f"ss.windows.CountTrigger.of(10), got {trigger!r}")
        if self._spec.assigner.is_merging and not trigger.can_merge():
            raise ConfigurationError(
                f"trigger {type(trigger).__name__} cannot merge, so it cannot be used with "
                f"{type(self._spec.assigner).__name__}; use a trigger whose can_merge() is True")
        return self._with(trigger=trigger)

    def allowed_lateness(self, lateness) -> "WindowedStream":
        """Keep event-time windows this long (seconds or timedelta) after they fired: late
        elements re-fire them. Elements later than that are dropped or go to the late side
        output. Ignored by processing-time windows, which are never late."""
        millis = to_millis(lateness, "allowed_lateness")
        return self._with(allowed_lateness=millis)

    def side_output_late_data(self, tag: OutputTag) -> "WindowedStream":
        """Send elements too late for every window to `tag`; read them with
        `result.get_side_output(tag)`."""
        if not isinstance(tag, OutputTag):
            raise ConfigurationError(f"side_output_late_data takes an ss.OutputTag, got {tag!r}")
        return self._with(late_tag=tag)

    # ------------------------------------------------------------------ terminals
    def reduce(self, fn: Callable[[dict, dict], dict], function: ProcessWindowFunction | None = None,
               **options) -> "DataStream":
        """Fold each window's rows pairwise with `fn(a, b) -> row`; emits the reduced row (or
        hands it to `function`, a ProcessWindowFunction, with the window)."""
        from streamsnap.runtime.operators.windows import ReduceContents

        if not callable(fn):
            raise ConfigurationError(f"reduce needs a function (a, b) -> row, got {fn!r}")
        return self._build(ReduceContents(fn), function, "reduce", **options)

    def aggregate(self, aggregate: AggregateFunction, function: ProcessWindowFunction | None = None,
                  *, serializer=None, **options) -> "DataStream":
        """Aggregate incrementally with an AggregateFunction; emits `get_result` (a row) or
        hands it to `function` with the window. `serializer` encodes the accumulators."""
        from streamsnap.runtime.operators.windows import AggregateContents

        for method in ("create_accumulator", "add", "get_result"):
            if not callable(getattr(aggregate, method, None)):
                raise ConfigurationError(
                    f"aggregate takes an AggregateFunction (create_accumulator, add, get_result, "
                    f"merge), got {aggregate!r} without {method}()")
        if self._spec.assigner.is_merging and \
                type(aggregate).merge is AggregateFunction.merge:
            raise ConfigurationError(
                f"{type(aggregate).__name__} has no merge(a, b); session windows merge, so "
                f"their accumulators must too")
        return self._build(AggregateContents(aggregate), function, "aggregate",
                           serializer=serializer, **options)

    def process(self, function: ProcessWindowFunction, **options) -> "DataStream":
        """Call `function.process(key, context, rows)` with all of a window's rows when it fires."""
        from streamsnap.runtime.operators.windows import ListContents

        return self._build(ListContents(), function, "process", required=True, **options)

    # ------------------------------------------------------------------ vectorized
    def aggregate_columns(self, aggregates: dict, **options) -> "DataStream":
        """Vectorized per-window aggregates on Arrow batches, no Python per row (tumbling,
        sliding and event-time session windows, default trigger; sessions take no
        count_distinct and no string columns). `aggregates` maps output names to
        ``(function, column)`` with function one of sum, min, max, mean, count_distinct, or to
        ``"count"`` (rows); min and max also take string columns. ``("count_distinct", column)``
        counts the distinct non-null values exactly (SQL's ``COUNT(DISTINCT column)``);
        ``("count_distinct", column, where)`` only those of rows whose boolean (or 0/1) column
        `where` holds (``COUNT(DISTINCT column) FILTER (WHERE where)``). Emits the key column(s)
        (``key`` for a key function), ``window_start``, ``window_end`` and the outputs; nulls are
        skipped (all-null gives None). ``split_distinct=N`` runs distinct counts of a few hot
        keys on every subtask: a partial stage per key and N hash buckets of each distinct
        column, then a sum per key (Flink's split distinct aggregation; api/split_distinct.py)."""
        from streamsnap.runtime.operators.local_windows import TWO_PHASES, splits
        from streamsnap.runtime.operators.vectorized_windows import VectorizedWindowOperatorFactory

        from streamsnap.time.windows import EventTimeSessionWindows

        spec = self._spec
        assigner = spec.assigner
        sessions = isinstance(assigner, EventTimeSessionWindows)
        if not sessions and not hasattr(assigner, "assign_window_starts"):
            raise ConfigurationError(
                f"aggregate_columns: {type(assigner).__name__} is not vectorized; use tumbling, "
                f"sliding or event-time session windows, or .aggregate(AggregateFunction) for "
                f"this assigner")
        if type(spec.trigger) is not type(assigner.default_trigger()):
            raise ConfigurationError(
                f"aggregate_columns fires windows with the assigner's default trigger; "
                f"{type(spec.trigger).__name__} needs .aggregate(...) or .reduce(...)")
        schema = self._keyed.schema
        parsed = parse_column_aggregates(aggregates, schema,
                                         {"window_start", "window_end", *self._keyed.key.columns})
        buckets = options.pop("split_distinct", None)
        if buckets is not None:
            from streamsnap.api.split_distinct import check_buckets, split_distinct_aggregate

            return split_distinct_aggregate(self, parsed, check_buckets(buckets), options)
        if sessions:
            factory_type = _session_factory(parsed, schema)
        keyed = self._keyed
        name = options.pop("name", None) or f"Window({type(assigner).__name__}).aggregate_columns"
        key = keyed.key.for_operator(name)
        if not sessions:
            from streamsnap.runtime.operators.sliced_windows import SlicedWindowOperatorFactory, sliceable

            factory_type = SlicedWindowOperatorFactory if sliceable(assigner, spec.allowed_lateness, parsed) \
                else VectorizedWindowOperatorFactory
        declared = options.get("schema") if isinstance(options.get("schema"), pa.Schema) else None
        timestamps = keyed.timestamp_assigner
        if factory_type in TWO_PHASES and splits(key, assigner, parsed):
            local, factory_type = TWO_PHASES[factory_type]
            keyed = self._local_stage(local, name, options.get("uid"), key, tuple(parsed))
        factory = factory_type(
            key, assigner, spec.allowed_lateness, tuple(parsed),
            spec.late_tag.name if spec.late_tag is not None else None, timestamps, declared)
        if options.get("schema") is None:
            options["schema"] = result_schema(None if keyed.key.function is not None else keyed.key.columns,
                                              tuple(parsed), schema)
        return window_results(self._add(factory, name, key, keyed=keyed, **options), assigner)

    def _local_stage(self, factory_type: type, name: str, uid: str | None, key, aggregates: tuple):
        """The local phase of a two-phase aggregate (runtime/operators/local_windows.py), chained
        to the keyed stream's input: the keyed stream the global phase reads."""
        from streamsnap.api.datastream import DataStream, KeyedStream
        from streamsnap.graph.stream_graph import NodeKind

        keyed = self._keyed
        spec = self._spec
        parallelisms = {n.parallelism for n in keyed._upstreams}
        node = DataStream(keyed._env, keyed._upstreams, None, keyed._tag)._add(
            NodeKind.OPERATOR, f"{name} (local)", None if uid is None else f"{uid}-local",
            factory_type(key, spec.assigner, spec.allowed_lateness, aggregates, keyed.timestamp_assigner),
            parallelisms.pop() if len(parallelisms) == 1 else None, None, stage=True)
        return KeyedStream(keyed._env, (node,), keyed.key)

    def sum(self, column: str, **options) -> "DataStream":
        """Vectorized sum of `column` per key and window (output column named `column`)."""
        return self.aggregate_columns({column: ("sum", column)}, **options)

    def min(self, column: str, **options) -> "DataStream":
        """Vectorized minimum of `column` per key and window (output column named `column`); see `aggregate_columns`."""
        return self.aggregate_columns({column: ("min", column)}, **options)

    def max(self, column: str, **options) -> "DataStream":
        """Vectorized maximum of `column` per key and window (output column named `column`); see `aggregate_columns`."""
        return self.aggregate_columns({column: ("max", column)}, **options)

    def mean(self, column: str, **options) -> "DataStream":
        """Vectorized mean of `column` per key and window (output column named `column`); see `aggregate_columns`."""
        return self.aggregate_columns({column: ("mean", column)}, **options)

    def count(self, **options) -> "DataStream":
        """Vectorized row count per key and window (output column `count`)."""
        return self.aggregate_columns({"count": "count"}, **options)

    def _add(self, factory, name: str, key, *, uid: str | None = None,
             parallelism: int | None = None, schema=None, what: str = "window", keyed=None) -> "DataStream":
        from streamsnap.api.datastream import DataStream, _row_schema
        from streamsnap.graph.partitioners import KeyGroupPartitioner
        from streamsnap.graph.stream_graph import NodeKind

        keyed = keyed or self._keyed
        node = keyed._add(NodeKind.OPERATOR, name, uid, factory, parallelism,
                          _row_schema(schema, None, what),
                          KeyGroupPartitioner(key, keyed._env.max_parallelism))
        return DataStream(keyed._env, (node,))

    def _build(self, contents, function, what: str, *, name: str | None = None,
               uid: str | None = None, parallelism: int | None = None, schema=None,
               serializer=None, required: bool = False) -> "DataStream":
        from streamsnap.runtime.operators.windows import WindowOperatorFactory

        if (function is not None or required) and \
                not callable(getattr(function, "process", None)):
            raise ConfigurationError(
                f"{what} takes a ProcessWindowFunction (an object with process(key, context, "
                f"elements)), got {function!r}")
        spec = self._spec
        keyed = self._keyed
        name = name or f"Window({type(spec.assigner).__name__}).{what}"
        key = keyed.key.for_operator(name)
        factory = WindowOperatorFactory(
            key, spec.assigner, spec.trigger, spec.allowed_lateness, contents, function,
            spec.late_tag.name if spec.late_tag is not None else None,
            keyed.timestamp_assigner, serializer)
        return self._add(factory, name, key, uid=uid, parallelism=parallelism, schema=schema,
                         what=what)


__all__ = ["AggregateFunction", "ProcessWindowFunction", "WindowedStream", "window_results"]


def window_results(stream: "DataStream", assigner) -> "DataStream":
    """`stream` (a vectorized window aggregate's output, windows from `assigner`) with its rows'
    event time set to their window's last millisecond, as Flink stamps window results: windows,
    a window Top-N or timers after it see each result at its window's end
    (time/timestamps.py WindowEndTimestamps)."""
    from streamsnap.time.timestamps import WindowEndTimestamps

    timestamps = WindowEndTimestamps(None if getattr(assigner, "is_merging", False)
                                     else getattr(assigner, "size_ms", None))
    for node in stream._upstreams:
        node.timestamps = timestamps
    return stream


def result_schema(key_columns: tuple[str, ...] | None, aggregates: tuple, schema: pa.Schema | None
                  ) -> "StreamSchema":
    """What a vectorized window aggregate's rows will hold, known at build time for the checks
    after it (the tasks still infer it from the rows): the key columns with their types,
    ``window_start``/``window_end`` (int64), then the outputs — count and count_distinct int64,
    mean float64, sum, min and max int64 (float64 over a float column, string over a string
    one; booleans count as 0/1), as the operator makes them from numpy; integer key columns
    int64, as their Python values are. Unknown (None) without the
    input's schema or with a key function (its type is the function's)."""
    from streamsnap.api.datastream import _known_not_declared
    from streamsnap.runtime.operators.vectorized_windows import is_text

    if schema is None or key_columns is None or any(c not in schema.names for c in key_columns):
        return _known_not_declared(None)
    def as_rows_give(kind: pa.DataType) -> pa.DataType:
        """The type of a column of the Python values the operator emits (keys and numpy
        results as Python objects): integers and booleans' 0/1 as int64, floats as float64."""
        if pa.types.is_integer(kind):
            return pa.int64()
        if pa.types.is_floating(kind):
            return pa.float64()
        return pa.string() if is_text(kind) else kind

    fields = [pa.field(c, as_rows_give(schema.field(c).type)) for c in key_columns]
    fields += [pa.field("window_start", pa.int64()), pa.field("window_end", pa.int64())]
    for a in aggregates:
        kind = None if a.column is None else schema.field(a.column).type
        if a.function in ("count", "count_distinct"):
            out = pa.int64()
        elif a.function == "mean" or pa.types.is_floating(kind):
            out = pa.float64()
        elif is_text(kind):
            out = pa.string()
        else:
            out = pa.int64()        # sums and extremes of integer or boolean (0/1) columns
        fields.append(pa.field(a.output, out))
    return _known_not_declared(pa.schema(fields))


def _check_distinct(output: str, column: str, where: str | None, schema: pa.Schema | None) -> None:
    """count_distinct's column must hold values a state map key can be (numbers, strings,
    bytes, booleans); its filter column must be boolean or integer (0/1)."""
    if schema is None:
        return
    for name, role in ((column, "column"), (where, "filter column")):
        if name is not None and name not in schema.names:
            raise ConfigurationError(
                f"aggregate_columns: {output!r}: count_distinct's {role} {name!r} is not in the "
                f"stream's schema (columns {schema.names}); add it with map_batches first")
    kind = schema.field(column).type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
            or pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)):
        raise ConfigurationError(
            f"aggregate_columns: {output!r}: count_distinct takes an integer, float, boolean, "
            f"string or binary column; {column!r} has type {kind} (cast it with map_batches)")
    if where is not None:
        kind = schema.field(where).type
        if not (pa.types.is_boolean(kind) or pa.types.is_integer(kind)):
            raise ConfigurationError(
                f"aggregate_columns: {output!r}: the filter column {where!r} has type {kind}; it "
                f"must be boolean or integer (nonzero = the row counts)")


def parse_column_aggregates(aggregates, schema: pa.Schema | None, reserved: set) -> tuple:
    """`aggregate_columns`' dict checked against the stream's schema (when known), as
    `ColumnAggregate`s; `reserved`: the output names taken (key and window columns)."""
    from streamsnap.runtime.operators.vectorized_windows import AGGREGATES, ColumnAggregate, is_text

    if not isinstance(aggregates, dict) or not aggregates:
        raise ConfigurationError(
            f"aggregate_columns takes a non-empty dict such as {{'total': ('sum', 'value'), "
            f"'n': 'count'}}, got {aggregates!r}")
    parsed = []
    for output, definition in aggregates.items():
        function, column, where = (definition, None, None) if definition == "count" else (
            definition + (None,) if isinstance(definition, tuple) and len(definition) == 2
            else definition if isinstance(definition, tuple) and len(definition) == 3
            and definition[0] == "count_distinct" else (None, None, None))
        if function not in AGGREGATES or (function != "count") != isinstance(column, str) \
                or not (where is None or isinstance(where, str)):
            raise ConfigurationError(
                f"aggregate_columns: {output!r}: give ('sum' | 'min' | 'max' | 'mean' | "
                f"'count_distinct', column name), ('count_distinct', column name, filter column "
                f"name) or 'count', got {definition!r}")
        if not isinstance(output, str) or output in reserved:
            raise ConfigurationError(
                f"aggregate_columns: output name {output!r} must be a str other than "
                f"{sorted(reserved)}")
        if function == "count_distinct":
            assert isinstance(column, str)     # checked above: count_distinct names a column
            _check_distinct(output, column, where, schema)
        elif column is not None and schema is not None:
            if column not in schema.names:
                raise ConfigurationError(
                    f"aggregate_columns: column {column!r} is not in the stream's schema "
                    f"(columns {schema.names})")
            kind = schema.field(column).type
            if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                    or pa.types.is_boolean(kind) or (is_text(kind) and function in ("min", "max"))):
                raise ConfigurationError(
                    f"aggregate_columns: column {column!r} has type {kind}; {function} "
                    f"takes integer, float or boolean columns"
                    + ("" if function in ("min", "max") else " (min and max also strings)"))
        parsed.append(ColumnAggregate(output, function, column, where))
    return tuple(parsed)


def _session_factory(aggregates: tuple, schema: pa.Schema | None) -> type:
    """The vectorized session operator's factory, for aggregates it computes: sessions merge,
    and merging distinct sets or string extremes is left to `.aggregate(...)`."""
    from streamsnap.runtime.operators.vectorized_sessions import VectorizedSessionOperatorFactory

    for a in aggregates:
        if a.function == "count_distinct":
            raise ConfigurationError(
                f"aggregate_columns: {a.output!r}: count_distinct is not vectorized on session "
                f"windows (merging sessions would merge their distinct sets); use tumbling or "
                f"sliding windows, or .aggregate(AggregateFunction) with a merge() for sessions")
        if a.column is not None and schema is not None and a.column in schema.names and \
                not (pa.types.is_integer(schema.field(a.column).type)
                     or pa.types.is_floating(schema.field(a.column).type)
                     or pa.types.is_boolean(schema.field(a.column).type)):
            raise ConfigurationError(
                f"aggregate_columns: {a.output!r}: on session windows {a.function} takes integer, "
                f"float or boolean columns; {a.column!r} has type {schema.field(a.column).type} "
                f"(use .aggregate(AggregateFunction) for string extremes of sessions)")
    return VectorizedSessionOperatorFactory
