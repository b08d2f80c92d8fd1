"""`ss.state.bootstrap`: a savepoint written from a Spark DataFrame, for a job to start from.

Why: a new streaming job often needs state that already exists elsewhere (balances in a table,
counts from a batch job). Flink's State Processor API writes it as a savepoint; so does this,
in the canonical format both state backends restore (`state/backends/hashmap.py`), so a job
started with `execute(restore_from=path)` finds the state under its operator's uid and
rescales it like any savepoint.

How, with Spark: one pass computes each row's key group with streamsnap's own key hashing
(`state/key_groups.py`, exactly what `key_by` uses), and the subtask of the savepoint that owns
it; Spark shuffles the rows by that subtask and sorts them by key group; each Spark task then
writes one keyed state file per subtask it received — one checksummed block per key group —
and returns its handle. The driver writes `_metadata` last (atomically), listing the handles
with paths relative to the savepoint directory, so the savepoint can be moved. Files of Spark
task attempts that did not count are deleted before `_metadata` is written.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import msgpack
import numpy as np
import pyarrow as pa

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.handles import FileHandle, KeyGroupsStateHandle, OperatorSubtaskState
from streamsnap.checkpoint.metadata import CheckpointMetadata, OperatorState, write_metadata
from streamsnap.checkpoint.storage import METADATA_FILE_NAME
from streamsnap.errors import ConfigurationError
from streamsnap.runtime.events import CheckpointType
from streamsnap.state.descriptors import LIST, MAP, VALUE
from streamsnap.state.errors import StateSerializationError
from streamsnap.state.key_groups import (assign_key_groups, check_parallelism, hash_keys_columns,
                                         key_group_range_for_subtask, subtasks_for_key_groups)
from streamsnap.state.serialization import pack_keys, pack_value
from streamsnap.state.snapshot import safe_file_prefix

KINDS = (VALUE, LIST, MAP)
_KG, _SUBTASK = "__streamsnap_key_group", "__streamsnap_subtask"
BOOTSTRAP_JOB_ID = "bootstrap"


def _columns(value, what: str, schema_names: list[str], required: bool = True) -> list[str]:
    if value is None and not required:
        return []
    names = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if not names or not all(isinstance(n, str) for n in names):
        raise ConfigurationError(f"bootstrap: {what} must be a column name or a list of column names, got {value!r}")
    missing = [n for n in names if n not in schema_names]
    if missing:
        raise ConfigurationError(f"bootstrap: {what} {', '.join(map(repr, missing))} not in the DataFrame; "
                                 f"its columns: {', '.join(schema_names)}")
    return names


def _python_column(batch: pa.RecordBatch, names: list[str], single: bool) -> list:
    """The values of one column, or dicts of several (a row-like value), or tuples (composite key)."""
    columns = [batch.column(batch.schema.get_field_index(n)).to_pylist() for n in names]
    if len(names) == 1:
        return columns[0]
    return list(zip(*columns)) if single else [dict(zip(names, row)) for row in zip(*columns)]


class _SubtaskFile:
    """One keyed state file of the savepoint: the key groups of one subtask, block by block."""

    def __init__(self, directory: str, uid: str, state_name: str, kind: str, subtask: int,
                 parallelism: int, max_parallelism: int):
        from streamsnap.state.backends.hashmap import MAGIC

        self.subtask = subtask
        self._state = (state_name, kind)
        self._range = key_group_range_for_subtask(max_parallelism, parallelism, subtask)
        self._name = filesystem.unique_name(f"{safe_file_prefix(uid)}-keyed")
        self._out = filesystem.open_write(filesystem.join(directory, self._name))
        self._out.write(MAGIC)
        self._position = len(MAGIC)
        self._offsets: dict[int, tuple[int, int]] = {}

    def write_key_group(self, key_group: int, entries: dict) -> None:
        from streamsnap.state.backends.hashmap import FORMAT_VERSION, _checksum

        name, kind = self._state
        try:
            keys, values = pack_keys(list(entries)), pack_value(list(entries.values()))
        except (TypeError, ValueError, OverflowError) as exc:
            raise StateSerializationError(
                f"bootstrap of state '{name}': a key or value cannot be stored ({exc}); state holds "
                f"None, bool, int, float, str, bytes, lists and dicts (structs): cast other column "
                f"types (timestamps, decimals) first") from exc
        payload = msgpack.packb([FORMAT_VERSION, key_group, [[name, kind, "msgpack", keys, values]]],
                                use_bin_type=True)
        self._out.write(payload)
        self._out.write(_checksum(payload))
        self._offsets[key_group] = (self._position, len(payload) + 8)
        self._position += len(payload) + 8

    def close(self) -> dict:
        self._out.close()
        return KeyGroupsStateHandle(FileHandle(self._name, self._position), self._range.start,
                                    self._range.end, self._offsets,
                                    states=((*self._state, "msgpack"),)).to_wire()


def _task_error(exc: Exception) -> Exception | None:
    """The streamsnap error a Spark task raised (PySpark wraps it in a PythonException), re-raised
    on the driver as itself so callers see the same error type and message as without Spark."""
    found = re.search(r"streamsnap\.(?:errors|state\.errors)\.(ConfigurationError|StateSerializationError): (.+)",
                      str(exc))
    if found is None:
        return None
    error = ConfigurationError(found.group(2)) if found.group(1) == "ConfigurationError" \
        else StateSerializationError(found.group(2))
    error.__cause__ = exc
    return error


def _add_entries(entries: dict, kind: str, keys: list, map_keys: list | None, values: list,
                 state_name: str) -> None:
    """Add the rows of one key group (possibly in several calls) to its entries."""
    if kind == VALUE:
        new = dict(zip(keys, values))
        if len(new) != len(keys) or not entries.keys().isdisjoint(new):
            seen = set(entries)
            repeated = next(k for k in keys if k in seen or seen.add(k))
            raise ConfigurationError(
                f"bootstrap of value state '{state_name}': key {repeated!r} is in more than one "
                f"row; a value state holds one value per key: deduplicate the DataFrame, or use "
                f"kind='list' (or 'map')")
        entries.update(new)
    elif kind == LIST:
        for key, value in zip(keys, values):
            entries.setdefault(key, []).append(value)
    else:
        for key, map_key, value in zip(keys, map_keys, values):
            entries.setdefault(key, {})[map_key] = value


def bootstrap(df, key_column, *, uid: str, state_name: str, path: str, value_column=None,
              kind: str = "value", map_key_column: str | None = None, max_parallelism: int = 128,
              parallelism: int | None = None) -> str:
    """Write a savepoint holding keyed state `state_name` of operator `uid`, from `df`.

    key_column: the key (a column, or a list of columns for a composite (tuple) key, as in
      `key_by`). value_column: the value (a column, or a list of columns stored as a dict).
    kind: "value" (one row per key), "list" (the rows of a key are its list, in no set order)
      or "map" (map_key_column → value_column per key).
    max_parallelism: the job's max_parallelism (StreamEnvironment's, default 128; it must match).
    parallelism: the savepoint's subtasks (files); restoring rescales them to the job's.
    path: a new (or empty) directory; returns it, for `env.execute(..., restore_from=path)`.
    The job reads the state with a descriptor of the same name and kind and the default
    (msgpack) serializer.
    """
    if not hasattr(df, "mapInArrow") or not hasattr(df, "sparkSession"):
        raise ConfigurationError(f"bootstrap takes a pyspark DataFrame, got {type(df).__name__}")
    if kind not in KINDS:
        raise ConfigurationError(f"bootstrap: kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    for what, value in (("uid", uid), ("state_name", state_name), ("path", path)):
        if not isinstance(value, str) or not value:
            raise ConfigurationError(f"bootstrap: {what} must be a non-empty str, got {value!r}")
    names = list(df.schema.names)
    key_names = _columns(key_column, "key_column", names)
    value_names = _columns(value_column, "value_column", names)
    map_key_names = _columns(map_key_column, "map_key_column", names, required=kind == MAP)
    if kind != MAP and map_key_column is not None:
        raise ConfigurationError(f"bootstrap: map_key_column only applies to kind='map', not kind={kind!r}")
    if len(map_key_names) > 1:
        raise ConfigurationError("bootstrap: map_key_column must be one column")
    spark = df.sparkSession
    from streamsnap.api.preflight import check_executors

    check_executors(spark.sparkContext)     # the tasks write with streamsnap: can executors import it?
    if parallelism is None:
        parallelism = min(max_parallelism, max(1, spark.sparkContext.defaultParallelism))
    check_parallelism(max_parallelism, parallelism)
    target = filesystem.normalize(path)
    fs, local = filesystem.filesystem(target)
    if fs.exists(local) and (fs.isfile(local) or fs.ls(local)):
        what = ("already a savepoint or checkpoint" if fs.exists(f"{local}/{METADATA_FILE_NAME}")
                else "not an empty directory")
        raise ConfigurationError(f"bootstrap: {filesystem.user_path(target)!r} is {what}; pass a new directory")
    filesystem.makedirs(target)

    from pyspark.sql.types import IntegerType, StructField, StructType

    def tag(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            columns = [batch.column(batch.schema.get_field_index(n)) for n in key_names]
            if any(c.null_count for c in columns):
                raise ConfigurationError(
                    f"bootstrap: a row has a null key in {', '.join(key_names)}; keyed state has no "
                    f"null keys: filter them out first")
            # What `key_by` computes: one column hashed as is, several as a tuple.
            key_groups = (assign_key_groups(columns[0], max_parallelism) if len(columns) == 1
                          else (hash_keys_columns(columns) % np.uint64(max_parallelism)).astype(np.int32))
            subtasks = subtasks_for_key_groups(key_groups, max_parallelism, parallelism)
            yield (batch.append_column(_KG, pa.array(key_groups, pa.int32()))
                        .append_column(_SUBTASK, pa.array(subtasks, pa.int32())))

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        current: _SubtaskFile | None = None
        key_group, entries = None, {}
        written = []
        for batch in batches:
            keys = _python_column(batch, key_names, single=True)
            values = _python_column(batch, value_names, single=False)
            map_keys = _python_column(batch, map_key_names, True) if map_key_names else None
            kgs, subtasks = batch.column(_KG).to_numpy(), batch.column(_SUBTASK).to_numpy()
            # Rows arrive sorted by (subtask, key group): take them a key group at a time.
            starts = np.flatnonzero((kgs[1:] != kgs[:-1]) | (subtasks[1:] != subtasks[:-1])) + 1
            bounds = [0, *starts.tolist(), len(kgs)]
            for low, high in zip(bounds, bounds[1:]):
                kg, subtask = int(kgs[low]), int(subtasks[low])
                if current is None or subtask != current.subtask:
                    if current is not None:
                        if entries:
                            current.write_key_group(key_group, entries)
                        written.append((current.subtask, current.close()))
                    current = _SubtaskFile(target, uid, state_name, kind, subtask, parallelism,
                                           max_parallelism)
                    key_group, entries = kg, {}
                elif kg != key_group:
                    if entries:
                        current.write_key_group(key_group, entries)
                    key_group, entries = kg, {}
                _add_entries(entries, kind, keys[low:high], map_keys[low:high] if map_keys else None,
                             values[low:high], state_name)
        if current is not None:
            if entries:
                current.write_key_group(key_group, entries)
            written.append((current.subtask, current.close()))
        if written:
            yield pa.RecordBatch.from_arrays([pa.array([s for s, _ in written], pa.int32()),
                                              pa.array([json.dumps(h) for _, h in written])],
                                             names=["subtask", "handle"])

    tagged_schema = StructType(list(df.schema.fields) + [StructField(_KG, IntegerType()),
                                                         StructField(_SUBTASK, IntegerType())])
    ordered = (df.mapInArrow(tag, tagged_schema).repartition(parallelism, _SUBTASK)
                 .sortWithinPartitions(_SUBTASK, _KG))
    try:
        rows = ordered.mapInArrow(write, "subtask int, handle string").collect()
    except Exception as exc:
        raise _task_error(exc) or exc
    handles = {}
    for row in rows:
        handles.setdefault(row.subtask, KeyGroupsStateHandle.from_wire(json.loads(row.handle)))
    kept = {h.file.path for h in handles.values()}
    for entry in fs.ls(local, detail=False):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if name not in kept:   # a Spark task attempt whose result did not count
            filesystem.delete(filesystem.join(target, name))
    operator = OperatorState(uid, parallelism, max_parallelism, {
        i: OperatorSubtaskState(keyed=(handles[i],)) if i in handles else OperatorSubtaskState()
        for i in range(parallelism)})
    now = time.time()
    write_metadata(target, CheckpointMetadata(BOOTSTRAP_JOB_ID, 0, CheckpointType.SAVEPOINT, now, now,
                                              {uid: operator}))
    return path
