"""The FileSink soak of issue 32: how many files a streaming job leaves, and at what rate.

W1 vectorized (Generator → keyed running sum) at parallelism 2 with 1 s exactly-once checkpoints
into a Parquet `FileSink`, as fast as it goes for `--duration` seconds, then stopped with a
draining savepoint (every open part rolls and is committed). Prints the files the directory
holds, the rows in them (read back with pyarrow, so rows/s counts committed rows only) and
rows/s over the run (from `execute_async()` to the end of the stop), and whether the output is
exact: as many committed rows as source records, none twice (counted by DuckDB).

The issue's shape is the default: 10 minutes. `--policy on-checkpoint` is FileSink's default
(a file per subtask per checkpoint: 1,202 files in the issue), `--policy rolling` a
`RollingPolicy(rollover_interval=--interval)` (≤ 1 file per subtask per interval, + 1 each at
the end); `--compact` adds compaction of a checkpoint's parts of all subtasks.

    python -m benchmarks.filesink_soak [--duration 600] [--policy rolling|on-checkpoint]
                                       [--interval 60] [--compact] [--rate EVENTS_PER_S]

Measured (`--duration 60`, loaded 2-core machine, one run each): rolling (60 s) 4 files,
46.5 M rows, 573 k rows/s; `--policy on-checkpoint` 114 files, 47.0 M rows, 567 k rows/s;
`--policy on-checkpoint --compact` 58 files (one per checkpoint), 45.7 M rows, 635 k rows/s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import pyarrow.parquet as pq

import streamsnap as ss
from benchmarks.workloads import _checkpoint_dir, build_w1, cleanup

PARALLELISM = 2
KEYS = 1000


def soak(spark, duration: float, policy: str, interval: float, compact: bool, rate: float | None = None) -> dict:
    out = tempfile.mkdtemp(prefix="filesink-soak-")
    rolling = (None if policy == "on-checkpoint"
               else ss.sinks.RollingPolicy(max_part_size=128 * 1024 * 1024, rollover_interval=interval,
                                           inactivity_interval=interval))
    env = ss.StreamEnvironment(parallelism=PARALLELISM, spark=spark,
                               checkpointing=ss.CheckpointConfig(interval=1.0, directory=_checkpoint_dir("soak-")),
                               network=ss.NetworkConfig(batch_size=8192))
    sink = ss.sinks.FileSink(out, format="parquet", mode="overwrite", rolling=rolling, compact=compact)
    build_w1(env, None, KEYS, "batch", sink, rate=rate)
    started = time.perf_counter()
    client = env.execute_async("filesink soak")
    time.sleep(duration)
    client.stop_with_savepoint(_checkpoint_dir("soak-savepoint-"), drain=True)
    result = client.wait(600)
    seconds = time.perf_counter() - started
    files = sorted(f for f in os.listdir(out) if not f.startswith((".", "_")))
    rows = sum(pq.ParquetFile(os.path.join(out, f)).metadata.num_rows for f in files)
    # Exact: one output row per source row (W1 emits each running sum), none twice — a key's
    # running totals only grow, so a repeated (key, total) is a duplicated row. Read by DuckDB,
    # as an analyst would.
    import duckdb

    distinct = duckdb.sql(f"SELECT count(DISTINCT (key, total)) FROM read_parquet('{out}/*.parquet')").fetchall()[0][0]
    exact = rows == distinct == result.records_in
    hidden = sorted(f for f in os.listdir(out) if f.startswith("."))
    if os.environ.get("SOAK_SHOW_HIDDEN"):
        print("hidden:", hidden, "visible:", files)
    shutil.rmtree(out, ignore_errors=True)
    return {"duration_s": duration, "policy": policy, "rollover_interval_s": None if rolling is None else interval,
            "compact": compact, "parallelism": PARALLELISM, "checkpoints": result.checkpoints.counts.completed,
            "files": len(files), "hidden_leftovers": len(hidden), "rows": rows, "distinct_rows": distinct,
            "source_records": result.records_in, "exact": exact, "seconds": round(seconds, 1),
            "rows_per_second": round(rows / seconds)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of input (default 600)")
    parser.add_argument("--policy", choices=("rolling", "on-checkpoint"), default="rolling")
    parser.add_argument("--interval", type=float, default=60.0, help="rollover interval in seconds (default 60)")
    parser.add_argument("--compact", action="store_true")
    parser.add_argument("--rate", type=float, default=None, help="events/s in all (default: as fast as it goes)")
    args = parser.parse_args(argv)
    from streamsnap.cluster.spark_session import embedded_session

    spark = embedded_session(16)
    try:
        print(json.dumps(soak(spark, args.duration, args.policy, args.interval, args.compact, args.rate)))
    finally:
        cleanup()
        spark.stop()


if __name__ == "__main__":
    main()
