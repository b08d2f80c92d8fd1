"""Spark Structured Streaming baselines for the side-by-side benchmarks.

Every function takes the suite's existing `SparkSession` (it never creates or stops one), runs
one streaming query to completion (or for a fixed time), stops it, restores every session conf it
changed, and returns plain numbers. Workload W1, "keyed running sum": row `i` of `n` has
`key = i % k`, `value = i` (int64); a per-key running sum is kept in state and the output is
consumed and discarded.

- `write_w1_input`                     W1 as Parquet files, written with pyarrow.
- `run_sql_aggregation`                `groupBy(key).agg(sum(value))`, update mode, RocksDB state.
- `run_transform_with_state_in_pandas` the same with `transformWithStateInPandas` and a
                                       `ValueState` per key, one output row per input row.
- `run_processing_time`                either query as a long-running stream (processing-time
                                       trigger, checkpoint location) until it has read the input.
- `run_microbatch_latency`             event-creation -> sink latency of the micro-batch engine
                                       on the same keyed sum, fed by the `rate` source.

The session conf is session-wide: while a function runs, other code on the same session sees the
RocksDB provider and its shuffle-partition count (the query itself keeps its own copy taken at
`start()`). Do not run these functions concurrently with each other on one session.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Callable, Iterator

import numpy as np

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
SHUFFLE_CONF = "spark.sql.shuffle.partitions"
PROGRESS_RETENTION_CONF = "spark.sql.streaming.numRecentProgressUpdates"

W1_SCHEMA_DDL = "key BIGINT, value BIGINT, ts DOUBLE"
TWS_OUTPUT_DDL = "key BIGINT, value BIGINT, running_sum BIGINT"

Sink = Callable[[Any, int], None]  # foreachBatch(batch_df, batch_id)


# --- input -----------------------------------------------------------------------------------

def write_w1_input(directory: str, n: int, k: int, files: int = 8) -> None:
    """Write W1's `n` rows as `files` Parquet files in `directory` (created if missing).

    Columns: `key` int64 = i % k, `value` int64 = i, `ts` float64 = 0.0 (an event-time
    placeholder). Rows are split into contiguous, near-equal ranges: `part-00000.parquet` holds the
    first range, `part-00001.parquet` the next, and so on (zero-padded, so name order = row order),
    and the files get strictly increasing modification times in the same order, because Spark's
    file stream source orders files by modification time. Each file is written under a hidden
    temporary name and renamed into place, so a reader never sees a half-written file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not isinstance(n, int) or n < 0:
        raise ValueError(f"write_w1_input: n must be an integer >= 0, got {n!r}")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"write_w1_input: k must be an integer >= 1, got {k!r}")
    if not isinstance(files, int) or files < 1:
        raise ValueError(f"write_w1_input: files must be an integer >= 1, got {files!r}")
    os.makedirs(directory, exist_ok=True)
    existing = sorted(f for f in os.listdir(directory) if f.endswith(".parquet"))
    if existing:
        raise FileExistsError(
            f"write_w1_input: {directory!r} already holds Parquet files ({existing[0]}, ...); "
            f"a stream over it would read both inputs. Use an empty or new directory.")
    schema = pa.schema([("key", pa.int64()), ("value", pa.int64()), ("ts", pa.float64())])
    bounds = np.linspace(0, n, files + 1).round().astype(np.int64)
    base_ns = time.time_ns() - (files + 1) * 1_000_000_000
    for j in range(files):
        values = np.arange(bounds[j], bounds[j + 1], dtype=np.int64)
        table = pa.Table.from_arrays(
            [pa.array(values % k), pa.array(values), pa.array(np.zeros(len(values)))],
            schema=schema)
        final = os.path.join(directory, f"part-{j:05d}.parquet")
        tmp = os.path.join(directory, f".part-{j:05d}.parquet.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, final)
        # Whole seconds apart: Spark keeps file times in milliseconds; some file systems store
        # them at coarser grain.
        mtime_ns = base_ns + j * 1_000_000_000
        os.utime(final, ns=(mtime_ns, mtime_ns))


def _w1_input_rows(input_dir: str) -> tuple[int, int]:
    """(number of Parquet files, total rows) in a W1 input directory; clear errors otherwise."""
    import pyarrow.parquet as pq

    if not os.path.exists(input_dir):
        raise FileNotFoundError(
            f"W1 input directory {input_dir!r} does not exist (write it with write_w1_input)")
    if not os.path.isdir(input_dir):
        raise NotADirectoryError(f"W1 input {input_dir!r} is not a directory")
    names = sorted(f for f in os.listdir(input_dir)
                   if f.endswith(".parquet") and not f.startswith((".", "_")))
    if not names:
        raise FileNotFoundError(
            f"W1 input directory {input_dir!r} holds no Parquet files (write it with "
            f"write_w1_input)")
    rows = sum(pq.ParquetFile(os.path.join(input_dir, f)).metadata.num_rows for f in names)
    return len(names), rows


def _check_fresh_checkpoint(checkpoint_dir: str) -> None:
    # A reused checkpoint would resume where its last run stopped and read nothing new, and the
    # batch/row accounting below assumes the query starts at batch 0.
    if os.path.isdir(checkpoint_dir) and os.listdir(checkpoint_dir):
        raise FileExistsError(
            f"checkpoint directory {checkpoint_dir!r} is not empty; every run needs a new one "
            f"(a reused checkpoint resumes the old query and reads nothing new)")
    if os.path.exists(checkpoint_dir) and not os.path.isdir(checkpoint_dir):
        raise NotADirectoryError(f"checkpoint location {checkpoint_dir!r} is a file")


# --- session conf ----------------------------------------------------------------------------

@contextlib.contextmanager
def _session_conf(spark, settings: dict[str, str]) -> Iterator[None]:
    """Set runtime SQL confs for the duration; afterwards restore each one exactly as it was
    (re-set to its previous explicit value, or unset if it had none)."""
    saved: dict[str, str | None] = {}
    try:
        for key, value in settings.items():
            saved[key] = spark.conf.get(key, None)
            spark.conf.set(key, value)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def _stateful_confs(spark, shuffle_partitions: int, batches_hint: int) -> dict[str, str]:
    if not isinstance(shuffle_partitions, int) or shuffle_partitions < 1:
        raise ValueError(f"shuffle_partitions must be an integer >= 1, got {shuffle_partitions!r}")
    retention = int(spark.conf.get(PROGRESS_RETENTION_CONF, "100"))
    return {
        PROVIDER_CONF: ROCKSDB_PROVIDER,
        SHUFFLE_CONF: str(shuffle_partitions),
        # Keep every batch's progress so batches/rows are counted from recentProgress exactly.
        PROGRESS_RETENTION_CONF: str(max(retention, batches_hint + 10)),
    }


# --- running a query -------------------------------------------------------------------------

def _stop(query) -> None:
    if query is not None and query.isActive:
        query.stop()


def _executed_batches(query) -> list[dict]:
    """Progress of the micro-batches that ran (idle "no new data" reports have no addBatch)."""
    seen: dict[int, dict] = {}
    for progress in query.recentProgress:
        if "addBatch" in (progress["durationMs"] or {}):
            seen[int(progress["batchId"])] = progress
    return [seen[b] for b in sorted(seen)]


def _run_available_now(spark, stream_df, input_dir: str, checkpoint_dir: str,
                       shuffle_partitions: int, output_mode: str, sink: Sink | None,
                       expected_rows: int, files: int, name: str, files_out: dict | None = None) -> dict:
    """`files_out` ({"path": ..., "partition_by": [...]}): Spark's own Parquet file sink instead of
    `sink` (foreachBatch) or, with neither, the noop sink."""
    writer = stream_df.writeStream.outputMode(output_mode)
    if files_out is not None:
        if sink is not None:
            raise ValueError(f"{name}: give a foreachBatch sink or files_out, not both")
        writer = writer.format("parquet").option("path", files_out["path"]).partitionBy(
            *files_out.get("partition_by", ()))
    else:
        writer = writer.format("noop") if sink is None else writer.foreachBatch(sink)
    writer = writer.option("checkpointLocation", checkpoint_dir).trigger(availableNow=True)
    query = None
    with _session_conf(spark, _stateful_confs(spark, shuffle_partitions, files)):
        try:
            started = time.perf_counter()
            query = writer.start()
            query.awaitTermination()
            seconds = time.perf_counter() - started
        finally:
            _stop(query)
    batches = _executed_batches(query)
    batch_rows = [int(p["numInputRows"]) for p in batches]
    read = sum(batch_rows)
    if read != expected_rows:
        raise RuntimeError(
            f"{name}: the query read {read} rows in {len(batches)} micro-batches, but "
            f"{input_dir!r} holds {expected_rows}")
    return {"seconds": seconds, "rows": read, "batches": len(batches),
            "batch_rows": batch_rows,
            "batch_seconds": [int(p["durationMs"]["triggerExecution"]) / 1000.0 for p in batches]}


def steady_rate(run: dict) -> float:
    """Rows per second of the micro-batches after the first, each timed by Spark itself from
    trigger to commit (planning, reading, state-store commit, offset and commit logs): the
    engine's sustained throughput, without query start-up or the first batch's warm-up."""
    rows, seconds = run["batch_rows"][1:], run["batch_seconds"][1:]
    if not rows or sum(seconds) <= 0:
        raise ValueError(f"steady_rate needs at least two timed micro-batches, got {len(run['batch_rows'])}")
    return sum(rows) / sum(seconds)


def _w1_stream(spark, input_dir: str, max_files_per_trigger: int | None):
    reader = spark.readStream.schema(W1_SCHEMA_DDL)
    if max_files_per_trigger is not None:
        if not isinstance(max_files_per_trigger, int) or max_files_per_trigger < 1:
            raise ValueError(f"max_files_per_trigger must be an integer >= 1 or None, "
                             f"got {max_files_per_trigger!r}")
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    # None: the option stays unset, and Spark's file source then takes every new file at once.
    return reader.parquet(input_dir)


# --- W1 throughput: SQL aggregation ----------------------------------------------------------

def sql_aggregation_stream(spark, input_dir: str, max_files_per_trigger: int | None = None):
    """W1 as Spark SQL over the Parquet files: `groupBy("key").agg(sum("value"))` (update mode)."""
    from pyspark.sql import functions as F

    return _w1_stream(spark, input_dir, max_files_per_trigger).groupBy("key").agg(F.sum("value").alias("sum"))


def run_sql_aggregation(spark, input_dir: str, checkpoint_dir: str, shuffle_partitions: int = 2,
                        *, max_files_per_trigger: int | None = None,
                        sink: Sink | None = None) -> dict:
    """W1 as Spark SQL: `groupBy("key").agg(sum("value"))`, update mode, RocksDB state store,
    `trigger(availableNow=True)` over the Parquet files in `input_dir`.

    Returns `{"seconds", "rows", "batches", "batch_rows", "batch_seconds"}`: wall time from
    `start()` to termination (so it includes query start-up, planning, and the final
    state/offset commits), rows read, micro-batches run, and each micro-batch's input rows and
    trigger-to-commit time (from `query.recentProgress`; see `steady_rate`).

    `max_files_per_trigger=None` (default) reads all files in ONE micro-batch: that is Spark's
    most favourable throughput setting (per-batch costs - planning, state-store commit, offset
    and commit logs - are paid once), so the ratio against streamsnap is not inflated by a
    batch size we picked. Pass e.g. 1 to pay them once per file (8 batches for the default
    input), which is closer to a stream that checkpoints while it runs.

    `sink=None` discards the output through the `noop` sink; a callable `sink(batch_df,
    batch_id)` is used as a `foreachBatch` sink instead (tests use it to check the sums).
    `checkpoint_dir` must be new or empty.
    """
    files, expected = _w1_input_rows(input_dir)
    _check_fresh_checkpoint(checkpoint_dir)
    stream = sql_aggregation_stream(spark, input_dir, max_files_per_trigger)
    return _run_available_now(spark, stream, input_dir, checkpoint_dir, shuffle_partitions,
                              "update", sink, expected, files, "run_sql_aggregation")


# --- W1 throughput: transformWithStateInPandas -------------------------------------------------

try:
    from pyspark.sql.streaming import StatefulProcessor as _StatefulProcessorBase
except ImportError:  # pragma: no cover - pyspark < 4.0
    _StatefulProcessorBase = object


class RunningSum(_StatefulProcessorBase):
    """Per-key running sum for `transformWithStateInPandas`: a `ValueState` holds the key's sum;
    each input row yields `(key, value, running_sum)`, computed with one `numpy.cumsum` per pandas
    chunk of the key's rows. The state is read once and written once per key and micro-batch.
    Within a micro-batch the rows of a key arrive in shuffle order, not `i` order, so the running
    sums are the prefix sums of that order (the last one is the key's total either way)."""

    def init(self, handle) -> None:
        from pyspark.sql.types import LongType, StructField, StructType

        self._sum = handle.getValueState(
            "running_sum", StructType([StructField("sum", LongType(), False)]))

    def handleInputRows(self, key, rows, timerValues):
        import pandas as pd

        state = self._sum.get()
        carry = int(state[0]) if state is not None else 0
        out = []
        for pdf in rows:
            if len(pdf) == 0:
                continue
            values = pdf["value"].to_numpy(dtype=np.int64)
            sums = np.cumsum(values)
            sums += carry
            carry = int(sums[-1])
            out.append(pd.DataFrame({"key": pdf["key"].to_numpy(dtype=np.int64),
                                     "value": values, "running_sum": sums}))
        # Update before yielding: the output is consumed lazily, after this call returns.
        self._sum.update((carry,))
        yield from out

    def close(self) -> None:
        pass


def missing_tws_dependencies() -> list[str]:
    """The modules transformWithStateInPandas needs that are not installed."""
    return [name for name in ("pandas", "google.protobuf") if _find_spec(name) is None]


def _require_tws_dependencies() -> None:
    missing = missing_tws_dependencies()
    if missing:
        raise ImportError(
            "transformWithStateInPandas needs the Python packages pandas and protobuf (PySpark "
            f"talks to the state store over protobuf); missing: {', '.join(missing)}. "
            "Install them, e.g. `pip install pandas protobuf`.")


def _find_spec(name: str):
    import importlib.util

    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:  # the parent package is missing
        return None


def transform_with_state_stream(spark, input_dir: str, max_files_per_trigger: int | None = None):
    """W1 with `transformWithStateInPandas(RunningSum())` over the Parquet files (append mode,
    one output row per input row; only `key` and `value` reach the processor)."""
    _require_tws_dependencies()
    return (_w1_stream(spark, input_dir, max_files_per_trigger)
            .select("key", "value")
            .groupBy("key")
            .transformWithStateInPandas(statefulProcessor=RunningSum(), outputStructType=TWS_OUTPUT_DDL,
                                        outputMode="Append", timeMode="None"))


def run_processing_time(spark, stream_df, output_mode: str, input_dir: str, checkpoint_dir: str,
                        shuffle_partitions: int = 2, trigger_seconds: float = 1.0, timeout: float = 1800.0,
                        output_dir: str | None = None) -> dict:
    """Run a W1 query as a long-running stream: `trigger(processingTime=...)`, a
    `checkpointLocation`, RocksDB state, `noop` sink (or, with `output_dir`, Spark's Parquet file
    sink there: exactly-once through its `_spark_metadata` log); stop it once its micro-batches
    have read every row of `input_dir`.

    Returns `{"seconds", "rows", "batches"}`: seconds from `start()` until the progress report of
    the micro-batch that read the last row is seen (polled every 20 ms) — query start-up,
    planning, every batch and its state-store, offset and commit logs included.
    """
    files, expected = _w1_input_rows(input_dir)
    _check_fresh_checkpoint(checkpoint_dir)
    writer = (stream_df.writeStream.outputMode(output_mode).format("noop" if output_dir is None else "parquet")
              .option("checkpointLocation", checkpoint_dir).trigger(processingTime=f"{trigger_seconds} seconds"))
    if output_dir is not None:
        writer = writer.option("path", output_dir)
    query = None
    with _session_conf(spark, _stateful_confs(spark, shuffle_partitions, files)):
        try:
            started = time.perf_counter()
            query = writer.start()
            deadline = started + timeout
            while True:
                batches = _executed_batches(query)
                read = sum(int(p["numInputRows"]) for p in batches)
                if read >= expected:
                    seconds = time.perf_counter() - started
                    break
                if query.exception() is not None or not query.isActive:
                    raise RuntimeError(f"run_processing_time: the query stopped after {read} of {expected} rows: "
                                       f"{query.exception()}")
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"run_processing_time: {read} of {expected} rows after {timeout:g} s")
                time.sleep(0.02)
        finally:
            _stop(query)
    if read != expected:
        raise RuntimeError(f"run_processing_time: the query read {read} rows, but {input_dir!r} holds {expected}")
    return {"seconds": seconds, "rows": read, "batches": len(batches)}


def run_transform_with_state_in_pandas(spark, input_dir: str, checkpoint_dir: str,
                                       shuffle_partitions: int = 2, *,
                                       max_files_per_trigger: int | None = None,
                                       sink: Sink | None = None) -> dict:
    """W1 with the arbitrary-state API: `groupBy("key").transformWithStateInPandas(RunningSum(),
    outputStructType="key long, value long, running_sum long", outputMode="Append",
    timeMode="None")`, RocksDB state store, `trigger(availableNow=True)`, `noop` sink.

    One output row per input row. Only `key` and `value` are passed to the processor (the `ts`
    placeholder is pruned, as a user would). Same return shape, defaults and `sink`/
    `max_files_per_trigger` options as `run_sql_aggregation`. Needs pandas and protobuf.
    """
    files, expected = _w1_input_rows(input_dir)
    _check_fresh_checkpoint(checkpoint_dir)
    stream = transform_with_state_stream(spark, input_dir, max_files_per_trigger)
    return _run_available_now(spark, stream, input_dir, checkpoint_dir, shuffle_partitions,
                              "append", sink, expected, files,
                              "run_transform_with_state_in_pandas")


# --- latency ---------------------------------------------------------------------------------

def _offset_seconds(offset) -> int:
    """A rate-source offset from a progress report (whole seconds; None/"null" before batch 0)."""
    if isinstance(offset, str):
        offset = json.loads(offset)
    return 0 if offset is None else int(offset)


def _rate_source_start_ms(checkpoint_dir: str) -> int:
    """The rate source's start time: `timestamp` of row v is start + v * 1000 / rowsPerSecond ms.

    Spark keeps it in the source's metadata log, `<checkpoint>/sources/0/0`, as "v1\\n<ms>"."""
    path = os.path.join(checkpoint_dir, "sources", "0", "0")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split()
        return int(lines[-1])
    except (OSError, ValueError, IndexError) as exc:
        raise RuntimeError(
            f"cannot read the rate source's start time from {path!r} ({exc}); this Spark "
            f"version keeps it elsewhere, so latencies cannot be derived") from exc


def run_microbatch_latency(spark, rate: int, seconds: float, checkpoint_dir: str,
                           trigger_interval: str | None = None, *, k: int = 1000,
                           shuffle_partitions: int = 2, num_partitions: int = 2,
                           warmup: float = 2.0) -> dict:
    """Per-row latency, event creation -> result visible at the sink, of Spark's micro-batch
    engine on W1's keyed running sum at a fixed input rate.

    Query: `rate` source (`rowsPerSecond=rate`, `numPartitions=num_partitions`), `key = value %
    k`, `groupBy("key").agg(sum("value"))` in update mode on the RocksDB state store, a Python
    `foreachBatch` sink that collects the batch's updated sums to the driver and discards them.
    Trigger: Spark's default (next batch as soon as the previous one ends) unless
    `trigger_interval` (e.g. "500 milliseconds") is given. Runs `seconds` seconds from `start()`,
    then stops the query.

    Definition. The rate source stamps row v with its creation time
    `ts(v) = start + v / rate` (evenly spaced, wall clock). A row becomes visible when the
    `foreachBatch` call of the micro-batch that contains it has collected that batch's output:
    `visible(b)` = wall clock right after the collect. Each row's latency is
    `visible(batch of v) - ts(v)`, for EVERY input row (not one sample per batch or key). The
    rows of a batch are known exactly from its progress report (rate-source offsets are whole
    seconds: the batch covers rows `[start_s * rate, end_s * rate)`, checked against its
    numInputRows), and `start` is read from the source's checkpoint metadata, so the aggregation
    carries no extra columns or state for the measurement. Rows of the batch still running when
    the query is stopped are never visible and are not sampled, nor are rows created in the
    first `warmup` seconds after the source started (query start-up, code generation,
    state-store creation; 2 s, as streamsnap's latency sink).

    Caveat, fairness: the rate source releases rows in whole seconds - row v only becomes
    readable at `start + (floor(v / rate) + 1) s` - so the latency above includes 0-1 s (0.5 s
    on average) of waiting inside the test source that a push source such as Kafka would not
    add. `p50_after_release`/`p99_after_release` measure from that release instead: the engine's
    own share (polling, planning, shuffle, state, sink), a lower bound for what Spark could do
    with a real source. Use `p50`/`p99` for "creation -> visible" as defined, the release-based
    pair to compare engines alone.

    Returns `{"p50", "p99", "samples", "batches", "p50_after_release", "p99_after_release"}`
    in seconds; `samples` = rows measured, `batches` = micro-batches they came from.
    """
    from pyspark.sql import functions as F

    if not isinstance(rate, int) or rate < 1:
        raise ValueError(f"rate must be an integer >= 1 (rows per second), got {rate!r}")
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if not isinstance(num_partitions, int) or num_partitions < 1:
        raise ValueError(f"num_partitions must be an integer >= 1, got {num_partitions!r}")
    if not warmup >= 0:
        raise ValueError(f"warmup must be >= 0 seconds, got {warmup!r}")
    _check_fresh_checkpoint(checkpoint_dir)

    visible: dict[int, float] = {}

    def on_batch(batch_df, batch_id: int) -> None:
        batch_df.collect()  # the updated sums reach the sink here; consumed and discarded
        visible[batch_id] = time.time()

    stream = (spark.readStream.format("rate")
              .option("rowsPerSecond", rate).option("numPartitions", num_partitions).load()
              .select((F.col("value") % k).alias("key"), F.col("value"))
              .groupBy("key").agg(F.sum("value").alias("sum")))
    writer = (stream.writeStream.outputMode("update").foreachBatch(on_batch)
              .option("checkpointLocation", checkpoint_dir))
    if trigger_interval is not None:
        writer = writer.trigger(processingTime=trigger_interval)
    query = None
    # At most one batch with data per second (offsets are whole seconds), plus empty ones.
    confs = _stateful_confs(spark, shuffle_partitions, 2 * int(seconds) + 10)
    with _session_conf(spark, confs):
        try:
            query = writer.start()
            deadline = time.monotonic() + seconds
            while query.isActive:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                query.awaitTermination(min(0.25, max(0.01, left)))  # Spark wants >= 1 ms
            failure = query.exception()
        finally:
            _stop(query)
    if failure is not None:
        raise RuntimeError(f"run_microbatch_latency: the query failed: {failure}")

    start_ms = _rate_source_start_ms(checkpoint_dir)
    data_batches = []
    for progress in _executed_batches(query):
        batch_id = int(progress["batchId"])
        source = progress["sources"][0]
        first_s, end_s = _offset_seconds(source["startOffset"]), _offset_seconds(source["endOffset"])
        rows = int(progress["numInputRows"])
        if rows == 0 or batch_id not in visible:
            continue
        if rows != (end_s - first_s) * rate:
            raise RuntimeError(
                f"run_microbatch_latency: batch {batch_id} read {rows} rows for rate-source "
                f"seconds [{first_s}, {end_s}) at {rate} rows/s; expected {(end_s - first_s) * rate}")
        data_batches.append((batch_id, first_s, end_s))
    first_sampled = int(np.ceil(warmup * rate))  # rows v with v / rate < warmup are warm-up
    created, released, batches = [], [], 0
    for batch_id, first_s, end_s in data_batches:
        v = np.arange(max(first_s * rate, first_sampled), end_s * rate, dtype=np.int64)
        if v.size == 0:
            continue
        batches += 1
        visible_ms = visible[batch_id] * 1000.0
        created.append(visible_ms - (start_ms + v * (1000.0 / rate)))
        released.append(visible_ms - (start_ms + (v // rate + 1) * 1000.0))
    if not batches:
        raise RuntimeError(
            f"run_microbatch_latency: no row to measure after {seconds} s ({len(data_batches)} "
            f"micro-batches with data, rows of the first {warmup} s left out as warm-up); "
            f"run longer")
    lat = np.concatenate(created) / 1000.0
    lat_release = np.concatenate(released) / 1000.0
    return {
        "p50": float(np.percentile(lat, 50)),
        "p99": float(np.percentile(lat, 99)),
        "samples": int(lat.size),
        "batches": batches,
        "p50_after_release": float(np.percentile(lat_release, 50)),
        "p99_after_release": float(np.percentile(lat_release, 99)),
    }
