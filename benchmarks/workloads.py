"""The streamsnap side of the benchmarks: W1 in its two forms, and the jobs behind each figure.

W1 "keyed running sum": N rows (key = i % K, value = i), parallelism 2, a keyed shuffle, the
per-key running sum in keyed state, every running sum emitted to a sink that discards it.
Throughput is timed inside the job, between the first and the last row reaching the sink, so
deployment and teardown do not count (checkpoint pauses and the final checkpoint do).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
import uuid

import numpy as np
import psutil
import pyarrow as pa

import streamsnap as ss
from streamsnap.cluster.status import JobStatus
from streamsnap.connectors.base import Sink, SinkWriter

PARALLELISM = 2
_checkpoint_root: str | None = None


def _checkpoint_dir(prefix: str) -> str:
    """A fresh checkpoint directory under one per-process root that `cleanup` removes."""
    global _checkpoint_root
    if _checkpoint_root is None:
        _checkpoint_root = tempfile.mkdtemp(prefix="ssbench-")
    return tempfile.mkdtemp(prefix=prefix, dir=_checkpoint_root)


def cleanup() -> None:
    """Delete every checkpoint the workloads wrote in this process."""
    global _checkpoint_root
    if _checkpoint_root is not None:
        shutil.rmtree(_checkpoint_root, ignore_errors=True)
        _checkpoint_root = None


def cancel_and_wait(client, timeout: float) -> None:
    """End a measured job by cancelling it; a job that failed instead is an error of the run."""
    client.cancel()
    try:
        client.wait(timeout)
    except ss.JobExecutionError:
        if client.status() != "CANCELED":
            raise


def _batch_size(form: str) -> int:
    return 65536 if form == "batch" else 8192


def _median_or_nan(values) -> float:
    return float(np.median(values)) if len(values) else float("nan")


def _percentile_or_nan(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


class RowRunningSum(ss.KeyedProcessFunction):
    """W1, per-row API."""

    def open(self, ctx):
        self.total = ctx.get_state(ss.ValueStateDescriptor("total", default=0))

    def process_element(self, row, ctx):
        total = self.total.value() + row["value"]
        self.total.update(total)
        return {"key": ctx.current_key, "total": total, "ts": row["ts"]}


class BatchRunningSum(ss.KeyedBatchFunction):
    """W1, vectorized API: per batch, per-key running sums with numpy, state per distinct key."""

    def open(self, ctx):
        self.total = ctx.get_state(ss.ValueStateDescriptor("total", default=0))

    def process_batch(self, batch, keys):
        start = np.array(self.total.get_many(keys), dtype=np.int64)
        running, totals = ss.group_cumsum(batch.column("value").to_numpy(), keys.index, start)
        self.total.put_many(keys, totals)
        return pa.RecordBatch.from_arrays([batch.column("key"), pa.array(running), batch.column("ts")],
                                          names=["key", "total", "ts"])


def _w1_rows(k: int, stamp: bool):
    def rows(indices: np.ndarray):
        ts = np.full(len(indices), time.time() if stamp else 0.0)
        return {"key": indices % k, "value": indices, "ts": ts}
    return rows


def build_w1(env: ss.StreamEnvironment, n: int | None, k: int, form: str, sink, rate: float | None = None,
             batch_size: int = 8192, stamp: bool = False, slow_sink: float = 0.0):
    if form not in ("row", "batch"):
        raise ValueError(f"W1 form must be 'row' (process) or 'batch' (process_batches), got {form!r}")
    keyed = env.from_source(ss.sources.Generator(_w1_rows(k, stamp), count=n, rate=rate, vectorized=True,
                                                 batch_size=batch_size),
                            name="events", uid="events").key_by("key")
    out = (keyed.process(RowRunningSum(), name="sum", uid="sum") if form == "row"
           else keyed.process_batches(BatchRunningSum(), name="sum", uid="sum"))
    if slow_sink:
        out = out.map_batches(_Throttle(slow_sink), name="slow", uid="slow")
    out.sink_to(sink, name="sink", uid="sink")


class _Throttle:
    """Sleeps `seconds_per_row` per row: a slow consumer that backpressures the job."""

    def __init__(self, seconds_per_row: float):
        self.seconds_per_row = seconds_per_row

    def __call__(self, batch):
        time.sleep(batch.num_rows * self.seconds_per_row)
        return batch


def _environment(spark, form: str, checkpoint_interval: float | None, network: ss.NetworkConfig | None = None,
                 unaligned: bool = False, aligned_timeout: float | None = None):
    checkpointing = None
    if checkpoint_interval is not None:
        checkpointing = ss.CheckpointConfig(interval=checkpoint_interval, directory=_checkpoint_dir("ckpt-"),
                                            unaligned=unaligned, aligned_timeout=aligned_timeout)
    return ss.StreamEnvironment(parallelism=PARALLELISM, spark=spark, checkpointing=checkpointing,
                                network=network or ss.NetworkConfig(batch_size=_batch_size(form)))


class _TimingWriter(SinkWriter):
    """Discards rows, remembering when the first and the last arrived (and how many)."""

    def __init__(self, ctx):
        self._ctx = ctx
        self.first = self.last = None
        self.rows = 0

    def write(self, batch) -> None:
        now = time.time()
        if self.first is None:
            self.first = now
        self.last = now
        self.rows += batch.num_rows if hasattr(batch, "num_rows") else len(batch)

    def end_input(self) -> None:
        self._ctx.driver.send({"type": "sink", "uid": self._ctx.uid, "op": "timing",
                               "subtask": self._ctx.subtask_index, "first": self.first, "last": self.last,
                               "rows": self.rows})


class _Timings:
    def __init__(self):
        self.reports: list[dict] = []

    def on_message(self, subtask: int, message: dict) -> None:
        self.reports.append(message)


class TimingSink(Sink):
    """A discarding sink that measures throughput inside the job (no start-up, no teardown)."""

    def __init__(self):
        self.timings = None

    def create_writer(self, ctx) -> SinkWriter:
        return _TimingWriter(ctx)

    def create_driver_component(self):
        self.timings = _Timings()
        return self.timings

    def __getstate__(self):
        return {**self.__dict__, "timings": None}  # driver-side only

    def events_per_second(self) -> float:
        return rows_per_second(self.timings.reports)


def rows_per_second(reports: list[dict]) -> float:
    """Rows over all sink subtasks / (last arrival at any - first arrival at any); each report
    holds one subtask's `first`, `last` (epoch seconds, None without rows) and `rows`."""
    reports = [r for r in reports if r["first"] is not None]
    rows = sum(r["rows"] for r in reports)
    span = max(r["last"] for r in reports) - min(r["first"] for r in reports)
    return rows / span


def run_w1(spark, n: int, k: int, form: str, checkpoint_interval: float | None) -> dict:
    """One W1 run of n rows: events/s between the first and the last row at the sink."""
    env = _environment(spark, form, checkpoint_interval)
    sink = TimingSink()
    build_w1(env, n, k, form, sink, batch_size=_batch_size(form))
    result = env.execute(f"W1 {form} n={n}")
    checkpoints = result.checkpoints.counts.completed if result.checkpoints else 0
    return {"events_per_second": sink.events_per_second(), "duration": result.duration, "checkpoints": checkpoints}


def w1_throughput(spark, n: int, k: int, form: str, checkpoint_interval: float | None, runs: int = 3) -> dict:
    """Median events/s over `runs` runs of n rows (after one warm-up run)."""
    run_w1(spark, max(1, n // 10), k, form, checkpoint_interval)  # warm workers and imports
    return summarize([run_w1(spark, n, k, form, checkpoint_interval) for _ in range(runs)])


def summarize(measured: list[dict]) -> dict:
    """The median events/s of `run_w1` results, with every run's figures."""
    return {"events_per_second": statistics.median(m["events_per_second"] for m in measured),
            "runs": [m["events_per_second"] for m in measured], "details": measured}



# ------------------------------------------------------------------------------- end-to-end timing
def stamp_start(directory: str) -> None:
    """Record, in a file under `directory`, the wall-clock time a source subtask started."""
    with open(os.path.join(directory, f"start-{uuid.uuid4().hex}"), "w") as f:
        f.write(repr(time.time()))


def read_starts(directory: str) -> list[float]:
    """Every time `stamp_start` recorded under `directory`."""
    starts = []
    for path in glob.glob(os.path.join(directory, "start-*")):
        with open(path) as f:
            starts.append(float(f.read()))
    return starts


class _EndWriter(SinkWriter):
    def __init__(self, ctx):
        self._ctx, self.rows = ctx, 0

    def write(self, batch) -> None:
        self.rows += batch.num_rows if hasattr(batch, "num_rows") else len(batch)

    def end_input(self) -> None:
        self._ctx.driver.send({"type": "sink", "uid": self._ctx.uid, "op": "end",
                               "subtask": self._ctx.subtask_index, "end": time.time(), "rows": self.rows})


class _Ends:
    def __init__(self):
        self.reports: list[dict] = []

    def on_message(self, subtask: int, message: dict) -> None:
        self.reports.append(message)


class EndSink(Sink):
    """Discards every row (no Arrow conversion, like `sinks.Discard`); each subtask reports its
    row count and when its input ended."""

    checks_schema = False

    def __init__(self):
        self.ends = None

    def create_writer(self, ctx) -> SinkWriter:
        return _EndWriter(ctx)

    def create_driver_component(self):
        self.ends = _Ends()
        return self.ends

    def __getstate__(self):
        return {**self.__dict__, "ends": None}  # driver-side only

# ------------------------------------------------------------------------------- latency
def since_event_creation(batch, now: float) -> np.ndarray:
    """Seconds from each row's creation stamp (`ts`, epoch seconds) to `now`."""
    if isinstance(batch, list):  # per-row output: read the stamps, do not convert the rows
        ts = np.fromiter((row["ts"] for row in batch), dtype=np.float64, count=len(batch))
    else:
        ts = batch.column("ts").to_numpy()
    return now - ts


class _LatencyWriter(SinkWriter):
    def __init__(self, ctx, warmup: float, measure):
        self._ctx = ctx
        self._samples: list[np.ndarray] = []
        self._start = time.time() + warmup
        self._measure = measure
        # Throughput of the same rows (the max-rate run): first and last arrival, rows.
        self._first = self._last = None
        self._rows = 0

    def write(self, batch) -> None:
        now = time.time()
        if self._first is None:
            self._first = now
        self._last = now
        self._rows += batch.num_rows if hasattr(batch, "num_rows") else len(batch)
        if now < self._start:
            return
        self._samples.append(self._measure(batch, now))

    def _flush(self, final: bool) -> None:
        if not self._samples and not final:
            return
        lat = np.concatenate(self._samples) if self._samples else np.array([], dtype=np.float64)
        if lat.size > 200_000:
            lat = np.random.default_rng(0).choice(lat, 200_000, replace=False)
        message = {"type": "sink", "uid": self._ctx.uid, "op": "latency",
                   "subtask": self._ctx.subtask_index, "values": lat.tobytes()}
        if final:
            message.update(first=self._first, last=self._last, rows=self._rows)
        self._ctx.driver.send(message)
        self._samples = []

    def end_input(self) -> None:
        self._flush(final=True)

    def close(self) -> None:
        self._flush(final=False)


class _LatencyCollector:
    def __init__(self):
        self.samples: list[np.ndarray] = []
        self.timings: list[dict] = []
        self._lock = threading.Lock()

    def on_message(self, subtask: int, message: dict) -> None:
        with self._lock:
            values = np.frombuffer(message["values"], dtype=np.float64)
            if values.size:
                self.samples.append(values)
            if "rows" in message:
                self.timings.append({k: message[k] for k in ("first", "last", "rows")})


class LatencySink(Sink):
    """Records a latency per row after a warm-up (samples to the driver): `measure(batch, now)`,
    a module-level function, gives them; by default event creation → sink. Each subtask also
    reports its first and last arrival and its rows (`events_per_second`). Rows are read where
    they are (a per-row operator's dicts are not converted to Arrow, like `sinks.Discard`)."""

    checks_schema = False

    def __init__(self, warmup: float = 2.0, measure=since_event_creation):
        self.warmup = warmup
        self.measure = measure
        self.collector = None

    def create_writer(self, ctx) -> SinkWriter:
        return _LatencyWriter(ctx, self.warmup, self.measure)

    def create_driver_component(self):
        self.collector = _LatencyCollector()
        return self.collector

    def __getstate__(self):
        # The collector lives on the driver (it holds a lock); tasks get the sink without it.
        return {**self.__dict__, "collector": None}

    def events_per_second(self) -> float:
        return rows_per_second(self.collector.timings)

    def percentiles(self) -> dict:
        """p50 / p99 / p99.9 / max (seconds) and the number of samples the run collected."""
        lat = np.concatenate(self.collector.samples) if self.collector.samples else np.array([np.nan])
        p50, p99, p999 = np.percentile(lat, [50, 99, 99.9])
        return {"p50": float(p50), "p99": float(p99), "p999": float(p999), "max": float(np.max(lat)),
                "samples": int(lat.size)}


# The per-row latency job (W1, per-row `process`) and the rate it is run at. Its source is the
# vectorized Generator stamping each batch with the wall clock (one stamp per batch, so the
# latency of a row counts from its batch's creation); a source batch holds at most
# LATENCY_SOURCE_BATCH rows (rate-limited, a subtask emits what its rate allowed since its last
# batch, ~1 ms of rows at 1 M/s). "Half the max rate" is half of what this very job sustains
# unthrottled with the same settings — buffer timeout, network batch size, source batch size,
# checkpoint interval, sink — measured warm (`w1_latency_max_rate`); a max taken from another
# configuration (8192-row source batches, 100 ms timeout, no checkpoints) is not the ceiling of
# the job whose latency is measured, so half of it may be more than half its load.
LATENCY_SOURCE_BATCH = 1024
LATENCY_NETWORK_BATCH = 8192


def _w1_latency_job(spark, n: int, k: int, form: str, rate: float | None, buffer_timeout: float,
                    checkpoint_interval: float | None, sink: LatencySink):
    network = ss.NetworkConfig(buffer_timeout=buffer_timeout, batch_size=LATENCY_NETWORK_BATCH)
    env = _environment(spark, form, checkpoint_interval, network=network)
    build_w1(env, n, k, form, sink, rate=rate, batch_size=LATENCY_SOURCE_BATCH, stamp=True)
    return env


def w1_latency_max_rate(spark, n: int, k: int, form: str = "row", buffer_timeout: float = 0.005,
                        checkpoint_interval: float | None = 1.0, runs: int = 3) -> dict:
    """Events/s the latency job (`w1_latency`, same settings) sustains unthrottled: first to
    last row at its sink, median over `runs` runs of n rows after a warm-up run of n / 4 (a
    cold first run of fresh Python workers measures low)."""
    def one(rows: int) -> float:
        sink = LatencySink(warmup=0.0)
        env = _w1_latency_job(spark, rows, k, form, None, buffer_timeout, checkpoint_interval, sink)
        env.execute(f"W1 latency max rate {form} n={rows} timeout={buffer_timeout}")
        return sink.events_per_second()

    one(max(1, n // 4))
    rates = [one(n) for _ in range(runs)]
    return {"events_per_second": statistics.median(rates), "runs": rates, "rows": n, "form": form,
            "buffer_timeout": buffer_timeout, "checkpoint_interval": checkpoint_interval,
            "source_batch": LATENCY_SOURCE_BATCH, "network_batch": LATENCY_NETWORK_BATCH}


def w1_latency(spark, rate: float, seconds: float, k: int, form: str, buffer_timeout: float,
               checkpoint_interval: float | None = 1.0, warmup: float = 2.0) -> dict:
    """p50/p99 of event creation → sink, at a fixed rate (events/s over both subtasks); the
    benchmark runs it at half and a quarter of `w1_latency_max_rate` with the same settings."""
    sink = LatencySink(warmup=warmup)
    env = _w1_latency_job(spark, int(rate * seconds), k, form, rate, buffer_timeout, checkpoint_interval, sink)
    env.execute(f"W1 latency {form} rate={rate} timeout={buffer_timeout}")
    return {**sink.percentiles(), "rate": rate, "buffer_timeout": buffer_timeout,
            "checkpoint_interval": checkpoint_interval}


# ------------------------------------------------------------------------------- checkpoints
def _run_collecting_checkpoints(env, name: str) -> list:
    """Run the job to its end; every checkpoint it completed, by id (the history is bounded,
    so it is read while the job runs)."""
    client = env.execute_async(name)
    seen = {}
    while not JobStatus(client.status()).is_terminal:
        stats = client.checkpoint_stats()
        if stats is not None:
            for c in stats.history:
                if c.status.name == "COMPLETED":
                    seen[c.checkpoint_id] = c
        time.sleep(0.2)
    client.wait(600)
    return [seen[i] for i in sorted(seen)]


def checkpoint_cost(spark, k: int, seconds: float, interval: float = 1.0) -> dict:
    """Checkpoint duration and size with K keys in state (vectorized W1, heap backend)."""
    env = _environment(spark, "batch", interval)
    rate = max(2 * k / seconds, 2_000_000)  # touch every key (twice) within the run
    build_w1(env, int(rate * seconds), k, "batch", ss.sinks.Discard(), rate=rate, batch_size=65536)
    checkpoints = _run_collecting_checkpoints(env, f"checkpoint cost K={k}")
    checkpoints = checkpoints[1:]  # the first one runs before all keys exist
    durations = [c.end_to_end_duration for c in checkpoints]
    return {"keys": k, "checkpoints": len(checkpoints),
            "p50": _percentile_or_nan(durations, 50), "p99": _percentile_or_nan(durations, 99),
            "state_bytes": max((c.state_size for c in checkpoints), default=0),
            "sync_max": max((s.sync_duration for c in checkpoints for s in c.subtasks), default=0.0)}


ALIGNED_TIMEOUT = 0.1   # seconds from the checkpoint's trigger before its barriers go unaligned
DEBLOAT_TARGET = 0.2    # seconds (Flink's default is 1 s; the backpressured in-flight data here is ~1-2 s)


def backpressure(spark, seconds: float, k: int = 1000) -> dict:
    """Alignment and checkpoint duration with a slow sink, against the same job unthrottled,
    and the backpressured job again with unaligned checkpoints, with checkpoints that start
    aligned and switch to unaligned after `ALIGNED_TIMEOUT` from their trigger, and with buffer
    debloating (aligned, `NetworkConfig(debloat_target=DEBLOAT_TARGET)`).

    The throttled sink takes 15 µs a row: ~130 K rows/s over both subtasks against 200 K/s of
    input, so buffers fill, sources are held back by credits, and aligned barriers queue behind
    the buffered data; unaligned ones overtake it and persist it instead; debloated frames keep
    that data to about the target's worth of processing."""
    out = {}
    for label, throttle, unaligned, timeout, debloat in (
            ("free", 0.0, False, None, None), ("backpressured", 1.5e-5, False, None, None),
            ("unaligned", 1.5e-5, True, None, None), ("aligned_timeout", 1.5e-5, True, ALIGNED_TIMEOUT, None),
            ("debloated", 1.5e-5, False, None, DEBLOAT_TARGET)):
        env = _environment(spark, "row", 1.0, network=ss.NetworkConfig(batch_size=8192, debloat_target=debloat),
                           unaligned=unaligned, aligned_timeout=timeout)
        rate = 200_000
        build_w1(env, int(rate * seconds), k, "row", ss.sinks.Discard(), rate=rate, slow_sink=throttle)
        checkpoints = _run_collecting_checkpoints(env, f"backpressure {label}")
        # Only the keyed subtasks align (two input channels each); sources have nothing to align.
        keyed = [s for c in checkpoints for s in c.subtasks if not s.vertex_id.startswith("events")]
        alignment = [s.alignment_duration for s in keyed]
        start_delay = [s.start_delay for s in keyed]
        durations = [c.end_to_end_duration for c in checkpoints]
        persisted = [sum(s.bytes_persisted_of_in_flight_data for s in c.subtasks) for c in checkpoints]
        out[label] = {"checkpoints": len(checkpoints), "debloat_target": debloat, "aligned_timeout": timeout,
                      "unaligned_subtasks": sum(s.unaligned for s in keyed), "keyed_subtasks": len(keyed),
                      "persisted_in_flight_bytes_p50": _median_or_nan(persisted),
                      "persisted_in_flight_bytes_max": max(persisted, default=0),
                      "start_delay_p50": _median_or_nan(start_delay),
                      "alignment_p50": _median_or_nan(alignment),
                      "alignment_max": max(alignment, default=float("nan")),
                      "duration_p50": _median_or_nan(durations),
                      "duration_max": max(durations, default=float("nan"))}
    return out


# ------------------------------------------------------------------------------- recovery
def recovery_time(spark, kills: int = 5, rate: float = 100_000, k: int = 1000, victim: str = "subtask") -> dict:
    """SIGKILL → first row at a sink after the restore, per kill (W1: a per-row keyed `process`
    behind a vectorized rate-limited Generator, a discarding sink, checkpoints every 1 s).

    victim "subtask": a keyed subtask's process (restarted in the slots that survived);
    "slot": the Spark task's Python worker that supervises it (a lost slot: a new Spark stage)."""
    if victim not in ("subtask", "slot"):
        raise ValueError(f"victim must be 'subtask' or 'slot', got {victim!r}")
    env = ss.StreamEnvironment(parallelism=PARALLELISM, spark=spark,
                               checkpointing=ss.CheckpointConfig(interval=1.0,
                                                                 directory=_checkpoint_dir("rec-")),
                               restart=ss.RestartStrategy.fixed_delay(attempts=kills + 1, delay=0.0))
    build_w1(env, None, k, "row", ss.sinks.Discard(), rate=rate)
    client = env.execute_async("recovery")
    while client.status() != "RUNNING":
        time.sleep(0.05)
    times, phases = [], []
    for i in range(kills):
        time.sleep(2.0)
        pid = [s for s in client.subtasks() if s.vertex == "sum"][i % PARALLELISM].pid
        if victim == "slot":
            pid = psutil.Process(pid).ppid()
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            recoveries = client.recoveries()
            if len(recoveries) > i and "first_output_at" in recoveries[i]:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no output within 60 s after kill {i}")
            time.sleep(0.01)
        r = recoveries[i]
        times.append(r["first_output_at"] - killed)
        phases.append({"noticed": r["failed_at"] - killed, "running": r["running_at"] - killed,
                       "first_output": r["first_output_at"] - killed, "restart": r.get("restart")})
    client.cancel()
    return {"median": statistics.median(times), "runs": times, "phases": phases, "victim": victim}
