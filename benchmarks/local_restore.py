"""Restore of one subtask's keyed state from task-local copies against from checkpoint storage,
on each backend, in one process: `python -m benchmarks.local_restore [keys] [hashmap,rocksdb,changelog]`.

A backend with `keys` Value-state entries takes one checkpoint (heap: one canonical file;
RocksDB: incremental, SST files in `shared/`; RocksDB in changelog mode: a materialization of the
keys, then `changed` of them rewritten and logged, so the checkpoint is the materialization plus a
log segment) with a local store; then fresh backends restore it
twice, alternately, from the local copies and — after the local directory is deleted — from
checkpoint storage, and the median of `runs` restores each is printed. Checkpoint storage here is
the same local disk (page cache), so the difference is what the local path saves besides the
network: RocksDB hard-links verified SST files instead of copying them; the heap reads the same
bytes. With remote storage the remote side also pays the transfer.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

from streamsnap.checkpoint import filesystem
from streamsnap.state import KeyGroupRange, ValueStateDescriptor
from streamsnap.state.backends.hashmap import HashMapKeyedStateBackend
from streamsnap.state.backends.changelog import ChangelogConfig
from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamsnap.state.backends.rocksdb.config import RocksDBConfig
from streamsnap.state.key_groups import assign_to_key_group
from streamsnap.state.local_recovery import LocalRecoveryStore

MAX_PARALLELISM = 128
_FULL = KeyGroupRange(0, MAX_PARALLELISM - 1)


def _backend(kind: str, root: str, store: LocalRecoveryStore):
    if kind == "hashmap":
        return HashMapKeyedStateBackend("op", MAX_PARALLELISM, _FULL, local_store=store)
    changelog = ChangelogConfig(materialization_interval=3600.0) if kind == "changelog" else None
    return RocksDBKeyedStateBackend("op", MAX_PARALLELISM, _FULL,
                                    RocksDBConfig(local_dir=os.path.join(root, "db"), changelog=changelog),
                                    local_store=store)


def _put(backend, state, keys, value_of) -> None:
    for key in keys:
        backend.set_current_key(key, assign_to_key_group(key, MAX_PARALLELISM))
        state.update(value_of(key))


def _checkpoint(backend, job: str, checkpoint_id: int):
    os.makedirs(os.path.join(job, f"chk-{checkpoint_id}"), exist_ok=True)
    location = filesystem.normalize(os.path.join(job, f"chk-{checkpoint_id}"))
    handle = backend.snapshot(checkpoint_id, location).run()
    backend.notify_checkpoint_complete(checkpoint_id)
    return handle, location


def restore_times(kind: str, keys: int, runs: int = 3, changed: float = 0.1) -> dict:
    """Median seconds of a restore from local copies and from storage, and the bytes read."""
    root = tempfile.mkdtemp(prefix="local-restore-")
    try:
        job = os.path.join(root, "ckpt", "job")
        os.makedirs(os.path.join(job, "shared"))
        local_root = os.path.join(root, "local")
        source = _backend(kind, root, LocalRecoveryStore(local_root, "job"))
        state = source.get_state(ValueStateDescriptor("v", default=0))
        _put(source, state, range(keys), lambda key: key)
        if kind == "changelog":         # materialize the keys, then log `changed` of them anew
            source.changelog.book.materialization_interval = 0.0
            _checkpoint(source, job, 1)
            source.changelog.book.materialization_interval = 3600.0
            source.changelog.wait_for_materializations(600)
            _put(source, state, range(0, keys, max(1, round(1 / changed))), lambda key: -key)
            handle, location = _checkpoint(source, job, 2)
        else:
            handle, location = _checkpoint(source, job, 1)
        source.dispose()
        saved = os.path.join(root, "saved-local")
        shutil.copytree(local_root, saved, copy_function=os.link)   # to put the copies back
        times: dict[str, list[float]] = {"local": [], "remote": []}
        read: dict[str, dict] = {}
        for _ in range(runs):
            for where in ("local", "remote"):
                shutil.rmtree(local_root, ignore_errors=True)
                if where == "local":
                    shutil.copytree(saved, local_root, copy_function=os.link)
                store = LocalRecoveryStore(local_root, "job")
                backend = _backend(kind, root, store)
                started = time.monotonic()
                backend.restore([handle], location)
                times[where].append(time.monotonic() - started)
                read[where] = store.restored.to_wire()
                backend.dispose()
        return {"backend": kind, "keys": keys, "local_s": statistics.median(times["local"]),
                "remote_s": statistics.median(times["remote"]), "read": read}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    keys = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    kinds = sys.argv[2].split(",") if len(sys.argv) > 2 else ("hashmap", "rocksdb", "changelog")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for kind in kinds:
        r = restore_times(kind, keys)
        local, remote = r["read"]["local"], r["read"]["remote"]
        print(f"{kind:8} {keys:,} keys: restore from local copies {r['local_s']:.3f} s "
              f"({local['local_files']} files, {local['local_bytes'] / 1e6:.1f} MB, "
              f"{local['remote_files']} remote), from storage {r['remote_s']:.3f} s "
              f"({remote['remote_files']} files, {remote['remote_bytes'] / 1e6:.1f} MB); "
              f"ratio {r['local_s'] / r['remote_s']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
