"""What an incremental RocksDB checkpoint uploads, and what it consists of, per compaction style.

One keyed subtask's RocksDB backend in this process (no Spark: the figures are the backend's
own): K keys loaded with `put_many`, then intervals of 1 % of the keys updated the way the
state-backends benchmark's steady phase does it (keys spread by a prime stride, batches of
2,500 distinct keys read with `get_many` and written back with `put_many`), an incremental
checkpoint after each. Per style: the mean upload per checkpoint, split into flush output and
compaction output (RocksDB's event log in the database's LOG file names the job that created
each SST file), against the live state (the first checkpoint's upload, the state as loaded) and
against each checkpoint's full size; the CPU time of one interval's reads and writes (this
thread's); the checkpoint's full size, mean and max.

    python -m benchmarks.rocksdb_compaction [--keys 5000000] [--intervals 80] [--styles universal,level]

The styles run one after the other in one process; CPU figures are comparable within a run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

from streamsnap.graph.keys import BatchKeys
from streamsnap.state import KeyGroupRange, ValueStateDescriptor
from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamsnap.state.backends.rocksdb.config import RocksDBConfig
from streamsnap.state.key_groups import assign_key_groups

MAX_PARALLELISM = 128
LOAD_BATCH = 32768
STEADY_BATCH = 2500
STRIDE = 7919


def _batch_keys(keys: np.ndarray) -> BatchKeys:
    unique, index = np.unique(keys, return_inverse=True)
    return BatchKeys(unique.tolist(), index, assign_key_groups(unique, MAX_PARALLELISM).tolist())


def _created_by(db_directory: str) -> dict[int, str]:
    """SST file number -> "flush" or "compaction", from RocksDB's event log."""
    jobs, files = {}, {}
    with open(os.path.join(db_directory, "LOG")) as log:
        for line in log:
            if "EVENT_LOG_v1" not in line:
                continue
            event = json.loads(line.split("EVENT_LOG_v1", 1)[1])
            kind = event.get("event")
            if kind in ("flush_started", "compaction_started"):
                jobs[event["job"]] = kind.split("_")[0]
            elif kind == "table_file_creation":
                files[event["file_number"]] = event["job"]
    return {number: jobs.get(job, "unknown") for number, job in files.items()}


def measure(keys: int, intervals: int, compaction: str, trigger: int = 16) -> dict:
    root = tempfile.mkdtemp(prefix="rocksdb-compaction-")
    job = os.path.join(root, "job")
    os.makedirs(os.path.join(job, "shared"))
    backend = RocksDBKeyedStateBackend(
        "sum", MAX_PARALLELISM, KeyGroupRange(0, MAX_PARALLELISM - 1),
        RocksDBConfig(local_dir=os.path.join(root, "db"), compaction=compaction,
                      level0_compaction_trigger=trigger))
    try:
        state = backend.get_state(ValueStateDescriptor("total", default=0))

        def checkpoint(checkpoint_id: int) -> dict:
            location = os.path.join(job, f"chk-{checkpoint_id}")
            os.makedirs(location)
            snapshot = backend.snapshot(checkpoint_id, "file://" + location)
            handle = snapshot.run()
            backend.notify_checkpoint_complete(checkpoint_id)
            origin = _created_by(os.path.join(backend.directory, "db"))
            parts = {"flush": 0, "compaction": 0, "unknown": 0}
            for name, file, new in zip(handle.sst_names, handle.shared_files, handle.new_shared):
                if new:
                    parts[origin.get(int(name.split(".")[0]), "unknown")] += file.size
            return {"written": snapshot.uploaded_bytes, "full": handle.size, **parts}

        for start in range(0, keys, LOAD_BATCH):
            batch = _batch_keys(np.arange(start, min(keys, start + LOAD_BATCH)))
            state.put_many(batch, [1] * len(batch.unique))
        live = checkpoint(1)["written"]
        rows = []
        changed = keys // 100
        for i in range(intervals):
            touched = (np.arange(i * changed, (i + 1) * changed) * STRIDE) % keys
            cpu = time.thread_time()
            for start in range(0, changed, STEADY_BATCH):
                batch = _batch_keys(touched[start:start + STEADY_BATCH])
                state.put_many(batch, [v + 1 for v in state.get_many(batch)])
            cpu = time.thread_time() - cpu
            rows.append({**checkpoint(i + 2), "cpu": cpu})
    finally:
        backend.dispose()
        shutil.rmtree(root, ignore_errors=True)
    n = len(rows)
    return {
        "compaction": compaction, "trigger": trigger, "keys": keys, "intervals": n, "live_mb": live / 1e6,
        "written_mb_per_checkpoint": sum(r["written"] for r in rows) / n / 1e6,
        "flush_mb_per_checkpoint": sum(r["flush"] for r in rows) / n / 1e6,
        "compaction_mb_per_checkpoint": sum(r["compaction"] for r in rows) / n / 1e6,
        "written_share_of_live": sum(r["written"] for r in rows) / n / live,
        "written_share_of_full": sum(r["written"] for r in rows) / sum(r["full"] for r in rows),
        "full_mb_mean": statistics.mean(r["full"] for r in rows) / 1e6,
        "full_mb_max": max(r["full"] for r in rows) / 1e6,
        "cpu_per_interval_median": statistics.median(r["cpu"] for r in rows),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rocksdb_compaction", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=5_000_000)
    parser.add_argument("--intervals", type=int, default=80)
    parser.add_argument("--styles", default="universal,level",
                        help="comma-separated compaction styles, optionally style:trigger (level:32)")
    args = parser.parse_args(argv)
    for spec in args.styles.split(","):
        style, _, trigger = spec.strip().partition(":")
        r = measure(args.keys, args.intervals, style, int(trigger or 16))
        print(f"{style} (trigger {r['trigger']}): {r['written_mb_per_checkpoint']:.2f} MB per checkpoint "
              f"= {r['written_share_of_live']:.1%} of the live state ({r['live_mb']:.1f} MB), "
              f"{r['written_share_of_full']:.1%} of the full size; flush {r['flush_mb_per_checkpoint']:.2f} MB, "
              f"compaction output {r['compaction_mb_per_checkpoint']:.2f} MB; full size mean "
              f"{r['full_mb_mean']:.1f} MB, max {r['full_mb_max']:.1f} MB; reads+writes of one interval "
              f"{r['cpu_per_interval_median'] * 1000:.0f} ms CPU (median) over {r['intervals']} intervals",
              flush=True)


if __name__ == "__main__":
    main()
