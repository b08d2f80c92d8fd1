"""Planning a keyed state read on the driver, so that `ss.state.read` is one Spark job and bad
input fails before it.

Why on the driver: everything a read needs to know before Spark starts is small and readable
there through fsspec — `_metadata` names the files of operator `uid`'s keyed state; each full
snapshot's handle lists the states its file holds (name, kind, serializer), an incremental
RocksDB snapshot's list is in its small private bundle. So the driver checks the request
against what exists (unknown state, a serializer it needs, a changelog checkpoint it cannot
read), checks that every file is there with the size `_metadata` recorded (a damaged checkpoint
is named before any task runs), and infers the columns' Arrow types from a bounded sample —
the first key-group blocks of each full file, one ranged read each, the way Spark's JSON source
samples rows to infer a schema. Given types are checked against the same sample. The Spark job
then only decodes, one task per file.

The sample bounds: `SAMPLE_BYTES` per file first; only when no entry of the state is in any of
those blocks are further blocks read, up to `SAMPLE_LIMIT` in all. When no file is a full
snapshot (every subtask wrote an incremental RocksDB checkpoint) the smallest database is
downloaded and scanned instead; passing key_type / value_type (/ map_key_type) skips the sample.
A value that does not fit the sampled type is reported by its task, naming the column and the
type argument to pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.handles import (ChangelogStateHandle, IncrementalKeyGroupsStateHandle,
                                           KeyGroupsStateHandle, keyed_handle_from_wire)
from streamsnap.checkpoint.metadata import CheckpointMetadata
from streamsnap.errors import ConfigurationError, RestoreError
from streamsnap.state.key_groups import KeyGroupRange
from streamsnap.state.serialization import Serializer
from streamsnap.state_processor import tables
from streamsnap.state_processor.scan import keyed_tasks, scan

SAMPLE_BYTES = 256 << 10
SAMPLE_LIMIT = 16 << 20
SAMPLE_ROWS = 20_000


@dataclass(frozen=True)
class KeyedRead:
    """What the one Spark job of a keyed state read runs with: a task per file, one schema."""

    tasks: list[dict]
    schema: pa.Schema


def _states_of(task: dict, uid: str) -> list[tuple[str, str, str]] | None:
    """The states a task's file holds; None when its handle predates the listing."""
    handle = keyed_handle_from_wire(task["handle"])
    if isinstance(handle, ChangelogStateHandle):
        raise ConfigurationError(
            f"operator {uid!r}: its keyed state in this checkpoint is a changelog (RocksDBConfig("
            f"changelog=True)), which the state reader cannot read; take a savepoint of the job "
            f"(client.trigger_savepoint(dir)) and read that")
    if isinstance(handle, IncrementalKeyGroupsStateHandle):
        from streamsnap.state.backends.rocksdb.incremental import bundle_states

        return bundle_states(handle, task["base"], uid)
    return None if handle.states is None else list(handle.states)


def keyed_states(tasks: list[dict], uid: str) -> dict[str, tuple[str, str]] | None:
    """{state name: (kind, serializer tag)} over all files; None if some file does not say."""
    found: dict[str, tuple[str, str]] = {}
    for task in tasks:
        states = _states_of(task, uid)
        if states is None:
            return None
        for name, kind, tag in states:
            found.setdefault(name, (kind, tag))
    return found


def check_files(tasks: list[dict], uid: str, path: str) -> None:
    """Every file of the read exists with the size `_metadata` recorded, else RestoreError."""
    for task in tasks:
        handle = keyed_handle_from_wire(task["handle"])
        files = (handle.file, *handle.shared_files)
        for file in files:
            url = filesystem.join(task["base"], file.path)
            fs, local = filesystem.filesystem(url)
            try:
                size = fs.size(local)
            except FileNotFoundError:
                size = None
            if size != file.size:
                what = "is missing" if size is None else f"has {size} bytes, _metadata recorded {file.size}"
                raise RestoreError(
                    f"{path} is damaged: the keyed state file {filesystem.user_path(url)} of operator "
                    f"{uid!r}, subtask {task['subtask']} {what}; read another checkpoint or savepoint "
                    f"(the job's earlier chk-<n>, or a savepoint)")


def _first_blocks(handle: KeyGroupsStateHandle, budget: int, skip: int) -> KeyGroupRange | None:
    """The key groups after the first `skip` ones whose blocks fit in `budget` bytes (at least one)."""
    wanted = sorted(handle.offsets)[skip:]
    if not wanted:
        return None
    total, last = 0, wanted[0]
    for kg in wanted:
        total += handle.offsets[kg][1]
        if total > budget and kg != wanted[0]:
            break
        last = kg
    return KeyGroupRange(wanted[0], last)


def _sample_rows(tasks: list[dict], state_name: str, serializer: Serializer | None) -> list[dict]:
    """Column dicts of the requested state from a bounded read of the files (see module doc)."""
    from streamsnap.state.backends.hashmap import read_key_group_blocks

    samples: list[dict] = []
    found = 0

    def take(blocks) -> None:
        nonlocal found
        for _, states in blocks:
            for name, kind, tag, wire in states:
                if name == state_name and wire:
                    samples.append(tables.keyed_rows(name, kind, tag, wire, serializer))
                    found += len(wire)

    full = [(t, keyed_handle_from_wire(t["handle"])) for t in tasks]
    full = [(t, h) for t, h in full if isinstance(h, KeyGroupsStateHandle)]
    if not full:
        smallest = min(tasks, key=lambda t: keyed_handle_from_wire(t["handle"]).size)
        for block in scan(smallest):
            take([block])
            if found >= SAMPLE_ROWS:
                break
        return samples
    read = [0] * len(full)          # key groups read so far, per file
    spent = 0

    def chunk(i: int) -> bool:
        """The next SAMPLE_BYTES of blocks of file i; False when it has no more."""
        nonlocal spent
        task, handle = full[i]
        key_groups = _first_blocks(handle, SAMPLE_BYTES, read[i])
        if key_groups is None:
            return False
        chosen = [kg for kg in handle.offsets if kg in key_groups]
        read[i] += len(chosen)
        spent += sum(handle.offsets[kg][1] for kg in chosen)
        take(read_key_group_blocks(handle, task["base"], key_groups, int(task["max_parallelism"]),
                                   task["uid"]))
        return True

    for i in range(len(full)):      # a little of every file: types that differ between files
        chunk(i)
    for i in range(len(full)):      # nothing of the state yet: read on, within SAMPLE_LIMIT
        more = True
        while more and not found and spent < SAMPLE_LIMIT:
            more = chunk(i)
    return samples


def plan_keyed_read(metadata: CheckpointMetadata, base: str, uid: str, state_name: str, path: str,
                    operator_states: dict[str, str], serializer: Serializer | None,
                    given: dict[str, pa.DataType | None]) -> KeyedRead:
    """The checked plan of reading keyed state `state_name` of operator `uid`."""
    tasks = keyed_tasks(metadata, base, uid)
    states = keyed_states(tasks, uid)
    if states is not None and state_name not in states:
        keyed = ", ".join(repr(n) for n in sorted(states)) or "none"
        operator = ", ".join(repr(n) for n in sorted(operator_states)) or "none"
        raise ConfigurationError(
            f"operator {uid!r} in {path} has no state named {state_name!r}; its keyed states: "
            f"{keyed}; its operator states: {operator}")
    check_files(tasks, uid, path)
    where = f"state '{state_name}' of operator '{uid}'"
    kind, tag = states[state_name] if states is not None else (None, None)
    if tag is not None:
        tables.decoder(state_name, tag, serializer)       # a serializer it needs and lacks: now
    names = tables.columns_of(kind) if kind is not None else None
    if names is not None and all(given.get(n) is not None for n in names):
        return KeyedRead(tasks, tables.unify([], names, given, where))
    samples = _sample_rows(tasks, state_name, serializer)
    if kind is None:
        if not samples:
            raise ConfigurationError(
                f"operator {uid!r} in {path} has no entries of a state named {state_name!r} in the "
                f"sampled key groups, and its _metadata predates state listings; check the name "
                f"with ss.state.metadata(spark, path)")
        names = tuple(samples[0])
    schema = tables.unify([tables.infer_schema(s, where) for s in samples], names, given, where)
    for sample in samples:          # given types that do not fit fail here, not in a task
        tables.to_batch(sample, schema, where)
    return KeyedRead(tasks, schema)
