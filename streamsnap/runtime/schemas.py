"""The one rule for rows: how dicts become Arrow, checked, wherever that happens.

Rows are Python dicts inside a chain of per-row operators; they become Arrow record batches
where the engine needs Arrow — an operator's network output, a sink's input, a vectorized
operator's input. Every one of those places converts through a `RowSchema`, so every operator
and every sink (Collect, Print, FileSink alike) applies the same rule:

* A stream's schema is **declared** (`schema=pa.schema([...])` on a source or on `map`,
  `flat_map`, `process`; `output_schema=` of the vectorized operators) or **inferred** from the
  first batch a subtask converts: the fields of its rows in first-seen order, each typed by
  Arrow from all of that batch's values. `from_collection` knows all its rows up front and
  infers over the whole collection at build time, by the same rule.
* Every later row must fit it, else the job fails with a `SchemaError` naming the operator,
  the subtask, the field, the row and the fix:
  - a field the schema lacks is an error (never silently dropped);
  - a missing field is an error (never silently filled with None) unless the schema was
    declared and the field is nullable — then it is null, as the user declared;
  - None is a value: allowed unless the field is declared `nullable=False`;
  - a value must fit the field's type: same type, or a lossless conversion (an int into a
    float field, 3.0 into an int field, int64 into int32 when it fits, string into
    large_string). An int into a string field, 2.5 into an int field, True into an int field
    are errors. A type that inference could not know — a field whose first values were all
    None (null), or only empty lists (list<null>) — is not a decision: it takes the type of its
    first real values, as Spark's schema inference merges its NullType (a declared schema is
    never changed).
* **Widening** is opt-in, with `schema="widen"` on the producing operator (or Generator): the
  schema starts inferred and grows instead of failing — a new field is appended (nullable;
  rows without it hold null), a missing field is null, a null-typed field takes the type of
  its first value, an integer field becomes float64 when a float arrives. Anything else (an
  int field meeting a string) still fails. Sinks downstream of a widening stream widen with
  it: FileSink starts a new part file whenever the schema grows (read the directory with
  Spark's `mergeSchema`), Collect keeps every row's fields.
* Arrow batches (vectorized operators, file sources) are checked against the schema where
  they reach a sink by the same rule (a batch is a set of rows).

Schema errors are `DataError`s: deterministic (a restart replays the same rows), so the job
fails at once rather than after every restart.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from streamsnap.errors import ConfigurationError, SchemaError, describe_row

MODES = ("declared", "inferred", "widen")
_NESTED = ("struct", "list", "map")
WIDEN = "widen"

_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError,
                      TypeError, ValueError)


@dataclass(frozen=True)
class StreamSchema:
    """What the pipeline knows about a stream's rows when it is built (picklable)."""

    schema: pa.Schema | None = None
    mode: str = "inferred"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"schema mode must be one of {MODES}, got {self.mode!r}")
        if self.mode == "declared" and self.schema is None:
            raise ValueError("a declared stream schema needs a schema")

    @classmethod
    def of(cls, value, what: str) -> "StreamSchema":
        """Parse a user's `schema=` argument: a pyarrow.Schema, "widen", or None (inferred)."""
        if value is None:
            return cls()
        if isinstance(value, pa.Schema):
            return cls(value, "declared")
        if value == WIDEN:
            return cls(None, WIDEN)
        raise ConfigurationError(
            f"{what}: schema must be a pyarrow.Schema (declared), \"widen\" (inferred from the first "
            f"batch, grows with new fields) or None (inferred from the first batch), got {value!r}")

    @classmethod
    def combine(cls, specs: list["StreamSchema"]) -> "StreamSchema":
        """The schema of a stream fed by several upstreams (union) or passed through (filter)."""
        if not specs:
            return cls()
        if any(s.mode == WIDEN for s in specs):
            return cls(None, WIDEN)
        first = specs[0]
        if all(s.mode == "declared" for s in specs) and all(s.schema.equals(first.schema) for s in specs[1:]):
            return first
        return cls()

    @property
    def declared(self) -> pa.Schema | None:
        return self.schema if self.mode == "declared" else None


def _describe_schema(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}{'' if f.nullable else ' not null'}" for f in schema) or "(no fields)"


def _kind(t: pa.DataType) -> str:
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _: False)(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return "list"
    for name in ("timestamp", "date", "time", "duration", "struct", "map", "dictionary"):
        if getattr(pa.types, f"is_{name}")(t):
            return name
    return str(t)


def _compatible(source: pa.DataType, target: pa.DataType) -> bool:
    """Values of `source` may go into a `target` field if every value converts losslessly."""
    if source == target or pa.types.is_null(source):
        return True
    a, b = _kind(source), _kind(target)
    return a == b or {a, b} == {"int", "float"}  # float -> int only if integral (a safe cast checks)


def _widened(current: pa.DataType, incoming: pa.DataType) -> pa.DataType | None:
    """The type a widening stream's field takes when `incoming` values arrive, or None."""
    if pa.types.is_null(current):
        return incoming
    a, b = _kind(current), _kind(incoming)
    if a == "int" and b == "float":
        return pa.float64()
    if a == b == "int" and incoming.bit_width > current.bit_width:
        return incoming
    return None


def _refined(current: pa.DataType, incoming: pa.DataType) -> pa.DataType | None:
    """`current` with its unknown (null) parts taken from `incoming`, or None if it has none
    or they do not line up (list<null> + list<int64> -> list<int64>)."""
    if pa.types.is_null(current):
        return None if pa.types.is_null(incoming) else incoming
    for is_list, make in ((pa.types.is_list, pa.list_), (pa.types.is_large_list, pa.large_list)):
        if is_list(current) and is_list(incoming):
            inner = _refined(current.value_type, incoming.value_type)
            return None if inner is None else make(inner)
    return None


def _cast(array: pa.Array, target: pa.DataType) -> pa.Array | None:
    """`array` as `target` if the conversion is lossless, else None."""
    if array.type == target:
        return array
    if pa.types.is_null(array.type):
        return pa.nulls(len(array), target)
    if not _compatible(array.type, target):
        return None
    try:
        return array.cast(target, safe=True)
    except _CONVERSION_ERRORS:
        return None


class RowSchema:
    """Converts one subtask's rows (or checks its Arrow batches) against a stream's schema.

    operator / subtask: where the conversion runs, for the error message (the task name, e.g.
    "Source: events -> enrich (2/2)"). producer: the operator whose rows these are, where the
    fix goes (defaults to `operator`). role: "output" or "input" — wording only.
    """

    def __init__(self, spec: StreamSchema | None, operator: str, subtask: str | None = None,
                 producer: str | None = None, role: str = "output"):
        spec = spec or StreamSchema()
        self.mode = spec.mode
        self.schema: pa.Schema | None = spec.declared
        self.operator = operator
        self.subtask = subtask
        self.producer = producer or operator
        self.role = role

    # ---------------------------------------------------------------- rows -> Arrow
    def to_batch(self, rows: list) -> pa.RecordBatch:
        if not rows:
            return pa.RecordBatch.from_pylist([], schema=self.schema)
        if self.schema is None:
            self.schema = self._infer(rows)
        schema = self.schema
        names = schema.names
        n, k = len(rows), len(names)
        counts_fit = sum(map(len, rows)) == n * k
        if counts_fit and self.mode != WIDEN:
            batch = self._fast_batch(rows, schema)
            if batch is not None:
                return batch
        if self.mode == WIDEN or not counts_fit:
            self._check_fields(rows)  # also widens
            schema = self.schema
            names = schema.names
        columns = []
        for index, name in enumerate(names):
            field = schema.field(index)
            values = [row.get(name) for row in rows]
            column = self._fit(field, values, rows)
            if column.null_count:
                self._check_nulls(field, column, rows)
            columns.append(column)
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def _fast_batch(self, rows: list, schema: pa.Schema) -> pa.RecordBatch | None:
        """The common case in one pass of Arrow's own conversion: every row has the schema's
        fields (in its order, as the first row shows; the caller checked the counts) and Arrow
        infers exactly the schema's types from all of the values — so nothing is cast, nothing
        truncated (2.5 in an int field infers double and misses). None is the only case left to
        check, as the slow path does. Anything else: None, and the slow path decides (and names
        the operator, field and row of an error)."""
        try:
            inferred = pa.RecordBatch.from_pylist(rows)
        except _CONVERSION_ERRORS:
            return None
        if inferred.schema.names != schema.names:
            return None
        columns = inferred.columns
        for field, column in zip(schema, columns):
            if column.type != field.type:
                return None
        for field, column in zip(schema, columns):
            if column.null_count:
                # Absent fields became nulls here too: the same check as the slow path.
                self._check_nulls(field, column, rows)
        return pa.RecordBatch.from_arrays(columns, schema=schema)

    def _infer(self, rows: list) -> pa.Schema:
        names = list(dict.fromkeys(name for row in rows for name in row))
        fields = []
        for name in names:
            values = [row.get(name) for row in rows]
            try:
                fields.append(pa.field(name, pa.array(values).type))
            except _CONVERSION_ERRORS as exc:
                row, value = _first_odd_value(name, values, rows)
                raise self._error(
                    name, row, f"field '{name}' holds values of different types in the first batch "
                    f"(e.g. {value!r} of type {type(value).__name__}: {exc}); its type cannot be inferred",
                    "declare the field's type with schema=pa.schema([...]), or cast the values to one type "
                    "in your function") from None
        if not names:
            raise self._error(None, rows[0], "rows have no fields",
                              "return dicts with at least one field")
        return pa.schema(fields)

    def _check_fields(self, rows: list) -> None:
        """Rows with a field the schema lacks (an error, or widening)."""
        known = set(self.schema.names)
        k = len(known)
        for row in rows:
            if len(row) == k and known.issuperset(row):
                continue
            extra = [name for name in row if name not in known]
            if not extra:
                continue
            if self.mode != WIDEN:
                raise self._error(
                    extra[0], row, f"row has field '{extra[0]}', which the stream's schema lacks",
                    self._fix("declare the field in schema=pa.schema([...]) (nullable if it may be "
                              "absent), remove it in your function, or opt into schema=\"widen\""))
            for name in extra:
                values = [r.get(name) for r in rows]
                try:
                    type_ = pa.array(values).type
                except _CONVERSION_ERRORS:
                    odd_row, value = _first_odd_value(name, values, rows)
                    raise self._error(name, odd_row, f"new field '{name}' holds values of different types "
                                      f"(e.g. {value!r})", self._fix("cast its values to one type")) from None
                self.schema = self.schema.append(pa.field(name, type_))
                known.add(name)
            k = len(known)

    def _fit(self, field: pa.Field, values: list, rows: list) -> pa.Array:
        # Infer, then convert losslessly: converting straight to the field's type would let
        # Arrow truncate 2.5 to 2 without a word.
        try:
            column = pa.array(values)
        except _CONVERSION_ERRORS:
            column = None
        if column is not None:
            if column.type == field.type:
                return column
            cast = _cast(column, field.type)
            if cast is not None:
                return cast
            refined = _refined(field.type, column.type) if self.mode != "declared" else None
            if refined is not None:
                self._replace_field(field.with_type(refined))
                return column
            if self.mode == WIDEN:
                wider = _widened(field.type, column.type)
                if wider is not None:
                    self._replace_field(field.with_type(wider))
                    cast = _cast(column, wider)
                    if cast is not None:
                        return cast
        if _kind(field.type) in _NESTED:
            # Nested values (dicts, lists) infer as structs and lists of their own; the declared
            # type decides (e.g. a map<string, int64> from dicts).
            try:
                return pa.array(values, type=field.type)
            except _CONVERSION_ERRORS as exc:
                row, value = _first_misfit(field.type, values, rows)
                raise self._misfit(field, row, value) from exc
        row, value = _first_misfit(field.type, values, rows)
        raise self._misfit(field, row, value)

    def _check_nulls(self, field: pa.Field, column: pa.Array, rows: list) -> None:
        name = field.name
        optional = self.mode == WIDEN or (self.mode == "declared" and field.nullable)
        for i in column.is_null().to_numpy(zero_copy_only=False).nonzero()[0].tolist():
            row = rows[i]
            if name not in row:
                if not optional:
                    extra = [n for n in row if n not in self.schema.names]
                    detail = f" (it has '{extra[0]}' instead)" if extra else ""
                    raise self._error(name, row, f"row lacks field '{name}'{detail}", self._fix(
                        "return every field in every row (None for a missing value), or declare the "
                        "field nullable in schema=pa.schema([...]) so it may be absent"))
            elif not field.nullable:
                raise self._error(name, row, f"field '{name}' is None, but the schema declares it not nullable",
                                  self._fix("give it a value, or declare it nullable in schema="))

    def _replace_field(self, field: pa.Field) -> None:
        self.schema = self.schema.set(self.schema.get_field_index(field.name), field)

    # ---------------------------------------------------------------- Arrow batches
    def conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Check an Arrow batch against the schema (or infer it from this first batch)."""
        if self.schema is None:
            self.schema = batch.schema.remove_metadata()
            return batch
        if batch.schema.equals(self.schema):
            return batch
        names = batch.schema.names
        extra = [name for name in names if self.schema.get_field_index(name) < 0]
        for name in extra:
            if self.mode != WIDEN:
                raise self._error(name, _first_row(batch), f"a batch has field '{name}', which the stream's "
                                  f"schema lacks (batch schema: {_describe_schema(batch.schema)})", self._fix(
                                      "declare the field in schema=, drop it upstream, or opt into schema=\"widen\""))
            self.schema = self.schema.append(batch.schema.field(name).with_nullable(True))
        columns = []
        for index, field in enumerate(self.schema):
            name = field.name
            position = batch.schema.get_field_index(name)
            if position < 0:
                optional = self.mode == WIDEN or (self.mode == "declared" and field.nullable)
                if not optional:
                    raise self._error(name, _first_row(batch), f"a batch lacks field '{name}' (batch schema: "
                                      f"{_describe_schema(batch.schema)})", self._fix(
                                          "return every field in every batch, or declare it nullable in schema="))
                columns.append(pa.nulls(batch.num_rows, field.type))
                continue
            column = batch.column(position)
            cast = _cast(column, field.type)
            refined = _refined(field.type, column.type) if cast is None and self.mode != "declared" else None
            if refined is not None:
                field = field.with_type(refined)
                self._replace_field(field)
                cast = column
            if cast is None and self.mode == WIDEN:
                wider = _widened(field.type, column.type)
                if wider is not None:
                    field = field.with_type(wider)
                    self._replace_field(field)
                    cast = _cast(column, wider)
            if cast is None:
                row, value = _first_misfit(field.type, column.to_pylist(), None, batch)
                raise self._misfit(field, row, value, arrived=column.type)
            if cast.null_count and not field.nullable:
                i = cast.is_null().to_numpy(zero_copy_only=False).nonzero()[0][0]
                raise self._error(name, batch.slice(int(i), 1).to_pylist()[0],
                                  f"field '{name}' is null, but the schema declares it not nullable",
                                  self._fix("give it a value, or declare it nullable in schema="))
            columns.append(cast)
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    # ---------------------------------------------------------------- errors
    def _where(self) -> str:
        where = f"operator '{self.operator}'"
        if self.subtask:
            where += f" (subtask {self.subtask})"
        return where

    def _fix(self, specific: str) -> str:
        return f"{specific} — on '{self.producer}', the operator producing these rows"

    def _misfit(self, field: pa.Field, row, value, arrived: pa.DataType | None = None) -> SchemaError:
        got = f"{value!r} ({type(value).__name__})" if arrived is None else f"{value!r} (a {arrived} column)"
        if pa.types.is_null(field.type):  # only a declared schema keeps a null type (inferred ones refine)
            problem = f"field '{field.name}' got the value {got}, but the schema declares its type as null"
            fix = "declare the field's real type in schema=pa.schema([...])"
        else:
            problem = f"value {got} of field '{field.name}' does not fit its type {field.type}"
            fix = (f"cast it in your function (e.g. {_cast_hint(field.type)}), or declare the type you mean "
                   f"with schema=pa.schema([...])")
            if self.mode != WIDEN:
                fix += ", or opt into schema=\"widen\" (an int field widens to float)"
        return self._error(field.name, row, problem, self._fix(fix))

    def _error(self, field: str | None, row, problem: str, fix: str) -> SchemaError:
        schema = _describe_schema(self.schema) if self.schema is not None else "(not yet known)"
        origin = {"declared": "declared", "inferred": "inferred from the first batch",
                  WIDEN: "inferred, widening"}[self.mode]
        message = (f"{self._where()}: {self.role} row does not fit the stream's schema: {problem}\n"
                   f"  row: {describe_row(row)}\n"
                   f"  schema ({origin}): {schema}\n"
                   f"  fix: {fix}")
        return SchemaError(message, operator=self.operator, subtask=self.subtask, field=field, row=row)


def _cast_hint(t: pa.DataType) -> str:
    kind = _kind(t)
    return {"int": "int(value)", "float": "float(value)", "string": "str(value)",
            "bool": "bool(value)"}.get(kind, "a value of that type")


def _first_row(batch: pa.RecordBatch):
    return batch.slice(0, 1).to_pylist()[0] if batch.num_rows else {}


def _first_odd_value(name: str, values: list, rows: list):
    """The first value whose type differs from the first non-None value's."""
    first = next((v for v in values if v is not None), None)
    for value, row in zip(values, rows):
        if value is not None and type(value) is not type(first):
            return row, value
    for value, row in zip(values, rows):  # same Python type, yet Arrow refused one (e.g. too large)
        try:
            pa.array([value])
        except _CONVERSION_ERRORS:
            return row, value
    return rows[0], first


def _first_misfit(target: pa.DataType, values: list, rows: list | None, batch: pa.RecordBatch | None = None):
    """(row, value) of the first value that does not convert losslessly to `target`."""
    for i, value in enumerate(values):
        if value is None:
            continue
        try:
            ok = _cast(pa.array([value]), target) is not None
        except _CONVERSION_ERRORS:
            ok = False
        if not ok:
            row = rows[i] if rows is not None else batch.slice(i, 1).to_pylist()[0]
            return row, value
    i = next((i for i, v in enumerate(values) if v is not None), 0)
    row = rows[i] if rows is not None else (batch.slice(i, 1).to_pylist()[0] if batch is not None and batch.num_rows else {})
    return row, values[i] if values else None


def infer_collection_schema(rows: list, what: str, declared: pa.Schema | None = None) -> pa.Schema:
    """The schema of a whole collection known up front, by the rule above (ConfigurationError):
    inferred over all rows, or `declared` with every row checked against it."""
    spec = StreamSchema(declared, "declared") if declared is not None else None
    try:
        return RowSchema(spec, what, producer=what).to_batch(rows).schema
    except SchemaError as exc:
        raise ConfigurationError(str(exc)) from None


def for_output(node, task_name: str, tag=None) -> RowSchema:
    """The RowSchema of a subtask's network output for stream node `node` (a side output: inferred)."""
    if tag is not None:
        return RowSchema(None, f"{node.name}, side output {tag}", task_name, producer=node.name)
    return RowSchema(node.stream_schema, node.name, task_name)


__all__ = ["StreamSchema", "RowSchema", "MODES", "WIDEN", "infer_collection_schema", "describe_row", "for_output"]
