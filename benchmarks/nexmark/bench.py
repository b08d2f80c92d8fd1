"""Nexmark throughput: each query of queries.py on streamsnap, and on Spark Structured Streaming
where Spark can express it, in events/s per core (parallelism 2 on 2 cores: events/s / 2).

streamsnap: one job per query over `count` events of the default NexmarkConfig (standard
sizes, in order); timed from the first batch the generator makes (wall clock, written by the
source task) to the end of input at the query's sink (after the final watermark fired every
window), so the generator, every operator, the shuffles, and the final window firing count;
deployment and teardown do not.

Spark: the queries of spark_queries.py (all but q4) over the same events written to Parquet
first (not timed), read one file per micro-batch, the last file ending with the end-of-input row
that lets the final no-data batch emit the last windows; rate = input events / Spark's own
trigger-to-commit time over micro-batches 2.. (that final batch included), as the W1 Spark
baselines measure (benchmarks/spark_baselines.py). Reading and decoding Parquet counts,
generating the events does not.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import numpy as np

import streamsnap as ss
from benchmarks import workloads
from benchmarks.nexmark import queries, spark_queries
from streamsnap.connectors import nexmark

PARALLELISM = 2
CORES = 2
FLINK_PER_CORE = {"q0": 155_000, "q1": 158_000, "q2": 175_000, "q5": 22_000, "q7": 12_300, "q8": 146_000}
CONFIG = nexmark.NexmarkConfig(seed=1)


class _StampedEvents:
    """The vectorized generator, writing the wall-clock time of its first call to a file
    under `directory` (once per process): when the source started producing."""

    def __init__(self, events, directory: str):
        self.events, self.directory, self.schema = events, directory, events.schema
        self._stamped = False

    def __call__(self, index):
        if not self._stamped:
            self._stamped = True
            workloads.stamp_start(self.directory)
        return self.events(index)


EndSink = workloads.EndSink


def run_streamsnap(spark, query: str, count: int, batch_size: int = 8192) -> dict:
    """One run of `query` over `count` events: events/s from the generator's first batch to the
    end of input at the sink."""
    stamps = tempfile.mkdtemp(prefix="ssbench-nexmark-")
    try:
        env = ss.StreamEnvironment(parallelism=PARALLELISM, spark=spark,
                                   network=ss.NetworkConfig(batch_size=batch_size))
        source = ss.sources.Generator(_StampedEvents(nexmark.events(CONFIG, vectorized=True), stamps),
                                      count=count, vectorized=True, schema=nexmark.SCHEMA,
                                      batch_size=batch_size)
        sink = EndSink()
        queries.QUERIES[query](queries.events(env, CONFIG, count, source=source)).sink_to(sink, name="out")
        result = env.execute(f"nexmark {query} n={count}")
        starts = workloads.read_starts(stamps)
    finally:
        shutil.rmtree(stamps, ignore_errors=True)
    seconds = max(r["end"] for r in sink.ends.reports) - min(starts)
    return {"events_per_second": count / seconds, "seconds": seconds, "job_seconds": result.duration,
            "output_rows": sum(r["rows"] for r in sink.ends.reports)}


# ----------------------------------------------------------------------------- Spark
def write_events_parquet(directory: str, count: int, files: int = 8, config: nexmark.NexmarkConfig = CONFIG) -> None:
    """The first `count` events of `config` as `files` Parquet files, in order (name and mtime),
    the last ending with Spark's end-of-input row (spark_queries.end_marker)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    generate = nexmark.events(config, vectorized=True)
    bounds = np.linspace(0, count, files + 1).round().astype(np.int64)
    base_ns = time.time_ns() - (files + 1) * 1_000_000_000
    for j in range(files):
        chunks = [generate(np.arange(lo, min(lo + 65536, bounds[j + 1]), dtype=np.int64))
                  for lo in range(bounds[j], bounds[j + 1], 65536)]
        table = pa.Table.from_batches(chunks, schema=nexmark.SCHEMA)
        if j == files - 1:
            table = pa.concat_tables([table, spark_queries.end_marker()])
        path = os.path.join(directory, f"part-{j:05d}.parquet")
        pq.write_table(table, path)
        os.utime(path, ns=(base_ns + j * 1_000_000_000,) * 2)


SPARK_QUERIES = spark_queries.SPARK_QUERIES   # all but q4: spark_queries' docstring says why
# Spark SS runs these queries at 4-80 K events/s here: each reads 1/N of the Spark input size, so
# a quick run stays within minutes (still 8 micro-batches of >= 12 K events; the rate is per event).
SPARK_INPUT_DIVISOR = {"q0": 4, "q1": 4, "q2": 4, "q3": 8, "q5": 40, "q7": 8, "q8": 8}


def run_spark(spark, query: str, input_dir: str, checkpoint_dir: str) -> dict:
    """One run of `query` on Spark SS over the Parquet input: rate over micro-batches 2.. (for
    the windowed queries the last is the no-data batch that emits the final windows)."""
    from benchmarks import spark_baselines as sb

    files, expected = sb._w1_input_rows(input_dir)
    scans = spark_queries.SCANS.get(query, 1)
    stream = spark_queries.queries(spark, input_dir, CONFIG)[query]()
    run = sb._run_available_now(spark, stream, input_dir, checkpoint_dir, 2, "append", None, expected * scans,
                                files, f"nexmark {query}")
    return {"events_per_second": sb.steady_rate(run) / scans, "batch_seconds": run["batch_seconds"],
            "rows_per_batch": expected // files}


def run_all(spark, count: int, spark_count: int, runs: int, results: dict) -> None:
    """Every query on streamsnap (median of `runs`, after a warm-up), then every query Spark SS
    expresses (SPARK_QUERIES) on Spark."""
    for name in queries.QUERIES:
        print(f"  nexmark {name} on streamsnap, {runs} runs of {count:,} events ...", flush=True)
        run_streamsnap(spark, name, max(100_000, count // 10))
        measured = [run_streamsnap(spark, name, count) for _ in range(runs)]
        rates = [m["events_per_second"] for m in measured]
        results[f"nexmark_{name}"] = {"events_per_second": statistics.median(rates),
                                      "per_core": statistics.median(rates) / CORES, "runs": rates,
                                      "details": measured, "events": count}
    work = tempfile.mkdtemp(prefix="ssbench-nexmark-spark-")
    try:
        print(f"  writing {spark_count:,} Nexmark events as Parquet for Spark ...", flush=True)
        write_events_parquet(os.path.join(work, "warm"), max(8, spark_count // 20))
        for divisor in sorted({1, *SPARK_INPUT_DIVISOR.values()}):
            write_events_parquet(os.path.join(work, f"in-{divisor}"), max(8, spark_count // divisor))
        for name in SPARK_QUERIES:
            divisor = SPARK_INPUT_DIVISOR.get(name, 1)
            print(f"  nexmark {name} on Spark SS, {runs} runs of {max(8, spark_count // divisor):,} events ...",
                  flush=True)
            run_spark(spark, name, os.path.join(work, "warm"), os.path.join(work, f"ckpt-{name}-warm"))
            measured = [run_spark(spark, name, os.path.join(work, f"in-{divisor}"),
                                  os.path.join(work, f"ckpt-{name}-{i}")) for i in range(runs)]
            rates = [m["events_per_second"] for m in measured]
            results[f"nexmark_spark_{name}"] = {"events_per_second": statistics.median(rates),
                                                "per_core": statistics.median(rates) / CORES, "runs": rates,
                                                "rows_per_batch": measured[0]["rows_per_batch"],
                                                "events": max(8, spark_count // divisor),
                                                "spark": str(spark.version)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
