"""Restore of one subtask's keyed state from task-local copies against from checkpoint storage,
on each backend, in one process: `python -m benchmarks.local_restore [keys]`.

A backend with `keys` Value-state entries takes one checkpoint (heap: one canonical file;
RocksDB: incremental, SST files in `shared/`) with a local store; then fresh backends restore it
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
from streamsnap.state.backends.rocksdb import RocksDBConfig, RocksDBKeyedStateBackend
from streamsnap.state.key_groups import assign_to_key_group
from streamsnap.state.local_recovery import LocalRecoveryStore

MAX_PARALLELISM = 128
_FULL = KeyGroupRange(0, MAX_PARALLELISM - 1)


def _backend(kind: str, root: str, store: LocalRecoveryStore):
    if kind == "hashmap":
        return HashMapKeyedStateBackend("op", MAX_PARALLELISM, _FULL, local_store=store)
    return RocksDBKeyedStateBackend("op", MAX_PARALLELISM, _FULL,
                                    RocksDBConfig(local_dir=os.path.join(root, "db")), local_store=store)


def restore_times(kind: str, keys: int, runs: int = 3) -> dict:
    """Median seconds of a restore from local copies and from storage, and the bytes read."""
    root = tempfile.mkdtemp(prefix="local-restore-")
    try:
        job = os.path.join(root, "ckpt", "job")
        os.makedirs(os.path.join(job, "shared"))
        os.makedirs(os.path.join(job, "chk-1"))
        location = filesystem.normalize(os.path.join(job, "chk-1"))
        local_root = os.path.join(root, "local")
        source = _backend(kind, root, LocalRecoveryStore(local_root, "job"))
        state = source.get_state(ValueStateDescriptor("v", default=0))
        for key in range(keys):
            source.set_current_key(key, assign_to_key_group(key, MAX_PARALLELISM))
            state.update(key)
        handle = source.snapshot(1, location).run()
        source.notify_checkpoint_complete(1)
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
    for kind in ("hashmap", "rocksdb"):
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
