"""`ss.state.read` and `ss.state.metadata`: a checkpoint's or savepoint's state as Spark DataFrames.

Why Spark does the reading: keyed state is as large as the job's state, spread over one file
per subtask (or one RocksDB database per subtask). Each file becomes one Spark task
(`spark.range(n, numPartitions=n).mapInArrow`): the task decodes it in its Python worker with
streamsnap's own restore code (`scan.py`) and returns Arrow batches, so the state is read in
parallel by key-group range and never passes through the driver. Only `_metadata` and the small
operator (non-keyed) state are read on the driver.

A keyed read is one Spark job: the driver plans it first (`plan.py`: which files, which
states they hold, that every file is there, the column types from a bounded sample), so an
unknown operator uid or state name, a missing serializer, a type that does not fit or a damaged
checkpoint fails on the driver, naming it, before any task runs. What only a task can find (a
corrupt block, a value that does not fit the sampled type) fails that task with a message naming
the state, operator, subtask and file. `metadata` takes key counts from the handles (recorded
when the state was written), surveying with one Spark job only files that recorded none.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pyarrow as pa

from streamsnap.checkpoint.handles import BROADCAST, ChangelogStateHandle, keyed_handle_from_wire
from streamsnap.checkpoint.metadata import CheckpointMetadata, read_metadata
from streamsnap.checkpoint.storage import resolve_restore_path
from streamsnap.errors import ConfigurationError, RestoreError, StreamsnapError
from streamsnap.state.serialization import Serializer
from streamsnap.state_processor import tables
from streamsnap.state_processor.plan import plan_keyed_read
from streamsnap.state_processor.scan import keyed_tasks, scan

_FLUSH_ROWS = 65_536
_SURVEY_SCHEMA = "survey string"


def load(path: str) -> tuple[CheckpointMetadata, str]:
    """(metadata, base directory) of a checkpoint or savepoint; RestoreError naming a bad path."""
    if not isinstance(path, str) or not path:
        raise ConfigurationError(f"expected the path of a checkpoint (chk-<n>) or savepoint directory, got {path!r}")
    metadata_url, base = resolve_restore_path(path)
    return read_metadata(metadata_url), base


def _operator_state_names(metadata: CheckpointMetadata, uid: str) -> dict[str, str]:
    """Operator (non-keyed) state name → distribution mode, from the handles in `_metadata`."""
    names: dict[str, str] = {}
    for state in metadata.operators[uid].subtask_states.values():
        for handle in state.operator:
            for name, (mode, _) in handle.states.items():
                names[name] = mode
    return names


def _check_uid(metadata: CheckpointMetadata, uid: str, path: str) -> None:
    if uid not in metadata.operators:
        known = ", ".join(repr(u) for u in sorted(metadata.operators)) or "none"
        raise ConfigurationError(
            f"{path} has no operator with uid {uid!r}; its operators: {known} (operators are "
            f"named by the uid= given in the job, or the generated one shown here)")


def _run(spark, tasks: list[dict], fn: Callable[[dict], Iterator[pa.RecordBatch]], schema):
    """A DataFrame of `fn(task)` over all tasks, one Spark task (partition) per task."""
    from streamsnap.api.preflight import check_executors

    check_executors(spark)     # the tasks decode with streamsnap: can executors import it?
    def run(batches):
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from fn(tasks[index])

    return spark.range(0, len(tasks), 1, max(1, len(tasks))).mapInArrow(run, schema)


def _survey_task(task: dict) -> Iterator[pa.RecordBatch]:
    """Per task: {name: [kind, tag, keys]} of the states its file holds."""
    states: dict[str, list] = {}
    for _, blocks in scan(task):
        for name, kind, tag, wire in blocks:
            states.setdefault(name, [kind, tag, 0])[2] += len(wire)
    out = json.dumps({"uid": task["uid"], "states": states})
    yield pa.RecordBatch.from_arrays([pa.array([out])], names=["survey"])


def _survey(spark, tasks: list[dict]) -> dict[str, dict[str, list]]:
    """{uid: {name: [kind, tag, keys]}} over all tasks: from the counts their handles recorded
    when written, and with one Spark job over the files of those that recorded none (handles
    written before the counts were)."""
    by_uid: dict[str, dict[str, list]] = {}
    unsurveyed = []
    for task in tasks:
        wire = task["handle"]
        if "keys" not in wire or "states" not in wire:
            unsurveyed.append(task)
            continue
        kinds = {name: (kind, tag) for name, kind, tag in wire["states"]}
        states = by_uid.setdefault(task["uid"], {})
        for name, keys in wire["keys"]:
            if keys:                         # as the survey, which sees only states with entries
                states.setdefault(name, [*kinds[name], 0])[2] += keys
    if not unsurveyed:
        return by_uid
    for row in _run(spark, unsurveyed, _survey_task, _SURVEY_SCHEMA).collect():
        result = json.loads(row.survey)
        states = by_uid.setdefault(result["uid"], {})
        for name, (kind, tag, keys) in result["states"].items():
            states.setdefault(name, [kind, tag, 0])[2] += keys
    return by_uid


def _reader_task(state_name: str, schema: pa.Schema, serializer: Serializer | None):
    def read(task: dict) -> Iterator[pa.RecordBatch]:
        where = (f"state '{state_name}' of operator '{task['uid']}' (subtask {task['subtask']}, "
                 f"file {task['handle']['file']['path']})")
        pending: dict[str, list] = {name: [] for name in schema.names}
        try:
            for _, blocks in scan(task):
                for name, kind, tag, wire in blocks:
                    if name != state_name:
                        continue
                    rows = tables.keyed_rows(name, kind, tag, wire, serializer)
                    for column, values in rows.items():
                        pending[column].extend(values)
                    if len(pending["key"]) >= _FLUSH_ROWS:
                        yield tables.to_batch(pending, schema, where)
                        pending = {name: [] for name in schema.names}
        except StreamsnapError:
            raise
        except Exception as exc:        # a serializer's loads, a malformed block: say where
            raise RestoreError(f"reading {where}: {type(exc).__name__}: {exc}") from exc
        if pending["key"]:
            yield tables.to_batch(pending, schema, where)
    return read


def _spark_schema(schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def _check_type(value, name: str) -> None:
    if value is not None and not isinstance(value, pa.DataType):
        raise ConfigurationError(f"{name} must be a pyarrow DataType (e.g. pa.int64()) or None, got {value!r}")


def read(spark, path: str, uid: str, state_name: str, *, key_type: pa.DataType | None = None,
         value_type: pa.DataType | None = None, map_key_type: pa.DataType | None = None,
         serializer: Serializer | None = None):
    """A DataFrame of one state of operator `uid` in a checkpoint (`chk-<n>`) or savepoint.

    Keyed state: `key, value` for Value / Reducing / List state (a List's value is an array),
    `key, map_key, value` for Map state; timers are the Map states named
    `_timers.<service>.event_time` / `.processing_time` (map_key: (timestamp, namespace)).
    Operator state: `subtask, value` per element (broadcast state: `key, value`).
    Read in parallel, one Spark task per keyed state file (heap and RocksDB, full and
    incremental snapshots alike). key_type / value_type / map_key_type: pyarrow types of those
    columns (default: inferred from all values). serializer: for states written with another
    serializer than msgpack (e.g. PickleSerializer(); unpickling runs code).
    """
    for name, value in (("key_type", key_type), ("value_type", value_type), ("map_key_type", map_key_type)):
        _check_type(value, name)
    if not hasattr(spark, "sparkContext") or not hasattr(spark, "range"):
        raise ConfigurationError(f"read takes a SparkSession first, got {type(spark).__name__}")
    for what, value in (("uid", uid), ("state_name", state_name)):
        if not isinstance(value, str) or not value:
            raise ConfigurationError(f"{what} must be a non-empty str, got {value!r}")
    metadata, base = load(path)
    _check_uid(metadata, uid, path)
    operator_states = _operator_state_names(metadata, uid)
    if state_name in operator_states:
        return _read_operator_state(spark, metadata, base, uid, state_name, operator_states[state_name],
                                    serializer, {"key": key_type, "value": value_type})
    plan = plan_keyed_read(metadata, base, uid, state_name, path, operator_states, serializer,
                           {"key": key_type, "value": value_type, "map_key": map_key_type})
    return _run(spark, plan.tasks, _reader_task(state_name, plan.schema, serializer),
                _spark_schema(plan.schema))


def _read_operator_state(spark, metadata: CheckpointMetadata, base: str, uid: str, state_name: str,
                         mode: str, serializer: Serializer | None, given: dict):
    """Operator state is small (source offsets, sink transactions): read on the driver."""
    from streamsnap.state.assignment import StateElementRef
    from streamsnap.state.operator_state import read_elements

    first, values = [], []
    for subtask in sorted(metadata.operators[uid].subtask_states):
        for handle in metadata.operators[uid].subtask_states[subtask].operator:
            if state_name not in handle.states:
                continue
            refs = [StateElementRef(handle.file, offset, length)
                    for offset, length in handle.states[state_name][1]]
            for tag, wire in read_elements(refs, base):
                loads = tables.decoder(state_name, tag, serializer)
                if mode == BROADCAST:
                    first.append(tables.friendly(wire[0]))
                    values.append(tables.friendly(wire[1] if loads is None else loads(wire[1])))
                else:
                    first.append(subtask)
                    values.append(tables.friendly(wire if loads is None else loads(wire)))
    names = ("key", "value") if mode == BROADCAST else ("subtask", "value")
    columns = {names[0]: first, "value": values}
    where = f"operator state '{state_name}' of operator '{uid}'"
    types = {names[0]: pa.int32() if mode != BROADCAST else given["key"], "value": given["value"]}
    schema = tables.unify([tables.infer_schema(columns, where)], names, types, where)
    table = pa.Table.from_batches([tables.to_batch(columns, schema, where)])
    return spark.createDataFrame(table, schema=_spark_schema(schema))


_METADATA_DDL = ("checkpoint_id long, checkpoint_type string, uid string, parallelism int, "
                 "max_parallelism int, operator_bytes long, state_name string, state_type string, "
                 "kind string, serializer string, keys long")


def metadata(spark, path: str):
    """A DataFrame describing a checkpoint or savepoint: one row per (operator, state) — uid,
    parallelism, max_parallelism, the operator's bytes, and per state its name, whether keyed
    or operator state, its kind (value/list/map/reducing, or split/union/broadcast), serializer
    and number of keys (elements for operator state). Operators without state have one row with
    a null state. Keyed state names and key counts come from the handles in `_metadata` (counted
    when the files were written; no Spark job); files of checkpoints written before handles
    counted keys are surveyed with Spark (one task per file). The keyed state of a changelog checkpoint (RocksDBConfig(changelog=...))
    is one row of kind "changelog" without names or counts: its state is a materialization plus
    log segments the reader cannot decode — read a savepoint of the job instead."""
    meta, base = load(path)
    tasks, changelog = [], set()
    for uid in sorted(meta.operators):
        for task in keyed_tasks(meta, base, uid):
            if isinstance(keyed_handle_from_wire(task["handle"]), ChangelogStateHandle):
                changelog.add(uid)
            else:
                tasks.append(task)
    by_uid = _survey(spark, tasks)
    rows = []
    for uid in sorted(meta.operators):
        operator = meta.operators[uid]
        head = (meta.checkpoint_id, meta.checkpoint_type.value, uid, operator.parallelism,
                operator.max_parallelism, operator.state_size)
        states = by_uid.get(uid, {})
        for name in sorted(states):
            kind, tag, keys = states[name]
            rows.append((*head, name, "keyed", kind, tag, keys))
        if uid in changelog:
            rows.append((*head, None, "keyed", "changelog", None, None))
        counts: dict[str, list] = {}
        for state in operator.subtask_states.values():
            for handle in state.operator:
                for name, (mode, offsets) in handle.states.items():
                    counts.setdefault(name, [mode, 0])[1] += len(offsets)
        for name in sorted(counts):
            rows.append((*head, name, "operator", counts[name][0], None, counts[name][1]))
        if not states and not counts and uid not in changelog:
            rows.append((*head, None, None, None, None, None))
    return spark.createDataFrame(rows, _METADATA_DDL)
