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

Several states and operators (`SavepointWriter`, composed state by state as Flink's
SavepointWriter composes operators): each keyed state is its own job and its own file per
subtask (a subtask restores all its files' states); operator list state is small, so the driver
writes it with the operator state backend's own snapshot code, elements dealt to subtasks.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import msgpack
import numpy as np
import pyarrow as pa

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.handles import (BROADCAST, SPLIT_DISTRIBUTE, UNION, FileHandle, KeyGroupsStateHandle,
                                           OperatorStateHandle, OperatorSubtaskState)
from streamsnap.checkpoint.metadata import CheckpointMetadata, OperatorState, write_metadata
from streamsnap.checkpoint.storage import METADATA_FILE_NAME
from streamsnap.errors import ConfigurationError
from streamsnap.runtime.events import CheckpointType
from streamsnap.state.descriptors import LIST, MAP, VALUE
from streamsnap.state.errors import StateSerializationError
from streamsnap.state.key_groups import (assign_key_groups, check_max_parallelism, check_parallelism,
                                         hash_keys_columns,
                                         key_group_range_for_subtask, subtasks_for_key_groups)
from streamsnap.state.serialization import pack_keys, pack_value
from streamsnap.state.snapshot import safe_file_prefix

KINDS = (VALUE, LIST, MAP)
_KG, _SUBTASK = "__streamsnap_key_group", "__streamsnap_subtask"
BOOTSTRAP_JOB_ID = "bootstrap"

log = logging.getLogger(__name__)


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
        self._keys = 0

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
        self._keys += len(entries)

    def close(self) -> dict:
        self._out.close()
        return KeyGroupsStateHandle(FileHandle(self._name, self._position), self._range.start,
                                    self._range.end, self._offsets,
                                    states=((*self._state, "msgpack"),), keys=((self._state[0], self._keys),)).to_wire()


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


@dataclass(frozen=True)
class _KeyedSpec:
    df: object
    uid: str
    state_name: str
    kind: str
    key_names: list[str]
    value_names: list[str]
    map_key_names: list[str]


@dataclass(frozen=True)
class _OperatorStateSpec:
    uid: str
    state_name: str
    mode: str
    values: list


OPERATOR_MODES = (SPLIT_DISTRIBUTE, UNION, BROADCAST)


def _check_name(what: str, value) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"bootstrap: {what} must be a non-empty str, got {value!r}")


class SavepointWriter:
    """A savepoint composed of several operators and states, written at once by `write(path)`.

        (ss.state.SavepointWriter(max_parallelism=128)
           .keyed_state(balances, "account", uid="sum", state_name="total", value_column="amount")
           .keyed_state(limits, "account", uid="sum", state_name="limit", value_column="limit")
           .operator_state([0, 0], uid="dedupe", state_name="offsets", mode="split")
           .write("/tmp/savepoints/start"))

    Each call adds one state of one operator (by uid) and checks its arguments at once; `write`
    runs one Spark job per keyed state (rows routed to key groups, shuffled, written by the tasks)
    and writes operator states on the driver (they are small), then `_metadata` last. An
    operator's parallelism (its files) is the same for all its states: pass it once or let it
    default (keyed: the Spark default parallelism, capped at max_parallelism; operator state
    only: 1). A restoring job rescales it like any savepoint's.
    """

    def __init__(self, max_parallelism: int = 128):
        check_max_parallelism(max_parallelism)
        self.max_parallelism = max_parallelism
        self._keyed: list[_KeyedSpec] = []
        self._operator: list[_OperatorStateSpec] = []
        self._parallelism: dict[str, int] = {}
        self._names: dict[tuple[str, str], str] = {}

    def _add(self, uid: str, state_name: str, what: str, parallelism: int | None) -> None:
        _check_name("uid", uid)
        _check_name("state_name", state_name)
        if (uid, state_name) in self._names:
            raise ConfigurationError(
                f"bootstrap: operator {uid!r} already has a {self._names[(uid, state_name)]} named "
                f"{state_name!r} in this savepoint; give each state of an operator its own name")
        if parallelism is not None:
            check_parallelism(self.max_parallelism, parallelism)
            known = self._parallelism.setdefault(uid, parallelism)
            if known != parallelism:
                raise ConfigurationError(
                    f"bootstrap: operator {uid!r} has parallelism {known} from an earlier state, not "
                    f"{parallelism}; an operator's states share its subtasks: pass the same "
                    f"parallelism (or none)")
        self._names[(uid, state_name)] = what

    def keyed_state(self, df, key_column, *, uid: str, state_name: str, value_column,
                    kind: str = "value", map_key_column: str | None = None,
                    parallelism: int | None = None) -> "SavepointWriter":
        """Keyed state `state_name` of operator `uid` from DataFrame `df` (see `bootstrap`)."""
        if not hasattr(df, "mapInArrow") or not hasattr(df, "sparkSession"):
            raise ConfigurationError(f"bootstrap takes a pyspark DataFrame, got {type(df).__name__}")
        if kind not in KINDS:
            raise ConfigurationError(f"bootstrap: kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
        names = list(df.schema.names)
        key_names = _columns(key_column, "key_column", names)
        value_names = _columns(value_column, "value_column", names)
        map_key_names = _columns(map_key_column, "map_key_column", names, required=kind == MAP)
        if kind != MAP and map_key_column is not None:
            raise ConfigurationError(f"bootstrap: map_key_column only applies to kind='map', not kind={kind!r}")
        if len(map_key_names) > 1:
            raise ConfigurationError("bootstrap: map_key_column must be one column")
        self._add(uid, state_name, "keyed state", parallelism)
        self._keyed.append(_KeyedSpec(df, uid, state_name, kind, key_names, value_names, map_key_names))
        return self

    def operator_state(self, values, *, uid: str, state_name: str, mode: str = "split",
                       parallelism: int | None = None) -> "SavepointWriter":
        """Operator (non-keyed) state `state_name` of operator `uid`: `values` (a list, or a
        small DataFrame collected on the driver: one column gives its values, several a dict per
        row). mode "split": the elements are dealt round-robin to the operator's subtasks (what
        `get_list_state` restores, dealt again over the job's subtasks); "union": every restoring
        subtask gets all of them (`get_union_list_state`); "broadcast": `values` is a dict (or a
        DataFrame of two columns, key and value) that every subtask of a broadcast process
        function finds in its broadcast state of that name."""
        if mode not in OPERATOR_MODES:
            raise ConfigurationError(f"bootstrap: operator state mode must be one of "
                                     f"{', '.join(map(repr, OPERATOR_MODES))}, got {mode!r}")
        if mode == BROADCAST:
            entries = _broadcast_entries(values, state_name)
            self._add(uid, state_name, "operator state", parallelism)
            self._operator.append(_OperatorStateSpec(uid, state_name, mode, entries))
            return self
        if hasattr(values, "collect") and hasattr(values, "schema"):
            columns = list(values.schema.names)
            rows = values.collect()
            values = [r[0] for r in rows] if len(columns) == 1 else [r.asDict(recursive=True) for r in rows]
        elif isinstance(values, (list, tuple)):
            values = list(values)
        else:
            raise ConfigurationError(f"bootstrap: operator state values must be a list or a pyspark "
                                     f"DataFrame, got {type(values).__name__}")
        self._add(uid, state_name, "operator state", parallelism)
        self._operator.append(_OperatorStateSpec(uid, state_name, mode, values))
        return self

    def write(self, path: str) -> str:
        """Write the savepoint into `path` (a new or empty directory); returns it, for
        `env.execute(..., restore_from=path)`."""
        _check_name("path", path)
        if not self._keyed and not self._operator:
            raise ConfigurationError("bootstrap: the savepoint has no state; add some with "
                                     "keyed_state(...) or operator_state(...) first")
        target = filesystem.normalize(path)
        fs, local = filesystem.filesystem(target)
        if fs.exists(local) and (fs.isfile(local) or fs.ls(local)):
            what = ("already a savepoint or checkpoint" if fs.exists(f"{local}/{METADATA_FILE_NAME}")
                    else "not an empty directory")
            raise ConfigurationError(f"bootstrap: {filesystem.user_path(target)!r} is {what}; pass a new directory")
        parallelism = dict(self._parallelism)
        for spec in self._keyed:
            if spec.uid not in parallelism:
                default = spec.df.sparkSession.sparkContext.defaultParallelism
                parallelism[spec.uid] = min(self.max_parallelism, max(1, default))
        for spec in self._operator:
            parallelism.setdefault(spec.uid, 1)
        existed = fs.exists(local)
        filesystem.makedirs(target)
        try:
            self._write_into(target, parallelism)
        except BaseException:
            # Nothing half-written stays behind: the directory was new or empty, and a retry
            # into the same path must find it so again.
            _remove_partial(target, keep_directory=existed)
            raise
        return path

    def _write_into(self, target: str, parallelism: dict[str, int]) -> None:
        fs, local = filesystem.filesystem(target)
        keyed: dict[str, dict[int, list]] = {}
        for spec in self._keyed:
            for subtask, handle in _write_keyed(spec, target, parallelism[spec.uid], self.max_parallelism).items():
                keyed.setdefault(spec.uid, {}).setdefault(subtask, []).append(handle)
        operator = _write_operator_states(self._operator, target, parallelism)
        kept = {h.file.path for by_subtask in (*keyed.values(), *operator.values())
                for handles in by_subtask.values() for h in handles}
        for entry in fs.ls(local, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if name not in kept:   # a Spark task attempt whose result did not count
                filesystem.delete(filesystem.join(target, name))
        operators = {}
        for uid in sorted(parallelism):
            subtasks = {}
            for i in range(parallelism[uid]):
                subtasks[i] = OperatorSubtaskState(keyed=tuple(keyed.get(uid, {}).get(i, ())),
                                                   operator=tuple(operator.get(uid, {}).get(i, ())))
            operators[uid] = OperatorState(uid, parallelism[uid], self.max_parallelism, subtasks)
        now = time.time()
        write_metadata(target, CheckpointMetadata(BOOTSTRAP_JOB_ID, 0, CheckpointType.SAVEPOINT, now, now,
                                                  operators))


def _remove_partial(target: str, keep_directory: bool) -> None:
    """Delete what a failed `write` left in `target`; a failure to do so is reported, never
    hiding the error that made the write fail."""
    try:
        if keep_directory:
            fs, local = filesystem.filesystem(target)
            for entry in fs.ls(local, detail=False):
                fs.rm(entry, recursive=True)
        else:
            filesystem.delete(target, recursive=True)
    except Exception:
        log.warning("bootstrap: could not remove the partial savepoint in %r; delete it before writing "
                    "there again", filesystem.user_path(target), exc_info=True)


def _broadcast_entries(values, state_name: str) -> list[tuple]:
    """The (key, value) entries of a bootstrapped broadcast state: a dict, or a DataFrame of
    two columns."""
    if hasattr(values, "collect") and hasattr(values, "schema"):
        if len(values.schema.names) != 2:
            raise ConfigurationError(
                f"bootstrap: broadcast state {state_name!r} from a DataFrame needs exactly two columns "
                f"(key, value), got {values.schema.names}; select them first")
        return [(r[0], r[1]) for r in values.collect()]
    if isinstance(values, dict):
        return list(values.items())
    raise ConfigurationError(f"bootstrap: broadcast state {state_name!r} takes a dict or a DataFrame of "
                             f"key and value columns, got {type(values).__name__}")


def _write_operator_states(specs: list[_OperatorStateSpec], target: str, parallelism: dict[str, int]
                           ) -> dict[str, dict[int, list[OperatorStateHandle]]]:
    """Each operator's list states, one file per subtask that has elements, written by the
    operator state backend's own snapshot (the format a restoring subtask reads)."""
    from streamsnap.state.operator_state import OperatorStateBackend

    by_uid: dict[str, list[_OperatorStateSpec]] = {}
    for spec in specs:
        by_uid.setdefault(spec.uid, []).append(spec)
    handles: dict[str, dict[int, list[OperatorStateHandle]]] = {}
    for uid, states in by_uid.items():
        p = parallelism[uid]
        for subtask in range(p):
            backend = OperatorStateBackend(uid)
            try:
                for spec in states:
                    if spec.mode == BROADCAST:
                        # restored from the lowest subtask's copy: subtask 0 holds the one copy
                        if subtask == 0:
                            backend.get_broadcast_state(spec.state_name).put_all(dict(spec.values))
                        continue
                    # union: every restoring subtask gets all elements, so one copy (subtask 0) is enough
                    elements = spec.values[subtask::p] if spec.mode == SPLIT_DISTRIBUTE else \
                        (spec.values if subtask == 0 else [])
                    state = (backend.get_list_state(spec.state_name) if spec.mode == SPLIT_DISTRIBUTE
                             else backend.get_union_list_state(spec.state_name))
                    state.update(elements)
                handle = backend.snapshot(0, target).run()
            finally:
                backend.dispose()
            if handle is not None:
                handles.setdefault(uid, {})[subtask] = [handle]
    return handles


def _write_keyed(spec: _KeyedSpec, target: str, parallelism: int, max_parallelism: int
                 ) -> dict[int, KeyGroupsStateHandle]:
    """One keyed state written by one Spark job: {subtask: its file's handle}."""
    df, uid, state_name, kind = spec.df, spec.uid, spec.state_name, spec.kind
    key_names, value_names, map_key_names = spec.key_names, spec.value_names, spec.map_key_names
    from streamsnap.api.preflight import check_executors

    check_executors(df.sparkSession)     # the tasks write with streamsnap: can executors import it?
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
    handles: dict[int, KeyGroupsStateHandle] = {}
    for row in rows:
        handles.setdefault(row.subtask, KeyGroupsStateHandle.from_wire(json.loads(row.handle)))
    return handles


def bootstrap(df, key_column, *, uid: str, state_name: str, path: str, value_column=None,
              kind: str = "value", map_key_column: str | None = None, max_parallelism: int = 128,
              parallelism: int | None = None) -> str:
    """Write a savepoint holding keyed state `state_name` of operator `uid`, from `df` — the
    one-state case of `SavepointWriter` (several states and operators, operator state).

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
    return (SavepointWriter(max_parallelism)
            .keyed_state(df, key_column, uid=uid, state_name=state_name, value_column=value_column,
                         kind=kind, map_key_column=map_key_column, parallelism=parallelism)
            .write(path))
