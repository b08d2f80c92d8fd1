"""Avro messages ↔ Arrow record batches, for the Kafka source and sink (format="avro").

Why it exists: Avro is the other common encoding of Kafka messages. The user gives the writer
schema (a record); its fields become the stream's columns, with Arrow types derived from the
Avro types, so the pipeline has a declared schema before the first message arrives.

Decoding: one poll's values are joined into one buffer. Flat records (nullable primitive
fields) are decoded column by column with numpy (`avro_columns.py`, no Python per message).
Other schemas, and any batch the columnar decoder does not accept, go through fastavro's C
decoder record after record (one call per message, no Python per field), with the stream
position after each record checked against the message lengths: a message whose bytes do not
decode to exactly one record is reported by its index (the source names its topic, partition
and offset), never silently misread as part of its neighbours; those rows then become one Arrow
struct array in a single call.

Logical types travel as their Arrow types (timestamp-millis/-micros → timestamp with UTC,
local-timestamp-* → timestamp without zone, date → date32, time-* → time32/time64, uuid →
string); fastavro decodes and encodes them as their underlying int/long/string here (the
logical annotations are stripped from the schema it is given), which Arrow converts without
per-value Python objects such as datetimes. The decimal logical type is not supported.

framing="confluent": every message starts with the Confluent Schema Registry wire header
(magic byte 0, 4-byte schema id); the source strips it (the schema id is not looked up: the
given schema must be the writer's), the sink writes it with the given schema id.

Encoding: flat records column by column (`avro_columns.py`), others with fastavro row by row
into one buffer.
"""

from __future__ import annotations

import copy
import io
import json

import numpy as np
import pyarrow as pa

from streamsnap.connectors.kafka import avro_columns
from streamsnap.errors import ConfigurationError

FRAMINGS = ("none", "confluent")
_PRIMITIVES = {"null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(),
               "float": pa.float32(), "double": pa.float64(), "bytes": pa.binary(), "string": pa.string()}
_LOGICAL = {("long", "timestamp-millis"): pa.timestamp("ms", tz="UTC"),
            ("long", "timestamp-micros"): pa.timestamp("us", tz="UTC"),
            ("long", "local-timestamp-millis"): pa.timestamp("ms"),
            ("long", "local-timestamp-micros"): pa.timestamp("us"),
            ("int", "date"): pa.date32(), ("int", "time-millis"): pa.time32("ms"),
            ("long", "time-micros"): pa.time64("us"), ("string", "uuid"): pa.string()}


class AvroEncodeError(ValueError):
    """Rows the sink was given do not fit the Avro schema (the message names the columns)."""


class AvroDecodeError(ValueError):
    """Message `index` of a batch is not one record of the schema (`reason` says how)."""

    def __init__(self, index: int, reason: str):
        super().__init__(reason)
        self.index = index
        self.reason = reason


def _fastavro():
    try:
        import fastavro
    except ImportError as exc:
        raise ConfigurationError("format='avro' needs fastavro: pip install 'streamsnap[kafka]' "
                                 "(or pip install fastavro)") from exc
    return fastavro


class _Mapper:
    """Avro schema → Arrow type, and the same schema without logical annotations (for fastavro)."""

    def __init__(self, what: str):
        self.what = what
        self.named: dict[str, pa.DataType] = {}
        self.visiting: set[str] = set()

    def fail(self, message: str):
        raise ConfigurationError(f"{self.what}: avro_schema {message}")

    def arrow(self, node, namespace: str = "") -> pa.DataType:
        if isinstance(node, str):
            if node in _PRIMITIVES:
                return _PRIMITIVES[node]
            full = node if "." in node or not namespace else f"{namespace}.{node}"
            for name in (full, node):
                if name in self.visiting:
                    self.fail(f"type {node!r} refers to itself; recursive types have no Arrow column type")
                if name in self.named:
                    return self.named[name]
            self.fail(f"names an unknown type {node!r} (define a named type before using it)")
        if isinstance(node, list):
            branches = [b for b in node if b != "null"]
            if len(branches) != 1 or len(node) > 2:
                self.fail(f"has the union {node!r}; only a type or [\"null\", type] (nullable) has an Arrow column "
                          f"type")
            return self.arrow(branches[0], namespace)
        if not isinstance(node, dict) or "type" not in node:
            self.fail(f"has {node!r} where a type was expected")
        kind = node["type"]
        logical = node.get("logicalType")
        if logical is not None:
            if logical == "decimal":
                self.fail("uses the decimal logical type, which is not supported; use double or string")
            if isinstance(kind, str) and (kind, logical) in _LOGICAL:
                return _LOGICAL[(kind, logical)]
        if kind in ("record", "error"):
            name = self.full_name(node, namespace)
            self.visiting.add(name)
            fields = node.get("fields")
            if not isinstance(fields, list):
                self.fail(f"record {node.get('name')!r} has no list of fields")
            inner = name.rpartition(".")[0]
            arrow = pa.struct([pa.field(f["name"], self.arrow(f["type"], inner), nullable=self.nullable(f["type"]))
                               for f in fields])
            self.visiting.discard(name)
            self.named[name] = arrow
            return arrow
        if kind == "enum":
            self.named[self.full_name(node, namespace)] = pa.string()
            return pa.string()
        if kind == "fixed":
            arrow = pa.binary(int(node["size"]))
            self.named[self.full_name(node, namespace)] = arrow
            return arrow
        if kind == "array":
            return pa.list_(self.arrow(node["items"], namespace))
        if kind == "map":
            return pa.map_(pa.string(), self.arrow(node["values"], namespace))
        return self.arrow(kind, namespace)

    @staticmethod
    def nullable(node) -> bool:
        return node == "null" or (isinstance(node, list) and "null" in node)

    @staticmethod
    def full_name(node: dict, namespace: str) -> str:
        name = node.get("name", "")
        space = node.get("namespace", namespace)
        return name if "." in name or not space else f"{space}.{name}"


def _strip_logical(node):
    """The schema with every logicalType removed: fastavro then reads and writes the underlying
    int/long/string values, which Arrow converts to and from its temporal types by itself."""
    if isinstance(node, list):
        return [_strip_logical(n) for n in node]
    if isinstance(node, dict):
        return {k: _strip_logical(v) for k, v in node.items() if k != "logicalType"}
    return node


def _storage(t: pa.DataType) -> pa.DataType:
    """Arrow type with temporal types replaced by their integer storage (what fastavro writes)."""
    if pa.types.is_timestamp(t) or pa.types.is_time64(t):
        return pa.int64()
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_storage(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_storage(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_type, _storage(t.item_type))
    return t


class AvroCodec:
    """One user-given record schema: its Arrow schema, decoding values, encoding batches."""

    def __init__(self, schema, *, framing: str = "none", schema_id: int | None = None, what: str = "Kafka"):
        if framing not in FRAMINGS:
            raise ConfigurationError(f"{what}: avro_framing must be one of {FRAMINGS}, got {framing!r}")
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise ConfigurationError(f"{what}: avro_schema is a str but not JSON ({exc}); give the Avro schema "
                                         f"as a dict or its JSON text") from exc
        if not isinstance(schema, dict) or schema.get("type") != "record":
            raise ConfigurationError(f"{what}: avro_schema must be an Avro record schema (a dict with "
                                     f"\"type\": \"record\" and its \"fields\"), got {schema!r:.200}")
        fastavro = _fastavro()
        try:
            fastavro.parse_schema(copy.deepcopy(schema))
            self._parsed = fastavro.parse_schema(_strip_logical(schema))
        except Exception as exc:  # fastavro raises SchemaParseException, KeyError, TypeError, ...
            raise ConfigurationError(f"{what}: avro_schema is not a valid Avro schema: {type(exc).__name__}: "
                                     f"{exc}") from exc
        struct = _Mapper(what).arrow(schema)
        self.arrow_schema = pa.schema(list(struct))
        self._struct = struct
        self._flat = avro_columns.flat_plan(schema)
        self._storage = _storage(struct)
        self.framing = framing
        self._header = b"" if schema_id is None else b"\x00" + int(schema_id).to_bytes(4, "big")
        self._read = fastavro.schemaless_reader
        self._write = fastavro.schemaless_writer

    def __getstate__(self):
        state = dict(self.__dict__)
        del state["_read"], state["_write"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        fastavro = _fastavro()
        self._read, self._write = fastavro.schemaless_reader, fastavro.schemaless_writer

    # ---------------------------------------------------------------- decode
    def decode(self, values: list[bytes]) -> pa.RecordBatch:
        """One record batch of the messages' records; AvroDecodeError names the first bad one."""
        n = len(values)
        lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
        if self.framing == "confluent":
            short = np.flatnonzero(lengths < 5)
            if short.size:
                raise AvroDecodeError(int(short[0]), "is shorter than the Confluent wire header (5 bytes)")
            magic = np.frombuffer(b"".join(v[:1] for v in values), dtype=np.uint8)
            wrong = np.flatnonzero(magic != 0)
            if wrong.size:
                raise AvroDecodeError(int(wrong[0]), f"starts with byte {int(magic[wrong[0]])}, not the Confluent "
                                                     f"wire format's magic byte 0")
            data = b"".join(v[5:] for v in values)
            lengths -= 5
        else:
            data = b"".join(values)
        ends = np.cumsum(lengths)
        if self._flat is not None:
            batch = avro_columns.decode(self._flat, data, ends, self.arrow_schema)
            if batch is not None:
                return batch
        stream = io.BytesIO(data)
        read, tell, schema = self._read, stream.tell, self._parsed
        rows: list = []
        positions = np.empty(n, dtype=np.int64)
        try:
            for i in range(n):
                rows.append(read(stream, schema, None))
                positions[i] = tell()
        except Exception as exc:  # fastavro raises whatever the bytes lead it to (EOFError, IndexError, ...)
            failed = len(rows)
            misread = np.flatnonzero(positions[:failed] != ends[:failed])
            at = int(misread[0]) if misread.size else failed
            raise AvroDecodeError(at, f"is not a record of the schema ({type(exc).__name__}: {exc})") from exc
        misread = np.flatnonzero(positions != ends)
        if misread.size:
            i = int(misread[0])
            start = int(ends[i - 1]) if i else 0
            raise AvroDecodeError(i, f"has {int(lengths[i])} bytes but its record ends after "
                                     f"{int(positions[i]) - start}: not one record of the schema")
        array = pa.array(rows, type=self._storage)
        if self._storage != self._struct:
            array = array.cast(self._struct)
        return pa.RecordBatch.from_struct_array(array)

    # ---------------------------------------------------------------- encode
    def encode(self, batch: pa.RecordBatch) -> list[bytes]:
        """One Avro message (with the framing header) per row of the batch."""
        missing = [name for name in self.arrow_schema.names if name not in batch.schema.names]
        if missing:
            raise ConfigurationError(f"Kafka sink: avro_schema's fields {missing} are not among the rows' columns "
                                     f"{batch.schema.names}. Fix: add them before the sink, or change avro_schema")
        try:
            columns = [batch.column(f.name).cast(f.type) for f in self.arrow_schema]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ConfigurationError(f"Kafka sink: the rows' columns {batch.schema} do not convert to avro_schema's "
                                     f"types {self.arrow_schema} ({exc}). Fix: cast the columns before the sink, "
                                     f"or change avro_schema") from exc
        nulls = [f.name for f, c in zip(self.arrow_schema, columns) if not f.nullable and c.null_count]
        if nulls:
            raise AvroEncodeError(f"Kafka sink: columns {nulls} hold nulls, but avro_schema's fields of those names "
                                  f"are not nullable. Fix: make them [\"null\", type] unions, or fill the nulls "
                                  f"before the sink")
        if self._flat is not None:
            return avro_columns.encode(self._flat, [c.cast(_storage(c.type)) for c in columns], self._header)
        struct = pa.StructArray.from_arrays(columns, fields=list(self.arrow_schema))
        if self._storage != self._struct:
            struct = struct.cast(self._storage)
        # All records into one buffer, cut at the position after each (one BytesIO per batch).
        write, schema, header = self._write, self._parsed, self._header
        stream = io.BytesIO()
        put, tell = stream.write, stream.tell
        ends = []
        rows = struct.to_pylist(maps_as_pydicts="strict")
        try:
            for row in rows:
                put(header)
                write(stream, schema, row)
                ends.append(tell())
        except Exception as exc:  # fastavro's ValueError/TypeError/... name neither the row nor the field
            raise AvroEncodeError(f"Kafka sink: row {len(ends)} of the batch ({rows[len(ends)]!r:.300}) does not "
                                  f"fit avro_schema ({type(exc).__name__}: {exc}). Fix: make the rows' values fit "
                                  f"the schema's types (enum symbols, fixed sizes) before the sink, or change "
                                  f"avro_schema") from exc
        data = stream.getvalue()
        return [data[start:end] for start, end in zip([0, *ends[:-1]], ends)]


__all__ = ["AvroCodec", "AvroDecodeError", "AvroEncodeError", "FRAMINGS"]
