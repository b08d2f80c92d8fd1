"""State entries as Arrow columns: the row shape of each kind of state, and its column types.

Why here: state holds Python values (msgpack: ints, strings, lists, dicts, tuples), a Spark
DataFrame needs one type per column. The shapes, one row per

* Value / Reducing state: key → `key, value`;
* List state: key → `key, value` (an array of the elements);
* Map state: (key, user key) → `key, map_key, value` (Spark's `statestore` reader does the same);
* operator list / union state: element → `subtask, value`; broadcast state: entry → `key, value`.

Tuples (composite keys, tuple values) become structs with fields `_1, _2, ...` (Spark's names
for tuple fields); dicts become structs (a row stored as a dict reads as its columns). Types
are inferred by Arrow from the values of every task and unified (an int and a float column
make a double; a column that is null everywhere is a string), unless the caller gives them.
TTL states are read without their timestamps; values of a non-msgpack serializer are decoded
with the serializer the caller passes (pickle only when asked: unpickling runs code).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from streamsnap.errors import ConfigurationError
from streamsnap.state.descriptors import LIST, MAP
from streamsnap.state.serialization import Serializer
from streamsnap.state.ttl import TTL_TAG_SUFFIX, is_ttl_tag

_PLAIN = (type(None), bool, int, float, str, bytes)
_PLAIN_SET = frozenset(_PLAIN)
KEYED_COLUMNS = {MAP: ("key", "map_key", "value")}
DEFAULT_KEYED_COLUMNS = ("key", "value")


def friendly(value: Any) -> Any:
    """`value` with tuples as dicts `{_1: ..., _2: ...}` (Arrow structs), recursively."""
    cls = value.__class__
    if cls in _PLAIN:
        return value
    if cls is tuple:
        return {f"_{i + 1}": friendly(v) for i, v in enumerate(value)}
    if cls is list:
        return [friendly(v) for v in value]
    if cls is dict:
        return {str(k): friendly(v) for k, v in value.items()}
    return value


def friendly_all(values) -> list:
    """`[friendly(v) for v in values]`, without a call per value when all are plain."""
    values = list(values)
    if set(map(type, values)) <= _PLAIN_SET:
        return values
    return [friendly(v) for v in values]


def columns_of(kind: str) -> tuple[str, ...]:
    return KEYED_COLUMNS.get(kind, DEFAULT_KEYED_COLUMNS)


def decoder(name: str, tag: str, serializer: Serializer | None):
    """A function from a wire element (timestamp already stripped) to the user's value."""
    base = tag.removesuffix(TTL_TAG_SUFFIX)
    if base == "msgpack":
        return None
    if serializer is None or serializer.tag != base:
        raise ConfigurationError(
            f"state '{name}' was written with the {base!r} serializer; pass serializer= with "
            f"that serializer (e.g. ss.state.PickleSerializer() for 'pickle' — unpickling runs "
            f"code: only for checkpoints written by a trusted job)")
    return serializer.loads


def keyed_rows(name: str, kind: str, tag: str, wire: dict, serializer: Serializer | None
               ) -> dict[str, list]:
    """Columns (`columns_of(kind)`) of one key group's entries of one state."""
    loads = decoder(name, tag, serializer)
    ttl = is_ttl_tag(tag)

    def element(w: Any) -> Any:
        if ttl:
            w = w[1]
        return friendly(w if loads is None else loads(w))

    keys = friendly_all(wire)
    if kind == MAP:
        out_keys, map_keys, values = [], [], []
        for key, entries in zip(keys, wire.values()):
            for user_key, value in entries.items():
                out_keys.append(key)
                map_keys.append(friendly(user_key))
                values.append(element(value))
        return {"key": out_keys, "map_key": map_keys, "value": values}
    if kind == LIST:
        return {"key": keys, "value": [[element(x) for x in items] for items in wire.values()]}
    if not ttl and loads is None:
        return {"key": keys, "value": friendly_all(wire.values())}
    return {"key": keys, "value": [element(v) for v in wire.values()]}


def _without_nulls(t: pa.DataType) -> pa.DataType:
    """Spark has no column of type null: a column null everywhere is read as a string."""
    if pa.types.is_null(t):
        return pa.string()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_without_nulls(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _without_nulls(f.type)) for f in t])
    return t


def infer_schema(columns: dict[str, list], where: str) -> pa.Schema:
    """The Arrow types of some rows' columns (null for a column without rows)."""
    fields = []
    for name, values in columns.items():
        try:
            fields.append(pa.field(name, pa.array(values).type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise ConfigurationError(
                f"{where}: the {name!r} column's values have no common type ({exc}); pass "
                f"{name}_type= (a pyarrow DataType) to read them as that type") from exc
    return pa.schema(fields)


def unify(schemas: list[pa.Schema], names: tuple[str, ...], given: dict[str, pa.DataType | None],
          where: str) -> pa.Schema:
    """One schema for all tasks: the given types, else the inferred ones unified."""
    try:
        merged = pa.unify_schemas(schemas, promote_options="permissive") if schemas else pa.schema([])
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ConfigurationError(
            f"{where}: the values have different types in different key groups ({exc}); pass "
            f"key_type= / value_type= (pyarrow DataTypes) to read them as one type") from exc
    fields = []
    for name in names:
        t = given.get(name)
        if t is None:
            index = merged.get_field_index(name)
            t = merged.field(index).type if index >= 0 else pa.null()
        fields.append(pa.field(name, _without_nulls(t)))
    return pa.schema(fields)


def to_batch(columns: dict[str, list], schema: pa.Schema, where: str) -> pa.RecordBatch:
    arrays = []
    for field in schema:
        try:
            arrays.append(pa.array(columns[field.name], type=field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise ConfigurationError(
                f"{where}: a value of the {field.name!r} column does not fit {field.type} "
                f"({exc}); pass {field.name}_type= with a type every value fits") from exc
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
