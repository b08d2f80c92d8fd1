"""Split distinct aggregation: a window aggregate with ``count_distinct`` run in two stages so
that a hot key's distinct values spread over all subtasks (Flink's
``table.optimizer.distinct-agg.split.enabled``).

One key's distinct set lives in one subtask, so a job whose few keys carry most rows (a
channel, a day) runs on one core however many it has. Splitting rewrites

    key_by(k).window(w).aggregate_columns({"users": ("count_distinct", "user"), "n": "count"})

into a partial stage keyed by ``(k, part, bucket)`` — each row once per distinct column
(``part``), bucketed by a stable hash of that column's value — and a final stage keyed by
``k`` that sums the partial counts of each window. Buckets partition the values, so the sum of
the buckets' distinct counts is the exact distinct count. The other aggregates ride along on
part 0 only (their inputs are null on the other parts): counts and sums are summed, minima and
maxima folded, means carried as a sum and a count and divided at the end. The result has the
unsplit aggregate's columns and types, so what follows it cannot tell the two apart.

`window_all(...).aggregate_columns(..., split_distinct=N)` splits a distinct count over the
whole stream the same way: its partial stage runs on every subtask, keyed by (part, bucket),
and only the sums of the partial counts are at parallelism 1.

Limits, each refused when the job is built: event-time tumbling or sliding windows only (the
final stage windows the partial results by their own window, `ResultWindows`), no allowed
lateness (a late refiring would add its partial to a final result already emitted) and no side
output of late rows (they would come out once per part, expanded)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.errors import ConfigurationError

PART = "__split_part"
BUCKET = "__split_bucket"
ROWS = "__split_rows"


@dataclass(frozen=True)
class SplitPlan:
    """What the expansion adds to each row, per part (picklable: it travels to the tasks)."""

    kept: tuple[str, ...]                   # the input columns copied (the partial stage's)
    distinct_columns: tuple[str, ...]       # part i buckets by distinct_columns[i]
    buckets: int
    wheres: tuple[tuple[str, str, str | None], ...]   # (added column, distinct column, filter column)
    inputs: tuple[tuple[str, str | None, bool], ...]  # (added column, source column or None: 1, valid-only)
    expanded: pa.Schema


def check_buckets(buckets) -> int:
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1:
        raise ConfigurationError(
            f"aggregate_columns: split_distinct takes a number of buckets (an int >= 1, e.g. 64) to "
            f"spread each key's distinct values over, got {buckets!r}")
    return buckets


def _check_splittable(windowed, aggregates: tuple, whole_stream: bool) -> None:
    spec = windowed._spec
    assigner = spec.assigner
    keyed = windowed._keyed
    what = "aggregate_columns(split_distinct=...)"
    if not any(a.function == "count_distinct" for a in aggregates):
        raise ConfigurationError(
            f"{what}: there is no count_distinct to split; drop split_distinct (the other aggregates "
            f"are already combined per batch)")
    if not getattr(assigner, "is_event_time", False) or getattr(assigner, "is_merging", False) \
            or not hasattr(assigner, "assign_window_starts"):
        raise ConfigurationError(
            f"{what}: splits event-time tumbling or sliding windows, not {type(assigner).__name__} "
            f"(its final stage windows the partial results by event time); drop split_distinct")
    if spec.allowed_lateness:
        raise ConfigurationError(
            f"{what}: a split aggregate takes no allowed_lateness (a late refiring would add its "
            f"partial to a result already emitted); drop one of the two")
    if spec.late_tag is not None:
        raise ConfigurationError(
            f"{what}: late rows cannot go to a side output of a split aggregate (they would come out "
            f"once per distinct column); drop side_output_late_data or split_distinct")
    if keyed.key.function is not None and not whole_stream:
        raise ConfigurationError(
            f"{what}: key by column names (key_by('k') or key_by(['a', 'b'])), not a function: the "
            f"partial stage adds its bucket to the key columns")
    if keyed.schema is None:
        raise ConfigurationError(
            f"{what}: the stream's schema must be known when the job is built (the partial stage "
            f"adds typed columns); give the step before it an output_schema")
    taken = sorted(n for n in [*keyed.schema.names, *(a.output for a in aggregates)]
                   if n.startswith("__split_"))
    if taken:
        raise ConfigurationError(
            f"{what}: columns and outputs named __split_* are the split's own; rename {taken}")


def _needed(schema: pa.Schema, keys: list, aggregates: tuple, timestamps) -> pa.Schema:
    """The columns the partial stage reads (keys, the aggregates' columns and filters, the event
    time's column): the expansion copies only these, once per distinct column."""
    time = timestamps if isinstance(timestamps, str) else getattr(timestamps, "column", None)
    if timestamps is not None and time is None:
        return schema                       # a timestamp function may read any column
    wanted = {*keys, time, *(a.column for a in aggregates), *(a.where for a in aggregates)}
    return pa.schema([f for f in schema if f.name in wanted])


def _plan(schema: pa.Schema, aggregates: tuple, buckets: int) -> tuple[SplitPlan, dict, dict, list]:
    """The expansion, the partial stage's aggregates, the final stage's, and the means to divide."""
    columns = tuple(dict.fromkeys(a.column for a in aggregates if a.function == "count_distinct"))
    wheres: dict[tuple, str] = {}
    inputs: list[tuple[str, str | None, bool]] = \
        [(ROWS, None, False)] if any(a.function == "count" for a in aggregates) else []
    partial_aggs: dict = {}
    final_aggs: dict = {}
    means = []
    for k, a in enumerate(aggregates):
        if a.function == "count_distinct":
            where = wheres.setdefault((a.column, a.where), f"__split_where_{len(wheres)}")
            partial_aggs[a.output] = ("count_distinct", a.column, where)
            final_aggs[a.output] = ("sum", a.output)
        elif a.function == "count":
            partial_aggs[a.output] = ("sum", ROWS)
            final_aggs[a.output] = ("sum", a.output)
        elif a.function == "mean":
            total, n = f"__split_sum_{k}", f"__split_n_{k}"
            inputs += [(f"__split_in_{k}", a.column, False), (f"__split_valid_{k}", a.column, True)]
            partial_aggs[total] = ("sum", f"__split_in_{k}")
            partial_aggs[n] = ("sum", f"__split_valid_{k}")
            final_aggs[total] = ("sum", total)
            final_aggs[n] = ("sum", n)
            means.append((a.output, total, n))
        else:
            inputs.append((f"__split_in_{k}", a.column, False))
            partial_aggs[a.output] = (a.function, f"__split_in_{k}")
            final_aggs[a.output] = ("sum" if a.function == "sum" else a.function, a.output)
    fields = list(schema) + [pa.field(PART, pa.int64()), pa.field(BUCKET, pa.int64())]
    fields += [pa.field(name, pa.bool_()) for name in wheres.values()]
    fields += [pa.field(name, pa.int64() if source is None or valid else schema.field(source).type)
               for name, source, valid in inputs]
    plan = SplitPlan(tuple(schema.names), columns, buckets, tuple((name, c, w) for (c, w), name in wheres.items()),
                     tuple(inputs), pa.schema(fields))
    return plan, partial_aggs, final_aggs, means


def expand(batch: pa.RecordBatch, plan: SplitPlan) -> pa.RecordBatch:
    """Each row once per distinct column: part i with its bucket from that column's value, its
    distinct filters true only for that column, the other aggregates' inputs on part 0 alone."""
    from streamsnap.runtime.operators.window_distinct import DistinctSpec, row_mask
    from streamsnap.state.key_groups import hash_keys

    n = batch.num_rows
    parts = []
    for part, column in enumerate(plan.distinct_columns):
        bucket = (hash_keys(batch.column(column)) % np.uint64(plan.buckets)).astype(np.int64)
        arrays = [batch.column(c) for c in plan.kept] + [pa.array(np.full(n, part, dtype=np.int64)),
                                                         pa.array(bucket)]
        for _, of, where in plan.wheres:      # the distinct count's own filter, on its part only
            arrays.append(pa.array(row_mask(batch, DistinctSpec(of, where)) if of == column
                                   else np.zeros(n, dtype=bool)))
        for name, source, valid in plan.inputs:
            kind = plan.expanded.field(name).type
            if part:
                arrays.append(pa.nulls(n, kind))
            elif source is None:
                arrays.append(pa.array(np.ones(n, dtype=np.int64)))
            elif valid:
                arrays.append(pc.cast(pc.is_valid(batch.column(source)), pa.int64()))
            else:
                arrays.append(batch.column(source))
        parts.append(arrays)
    if len(parts) == 1:
        return pa.RecordBatch.from_arrays(parts[0], schema=plan.expanded)
    return pa.RecordBatch.from_arrays(
        [pa.concat_arrays([p[i] for p in parts]) for i in range(len(plan.expanded))], schema=plan.expanded)


def finish(batch: pa.RecordBatch, means: tuple, schema: pa.Schema) -> pa.RecordBatch:
    """The final stage's rows as the unsplit aggregate's: its columns, in its order and types."""
    columns = {name: batch.column(name) for name in batch.schema.names}
    for output, total, n in means:
        count = pc.cast(columns[n], pa.float64())
        columns[output] = pc.if_else(pc.greater(pc.fill_null(count, 0), 0),
                                     pc.divide(pc.cast(columns[total], pa.float64()), count),
                                     pa.scalar(None, pa.float64()))
    return pa.RecordBatch.from_arrays([pc.cast(columns[f.name], f.type) for f in schema], schema=schema)


def split_distinct_aggregate(windowed, aggregates: tuple, buckets: int, options: dict, *,
                             whole_stream: bool = False):
    """`windowed.aggregate_columns(...)` as a partial stage per (key, part, bucket) and a final
    stage per key (module docstring); options: name, uid, parallelism as for the unsplit one.
    `whole_stream`: `window_all(...)`'s windows — the partial stage per (part, bucket) runs in
    parallel (the environment's parallelism) and only the sums are at parallelism 1."""
    from streamsnap.api.datastream import DataStream
    from streamsnap.api.windowing import result_schema, window_results
    from streamsnap.time.windows import ResultWindows

    _check_splittable(windowed, aggregates, whole_stream)
    keyed = windowed._keyed
    assigner = windowed._spec.assigner
    keys = [] if whole_stream else list(keyed.key.columns)
    schema = options.pop("schema", None)
    declared = result_schema(tuple(keys), aggregates, keyed.schema).schema
    if schema is not None and schema != declared:
        raise ConfigurationError(
            f"aggregate_columns(split_distinct=...): its rows are {declared}; a different schema= "
            f"cannot be declared for a split aggregate (cast with map_batches after it)")
    name = options.pop("name", None) or f"Window({type(assigner).__name__}).aggregate_columns"
    uid = options.pop("uid", None)
    parallelism = options.pop("parallelism", None)
    if options:
        raise ConfigurationError(f"aggregate_columns: unknown option(s) {sorted(options)}")
    plan, partial_aggs, final_aggs, means = _plan(
        _needed(keyed.schema, keys, aggregates, keyed.timestamp_assigner), aggregates, buckets)

    def stage(suffix: str, at: int | None = parallelism) -> dict:
        return {"name": f"{name} [{suffix}]", "uid": None if uid is None else f"{uid}-{suffix}",
                "parallelism": at}

    source = DataStream(keyed._env, keyed._upstreams, None, keyed._tag)
    spread = None if whole_stream else parallelism
    expanded = source.map_batches(partial(expand, plan=plan), output_schema=plan.expanded,
                                  **stage("split", spread))
    partials = (expanded.key_by(keys + [PART, BUCKET]).window(assigner)
                .aggregate_columns(partial_aggs, **stage("partial", spread)))
    size = assigner.size_ms
    if whole_stream:
        finals = partials.window_all(ResultWindows(size)).aggregate_columns(final_aggs, **stage("final"))
    else:
        finals = (partials.key_by(keys).window(ResultWindows(size))
                  .aggregate_columns(final_aggs, **stage("final")))
    out = finals.map_batches(partial(finish, means=tuple(means), schema=declared), output_schema=declared,
                             **stage("result", 1 if whole_stream else parallelism))
    return window_results(out, assigner)
