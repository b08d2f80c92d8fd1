"""Windows over the whole stream: `stream.window_all(assigner)` → `AllWindowedStream`.

Flink's `windowAll` / `AllWindowedStream`: one logical window per window interval over every
row of the stream, not per key. It is configured as a keyed `WindowedStream` is (trigger,
allowed lateness, late side output) and finished the same ways. The windows are held by one
operator at parallelism 1 (as in Flink), keyed by one constant key, so the keyed window
operators run it unchanged (runtime/operators/window_all.py). What runs in front of it:

* `reduce` / `aggregate` / `process`: nothing — every row goes to the one subtask (Flink does
  the same); its cost is Python per row there.
* `aggregate_columns` (and `sum`/`min`/`max`/`mean`/`count`): local/global aggregation, as
  Flink's planner runs a global aggregate — every upstream subtask reduces each batch to one
  partial aggregate per window (numpy), and the parallelism-1 stage merges them and fires.
* `top_n(n, by=...)`: a Window Top-N with ties (SQL's ``RANK() <= n`` per window): every
  upstream subtask keeps only the rows of each batch that can still be among their window's
  top n, the parallelism-1 stage ranks those (runtime/operators/window_top_n.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

import pyarrow as pa

from streamsnap.api.functions import Function, OutputTag
from streamsnap.api.windowing import (AggregateFunction, WindowedStream, parse_column_aggregates, result_schema,
                                      window_results)
from streamsnap.errors import ConfigurationError
from streamsnap.time.triggers import Trigger
from streamsnap.time.windows import ResultWindows, WindowAssigner

if TYPE_CHECKING:
    from streamsnap.api.datastream import DataStream


class ProcessAllWindowFunction(Function):
    """Called when a window of a `window_all` stream fires: `process(context, elements)` returns
    or yields rows (Flink's ProcessAllWindowFunction: a ProcessWindowFunction without a key).

    `context.window.start` / `.end` are epoch ms (end exclusive); `context.current_watermark()`,
    `context.current_processing_time()` and `context.output(tag, row)` are there too.
    `elements` are the window's rows, or the single pre-aggregated value with reduce/aggregate.
    """

    def process(self, context, elements: list) -> Iterable[dict] | dict | None:
        """Called when a window fires with its `elements`; return or yield rows."""
        raise NotImplementedError(f"{type(self).__name__} must implement process(self, context, elements)")


class _WithoutKey:
    """A ProcessAllWindowFunction as the window operator calls it: process(key, ...) with the
    constant key dropped; lifecycle hooks (open, close, checkpoint hooks) are the user's."""

    def __init__(self, function):
        self.function = function

    def process(self, key, context, elements):
        return self.function.process(context, elements)

    def __getattr__(self, name: str):
        if name == "function":           # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.function, name)


class AllWindowedStream:
    """A non-keyed stream cut into windows; finish it with reduce, aggregate, process,
    aggregate_columns (sum, min, max, mean, count) or top_n. The windows are held at
    parallelism 1 (see the module docstring for what runs in parallel in front of them)."""

    def __init__(self, stream: "DataStream", assigner: WindowAssigner):
        from streamsnap.api.datastream import KeyedStream
        from streamsnap.runtime.operators.window_all import WINDOW_ALL_KEY

        if not isinstance(assigner, WindowAssigner):
            raise ConfigurationError(
                f"window_all() takes a window assigner such as "
                f"ss.windows.TumblingEventTimeWindows.of(60), got {assigner!r}")
        self._stream = stream
        # The windows, as a keyed WindowedStream under the one constant key.
        self._windowed = WindowedStream(KeyedStream(stream._env, stream._upstreams, WINDOW_ALL_KEY, stream._tag),
                                        assigner)

    def _with(self, windowed: WindowedStream) -> "AllWindowedStream":
        copy = object.__new__(AllWindowedStream)
        copy._stream, copy._windowed = self._stream, windowed
        return copy

    # ------------------------------------------------------------------ configuration
    def trigger(self, trigger: Trigger) -> "AllWindowedStream":
        """Replace the assigner's default trigger (e.g. ss.windows.CountTrigger.of(100))."""
        return self._with(self._windowed.trigger(trigger))

    def allowed_lateness(self, lateness) -> "AllWindowedStream":
        """Keep event-time windows this long (seconds or timedelta) after they fired: late rows
        re-fire them; later ones are dropped or go to the late side output."""
        return self._with(self._windowed.allowed_lateness(lateness))

    def side_output_late_data(self, tag: OutputTag) -> "AllWindowedStream":
        """Send rows too late for every window to `tag` (`result.get_side_output(tag)`)."""
        return self._with(self._windowed.side_output_late_data(tag))

    # ------------------------------------------------------------------ per row, parallelism 1
    def reduce(self, fn: Callable[[dict, dict], dict], function: ProcessAllWindowFunction | None = None,
               **options) -> "DataStream":
        """Fold each window's rows pairwise with `fn(a, b) -> row` at parallelism 1 (as Flink's
        windowAll); emits the reduced row or hands it to `function`, a ProcessAllWindowFunction."""
        return self._windowed.reduce(fn, self._function(function, "reduce"), **self._options("reduce", options))

    def aggregate(self, aggregate: AggregateFunction, function: ProcessAllWindowFunction | None = None, *,
                  serializer=None, **options) -> "DataStream":
        """An AggregateFunction per window at parallelism 1; emits `get_result` (a row) or
        hands it to `function`, a ProcessAllWindowFunction. For speed, prefer aggregate_columns."""
        return self._windowed.aggregate(aggregate, self._function(function, "aggregate"), serializer=serializer,
                                        **self._options("aggregate", options))

    def process(self, function: ProcessAllWindowFunction, **options) -> "DataStream":
        """`function.process(context, rows)` with all of a window's rows when it fires (at
        parallelism 1: every row of the stream goes to one subtask)."""
        return self._windowed.process(self._function(function, "process", required=True),
                                      **self._options("process", options))

    def _function(self, function, what: str, required: bool = False) -> Any:
        if function is None and not required:
            return None
        if not callable(getattr(function, "process", None)):
            raise ConfigurationError(
                f"window_all(...).{what} takes a ProcessAllWindowFunction (an object with "
                f"process(context, elements)), got {function!r}")
        return _WithoutKey(function)

    def _options(self, what: str, options: dict) -> dict:
        assigner = self._windowed._spec.assigner
        return {**options, "parallelism": _one(options.get("parallelism"), what),
                "name": options.get("name") or f"WindowAll({type(assigner).__name__}).{what}"}

    # ------------------------------------------------------------------ vectorized, local/global
    def sum(self, column: str, **options) -> "DataStream":
        """Vectorized sum of `column` per window (output column named `column`)."""
        return self.aggregate_columns({column: ("sum", column)}, **options)

    def min(self, column: str, **options) -> "DataStream":
        """Vectorized minimum of `column` per window (output column named `column`)."""
        return self.aggregate_columns({column: ("min", column)}, **options)

    def max(self, column: str, **options) -> "DataStream":
        """Vectorized maximum of `column` per window (output column named `column`)."""
        return self.aggregate_columns({column: ("max", column)}, **options)

    def mean(self, column: str, **options) -> "DataStream":
        """Vectorized mean of `column` per window (output column named `column`)."""
        return self.aggregate_columns({column: ("mean", column)}, **options)

    def count(self, **options) -> "DataStream":
        """Vectorized row count per window (output column `count`)."""
        return self.aggregate_columns({"count": "count"}, **options)

    def aggregate_columns(self, aggregates: dict, *, name: str | None = None, uid: str | None = None,
                          parallelism: int | None = None, schema=None,
                          split_distinct: int | None = None) -> "DataStream":
        """Vectorized aggregates per window over the whole stream, as `WindowedStream.aggregate_columns`
        (same `aggregates`, tumbling and sliding windows, default trigger), emitting
        ``window_start``, ``window_end`` and the outputs (no key column). Local/global: each
        upstream subtask reduces every batch to one partial per window (numpy), the windows
        live at parallelism 1 (`parallelism` may only be 1). `uid` names the global stage (the
        local one, stateless, gets ``<uid>-local``). count_distinct is not pre-reduced: every
        row goes to the one subtask, unless ``split_distinct=N`` counts it on every subtask in
        N hash buckets of the values and sums the buckets at parallelism 1 (api/split_distinct.py)."""
        from streamsnap.graph.stream_graph import NodeKind
        from streamsnap.runtime.operators.window_all import (GlobalWindowAggregateOperatorFactory,
                                                             LocalWindowAggregateOperatorFactory)

        spec = self._windowed._spec
        assigner = spec.assigner
        self._check_vectorized("aggregate_columns")
        parallelism = _one(parallelism, "aggregate_columns")
        parsed = parse_column_aggregates(aggregates, self._stream.schema, {"window_start", "window_end"})
        if split_distinct is not None:
            from streamsnap.api.split_distinct import check_buckets, split_distinct_aggregate

            return split_distinct_aggregate(self._windowed, parsed, check_buckets(split_distinct),
                                            {"name": name, "uid": uid, "parallelism": parallelism,
                                             "schema": schema}, whole_stream=True)
        name = name or f"WindowAll({type(assigner).__name__}).aggregate_columns"
        local = self._stream._add(
            NodeKind.OPERATOR, f"{name} (local)", None if uid is None else f"{uid}-local",
            LocalWindowAggregateOperatorFactory(assigner, spec.allowed_lateness, parsed,
                                                self._stream.timestamp_assigner), None, None)
        key = self._windowed._keyed.key.for_operator(name)
        factory = GlobalWindowAggregateOperatorFactory(
            key, assigner, spec.allowed_lateness, parsed,
            spec.late_tag.name if spec.late_tag is not None else None, self._stream.timestamp_assigner,
            schema if isinstance(schema, pa.Schema) else None)
        if schema is None:
            schema = result_schema((), parsed, self._stream.schema)
        return window_results(self._on(local)._add(factory, name, key, uid=uid, parallelism=parallelism,
                                                   schema=schema), assigner)

    def top_n(self, n: int, *, by: str, descending: bool = True, rank_column: str | None = "rank",
              name: str | None = None, uid: str | None = None, parallelism: int | None = None) -> "DataStream":
        """Window Top-N with ties: per window, the rows ranked `n` or better by the numeric
        column `by` (highest first; `descending=False`: lowest first), emitted when the window
        fires — Flink SQL's ``RANK() OVER (PARTITION BY window_start, window_end ORDER BY by
        DESC) <= n``. Rows that tie share a rank and are all kept, so a window may emit more
        than n rows (``top_n(1, by="price")``: every row with the window's highest price).
        Nulls and NaN rank last. Each row comes out with ``window_start``, ``window_end`` and
        its rank in `rank_column` (None: no rank column). Local/global: every upstream
        subtask keeps only each batch's candidates (numpy); the ranking lives at parallelism
        1. Tumbling and sliding windows with the default trigger."""
        from streamsnap.api.datastream import _known_not_declared
        from streamsnap.graph.stream_graph import NodeKind
        from streamsnap.runtime.operators.top_n import check_n
        from streamsnap.runtime.operators.window_top_n import (RankContents, RankedRows, Ranking,
                                                               WindowTopNCandidatesFactory)
        from streamsnap.runtime.operators.windows import WindowOperatorFactory

        spec = self._windowed._spec
        self._check_vectorized("top_n")
        check_n(n)
        parallelism = _one(parallelism, "top_n")
        schema = self._stream.schema
        if not isinstance(by, str):
            raise ConfigurationError(f"top_n: by is the column to rank by, a str; got {by!r}")
        if not isinstance(descending, bool):
            raise ConfigurationError(f"top_n: descending must be True or False, got {descending!r}")
        if rank_column is not None and (not isinstance(rank_column, str) or not rank_column):
            raise ConfigurationError(f"top_n: rank_column must be a column name or None, got {rank_column!r}")
        own_windows = isinstance(spec.assigner, ResultWindows)     # window_top_n: the input's windows
        added = ([] if own_windows else ["window_start", "window_end"]) + \
            ([rank_column] if rank_column is not None else [])
        if schema is not None:
            if by not in schema.names:
                raise ConfigurationError(
                    f"top_n: by={by!r} is not a column of the stream (columns {schema.names})")
            kind = schema.field(by).type
            if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
                raise ConfigurationError(
                    f"top_n: column {by!r} has type {kind}; the window top-N ranks by an integer, "
                    f"float or boolean column (derive one with map_batches)")
            taken = [c for c in added if c in schema.names]
            if taken:
                raise ConfigurationError(
                    f"top_n: the stream already has column(s) {taken}, which top_n adds; rename them "
                    f"with map_batches first" + (", or pass another rank_column=" if rank_column in taken else ""))
            schema = pa.schema(list(schema) + [pa.field(c, pa.int64()) for c in added])
        ranking = Ranking(n, by, descending, rank_column)
        name = name or f"WindowAll({type(spec.assigner).__name__}).top_n({n})"
        local = self._stream._add(
            NodeKind.OPERATOR, f"{name} (local)", None if uid is None else f"{uid}-local",
            WindowTopNCandidatesFactory(spec.assigner, spec.allowed_lateness, ranking,
                                        self._stream.timestamp_assigner), None, self._stream._stream_schema)
        key = self._windowed._keyed.key.for_operator(name)
        factory = WindowOperatorFactory(
            key, spec.assigner, spec.trigger, spec.allowed_lateness, RankContents(ranking),
            RankedRows(ranking), spec.late_tag.name if spec.late_tag is not None else None,
            self._stream.timestamp_assigner)
        return self._on(local)._add(factory, name, key, uid=uid, parallelism=parallelism,
                                    schema=_known_not_declared(schema), what="top_n")

    def _check_vectorized(self, what: str) -> None:
        spec = self._windowed._spec
        assigner = spec.assigner
        if not hasattr(assigner, "assign_window_starts"):
            raise ConfigurationError(
                f"window_all(...).{what}: {type(assigner).__name__} is not vectorized; use tumbling "
                f"or sliding windows, or .aggregate(AggregateFunction) / .process(...) for this assigner")
        if type(spec.trigger) is not type(assigner.default_trigger()):
            raise ConfigurationError(
                f"window_all(...).{what} fires windows with the assigner's default trigger; "
                f"{type(spec.trigger).__name__} needs .aggregate(...), .reduce(...) or .process(...)")

    def _on(self, node) -> WindowedStream:
        """The windows with `node` (the local stage) as their input."""
        from streamsnap.api.datastream import KeyedStream

        windowed = self._windowed._with()
        windowed._keyed = KeyedStream(self._stream._env, (node,), self._windowed._keyed.key)
        return windowed


def _one(parallelism, what: str) -> int:
    if parallelism not in (None, 1):
        raise ConfigurationError(
            f"window_all(...).{what}: parallelism={parallelism!r}; the windows of window_all are one "
            f"logical window over the whole stream and run at parallelism 1 (as Flink's windowAll); "
            f"to spread windows over subtasks, key the stream: key_by(...).window(...)")
    return 1


__all__ = ["AllWindowedStream", "ProcessAllWindowFunction"]
