"""W1 on the same Parquet files: streamsnap against Spark Structured Streaming, in one run.

The Kafka benchmark's Structured Streaming side (issue 15). Spark's Kafka source needs the
spark-sql-kafka connector jar: PySpark's wheel does not ship it (pyspark/jars holds no
spark-sql-kafka-*) and no Maven repository is reachable from these machines, so both engines
read the same W1 input from files instead (`spark_baselines.write_w1_input`: `key = i % keys`,
`value = i`, `ts` = 0.0, as `files` Parquet files) and keep a keyed running sum:

* streamsnap — bounded `FileSource` (parallelism 2, 65 536-row batches) → `key_by("key")
  .process_batches(BatchRunningSum())` (vectorized W1: one running sum per row) → `Discard`,
  exactly-once aligned checkpoints every 1 s (heap state, local checkpoint directory).
  Time: from `execute_async()` to the job finished — job deployment on the warm session, every
  checkpoint taken meanwhile and the final one included.
* Spark SQL — `groupBy("key").agg(sum("value"))`, update mode (emits per-key totals per
  micro-batch, not a sum per row), RocksDB state store, 2 shuffle partitions,
  `trigger(processingTime="1 second")`, `checkpointLocation` set, `noop` sink.
* Spark transformWithStateInPandas — W1 as streamsnap computes it (a `ValueState` per key, one
  output row per input row), otherwise the same query settings.
  Spark time: from `start()` until the progress report of the micro-batch that read the last
  row is seen — query start-up, planning, the batches with their state-store commits and
  offset/commit logs included. `files_per_trigger=None` lets Spark take every file in its first
  micro-batch (its most favourable setting: the per-batch costs are paid once); the number of
  batches each run took is reported.

Runs alternate (streamsnap, SQL, transformWithState, streamsnap, ...) after one warm-up of
each, so a machine that slows down mid-run shifts all three; ratios are medians of each
round's streamsnap rate over the Spark one. Output is discarded on every side: the figures
compare reading, the keyed state and checkpointing, not a sink.

    python -m benchmarks.files_vs_spark [rows] [runs]
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import streamsnap as ss
from benchmarks import spark_baselines as sb
from benchmarks.workloads import BatchRunningSum, _checkpoint_dir, cleanup

PARALLELISM = 2
KEYS = 1000
FILES = 8


def run_streamsnap(spark, input_dir: str, rows: int) -> dict:
    """One run of the streamsnap side (see the module docstring for what its time includes)."""
    config = ss.CheckpointConfig(interval=1.0, directory=_checkpoint_dir("files-vs-spark-"))
    env = ss.StreamEnvironment(parallelism=PARALLELISM, spark=spark, checkpointing=config,
                               network=ss.NetworkConfig(batch_size=65536))
    (env.from_source(ss.sources.FileSource(input_dir, "parquet", batch_size=65536), name="files", uid="files")
        .key_by("key").process_batches(BatchRunningSum(), name="w1", uid="w1")
        .sink_to(ss.sinks.Discard(), name="out", uid="out"))
    started = time.perf_counter()
    client = env.execute_async("W1 files vs Spark")
    result = client.wait(1800)
    seconds = time.perf_counter() - started
    if result.records_in != rows:
        raise RuntimeError(f"streamsnap read {result.records_in} rows of {input_dir!r}, which holds {rows}")
    return {"seconds": seconds, "events_per_second": rows / seconds,
            "checkpoints": result.checkpoints.counts.completed if result.checkpoints else 0}


def run_spark(spark, kind: str, input_dir: str, work: str, rows: int, files_per_trigger: int | None) -> dict:
    """One run of a Spark side: kind "sql" (groupBy/sum) or "tws" (transformWithStateInPandas)."""
    if kind == "sql":
        stream, mode = sb.sql_aggregation_stream(spark, input_dir, files_per_trigger), "update"
    else:
        stream, mode = sb.transform_with_state_stream(spark, input_dir, files_per_trigger), "append"
    run = sb.run_processing_time(spark, stream, mode, input_dir, tempfile.mkdtemp(prefix="ckpt-", dir=work),
                                 shuffle_partitions=PARALLELISM, trigger_seconds=1.0)
    return {**run, "events_per_second": rows / run["seconds"]}


def measure(spark, rows: int, runs: int = 3, files_per_trigger: int | None = None) -> dict:
    """The three sides on one input, alternating; medians and per-round ratios."""
    work = tempfile.mkdtemp(prefix="ssbench-files-vs-spark-")
    try:
        warm, data = os.path.join(work, "warm"), os.path.join(work, "in")
        sb.write_w1_input(warm, max(FILES, rows // 20), KEYS, files=FILES)
        sb.write_w1_input(data, rows, KEYS, files=FILES)
        sides = {"streamsnap": lambda d, n: run_streamsnap(spark, d, n),
                 "spark_sql": lambda d, n: run_spark(spark, "sql", d, work, n, files_per_trigger),
                 "spark_tws": lambda d, n: run_spark(spark, "tws", d, work, n, files_per_trigger)}
        measured = alternate(sides, (warm, max(FILES, rows // 20)), (data, rows), runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        cleanup()
    ours = [m["events_per_second"] for m in measured["streamsnap"]]
    out = {"rows": rows, "files": FILES, "files_per_trigger": files_per_trigger, "runs": measured}
    for name in ("streamsnap", "spark_sql", "spark_tws"):
        out[name] = statistics.median(m["events_per_second"] for m in measured[name])
    for name in ("spark_sql", "spark_tws"):
        out[f"ratio_vs_{name}"] = statistics.median(
            a / b["events_per_second"] for a, b in zip(ours, measured[name]))
    return out


def alternate(sides: dict, warm: tuple, data: tuple, runs: int) -> dict[str, list[dict]]:
    """Every side once on `warm` (input, rows: warms workers, imports and the JVM), then `runs`
    rounds of every side in turn on `data`, so a machine that slows down mid-run shifts all of
    them; each run printed as it ends. Returns each side's runs."""
    for side in sides.values():
        side(*warm)
    measured: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in range(runs):
        for name, side in sides.items():
            m = side(*data)
            measured[name].append(m)
            extra = (f", {m['checkpoints']} checkpoints" if "checkpoints" in m
                     else f", {m['batches']} micro-batches" if "batches" in m else "")
            print(f"  {name:13s} {m['events_per_second'] / 1e6:.2f} M events/s ({m['seconds']:.1f} s{extra})",
                  flush=True)
    return measured


def in_embedded_session(measure: Callable[..., dict], *args) -> dict:
    """`measure(spark, *args)` on the benchmarks' local Spark session, stopped afterwards."""
    from streamsnap.cluster.spark_session import embedded_session

    spark = embedded_session(16)
    try:
        return measure(spark, *args)
    finally:
        spark.stop()


def main(rows: int = 8_000_000, runs: int = 3) -> dict:
    result = in_embedded_session(measure, rows, runs)
    print(f"median events/s: streamsnap {result['streamsnap'] / 1e6:.2f} M, Spark SQL "
          f"{result['spark_sql'] / 1e6:.2f} M, Spark transformWithStateInPandas {result['spark_tws'] / 1e6:.2f} M; "
          f"streamsnap / Spark SQL {result['ratio_vs_spark_sql']:.2f}x, / transformWithState "
          f"{result['ratio_vs_spark_tws']:.2f}x (medians of per-round ratios)")
    return result


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
