"""Split distinct aggregation (`aggregate_columns(..., split_distinct=N)`) against the same
aggregate unsplit, in one run: where it pays and what it costs.

`python -m benchmarks.split_distinct [--events 3000000] [--buckets 16] [--states rocksdb,heap]
[--nexmark-events 2000000]` runs, per state backend (exactly-once checkpoints every 10 s,
RocksDB incremental; parallelism 2 on 2 cores), each job unsplit and split:

* **hot key**: one key (a day) whose window counts distinct users — every row a new user, so
  each row is a distinct-set lookup and insert — and its rows: a vectorized `Generator` of
  {ts, day, user} (100 rows per millisecond of event time) → `key_by("day")` → a one-day
  tumbling window with ``{"users": ("count_distinct", "user"), "n": "count"}``. Unsplit, one
  keyed subtask does all of it while the other has nothing; split, both share it.
  Target on RocksDB, where the distinct set's lookups are the keyed stage's work: split ≥ 1.3×
  unsplit. On the heap a set lookup is cheap enough that the generator and the shuffle are
  the job's cost, so there the ratio is reported, not targeted.
* **nexmark q16** (benchmarks/nexmark/reports.py): thousands of channels per day, two distinct
  columns. Split, each bid goes through the partial stage twice (once per counted column) and
  the partial stage's groups per batch multiply, which costs more than the spread of its few
  hot channels gains on two cores; reported, no target (the suite runs it unsplit).

Rates are events/s per core from the generator's first batch to the end of input at the sink
(the generator, every operator, the shuffles and the windows' final firing count; deployment
and teardown do not), as benchmarks/nexmark/bench.py measures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from functools import partial

import numpy as np
import pyarrow as pa

import streamsnap as ss
from benchmarks import workloads
from benchmarks.nexmark import bench, reports

CORES = bench.CORES
TARGET = 1.3
SCHEMA = pa.schema([("ts", pa.int64()), ("day", pa.int64()), ("user", pa.int64())])


class _Rows:
    """A vectorized generator of one day's rows, every user new; stamps its first call."""

    schema = SCHEMA

    def __init__(self, directory: str):
        self.directory, self._stamped = directory, False

    def __call__(self, index) -> pa.RecordBatch:
        if not self._stamped:
            self._stamped = True
            workloads.stamp_start(self.directory)
        index = np.asarray(index, dtype=np.int64)
        return pa.RecordBatch.from_arrays([pa.array(index // 100), pa.array(np.zeros(len(index), dtype=np.int64)),
                                           pa.array(index * 7919)], schema=SCHEMA)


def run_hot_key(spark, events: int, state: str, buckets: int | None) -> dict:
    """One run of the hot-key job: events/s per core and the one result row."""
    work = tempfile.mkdtemp(prefix="ssbench-split-")
    stamps = os.path.join(work, "stamps")
    os.makedirs(stamps)
    try:
        env = bench._environment(spark, bench.BATCH_SIZE, state, 10.0, work)
        strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
        rows = env.from_source(ss.sources.Generator(_Rows(stamps), count=events, vectorized=True, schema=SCHEMA,
                                                    batch_size=bench.BATCH_SIZE),
                               name="rows", watermark_strategy=strategy)
        windows = rows.key_by("day").window(ss.windows.TumblingEventTimeWindows.of(86_400))
        counts = windows.aggregate_columns({"users": ("count_distinct", "user"), "n": "count"},
                                           split_distinct=buckets, name="distinct users")
        sink = workloads.EndSink()
        counts.sink_to(sink, name="out")
        counts.sink_to(ss.sinks.Collect(), name="result")
        result = env.execute(f"split distinct hot key buckets={buckets}")
        starts = workloads.read_starts(stamps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = max(r["end"] for r in sink.ends.reports) - min(starts)
    out = result.rows("result")
    if [(r["users"], r["n"]) for r in out] != [(events, events)]:
        raise AssertionError(f"hot key, buckets={buckets}: expected one window of {events} distinct users, got {out}")
    return {"events_per_second_per_core": events / seconds / CORES, "seconds": seconds}


def run_q16(spark, events: int, state: str, buckets: int | None) -> dict:
    """Nexmark q16, split or not: events/s per core and its output rows."""
    run = bench.run_streamsnap(spark, "q16", events, state=state, build=partial(reports.q16, split_distinct=buckets))
    return {"events_per_second_per_core": run["events_per_second"] / CORES, "seconds": run["seconds"],
            "output_rows": run["output_rows"]}


def measure(spark, events: int, buckets: int, states, nexmark_events: int) -> list[dict]:
    """Each job unsplit then split, per state, back to back (a machine slowing down shifts both)."""
    rows = []
    for state in states:
        for job, run, count in (("hot key", run_hot_key, events), ("nexmark q16", run_q16, nexmark_events)):
            if not count:
                continue
            unsplit, split = run(spark, count, state, None), run(spark, count, state, buckets)
            if "output_rows" in unsplit and unsplit["output_rows"] != split["output_rows"]:
                raise AssertionError(f"{job}: split gave {split['output_rows']} rows, unsplit {unsplit['output_rows']}")
            ratio = split["events_per_second_per_core"] / unsplit["events_per_second_per_core"]
            rows.append({"job": job, "state": state, "events": count, "buckets": buckets,
                         "unsplit": unsplit["events_per_second_per_core"],
                         "split": split["events_per_second_per_core"], "ratio": ratio,
                         "target": TARGET if job == "hot key" and state == "rocksdb" else None})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| job | state | events | unsplit /core | split /core (buckets) | split ÷ unsplit | target |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        verdict = "–" if r["target"] is None else \
            f"≥ {r['target']}: {'met' if r['ratio'] >= r['target'] else '**missed**'}"
        lines.append(f"| {r['job']} | {r['state']} | {r['events']:,} | {r['unsplit']:,.0f} | "
                     f"{r['split']:,.0f} ({r['buckets']}) | {r['ratio']:.2f}× | {verdict} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.split_distinct", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3_000_000, help="rows of the hot-key job")
    parser.add_argument("--nexmark-events", type=int, default=2_000_000, help="events of q16 (0: skip it)")
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--states", default="rocksdb,heap")
    args = parser.parse_args(argv)
    states = [s.strip() for s in args.states.split(",") if s.strip()]
    unknown = [s for s in states if s not in ("rocksdb", "heap")]
    if unknown or not states:
        parser.error(f"--states takes rocksdb and/or heap, got {args.states!r}")
    from benchmarks.__main__ import _spark_session

    spark = _spark_session()
    try:
        print(table(measure(spark, args.events, args.buckets, states, args.nexmark_events)), flush=True)
    finally:
        workloads.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
