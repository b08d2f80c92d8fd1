"""Reading one keyed snapshot file's entries, in whatever Python process holds it (a Spark task).

Why a separate module: the state reader runs one Spark task per keyed state handle (a subtask's
key-group range), and each task must decode with streamsnap's own restore code, never a second
copy of the format. A task is a small msgpack/JSON-safe dict made on the driver
(`keyed_tasks`); `scan` turns it into (key group, states) with the same functions a restoring
subtask uses:

* a full snapshot (heap checkpoints, every savepoint, RocksDB with `incremental=False`) is the
  canonical file: `read_key_group_blocks` reads its key groups with one ranged read;
* an incremental RocksDB snapshot is a database: it is downloaded into a temporary directory by
  the RocksDB backend's own restore and scanned (`rocksdb.canonical_entries`), then deleted.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

from streamsnap.checkpoint.handles import IncrementalKeyGroupsStateHandle, keyed_handle_from_wire
from streamsnap.checkpoint.metadata import CheckpointMetadata
from streamsnap.state.key_groups import KeyGroupRange

# (key group, [(state name, kind, serializer tag, {key: wire value})])
KeyGroupStates = tuple[int, list[tuple[str, str, str, dict]]]


def keyed_tasks(metadata: CheckpointMetadata, base: str, uid: str) -> list[dict]:
    """One task per keyed state handle of operator `uid` (in subtask order)."""
    operator = metadata.operators[uid]
    tasks = []
    for subtask in sorted(operator.subtask_states):
        for handle in operator.subtask_states[subtask].keyed:
            tasks.append({"uid": uid, "subtask": subtask, "handle": handle.to_wire(), "base": base,
                          "max_parallelism": operator.max_parallelism})
    return tasks


def scan(task: dict) -> Iterator[KeyGroupStates]:
    """The decoded key groups of one task's handle, in key-group order."""
    handle = keyed_handle_from_wire(task["handle"])
    uid, base, max_parallelism = task["uid"], task["base"], int(task["max_parallelism"])
    key_groups = KeyGroupRange(handle.key_group_start, handle.key_group_end)
    if isinstance(handle, IncrementalKeyGroupsStateHandle):
        yield from _scan_database(handle, base, uid, max_parallelism, key_groups)
        return
    from streamsnap.state.backends.hashmap import read_key_group_blocks

    yield from read_key_group_blocks(handle, base, key_groups, max_parallelism, uid)


def _scan_database(handle: IncrementalKeyGroupsStateHandle, base: str, uid: str,
                   max_parallelism: int, key_groups: KeyGroupRange) -> Iterator[KeyGroupStates]:
    from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
    from streamsnap.state.backends.rocksdb.config import RocksDBConfig
    from streamsnap.state.backends.rocksdb.snapshot import canonical_entries

    directory = tempfile.mkdtemp(prefix="streamsnap-state-reader-")
    backend = RocksDBKeyedStateBackend(uid, max_parallelism, key_groups,
                                       RocksDBConfig(local_dir=directory))
    try:
        backend.restore([handle], base)
        yield from canonical_entries(backend)
    finally:
        backend.dispose()
        shutil.rmtree(directory, ignore_errors=True)
