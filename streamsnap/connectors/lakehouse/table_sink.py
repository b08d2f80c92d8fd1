"""What lakehouse sinks share: their settings, the column types tables store, schema checks.

Types are mapped faithfully and the same way for Delta and Iceberg: timestamps keep their
instant (zoned ones stored as UTC, zone-less ones as local timestamps) at the microsecond
precision both formats store; decimals keep precision and scale; structs, lists and maps nest.
Unsigned integers widen to the next signed type, as neither format has unsigned ones; what no
format can hold (uint64, time of day, durations) is refused at build time, naming the column.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from streamsnap.connectors.base import Sink
from streamsnap.errors import ConfigurationError

SCHEMA_MODES = ("error", "merge")
_PARTITION_TYPES = (pa.types.is_integer, pa.types.is_string, pa.types.is_large_string, pa.types.is_date,
                    pa.types.is_boolean, pa.types.is_timestamp, pa.types.is_decimal)


def table_type(name: str, t: pa.DataType) -> pa.DataType:
    """The Arrow type a stream column of type `t` is stored with in a table (Delta and Iceberg
    alike: microsecond timestamps, UTC when zoned; signed integers; nested types kept)."""
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", "UTC") if t.tz is not None else pa.timestamp("us")
    if pa.types.is_dictionary(t):
        return table_type(name, t.value_type)
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t) or pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if pa.types.is_unsigned_integer(t):
        if t.bit_width == 64:
            raise ConfigurationError(f"column {name!r} is uint64, which no Delta or Iceberg integer type holds; "
                                     f"cast it to int64 (or decimal(20, 0)) before the sink")
        return {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}[t.bit_width]
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, table_type(f"{name}.{f.name}", f.type), f.nullable) for f in t])
    if pa.types.is_map(t):
        return pa.map_(table_type(f"{name}.key", t.key_type), table_type(f"{name}.value", t.item_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_list_view(t):
        return pa.list_(table_type(f"{name}.element", t.value_type))
    if pa.types.is_time(t) or pa.types.is_duration(t) or pa.types.is_interval(t) or pa.types.is_null(t):
        raise ConfigurationError(f"column {name!r} has type {t}, which the table formats have no type for; "
                                 f"convert it (e.g. to int64 or string) before the sink")
    return t


def table_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, table_type(f.name, f.type), f.nullable) for f in schema])


def to_table_types(batch: pa.RecordBatch) -> pa.RecordBatch:
    target = table_schema(batch.schema)
    return batch if target.equals(batch.schema) else batch.cast(target)


def schema_problem(stream: dict[str, Any], table: dict[str, Any], mode: str) -> str | None:
    """What stops the stream's columns (name -> type) from going into the table's, or None."""
    for name, kind in stream.items():
        if name not in table:
            if mode == "error":
                return (f"the stream has column {name!r}, which the table does not; schema_mode='merge' adds it to "
                        f"the table, or drop it from the stream")
        elif table[name] != kind:
            return (f"column {name!r} is {kind} in the stream but {table[name]} in the table; cast it in the stream "
                    f"to the table's type")
    return None


class TableSink(Sink):
    """Settings and build-time checks shared by the Delta and Iceberg sinks."""

    kind = "table"

    def __init__(self, partition_by: list[str] | str | None, schema_mode: str, target_file_size: int):
        if schema_mode not in SCHEMA_MODES:
            raise ConfigurationError(f"{type(self).__name__}.schema_mode must be one of "
                                     f"{', '.join(map(repr, SCHEMA_MODES))}, got {schema_mode!r}")
        if not isinstance(target_file_size, int) or target_file_size < 1024:
            raise ConfigurationError(f"{type(self).__name__}.target_file_size must be an int of bytes >= 1024, "
                                     f"got {target_file_size!r}")
        self.partition_by = [partition_by] if isinstance(partition_by, str) else list(partition_by or [])
        self.schema_mode = schema_mode
        self.target_file_size = target_file_size
        self._user_partitioning = partition_by is not None
        self._schema: pa.Schema | None = None

    def _where(self) -> str:
        raise NotImplementedError

    def validate(self, schema: pa.Schema | None) -> None:
        if schema is not None:
            self._schema = table_schema(schema)
            for name in self.partition_by:
                if name not in schema.names:
                    raise ConfigurationError(f"{self._where()}: partition column {name!r} is not in the stream "
                                             f"(columns: {', '.join(schema.names)})")
                if not any(check(schema.field(name).type) for check in _PARTITION_TYPES):
                    raise ConfigurationError(f"{self._where()}: partition column {name!r} has type "
                                             f"{schema.field(name).type}; partition by a primitive column")
        self._check_table()

    def check_output(self, sink_name: str, resuming: bool) -> None:
        """At `execute()`, before any Spark job: the table may have changed since `sink_to`."""
        self._check_table()

    def _check_table(self) -> None:
        raise NotImplementedError

    def _adopt_partitioning(self, table_partitions: list[str]) -> None:
        if self._user_partitioning and self.partition_by != table_partitions:
            raise ConfigurationError(f"{self._where()}: partition_by={self.partition_by} but the table is partitioned "
                                     f"by {table_partitions}; pass partition_by={table_partitions} (or None)")
        self.partition_by = table_partitions
