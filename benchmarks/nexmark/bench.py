"""Nexmark throughput: each query of catalog.py (q0-q22) on streamsnap, and on Spark Structured Streaming
where Spark can express it, in events/s per core (parallelism 2 on 2 cores: events/s / 2).

streamsnap: one job per query over `count` events of the default NexmarkConfig (standard
sizes, in order); timed from the first batch the generator makes (wall clock, written by the
source task) to the end of input at the query's sink (after the final watermark fired every
window), so the generator, every operator, the shuffles, and the final window firing count;
deployment and teardown do not.

Spark: the queries Spark SS expresses (spark_queries.SPARK_QUERIES; NOT_EXPRESSIBLE says which
not, and why) over the same events written to Parquet
first (not timed), read one file per micro-batch, the last file ending with the end-of-input row
that lets the final no-data batch emit the last windows; rate = input events / Spark's own
trigger-to-commit time over micro-batches 2.. (that final batch included), as the W1 Spark
baselines measure (benchmarks/spark_baselines.py). Reading and decoding Parquet counts,
generating the events does not. Output goes to the noop sink, q10's to Spark's Parquet file
sink (partitioned by dt and hm, as streamsnap's q10 writes it).

Like for like: over the very same Parquet files, streamsnap runs each such query too
(`run_streamsnap(input_dir=...)`: a FileSource reading only the columns the query reads,
PARQUET_COLUMNS, as Spark's plan reads only those; state on RocksDB, the same checkpoints),
timed from the first reader's first poll to the end of input at the sink. The report's ratio to
Spark SS is of that figure: the generator-fed rows pay for making the events, Spark does not.

`run_all` (what `python -m benchmarks run --only nexmark` calls) runs each query as Flink's suite
runs it: exactly-once checkpoints every 10 s with state on RocksDB (incremental) — the main row —
and again with state on the heap, counting the checkpoints each run completed; first it measures
the generator alone (generator_speed.flat_stream, events per CPU second), so each row can say
what share of its cost the generator is. Any queries run alone, on the states asked for
(`--state none`: no checkpoints), and print the same table:

    python -m benchmarks.nexmark.bench --query q9 --query q6 --events 1000000 --state rocksdb
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa

import streamsnap as ss
from benchmarks import workloads
from benchmarks.nexmark import catalog, queries, spark_queries, stateless
from streamsnap.connectors import nexmark
from streamsnap.connectors.files import FileSourceReader

PARALLELISM = 2
CORES = 2
CONFIG = nexmark.NexmarkConfig(seed=1)
BATCH_SIZE = 8192   # the source's RecordBatch size


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


_BID_COLUMNS = tuple(f"bid_{f}" for f in nexmark.BID_SCHEMA.names if f != "date_time")
_AUCTION_COLUMNS = tuple(f"auction_{f}" for f in nexmark.AUCTION_SCHEMA.names if f != "date_time")
# The flat columns each query's code reads, besides event_type and date_time: over Parquet its
# FileSource reads only these (a FileSource reads its schema's columns), as Spark's plan reads
# only the columns it uses. The kinds.py fronts (kinds.bids, kinds.auctions) take a kind's every
# column. Queries not listed read them all.
PARQUET_COLUMNS = {
    "q0": ("bid_auction", "bid_bidder", "bid_price", "bid_extra"),
    "q1": ("bid_auction", "bid_bidder", "bid_price", "bid_extra"),
    "q2": ("bid_auction", "bid_price"), "q5": ("bid_auction",), "q7": ("bid_auction", "bid_bidder", "bid_price"),
    "q3": ("person_id", "person_name", "person_city", "person_state", "auction_id", "auction_seller",
           "auction_category"),
    "q8": ("person_id", "person_name", "auction_seller"),
    **{q: _BID_COLUMNS for q in ("q10", "q11", "q13", "q14", "q17", "q21", "q22")},
    "q20": _BID_COLUMNS + _AUCTION_COLUMNS,
}


def parquet_schema(query: str) -> pa.Schema:
    """nexmark.SCHEMA with only the columns `query` reads (PARQUET_COLUMNS), in its order."""
    columns = PARQUET_COLUMNS.get(query)
    if columns is None:
        return nexmark.SCHEMA
    keep = {"event_type", "date_time", *columns}
    return pa.schema([f for f in nexmark.SCHEMA if f.name in keep])


class _StampedFiles(ss.sources.FileSource):
    """The FileSource over write_events_parquet's files, read by _StampedFileReader."""

    def __init__(self, path: str, stamps: str, **options):
        super().__init__(path, "parquet", **options)
        self.stamps = stamps

    def create_reader(self, ctx):
        return _StampedFileReader(self, ctx)


class _StampedFileReader(FileSourceReader):
    """A FileSource reader writing the wall-clock time of its first poll to a file under the
    source's `stamps` (as _StampedEvents: when the subtask started reading, after the file
    listing and the job's start-up) and leaving out Spark's end-of-input row (the last row of
    the last file), which is no event."""

    def __init__(self, source: _StampedFiles, ctx):
        super().__init__(source, ctx)
        self._stamps, self._stamped = source.stamps, False

    def poll(self):
        if not self._stamped:
            self._stamped = True
            workloads.stamp_start(self._stamps)
        batch = super().poll()
        if batch is not None and batch.num_rows and batch.column("event_type")[-1].as_py() == spark_queries.END:
            batch = batch.slice(0, batch.num_rows - 1)
        return batch


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


def run_streamsnap(spark, query: str, count: int, batch_size: int = BATCH_SIZE, state: str = "none",
                   interval: float = 10.0, build=None, input_dir: str | None = None) -> dict:
    """One run of `query` over `count` events: events/s from the generator's first batch to the
    end of input at the sink (q10 also writes its Parquet files, committed at the end).
    `build`: the query's pipeline (stream -> stream) instead of catalog.QUERIES[query]'s.
    `input_dir`: read the events from the Parquet files there (write_events_parquet, `count`
    events: Spark's input) instead of generating them, only the columns the query reads
    (parquet_schema), timed from the first reader's first poll."""
    work = tempfile.mkdtemp(prefix="ssbench-nexmark-")
    stamps = os.path.join(work, "stamps")
    os.makedirs(stamps)
    try:
        env = _environment(spark, batch_size, state, interval, work)
        if input_dir is None:
            source = ss.sources.Generator(_StampedEvents(nexmark.events(CONFIG, vectorized=True), stamps),
                                          count=count, vectorized=True, schema=nexmark.SCHEMA,
                                          batch_size=batch_size)
        else:
            source = _StampedFiles(input_dir, stamps, schema=parquet_schema(query), batch_size=batch_size)
        sink = EndSink()
        output = (build or catalog.QUERIES[query])(queries.events(env, CONFIG, count, source=source))
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


def run_spark(spark, query: str, input_dir: str, checkpoint_dir: str, output_dir: str | None = None) -> dict:
    """One run of `query` on Spark SS over the Parquet input: rate over micro-batches 2.. (for
    the windowed queries the last is the no-data batch that emits the final windows). Output is
    discarded (noop sink), except q10's, which Spark's file sink writes as Parquet partitioned
    by dt and hm under `output_dir` (default: beside the checkpoint), as streamsnap's q10 does."""
    from benchmarks import spark_baselines as sb

    files, expected = sb._w1_input_rows(input_dir)
    scans = spark_queries.SCANS.get(query, 1)
    files_out = None
    if query in spark_queries.FILE_OUTPUT:
        files_out = {"path": output_dir or checkpoint_dir.rstrip("/") + "-out",
                     "partition_by": spark_queries.FILE_OUTPUT[query]}
    with sb._session_conf(spark, spark_queries.UTC):
        stream = spark_queries.queries(spark, input_dir, CONFIG)[query]()
        run = sb._run_available_now(spark, stream, input_dir, checkpoint_dir, 2, "append", None, expected * scans,
                                    files, f"nexmark {query}", files_out=files_out)
    return {"events_per_second": sb.steady_rate(run) / scans, "batch_seconds": run["batch_seconds"],
            "rows_per_batch": expected // files}


def measure(spark, name: str, count: int, runs: int, state: str = "rocksdb", interval: float = 10.0,
            warm: bool = True, input_dir: str | None = None, warm_input: tuple[str, int] | None = None) -> dict:
    """`runs` runs of query `name` (after a warm-up run of a tenth of `count`, at least 100 K
    events, unless `warm` is False): the median events/s, per core, each run, the checkpoints
    each completed and the first run's output rows. `input_dir`: over the Parquet files there
    (run_streamsnap's), warmed up over `warm_input` (its directory and event count)."""
    if input_dir is not None and warm and warm_input is None:
        raise ValueError("measure: a run over input_dir warms up over warm_input=(directory, events)")
    if warm:
        if input_dir is None:
            run_streamsnap(spark, name, min(count, max(100_000, count // 10)), state=state, interval=interval)
        else:
            run_streamsnap(spark, name, warm_input[1], state=state, interval=interval, input_dir=warm_input[0])
    measured = [run_streamsnap(spark, name, count, state=state, interval=interval, input_dir=input_dir)
                for _ in range(runs)]
    rates = [m["events_per_second"] for m in measured]
    return {"events_per_second": statistics.median(rates), "per_core": statistics.median(rates) / CORES,
            "runs": rates, "details": measured, "events": count, "state": state, "interval": interval,
            "checkpoints": [m["checkpoints"] for m in measured], "output_rows": measured[0]["output_rows"]}


DEFAULT_STATES = ("rocksdb", "heap")   # issue 34: RocksDB incremental the main row, the heap the second


def check_choice(names, states) -> tuple[list[str], list[str]]:
    """`names` (default: every query) and `states` checked against catalog.QUERIES and STATES,
    before anything runs: a typo fails at once, naming the choices."""
    names = list(names or catalog.QUERIES)
    unknown = [n for n in names if n not in catalog.QUERIES]
    if unknown:
        raise ValueError(f"unknown Nexmark quer{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                         f"choose from {', '.join(catalog.QUERIES)}")
    states = list(states)
    bad = [s for s in states if s not in STATES]
    if bad or not states:
        raise ValueError(f"state must be one of {STATES}, got {bad or states!r}")
    return names, states


def run_streamsnap_all(spark, count: int, runs: int, results: dict, names=None, states=DEFAULT_STATES,
                       interval: float = 10.0, generator_seconds: float = 3.0) -> dict:
    """Each query of `names` on streamsnap, once per state of `states` (back to back, so a
    machine slowing down shifts a query's rows alike), into results["nexmark"], with the
    generator's own cost measured first (generator_speed.flat_stream). A query that fails is
    recorded in results["errors"] (and its traceback printed); the others still run."""
    import traceback

    from benchmarks.nexmark import generator_speed

    names, states = check_choice(names, states)
    out = results.setdefault("nexmark", {})
    out.update(events=count, runs=runs, states=states, interval=interval, cores=CORES, parallelism=PARALLELISM)
    print(f"  Nexmark generator alone (flat event stream, batches of {BATCH_SIZE}) ...", flush=True)
    out["generator"] = generator_speed.flat_stream(CONFIG, batch=BATCH_SIZE, seconds=generator_seconds)
    queries_out = out.setdefault("queries", {})
    for name in names:
        for i, state in enumerate(states):
            print(f"  nexmark {name} on streamsnap, state {state}, checkpoints every {interval:g} s"
                  f"{'' if state != 'none' else ' (off)'}, {runs} run(s) of {count:,} events ...", flush=True)
            try:
                r = measure(spark, name, count, runs, state, interval, warm=i == 0)
            except Exception as exc:  # one query's failure must not lose the other 45 rows
                traceback.print_exc()
                results.setdefault("errors", {})[f"nexmark {name} {state}"] = f"{type(exc).__name__}: {exc}"
                continue
            queries_out.setdefault(name, {})[state] = r
            print(f"    {r['per_core']:,.0f} events/s per core, checkpoints {r['checkpoints']}", flush=True)
    return out


def run_spark_all(spark, spark_count: int, runs: int, results: dict, names=None, interval: float = 10.0) -> None:
    """Each query of `names` Spark SS expresses (SPARK_QUERIES), median of `runs` after a warm-up,
    into results["nexmark"]["spark"]; and, on the very same Parquet files, streamsnap's run of
    the query (state on RocksDB, checkpoints every `interval` s, as the main row; median of
    `runs` after a warm-up) into its "streamsnap" entry: the like-for-like comparison, since the
    main rows pay for generating the events and Spark only for reading them."""
    names, _ = check_choice(names, DEFAULT_STATES)
    chosen = [n for n in SPARK_QUERIES if n in names]
    if not chosen:
        return
    out = results.setdefault("nexmark", {}).setdefault("spark", {})
    work = tempfile.mkdtemp(prefix="ssbench-nexmark-spark-")
    try:
        print(f"  writing {spark_count:,} Nexmark events as Parquet for Spark ...", flush=True)
        warm_count = max(8, spark_count // 20)
        write_events_parquet(os.path.join(work, "warm"), warm_count)
        for divisor in sorted({SPARK_INPUT_DIVISOR.get(n, 1) for n in chosen}):
            write_events_parquet(os.path.join(work, f"in-{divisor}"), max(8, spark_count // divisor))
        for name in chosen:
            divisor = SPARK_INPUT_DIVISOR.get(name, 1)
            count, input_dir = max(8, spark_count // divisor), os.path.join(work, f"in-{divisor}")
            print(f"  nexmark {name} on Spark SS, {runs} runs of {count:,} events ...", flush=True)
            run_spark(spark, name, os.path.join(work, "warm"), os.path.join(work, f"ckpt-{name}-warm"))
            measured = [run_spark(spark, name, input_dir, os.path.join(work, f"ckpt-{name}-{i}")) for i in range(runs)]
            rates = [m["events_per_second"] for m in measured]
            out[name] = {"events_per_second": statistics.median(rates), "per_core": statistics.median(rates) / CORES,
                         "runs": rates, "rows_per_batch": measured[0]["rows_per_batch"],
                         "events": count, "spark": str(spark.version)}
            print(f"    {out[name]['per_core']:,.0f} events/s per core", flush=True)
            print(f"  nexmark {name} on streamsnap over the same Parquet files, state rocksdb, "
                  f"{runs} runs ...", flush=True)
            out[name]["streamsnap"] = measure(spark, name, count, runs, "rocksdb", interval, input_dir=input_dir,
                                              warm_input=(os.path.join(work, "warm"), warm_count))
            print(f"    {out[name]['streamsnap']['per_core']:,.0f} events/s per core", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_all(spark, count: int, spark_count: int, runs: int, results: dict, names=None, states=DEFAULT_STATES,
            interval: float = 10.0, spark_runs: int | None = None, generator_seconds: float = 3.0) -> None:
    """Every query (`names`, default all of catalog.QUERIES) on streamsnap once per state (median
    of `runs` after a warm-up; RocksDB and the heap, checkpoints every `interval` s, by default),
    the generator's cost, then every one of them Spark SS expresses on Spark (`spark_runs` runs,
    default `runs`): results["nexmark"], which report.nexmark_table turns into the table."""
    names, states = check_choice(names, states)
    run_streamsnap_all(spark, count, runs, results, names, states, interval, generator_seconds)
    run_spark_all(spark, spark_count, spark_runs or runs, results, names, interval)


def main(argv=None) -> None:
    import argparse

    from benchmarks import report
    from streamsnap.cluster.spark_session import embedded_session

    parser = argparse.ArgumentParser(prog="python -m benchmarks.nexmark.bench",
                                     description="Nexmark queries on streamsnap, events/s per core")
    parser.add_argument("--query", action="append", choices=list(catalog.QUERIES),
                        help="a query to run (repeat for several; default: all)")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--state", action="append", choices=STATES,
                        help="rocksdb / heap: exactly-once checkpoints with that state backend; none: no "
                             "checkpoints (repeat for several; default: rocksdb and heap)")
    parser.add_argument("--checkpoint-interval", type=float, default=10.0, help="seconds (default 10, as Flink's suite)")
    parser.add_argument("--spark", action="store_true",
                        help="also run the chosen queries Spark SS expresses, over --events events")
    args = parser.parse_args(argv)
    if args.events < 1 or args.runs < 1 or args.checkpoint_interval <= 0:
        parser.error("--events and --runs must be >= 1 and --checkpoint-interval > 0")
    spark = embedded_session(16)
    results: dict = {"errors": {}}
    states = args.state or list(DEFAULT_STATES)
    run_streamsnap_all(spark, args.events, args.runs, results, args.query, states, args.checkpoint_interval)
    if args.spark:
        run_spark_all(spark, args.events, args.runs, results, args.query, args.checkpoint_interval)
    for name, per_state in results["nexmark"].get("queries", {}).items():
        for state, r in per_state.items():
            details = r["details"][-1]
            print(f"{name}: {r['per_core']:,.0f} events/s per core ({r['events_per_second']:,.0f} events/s at "
                  f"parallelism {PARALLELISM}), {args.events:,} events, state {state}, "
                  f"{details['checkpoints']} checkpoints, {details['output_rows']:,} output rows", flush=True)
    print()
    print(report.render_nexmark_table(results))
    for what, error in results["errors"].items():
        print(f"{what} failed: {error}")
    if results["errors"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
