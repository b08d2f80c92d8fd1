"""`stream.lookup_join(table, on=..., columns=..., how=...)`: enrichment from a bounded table.

The table — a pyarrow Table or a batch Spark DataFrame, collected to the driver here, when the
pipeline is built — is checked against the stream (join columns, their types, output names),
indexed once (runtime/operators/lookup_join.py) and shipped in the job graph to every subtask.
No key_by: the stream keeps its partitioning, and the operator has no state, so checkpoints
hold nothing of it and a restore joins with the table of the job graph being run (a job rebuilt
from a savepoint joins with the table its code collects then, as a Flink lookup join reads the
dimension table as it is now). `max_table_bytes` bounds the copy every subtask holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from streamsnap.errors import ConfigurationError
from streamsnap.graph.stream_graph import NodeKind
from streamsnap.runtime.operators.lookup_join import HOWS, LookupJoinOperatorFactory, LookupTable, key_type

if TYPE_CHECKING:
    from streamsnap.api.datastream import DataStream

#: The largest table (Arrow bytes) lookup_join ships to every subtask unless told otherwise.
DEFAULT_MAX_TABLE_BYTES = 64 << 20


def collect_table(table, max_table_bytes: int, where: str) -> pa.Table:
    """The lookup side as one pyarrow Table: a Table/RecordBatch as it is, a batch Spark
    DataFrame collected (Arrow); over `max_table_bytes` it is refused, naming the fixes — a
    DataFrame before it is collected (`arrow_bytes`)."""
    if isinstance(max_table_bytes, bool) or not isinstance(max_table_bytes, int) or max_table_bytes < 1:
        raise ConfigurationError(f"{where}: max_table_bytes must be a positive int (bytes), got {max_table_bytes!r}")
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    elif not isinstance(table, pa.Table):
        if not (hasattr(table, "sparkSession") and hasattr(table, "isStreaming")):
            raise ConfigurationError(
                f"{where}: the table must be a pyarrow Table or a batch Spark DataFrame, got "
                f"{type(table).__name__}; to join with a stream, key both and connect them")
        if table.isStreaming:
            raise ConfigurationError(
                f"{where}: the DataFrame is a streaming one (readStream); a lookup join needs a "
                f"bounded table. Join two streams with a.key_by(k).connect(b.key_by(k))")
        # Sized where it lies first: a DataFrame too large is refused before the driver holds it.
        _check_size(arrow_bytes(table), max_table_bytes, where)
        table = table.toArrow()
    _check_size(table.nbytes, max_table_bytes, where)
    return table


def _batch_bytes(batches):
    yield pa.RecordBatch.from_pydict({"bytes": [sum(b.nbytes for b in batches)]})


def arrow_bytes(frame) -> int:
    """The Arrow bytes of a batch DataFrame's rows, summed by its executors (one Spark job that
    moves a number per partition, not the rows): what `toArrow()` would bring to the driver."""
    sizes = frame.mapInArrow(_batch_bytes, "bytes long").agg({"bytes": "sum"}).collect()
    return int(sizes[0][0] or 0)


def _check_size(nbytes: int, max_table_bytes: int, where: str) -> None:
    if nbytes > max_table_bytes:
        raise ConfigurationError(
            f"{where}: the table holds {nbytes:,} bytes, above max_table_bytes={max_table_bytes:,}; "
            f"every subtask keeps a copy and it travels in the job graph. Select only the columns "
            f"you need, raise max_table_bytes=..., or for a table this large stream it "
            f"(env.from_dataframe) and join it keyed: table.key_by(k).connect(stream.key_by(k))"
            f".process_batches(...), which spreads it over the subtasks by key")


def _pairs(on, where: str) -> tuple[tuple[str, str], ...]:
    if isinstance(on, str):
        on = [on]
    if isinstance(on, dict):
        pairs = tuple(on.items())
    elif isinstance(on, (list, tuple)):
        pairs = tuple((c, c) for c in on)
    else:
        raise ConfigurationError(f"{where}: on= takes a column name, a list of them (named alike on both "
                                 f"sides) or a dict {{stream column: table column}}, got {on!r}")
    if not pairs or not all(isinstance(s, str) and s and isinstance(t, str) and t for s, t in pairs):
        raise ConfigurationError(f"{where}: on= needs at least one join column, as names; got {on!r}")
    return pairs


def _output_columns(columns, table: pa.Table, pairs, where: str) -> dict[str, str]:
    if columns is None:
        keys = {t for _, t in pairs}
        return {c: c for c in table.column_names if c not in keys}
    if isinstance(columns, str):
        columns = [columns]
    if isinstance(columns, dict):
        chosen = dict(columns)
    elif isinstance(columns, (list, tuple)):
        chosen = {c: c for c in columns}
    else:
        raise ConfigurationError(f"{where}: columns= takes the table's column names (a list) or a dict "
                                 f"{{table column: output name}}, got {columns!r}")
    missing = [c for c in chosen if c not in table.column_names]
    if missing:
        raise ConfigurationError(f"{where}: the table has no column {missing[0]!r} (its columns: "
                                 f"{table.column_names}); fix columns=")
    return chosen


def lookup_join(stream: "DataStream", table, on, *, columns=None, how: str = "inner", name: str | None = None,
                uid: str | None = None, parallelism: int | None = None,
                max_table_bytes: int = DEFAULT_MAX_TABLE_BYTES) -> "DataStream":
    """See DataStream.lookup_join."""
    from streamsnap.api.datastream import DataStream

    name = name or "LookupJoin"
    where = f"lookup_join '{name}'"
    if how not in HOWS:
        raise ConfigurationError(f"{where}: how must be one of {HOWS}, got {how!r}")
    if stream._partitioner is not None:
        raise ConfigurationError(f"{where}: a lookup join needs no key_by (every subtask holds the whole "
                                 f"table); call it on the stream before key_by()/rebalance()")
    pairs = _pairs(on, where)
    table = collect_table(table, max_table_bytes, where)
    missing = [t for _, t in pairs if t not in table.column_names]
    if missing:
        raise ConfigurationError(f"{where}: the table has no join column {missing[0]!r} (its columns: "
                                 f"{table.column_names}); fix on=")
    chosen = _output_columns(columns, table, pairs, where)
    schema = stream.schema
    out_schema = None
    if schema is not None:
        absent = [s for s, _ in pairs if s not in schema.names]
        if absent:
            raise ConfigurationError(f"{where}: the stream has no join column {absent[0]!r} (its columns: "
                                     f"{schema.names}); fix on=")
        for s, t in pairs:
            ours, theirs = schema.field(s).type, table.schema.field(t).type
            if key_type(ours) != key_type(theirs):
                raise ConfigurationError(
                    f"{where}: the stream's join column {s!r} is {ours} but the table's {t!r} is "
                    f"{theirs}; such keys never match. Cast one side (e.g. pc.cast in map_batches, or "
                    f"table.cast(...)) so both are the same type")
        clash = [out for out in chosen.values() if out in schema.names]
        if clash:
            raise ConfigurationError(
                f"{where}: the output would have two columns {clash[0]!r} (the stream's and the "
                f"table's); rename the table's with columns={{{clash[0]!r}: 'new_name'}} or leave it out")
        out_schema = pa.schema(list(schema) + [table.schema.field(c).with_name(out).with_nullable(True)
                                               for c, out in chosen.items()])
    if len(set(chosen.values())) != len(chosen):
        raise ConfigurationError(f"{where}: two table columns get the same output name in columns={columns!r}")
    try:
        index = LookupTable(table, pairs, chosen)
    except (pa.ArrowException, ValueError) as exc:
        raise ConfigurationError(f"{where}: cannot index the table on {[t for _, t in pairs]}: {exc}") from None
    factory = LookupJoinOperatorFactory(index, how, stream._stream_schema)
    node = stream._add(NodeKind.OPERATOR, name, uid, factory, parallelism, out_schema)
    return DataStream(stream._env, (node,))


__all__ = ["DEFAULT_MAX_TABLE_BYTES", "arrow_bytes", "collect_table", "lookup_join"]
