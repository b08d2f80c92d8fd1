"""The per-row API as the README writes it: W1 and the word count, end to end.

Both pipelines are written exactly as a user writes them from the README — a per-row
`Generator(lambda i: {...})` source (no vectorized source in front), per-row operators on dicts,
keyed state through `ValueState` — so these figures are what a user starting from the README
gets, beside the vectorized forms of `workloads.py`.

* **W1 per-row, README way**: `Generator(lambda i: {"key": i % K, "value": i})` → `key_by("key")`
  → a `KeyedProcessFunction` whose `process_element` emits every running sum
  (`{"key", "total"}`) → a discarding sink. Rate: source rows / s.
  At parallelism 2 it also runs on RocksDB (`state_backend="rocksdb"`), and on RocksDB
  without its write cache (`RocksDBConfig(write_cache_size=0)`: a native get and put per row),
  each against the heap figure of the same run.
* **word count**: `Generator(sentence)` (five words per sentence, a function of the index) →
  `flat_map(split)` (one row per word) → `map` (lower-cases the word) → `filter` (drops empty
  words: none are) → `key_by("word")` → a keyed count in `ValueState`, emitting every 1000th
  count per word → a discarding sink. Rate: words / s (5 per sentence).

What a figure includes: from the source's first poll (wall clock, stamped by the source task)
to the last sink subtask's end of input — the user's generator function, every operator, the
keyed shuffle (Arrow IPC over local TCP), state access, emission to the sink, the periodic
checkpoints (when enabled) — and not deployment (Spark job start, connections, state restore),
the final checkpoint after end of input, or teardown. Default network settings
(`NetworkConfig()`: 4096-row batches, 100 ms buffer timeout) and the Generator's default batch
size, as the README's example uses them.

* **W1 per-row latency, README way** (`w1_latency_readme`): the same W1 with a rate-limited
  per-row source, `Generator(lambda i: {"key": i % K, "value": i, "ts": time.time()},
  rate=...)` — each row stamped with the wall clock by the user's function when it is made —
  per-row `process` passing the stamp on with every running sum, a 5 ms buffer timeout
  (`NetworkConfig(buffer_timeout=0.005)`, default batch sizes), checkpoints every 1 s; latency
  = row creation → sink. Run at half the max rate of this very job (same settings, unthrottled:
  `w1_latency_readme_max_rate`), beside `workloads.w1_latency`, whose source is vectorized.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time

import streamsnap as ss
from benchmarks import workloads
from streamsnap.api.config import RocksDBConfig
from streamsnap.connectors.sources import Generator, GeneratorReader

WORDS = ("stream", "snap", "spark", "flink", "state", "barrier", "checkpoint", "exactly", "once",
         "python", "arrow", "key", "group", "window", "sink", "source")
WORDS_PER_SENTENCE = 5


# ----------------------------------------------------------------------------- timing plumbing
class _StampedReader(GeneratorReader):
    """A GeneratorReader that writes the wall-clock time of its first poll to a file."""

    def __init__(self, source, ctx, directory: str):
        super().__init__(source, ctx)
        self._directory = directory
        self._stamped = False

    def poll(self):
        if not self._stamped:
            self._stamped = True
            workloads.stamp_start(self._directory)
        return super().poll()


class StampedGenerator(Generator):
    """`Generator` whose subtasks record when they started producing (the user's function is
    called exactly as by a plain Generator: nothing wraps it)."""

    def __init__(self, fn, directory: str, **kwargs):
        super().__init__(fn, **kwargs)
        self.directory = directory

    def create_reader(self, ctx):
        return _StampedReader(self, ctx, self.directory)

    def starts(self) -> list[float]:
        return workloads.read_starts(self.directory)


EndSink = workloads.EndSink


# ----------------------------------------------------------------------------- the user's code
class RunningSum(ss.KeyedProcessFunction):
    """W1 as in the README: every running sum emitted."""

    def open(self, ctx):
        self.total = ctx.get_state(ss.ValueStateDescriptor("total", default=0))

    def process_element(self, row, ctx):
        total = self.total.value() + row["value"]
        self.total.update(total)
        yield {"key": ctx.current_key, "total": total}


def sentence(i: int) -> dict:
    """Sentence i: five words picked by a cheap deterministic hash of the index (as
    examples/word_count.py)."""
    h = (i * 2654435761) & 0xFFFFFFFF
    words = [WORDS[(h >> (4 * k)) % len(WORDS)] for k in range(WORDS_PER_SENTENCE)]
    return {"id": i, "text": " ".join(words)}


def split(row: dict):
    for word in row["text"].split():
        yield {"word": word}


class Count(ss.KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ss.ValueStateDescriptor("count", default=0))

    def process_element(self, row, ctx):
        n = self.count.value() + 1
        self.count.update(n)
        if n % 1000 == 0:
            yield {"word": ctx.current_key, "count": n}


# ----------------------------------------------------------------------------- the jobs
def _env(spark, parallelism: int, checkpoint_interval: float | None,
         state_backend: str | RocksDBConfig = "hashmap") -> ss.StreamEnvironment:
    checkpointing = None
    if checkpoint_interval is not None:
        checkpointing = ss.CheckpointConfig(interval=checkpoint_interval,
                                            directory=workloads._checkpoint_dir("perrow-"))
    return ss.StreamEnvironment(parallelism=parallelism, spark=spark, checkpointing=checkpointing,
                                state_backend=state_backend)


def _run(env, source: StampedGenerator, sink: EndSink, name: str, units: int) -> dict:
    result = env.execute(name)
    starts = source.starts()
    seconds = max(r["end"] for r in sink.ends.reports) - min(starts)
    return {"per_second": units / seconds, "seconds": seconds, "job_seconds": result.duration,
            "output_rows": sum(r["rows"] for r in sink.ends.reports),
            "checkpoints": result.checkpoints.counts.completed if result.checkpoints else 0}


def run_w1_readme(spark, n: int, k: int, parallelism: int, checkpoint_interval: float | None = 1.0,
                  state_backend: str | RocksDBConfig = "hashmap") -> dict:
    """One run of W1 the README way over n rows: source rows / s (see the module docstring)."""
    stamps = tempfile.mkdtemp(prefix="ssbench-perrow-")
    try:
        env = _env(spark, parallelism, checkpoint_interval, state_backend)
        source = StampedGenerator(lambda i: {"key": i % k, "value": i}, stamps, count=n)
        sink = EndSink()
        (env.from_source(source, name="events")
            .key_by("key")
            .process(RunningSum(), name="sum", uid="sum")
            .sink_to(sink, name="out"))
        out = _run(env, source, sink, f"W1 per-row README n={n} p={parallelism}", n)
    finally:
        shutil.rmtree(stamps, ignore_errors=True)
    if out["output_rows"] != n:
        raise RuntimeError(f"W1 per-row: the sink got {out['output_rows']} running sums, expected {n}")
    return out


def run_word_count(spark, sentences: int, parallelism: int, checkpoint_interval: float | None = 1.0) -> dict:
    """One run of the word-count pipeline over `sentences` sentences: words / s."""
    stamps = tempfile.mkdtemp(prefix="ssbench-perrow-")
    try:
        env = _env(spark, parallelism, checkpoint_interval)
        source = StampedGenerator(sentence, stamps, count=sentences)
        sink = EndSink()
        (env.from_source(source, name="sentences")
            .flat_map(split, name="split")
            .map(lambda r: {"word": r["word"].lower()}, name="lower")
            .filter(lambda r: r["word"] != "", name="non-empty")
            .key_by("word")
            .process(Count(), name="count", uid="count")
            .sink_to(sink, name="out"))
        words = sentences * WORDS_PER_SENTENCE
        out = _run(env, source, sink, f"word count n={sentences} p={parallelism}", words)
    finally:
        shutil.rmtree(stamps, ignore_errors=True)
    # Every word's count passes each multiple of 1000 once.
    expected = _expected_word_count_rows(sentences)
    if out["output_rows"] != expected:
        raise RuntimeError(f"word count: the sink got {out['output_rows']} rows, expected {expected}")
    return out


def _expected_word_count_rows(sentences: int) -> int:
    counts: dict = {}
    for i in range(sentences):
        for word in sentence(i)["text"].split():
            counts[word] = counts.get(word, 0) + 1
    return sum(c // 1000 for c in counts.values())


# ----------------------------------------------------------------------------- latency, README way
LATENCY_BUFFER_TIMEOUT = 0.005


def _w1_latency_readme_job(spark, n: int, k: int, rate: float | None, checkpoint_interval: float | None,
                           sink: workloads.LatencySink, parallelism: int = 2) -> ss.StreamEnvironment:
    checkpointing = None
    if checkpoint_interval is not None:
        checkpointing = ss.CheckpointConfig(interval=checkpoint_interval,
                                            directory=workloads._checkpoint_dir("perrow-lat-"))
    env = ss.StreamEnvironment(parallelism=parallelism, spark=spark, checkpointing=checkpointing,
                               network=ss.NetworkConfig(buffer_timeout=LATENCY_BUFFER_TIMEOUT))
    (env.from_source(ss.sources.Generator(lambda i: {"key": i % k, "value": i, "ts": time.time()},
                                          count=n, rate=rate), name="events", uid="events")
        .key_by("key")
        .process(workloads.RowRunningSum(), name="sum", uid="sum")
        .sink_to(sink, name="sink", uid="sink"))
    return env


def w1_latency_readme_max_rate(spark, n: int, k: int, checkpoint_interval: float | None = 1.0,
                               runs: int = 3) -> dict:
    """Events/s the README-way latency job sustains unthrottled (same settings as
    `w1_latency_readme`): first to last row at its sink, median of `runs` runs of n rows after a
    warm-up run of n / 4."""
    def one(rows: int) -> float:
        sink = workloads.LatencySink(warmup=0.0)
        env = _w1_latency_readme_job(spark, rows, k, None, checkpoint_interval, sink)
        env.execute(f"W1 per-row README latency max rate n={rows}")
        return sink.events_per_second()

    one(max(1, n // 4))
    rates = [one(n) for _ in range(runs)]
    return {"events_per_second": statistics.median(rates), "runs": rates, "rows": n,
            "buffer_timeout": LATENCY_BUFFER_TIMEOUT, "checkpoint_interval": checkpoint_interval,
            "source": "per-row Generator function"}


def w1_latency_readme(spark, rate: float, seconds: float, k: int, checkpoint_interval: float | None = 1.0,
                      warmup: float = 2.0) -> dict:
    """p50/p99 of row creation (stamped by the user's Generator function) → sink at `rate`
    events/s over both source subtasks, for the README-way job (module docstring)."""
    sink = workloads.LatencySink(warmup=warmup)
    env = _w1_latency_readme_job(spark, int(rate * seconds), k, rate, checkpoint_interval, sink)
    env.execute(f"W1 per-row README latency rate={rate}")
    return {**sink.percentiles(), "rate": rate, "buffer_timeout": LATENCY_BUFFER_TIMEOUT,
            "checkpoint_interval": checkpoint_interval}


def bytewax_available() -> bool:
    """Whether Bytewax (the `bench` extra) is installed, for the W1 comparison."""
    try:
        import bytewax  # noqa: F401
    except ImportError:
        return False
    return True


def measure(spark, n: int, sentences: int, k: int = 1000, runs: int = 3, parallelisms=(1, 2),
            checkpoint_interval: float | None = 1.0, bytewax: bool | None = None) -> dict:
    """Median per-row W1 (events/s) and word count (words/s) at each parallelism, after one
    small warm-up run of each; runs of the two pipelines interleaved. At parallelism 2, Bytewax's
    W1 (benchmarks/bytewax_w1.py: 2 processes x 1 worker, 1 s snapshots) runs interleaved with
    them when it is installed (`bytewax=None`) or asked for."""
    out: dict = {}
    if bytewax is None:
        bytewax = bytewax_available()
    for p in parallelisms:
        with_bytewax = bytewax and p == 2
        if with_bytewax:
            from benchmarks import bytewax_w1
        run_w1_readme(spark, max(1, n // 10), k, p, checkpoint_interval)          # warm workers, imports
        run_word_count(spark, max(1, sentences // 10), p, checkpoint_interval)
        # At parallelism 2, W1 also runs on RocksDB (issue 13: >= 50 % of the heap figure), with
        # its write cache (the default) and without (write_cache_size=0: every state write goes
        # to RocksDB at once, as before the cache existed).
        on_rocksdb = p == 2
        w1, wc, bw, rdb, rdb_direct = [], [], [], [], []
        for _ in range(runs):
            w1.append(run_w1_readme(spark, n, k, p, checkpoint_interval))
            wc.append(run_word_count(spark, sentences, p, checkpoint_interval))
            if with_bytewax:
                bw.append(bytewax_w1.run(n, k, processes=p))
            if on_rocksdb:
                rdb.append(run_w1_readme(spark, n, k, p, checkpoint_interval, "rocksdb"))
                rdb_direct.append(run_w1_readme(spark, n, k, p, checkpoint_interval,
                                                RocksDBConfig(write_cache_size=0)))
        series = [(f"w1_row_readme_p{p}", w1, "events_per_second"), (f"word_count_p{p}", wc, "words_per_second")]
        if with_bytewax:
            series.append((f"bytewax_w1_p{p}", bw, "events_per_second"))
        if on_rocksdb:
            series.append((f"w1_row_readme_rocksdb_p{p}", rdb, "events_per_second"))
            series.append((f"w1_row_readme_rocksdb_no_write_cache_p{p}", rdb_direct, "events_per_second"))
        for name, measured, unit in series:
            rates = [m["per_second"] for m in measured]
            out[name] = {unit: statistics.median(rates), "runs": rates, "parallelism": p,
                         "checkpoint_interval": checkpoint_interval, "details": measured}
    return out


__all__ = ["run_w1_readme", "run_word_count", "measure", "w1_latency_readme", "w1_latency_readme_max_rate", "RunningSum", "Count", "sentence", "split"]
