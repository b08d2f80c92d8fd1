"""Incremental RocksDB checkpoints on an S3-compatible store against the local disk, in one run:
`python -m benchmarks.checkpoint_storage [--keys 1000000] [--rounds 8] [--changed 0.01]`.

Two RocksDB keyed backends (one subtask's state, all key groups) hold the same `keys` Value-state
entries. Each takes a first, full checkpoint, then `rounds` incremental ones, each after
rewriting a `changed` fraction of the keys: the asynchronous part uploads the new SST files to
`shared/` and the private bundle, then the `_metadata` is written (a conditional PUT on S3, temp
file + rename locally) — what a checkpoint costs on top of the barrier's trip, which is the same
for both. One backend's checkpoint directory is on the local disk, the other's on the S3 server
scripts/s3-server starts (moto, in memory, on 127.0.0.1); rounds alternate between them so load
on the machine hits both alike. Printed: the median seconds of each kind and the ratio S3/local.

What the figure is not: a real S3 adds network latency and bandwidth; moto keeps objects in a
Python process's memory (its own HTTP server is the bottleneck, not a disk).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

from benchmarks import local_s3
from streamsnap.checkpoint import filesystem
from streamsnap.state import KeyGroupRange, ValueStateDescriptor
from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamsnap.state.backends.rocksdb.config import RocksDBConfig
from streamsnap.state.key_groups import assign_to_key_group

MAX_PARALLELISM = 128


class Side:
    """One backend and the checkpoint directory it writes to."""

    def __init__(self, name: str, directory: str, scratch: str, keys: int):
        self.name, self.job = name, filesystem.join(directory, "job")
        filesystem.makedirs(filesystem.join(self.job, "shared"))   # as CheckpointStorage lays it out
        self.backend = RocksDBKeyedStateBackend("op", MAX_PARALLELISM, KeyGroupRange(0, MAX_PARALLELISM - 1),
                                                RocksDBConfig(local_dir=os.path.join(scratch, name)))
        self.state = self.backend.get_state(ValueStateDescriptor("v", default=0))
        self.put(range(keys), 0)
        self.first = 0.0
        self.incremental: list[float] = []
        self.uploaded: list[int] = []

    def put(self, keys, salt: int) -> None:
        for key in keys:
            self.backend.set_current_key(key, assign_to_key_group(key, MAX_PARALLELISM))
            self.state.update(key * 31 + salt)

    def checkpoint(self, checkpoint_id: int) -> float:
        location = filesystem.join(self.job, f"chk-{checkpoint_id}")
        started = time.monotonic()
        filesystem.makedirs(location)
        snapshot = self.backend.snapshot(checkpoint_id, location)
        handle = snapshot.run()
        filesystem.write_once(filesystem.join(location, "_metadata"), b"streamsnap benchmark %d" % checkpoint_id)
        elapsed = time.monotonic() - started
        self.backend.notify_checkpoint_complete(checkpoint_id)
        self.uploaded.append(handle.incremental_size)
        return elapsed


def run(keys: int, rounds: int, changed: float, seed: int = 33, server: local_s3.LocalS3 | None = None) -> dict:
    """The figures of one run; starts (and stops) its own S3 server unless given one."""
    root = tempfile.mkdtemp(prefix="checkpoint-storage-")
    server_dir = os.path.join(root, "s3-server")
    own_server = server is None
    server = server or local_s3.start_server(server_dir)
    try:
        s3_directory = f"s3://{server.new_bucket('bench')}/ckpt"
        filesystem.configure(s3_directory, server.storage_options)
        local_directory = os.path.join(root, "ckpt")
        sides = [Side("local", local_directory, root, keys), Side("s3", s3_directory, root, keys)]
        for side in sides:
            side.first = side.checkpoint(1)
        rng = random.Random(seed)
        for checkpoint_id in range(2, rounds + 2):
            rewritten = rng.sample(range(keys), max(1, int(keys * changed)))
            for side in (sides if checkpoint_id % 2 else sides[::-1]):
                side.put(rewritten, checkpoint_id)
                side.incremental.append(side.checkpoint(checkpoint_id))
        result = {"keys": keys, "rounds": rounds, "changed": changed}
        for side in sides:
            result[side.name] = {"first_s": side.first, "p50_s": statistics.median(side.incremental),
                                 "max_s": max(side.incremental), "first_bytes": side.uploaded[0],
                                 "incremental_bytes_p50": int(statistics.median(side.uploaded[1:]))}
            side.backend.dispose()
        result["ratio_p50"] = result["s3"]["p50_s"] / result["local"]["p50_s"]
        result["ratio_first"] = result["s3"]["first_s"] / result["local"]["first_s"]
        return result
    finally:
        if own_server:
            local_s3.stop_server(server_dir)
        shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--changed", type=float, default=0.01, help="fraction of keys rewritten per checkpoint")
    args = parser.parse_args(argv)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    r = run(args.keys, args.rounds, args.changed)
    for name in ("local", "s3"):
        s = r[name]
        print(f"{name:5} {r['keys']:,} keys: first (full) checkpoint {s['first_s']:.3f} s ({s['first_bytes'] / 1e6:.1f} MB); "
              f"incremental p50 {s['p50_s']:.3f} s, max {s['max_s']:.3f} s "
              f"({s['incremental_bytes_p50'] / 1e6:.2f} MB uploaded each, {r['changed']:.0%} of keys rewritten)",
              flush=True)
    print(f"S3/local: incremental p50 x{r['ratio_p50']:.2f}, first checkpoint x{r['ratio_first']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
