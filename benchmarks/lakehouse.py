"""W1 into a Delta table, exactly-once: against the discarding sink and Spark writing files, in one run.

Issue 32's target. Every side keeps W1's keyed running sum and checkpoints every 1 s:

* streamsnap → Delta — `Generator` (vectorized, 65 536-row batches) → `key_by("key")
  .process_batches(BatchRunningSum())` → `ss.sinks.Delta(path)` (one running sum per row, so
  every input row is a table row), parallelism 2, exactly-once aligned checkpoints every 1 s:
  each completed checkpoint is one Delta commit, made by the sink's committer thread.
* streamsnap → discard — the same job into `ss.sinks.Discard()`. Target: Delta ≥ 50 % of it.
* Spark → Parquet — Structured Streaming over the same rows as Parquet files
  (`spark_baselines.write_w1_input`), W1 as `transformWithStateInPandas` (one output row per
  input row, as streamsnap computes it), RocksDB state, 2 shuffle partitions,
  `trigger(processingTime="1 second")`, Spark's Parquet file sink (exactly-once through its
  `_spark_metadata` log).
* Spark → Delta is not measured: delta-spark's PyPI wheel holds no jars (it adds
  `io.delta:delta-spark_2.13` through `spark.jars.packages`, fetched from Maven Central, which
  these machines cannot reach) and PySpark ships none, so this Spark cannot write Delta.

Times: streamsnap from `execute_async()` to the job finished (deployment on the warm session,
every checkpoint and its commit, the final one included); Spark from `start()` to the progress
report of the micro-batch that read the last row. Each side's output is checked: the Delta
table and Spark's files hold exactly `rows` rows. Runs alternate after one warm-up of each side;
ratios are medians of each round's ratio.

The commit's share: the committer records each commit's duration; beside it the median
checkpoint's end-to-end duration (trigger → completed), and the share of the commit in the time
from a checkpoint's trigger until its rows are visible (duration + commit).

    python -m benchmarks.lakehouse [rows] [runs]
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

import streamsnap as ss
from benchmarks import spark_baselines as sb
from benchmarks.files_vs_spark import alternate, in_embedded_session
from benchmarks.workloads import _checkpoint_dir, build_w1, cleanup

PARALLELISM = 2
KEYS = 1000
FILES = 8
BATCH = 65536
SPARK_DELTA = ("not measured: delta-spark's wheel has no jars and Maven (spark.jars.packages) is "
               "unreachable here; PySpark ships no Delta jar")


class RecordedDelta(ss.sinks.Delta):
    """`ss.sinks.Delta` keeping its committer (in this process: the JobMaster's) for its commit durations."""

    committer = None

    def create_driver_component(self):
        self.committer = super().create_driver_component()
        return self.committer

    def __getstate__(self):
        return {**self.__dict__, "committer": None}   # driver-side only


def table_rows(path: str) -> int:
    from deltalake import DeltaTable

    return DeltaTable(path).to_pyarrow_dataset().count_rows()


def run_streamsnap(spark, rows: int, sink: str, work: str) -> dict:
    """One run of W1 into `sink` ("delta" or "discard"); see the module docstring."""
    if sink not in ("delta", "discard"):
        raise ValueError(f"sink must be 'delta' or 'discard', got {sink!r}")
    config = ss.CheckpointConfig(interval=1.0, directory=_checkpoint_dir("lakehouse-"))
    env = ss.StreamEnvironment(parallelism=PARALLELISM, spark=spark, checkpointing=config,
                               network=ss.NetworkConfig(batch_size=BATCH))
    path = tempfile.mkdtemp(prefix="delta-", dir=work)
    target = RecordedDelta(path) if sink == "delta" else ss.sinks.Discard()
    build_w1(env, rows, KEYS, "batch", target, batch_size=BATCH)
    started = time.perf_counter()
    result = env.execute_async(f"W1 into {sink}").wait(1800)
    seconds = time.perf_counter() - started
    out = {"seconds": seconds, "events_per_second": rows / seconds,
           "checkpoints": result.checkpoints.counts.completed if result.checkpoints else 0}
    if sink == "delta":
        written = table_rows(path)
        if written != rows:
            raise RuntimeError(f"the Delta table {path!r} holds {written} rows, the job read {rows}")
        durations = [c.end_to_end_duration for c in result.checkpoints.history if c.end_to_end_duration is not None]
        commits = [c["seconds"] for c in target.committer.commits]
        out.update(commits=len(commits), commit_seconds=statistics.median(commits),
                   checkpoint_seconds=statistics.median(durations))
    shutil.rmtree(path, ignore_errors=True)
    return out


def spark_output_rows(output_dir: str) -> int:
    import pyarrow.dataset as ds

    return ds.dataset(output_dir, format="parquet", exclude_invalid_files=True,
                      ignore_prefixes=["_", "."]).count_rows()


def run_spark_parquet(spark, input_dir: str, rows: int, work: str) -> dict:
    """One run of Spark's W1 (transformWithStateInPandas) into Parquet files."""
    output = tempfile.mkdtemp(prefix="spark-out-", dir=work)
    run = sb.run_processing_time(spark, sb.transform_with_state_stream(spark, input_dir), "append", input_dir,
                                 tempfile.mkdtemp(prefix="ckpt-", dir=work), shuffle_partitions=PARALLELISM,
                                 trigger_seconds=1.0, output_dir=output)
    written = spark_output_rows(output)
    if written != rows:
        raise RuntimeError(f"Spark wrote {written} rows to {output!r}, it read {rows}")
    shutil.rmtree(output, ignore_errors=True)
    return {**run, "events_per_second": rows / run["seconds"]}


def measure(spark, rows: int, runs: int = 3) -> dict:
    """The three sides, alternating after a warm-up; medians and per-round ratios."""
    work = tempfile.mkdtemp(prefix="ssbench-lakehouse-")
    warm_rows = max(FILES, rows // 20)
    try:
        warm, data = os.path.join(work, "warm"), os.path.join(work, "in")
        sb.write_w1_input(warm, warm_rows, KEYS, files=FILES)
        sb.write_w1_input(data, rows, KEYS, files=FILES)
        sides = {"delta": lambda d, n: run_streamsnap(spark, n, "delta", work),
                 "discard": lambda d, n: run_streamsnap(spark, n, "discard", work),
                 "spark_parquet": lambda d, n: run_spark_parquet(spark, d, n, work)}
        measured = alternate(sides, (warm, warm_rows), (data, rows), runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        cleanup()
    out: dict = {"rows": rows, "runs": measured, "spark_delta": SPARK_DELTA}
    for name in sides:
        out[name] = statistics.median(m["events_per_second"] for m in measured[name])
    delta = measured["delta"]
    for name in ("discard", "spark_parquet"):
        out[f"delta_vs_{name}"] = statistics.median(
            a["events_per_second"] / b["events_per_second"] for a, b in zip(delta, measured[name]))
    out["commit_seconds"] = statistics.median(m["commit_seconds"] for m in delta)
    out["checkpoint_seconds"] = statistics.median(m["checkpoint_seconds"] for m in delta)
    out["commit_share"] = out["commit_seconds"] / (out["checkpoint_seconds"] + out["commit_seconds"])
    return out


def table(result: dict) -> str:
    """The figures as a Markdown table."""
    lines = ["| side | M events/s | vs streamsnap → Delta |", "|---|---|---|"]
    lines.append(f"| streamsnap → Delta (exactly-once) | {result['delta'] / 1e6:.2f} | 1 |")
    lines.append(f"| streamsnap → discard | {result['discard'] / 1e6:.2f} | Delta = "
                 f"{result['delta_vs_discard']:.0%} of it |")
    lines.append(f"| Spark transformWithStateInPandas → Parquet | {result['spark_parquet'] / 1e6:.2f} | Delta = "
                 f"{result['delta_vs_spark_parquet']:.1f}× |")
    lines.append(f"| Spark → Delta | — | {result['spark_delta']} |")
    lines.append("")
    lines.append(f"Delta commit: median {result['commit_seconds'] * 1000:.1f} ms; checkpoint trigger → completed "
                 f"median {result['checkpoint_seconds'] * 1000:.1f} ms; the commit's share of trigger → visible "
                 f"{result['commit_share']:.0%}.")
    return "\n".join(lines)


def main(rows: int = 8_000_000, runs: int = 3) -> dict:
    result = in_embedded_session(measure, rows, runs)
    print(table(result))
    return result


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
