"""Nexmark throughput: each query of catalog.py (q0-q22) on streamsnap, and on Spark Structured Streaming
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

Any query of `catalog` runs alone, with exactly-once checkpoints as Flink's suite runs them
(every 10 s, state on RocksDB incremental, or on the heap) or without:

    python -m benchmarks.nexmark.bench --query q9 --query q6 --events 1000000 --state rocksdb
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
from benchmarks.nexmark import catalog, queries, spark_queries, stateless
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


STATES = ("none", "heap", "rocksdb")   # no checkpoints; checkpoints with state on the heap / RocksDB


def _environment(spark, batch_size: int, state: str, interval: float, directory: str) -> ss.StreamEnvironment:
    """Parallelism 2; with `state` heap or rocksdb, exactly-once checkpoints every `interval` s
    (RocksDB: incremental, as Flink's Nexmark runs)."""
    if state not in STATES:
        raise ValueError(f"state must be one of {STATES}, got {state!r}")
    options = {}
    if state != "none":
        options = dict(checkpointing=ss.CheckpointConfig(interval=interval, directory=os.path.join(directory, "ckpt")),
                       state_backend=ss.RocksDBConfig(incremental=True) if state == "rocksdb" else "hashmap")
    return ss.StreamEnvironment(parallelism=PARALLELISM, spark=spark, network=ss.NetworkConfig(batch_size=batch_size),
                                **options)


def run_streamsnap(spark, query: str, count: int, batch_size: int = 8192, state: str = "none",
                   interval: float = 10.0) -> dict:
    """One run of `query` over `count` events: events/s from the generator's first batch to the
    end of input at the sink (q10 also writes its Parquet files, committed at the end)."""
    work = tempfile.mkdtemp(prefix="ssbench-nexmark-")
    stamps = os.path.join(work, "stamps")
    os.makedirs(stamps)
    try:
        env = _environment(spark, batch_size, state, interval, work)
        source = ss.sources.Generator(_StampedEvents(nexmark.events(CONFIG, vectorized=True), stamps),
                                      count=count, vectorized=True, schema=nexmark.SCHEMA,
                                      batch_size=batch_size)
        sink = EndSink()
        output = catalog.QUERIES[query](queries.events(env, CONFIG, count, source=source))
        output.sink_to(sink, name="out")
        if query == "q10":
            output.sink_to(stateless.q10_sink(os.path.join(work, "q10")), name="q10 files")
        result = env.execute(f"nexmark {query} n={count}")
        starts = workloads.read_starts(stamps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = max(r["end"] for r in sink.ends.reports) - min(starts)
    checkpoints = result.checkpoints.counts.completed if state != "none" else 0
    return {"events_per_second": count / seconds, "seconds": seconds, "job_seconds": result.duration,
            "output_rows": sum(r["rows"] for r in sink.ends.reports), "state": state, "checkpoints": checkpoints}


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


SPARK_QUERIES = spark_queries.SPARK_QUERIES   # those Spark SS can express: its docstring says which not, and why
# Spark SS runs these queries at 4-80 K events/s here: each reads 1/N of the Spark input size, so
# a quick run stays within minutes (still 8 micro-batches of >= 12 K events; the rate is per event).
SPARK_INPUT_DIVISOR = {"q0": 4, "q1": 4, "q2": 4, "q3": 8, "q5": 40, "q7": 8, "q8": 8, "q10": 4, "q11": 8, "q13": 8,
                       "q14": 4, "q17": 8, "q20": 8, "q21": 4, "q22": 4}


def run_spark(spark, query: str, input_dir: str, checkpoint_dir: str) -> dict:
    """One run of `query` on Spark SS over the Parquet input: rate over micro-batches 2.. (for
    the windowed queries the last is the no-data batch that emits the final windows)."""
    from benchmarks import spark_baselines as sb

    files, expected = sb._w1_input_rows(input_dir)
    scans = spark_queries.SCANS.get(query, 1)
    with sb._session_conf(spark, spark_queries.UTC):
        stream = spark_queries.queries(spark, input_dir, CONFIG)[query]()
        run = sb._run_available_now(spark, stream, input_dir, checkpoint_dir, 2, "append", None, expected * scans,
                                    files, f"nexmark {query}")
    return {"events_per_second": sb.steady_rate(run) / scans, "batch_seconds": run["batch_seconds"],
            "rows_per_batch": expected // files}


def measure(spark, name: str, count: int, runs: int, state: str = "none", interval: float = 10.0) -> dict:
    """`runs` runs of query `name` after a warm-up: the median events/s, per core, and each run."""
    run_streamsnap(spark, name, max(100_000, count // 10), state=state, interval=interval)
    measured = [run_streamsnap(spark, name, count, state=state, interval=interval) for _ in range(runs)]
    rates = [m["events_per_second"] for m in measured]
    return {"events_per_second": statistics.median(rates), "per_core": statistics.median(rates) / CORES,
            "runs": rates, "details": measured, "events": count, "state": state}


def run_all(spark, count: int, spark_count: int, runs: int, results: dict, names=None) -> None:
    """Every query (`names`, default all of catalog.QUERIES) on streamsnap (median of `runs`,
    after a warm-up), then every query Spark SS expresses (SPARK_QUERIES) on Spark."""
    for name in names or catalog.QUERIES:
        print(f"  nexmark {name} on streamsnap, {runs} runs of {count:,} events ...", flush=True)
        results[f"nexmark_{name}"] = measure(spark, name, count, runs)
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


def main(argv=None) -> None:
    import argparse

    from streamsnap.cluster.spark_session import embedded_session

    parser = argparse.ArgumentParser(prog="python -m benchmarks.nexmark.bench",
                                     description="Nexmark queries on streamsnap, events/s per core")
    parser.add_argument("--query", action="append", choices=list(catalog.QUERIES),
                        help="a query to run (repeat for several; default: all)")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--state", choices=STATES, default="none",
                        help="none: no checkpoints; heap / rocksdb: exactly-once checkpoints with that state backend")
    parser.add_argument("--checkpoint-interval", type=float, default=10.0, help="seconds (default 10, as Flink's suite)")
    args = parser.parse_args(argv)
    spark = embedded_session(16)
    for name in args.query or catalog.QUERIES:
        r = measure(spark, name, args.events, args.runs, args.state, args.checkpoint_interval)
        details = r["details"][-1]
        print(f"{name}: {r['per_core']:,.0f} events/s per core ({r['events_per_second']:,.0f} events/s at "
              f"parallelism {PARALLELISM}), {args.events:,} events, state {args.state}, "
              f"{details['checkpoints']} checkpoints, {details['output_rows']:,} output rows", flush=True)


if __name__ == "__main__":
    main()
