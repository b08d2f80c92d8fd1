"""`python -m benchmarks run --quick|--full`: every benchmark in one run, side by side.

All figures come from the same process and machine minutes apart, each a median over runs
or a ratio to its comparison measured in the same run, because these machines are shared and
noisy. streamsnap throughput is timed inside the job (first to last row at the sink); Spark's
by its own per-micro-batch timings after the first batch. Writes benchmarks/results/<date>.md (+ .json and PNG plots) and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback

from benchmarks import report, workloads

# Nexmark (issue 34: every query, checkpoints every 10 s, RocksDB incremental and the heap):
# quick, 5 M events x 1 run per query and state. At 0.3 M events/s a run takes ~17 s (>= one
# 10 s checkpoint) + ~5 s to deploy; 46 runs (23 queries x 2 states) ~ 1000 s, plus 23 warm-ups
# of 0.5 M ~ 150 s: ~19 min. At 1.5 M events/s: 46 x (3.3 + 5) + 23 x 5.3 ~ 8.4 min, but those
# fast runs end before the first checkpoint (their rows say 0). Queries slower than 0.3 M
# events/s take longer in proportion. Full: 10 M events x 3 runs, 10 M+ as Flink's suite asks.
PROFILES = {
    "quick": dict(files_vs_spark=8_000_000, row=6_000_000, batch=100_000_000, spark_sql=16_000_000,
                  spark_tws=4_000_000, ceiling=20_000_000, runs=5, state_keys=(10_000, 1_000_000, 10_000_000),
                  state_seconds=8.0, latency_seconds=10.0, backpressure_seconds=8.0, kills=10, keys=1000,
                  nexmark=5_000_000, nexmark_runs=1, nexmark_spark=4_000_000, nexmark_spark_runs=3,
                  per_row=2_000_000, per_row_sentences=400_000, per_row_runs=3, window_events=20_000_000,
                  large_state_keys=10_000_000),
    "full": dict(files_vs_spark=24_000_000, row=20_000_000, batch=300_000_000, spark_sql=48_000_000,
                 spark_tws=8_000_000, ceiling=60_000_000, runs=5, state_keys=(10_000, 1_000_000, 10_000_000),
                 state_seconds=20.0, latency_seconds=30.0, backpressure_seconds=20.0, kills=12, keys=1000,
                 nexmark=10_000_000, nexmark_runs=3, nexmark_spark=24_000_000, nexmark_spark_runs=5,
                 per_row=6_000_000, per_row_sentences=1_200_000, per_row_runs=5, window_events=60_000_000,
                 large_state_keys=10_000_000),
}

BENCHMARKS = ("throughput", "per_row", "spark", "ceiling", "checkpoints", "backpressure", "latency", "recovery",
              "nexmark", "window_latency", "state_backends", "files_vs_spark")


def _spark_session():
    from streamsnap.cluster.spark_session import embedded_session

    return embedded_session(16)


def run_throughput(spark, p: dict, results: dict) -> None:
    """W1 per form, runs with and without checkpoints interleaved (A B A B ...), so a machine
    that slows down mid-run shifts both; overhead = 1 - median of the paired ratios."""
    for form in ("row", "batch"):
        print(f"  w1_{form} with and without checkpoints, {p['runs']} pairs ...", flush=True)
        workloads.run_w1(spark, max(1, p[form] // 10), p["keys"], form, 1.0)  # warm workers and imports
        pairs = [(workloads.run_w1(spark, p[form], p["keys"], form, None),
                  workloads.run_w1(spark, p[form], p["keys"], form, 1.0)) for _ in range(p["runs"])]
        for label, side in (("no_checkpoints", 0), ("checkpoints_1s", 1)):
            results[f"w1_{form}_{label}"] = workloads.summarize([pair[side] for pair in pairs])
        ratios = [with_["events_per_second"] / without["events_per_second"] for without, with_ in pairs]
        results[f"w1_{form}_overhead"] = {"overhead": 1 - statistics.median(ratios), "ratios": ratios}


def run_per_row(spark, p: dict, results: dict) -> None:
    """W1 and the word count written the README way (per-row Generator function, per-row
    operators, every result emitted), at parallelism 1 and 2, checkpoints every 1 s; see
    benchmarks/per_row.py for what each figure includes."""
    from benchmarks import per_row

    print(f"  per-row W1 ({p['per_row']:,} rows) and word count ({p['per_row_sentences']:,} sentences), "
          f"parallelism 1 and 2, {p['per_row_runs']} runs each ...", flush=True)
    results.update(per_row.measure(spark, p["per_row"], p["per_row_sentences"], p["keys"], runs=p["per_row_runs"]))


def run_spark(spark, p: dict, results: dict) -> None:
    """Spark's sustained micro-batch throughput on W1: the input as 8 Parquet files read one
    file per micro-batch (each batch a Spark checkpoint: state-store commit, offset and commit
    logs), rate = rows / Spark's own trigger-to-commit time over batches 2..8."""
    from benchmarks import spark_baselines as sb

    for name, fn, n in (("spark_sql_aggregation", sb.run_sql_aggregation, p["spark_sql"]),
                        ("spark_transform_with_state_in_pandas", sb.run_transform_with_state_in_pandas,
                         p["spark_tws"])):
        print(f"  {name} ...", flush=True)
        work = tempfile.mkdtemp(prefix="ssbench-spark-")
        try:
            sb.write_w1_input(os.path.join(work, "warm"), max(8, n // 20), p["keys"])
            fn(spark, os.path.join(work, "warm"), os.path.join(work, "ckpt-warm"), max_files_per_trigger=1)
            sb.write_w1_input(os.path.join(work, "in"), n, p["keys"])
            runs = [fn(spark, os.path.join(work, "in"), os.path.join(work, f"ckpt-{i}"), max_files_per_trigger=1)
                    for i in range(p["runs"])]
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rates = [sb.steady_rate(r) for r in runs]
        results[name] = {"events_per_second": statistics.median(rates), "runs": rates,
                         "rows_per_batch": n // len(runs[0]["batch_rows"]),
                         "batch_seconds": [r["batch_seconds"] for r in runs], "spark": str(spark.version)}


def run_ceiling(spark, p: dict, results: dict) -> None:
    from benchmarks import ceiling

    print("  ceiling ...", flush=True)
    results["ceiling"] = ceiling.measure_ceiling_median(p["ceiling"], p["keys"], runs=p["runs"])


def run_checkpoints(spark, p: dict, results: dict) -> None:
    results["checkpoint_cost"] = []
    for k in p["state_keys"]:
        print(f"  checkpoint cost K={k:,} ...", flush=True)
        results["checkpoint_cost"].append(workloads.checkpoint_cost(spark, k, p["state_seconds"]))


def run_backpressure(spark, p: dict, results: dict) -> None:
    print("  backpressure ...", flush=True)
    results["backpressure"] = workloads.backpressure(spark, p["backpressure_seconds"])


def run_latency(spark, p: dict, results: dict) -> None:
    """Per-row W1 (vectorized source, per-row `process`): event creation -> sink at half and a
    quarter of the max rate of the same job with the same settings (buffer timeout 5 ms, 1 s
    checkpoints), measured warm just before (workloads.w1_latency_max_rate); at the same rate
    with a 100 ms timeout; Spark's micro-batch latency at that rate; and W1 written the README
    way (per-row rate-limited Generator function, per_row.w1_latency_readme) at half of its
    own max rate, 5 ms timeout."""
    from benchmarks import spark_baselines as sb

    print(f"  latency: the job's max rate (buffer timeout 5 ms, checkpoints 1 s, {p['row']:,} rows) ...", flush=True)
    max_rate = workloads.w1_latency_max_rate(spark, p["row"], p["keys"], "row", 0.005, 1.0)
    rate = max_rate["events_per_second"] / 2
    results["latency"] = {"rate": rate, "max_rate": max_rate}
    for timeout in (0.1, 0.005):
        print(f"  latency at {rate:,.0f} events/s, buffer timeout {timeout * 1000:g} ms ...", flush=True)
        results["latency"][f"streamsnap_{timeout * 1000:g}ms"] = workloads.w1_latency(
            spark, rate, p["latency_seconds"], p["keys"], "row", timeout)
    # The same at a quarter of the maximum: how far below saturation the 50 ms target is met.
    print(f"  latency at {rate / 2:,.0f} events/s, buffer timeout 5 ms ...", flush=True)
    results["latency"]["streamsnap_5ms_quarter_rate"] = workloads.w1_latency(
        spark, rate / 2, p["latency_seconds"], p["keys"], "row", 0.005)
    # The per-row path end to end, written the README way: a per-row rate-limited Generator
    # function in front (benchmarks/per_row.py), at half of that job's own max rate.
    from benchmarks import per_row

    print(f"  README-way latency job (per-row Generator function): its max rate ({p['per_row']:,} rows) ...",
          flush=True)
    readme_max = per_row.w1_latency_readme_max_rate(spark, p["per_row"], p["keys"])
    readme_rate = readme_max["events_per_second"] / 2
    print(f"  README-way latency at {readme_rate:,.0f} events/s, buffer timeout 5 ms ...", flush=True)
    results["latency_readme"] = {"rate": readme_rate, "max_rate": readme_max,
                                 "streamsnap_5ms": per_row.w1_latency_readme(spark, readme_rate,
                                                                             p["latency_seconds"], p["keys"])}
    print("  Spark micro-batch latency ...", flush=True)
    work = tempfile.mkdtemp(prefix="ssbench-sparklat-")
    try:
        results["latency"]["spark_microbatch"] = sb.run_microbatch_latency(
            spark, int(rate), p["latency_seconds"], os.path.join(work, "ckpt"), k=p["keys"])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_window_latency(spark, p: dict, results: dict) -> None:
    """A keyed event-time window count: window end -> result, at half its own max rate (issue 11)."""
    from benchmarks import window_latency

    print("  window count: max rate ...", flush=True)
    window_latency.max_rate(spark, p["window_events"] // 4)   # warm: a cold first run measures ~half
    max_rate = window_latency.max_rate(spark, p["window_events"])
    results["window_latency"] = {"max_rate": max_rate}
    for share in (0.5, 0.25):
        print(f"  window count latency at {share:g} x {max_rate:,.0f} events/s ...", flush=True)
        results["window_latency"][f"at_{share:g}_max"] = window_latency.window_latency(
            spark, max_rate * share, p["latency_seconds"])


def run_recovery(spark, p: dict, results: dict) -> None:
    print("  recovery, a subtask killed ...", flush=True)
    results["recovery"] = workloads.recovery_time(spark, kills=p["kills"])
    # What a lost slot costs: its Spark task's Python worker killed, a new barrier stage.
    print("  recovery, a slot killed ...", flush=True)
    results["recovery_slot"] = workloads.recovery_time(spark, kills=max(3, p["kills"] // 2), victim="slot")


def run_nexmark(spark, p: dict, results: dict) -> None:
    """Nexmark q0-q22 (or `--only-queries`) on streamsnap with exactly-once checkpoints every 10 s,
    state on RocksDB and on the heap (or `--nexmark-states`), the generator's own cost, and on
    Spark SS every query it can express; see benchmarks/nexmark/bench.py and spark_queries.py."""
    from benchmarks.nexmark import bench

    if p.get("nexmark_spark_only"):
        bench.run_spark_all(spark, p["nexmark_spark"], p["nexmark_spark_runs"], results, p.get("nexmark_queries"))
        return
    bench.run_all(spark, p["nexmark"], p["nexmark_spark"], p["nexmark_runs"], results,
                  names=p.get("nexmark_queries"), states=p.get("nexmark_states", bench.DEFAULT_STATES),
                  spark_runs=p["nexmark_spark_runs"])


def run_state_backends(spark, p: dict, results: dict) -> None:
    """Large keyed state on the heap and on RocksDB (incremental): checkpoints with 1 % of the
    keys changing per interval, and recovery of the whole state (benchmarks/state_backends.py)."""
    from benchmarks import state_backends

    # Heap: 15 steady checkpoints. RocksDB: 30, so the mean upload amortizes the one-off
    # compaction of the load's files and the steady compactions of the 1 % changes.
    print(f"  {p['large_state_keys']:,} keys on hashmap ...", flush=True)
    results.setdefault("state_backends", {})["hashmap"] = state_backends.large_state(
        spark, p["large_state_keys"], "hashmap", steady_checkpoints=15)
    print(f"  {p['large_state_keys']:,} keys on rocksdb ...", flush=True)
    results["state_backends"]["rocksdb"] = state_backends.large_state(
        spark, p["large_state_keys"], "rocksdb", steady_checkpoints=30)
    # The same job with task-local recovery: its recovery reads the local copies.
    for backend in ("hashmap", "rocksdb"):
        print(f"  {p['large_state_keys']:,} keys on {backend} with local recovery ...", flush=True)
        results["state_backends"][f"{backend}+local"] = state_backends.large_state(
            spark, p["large_state_keys"], backend, steady_checkpoints=2, local_recovery=True)
    # RocksDB in changelog mode: a checkpoint uploads the log since the last one; the periodic
    # materializations (every 30 s here, so the window holds one) amortized in the mean.
    from streamsnap import ChangelogConfig, RocksDBConfig
    print(f"  {p['large_state_keys']:,} keys on rocksdb, changelog ...", flush=True)
    results["state_backends"]["rocksdb+changelog"] = state_backends.large_state(
        spark, p["large_state_keys"], RocksDBConfig(changelog=ChangelogConfig(materialization_interval=30.0)),
        steady_checkpoints=35, label="rocksdb+changelog", settle=True)
    # ... and with task-local recovery: its restore reads the materialization and the log locally
    # (`python -m benchmarks.changelog_recovery` alternates the two for a paired comparison).
    print(f"  {p['large_state_keys']:,} keys on rocksdb, changelog with local recovery ...", flush=True)
    results["state_backends"]["rocksdb+changelog+local"] = state_backends.large_state(
        spark, p["large_state_keys"], RocksDBConfig(changelog=ChangelogConfig(materialization_interval=30.0)),
        steady_checkpoints=3, label="rocksdb+changelog+local", settle=True, local_recovery=True)
    # RocksDB with unaligned checkpoints: the barrier no longer waits behind the busy keyed
    # task's input, but the input it overtakes is written with each checkpoint.
    print(f"  {p['large_state_keys']:,} keys on rocksdb, unaligned checkpoints ...", flush=True)
    results["state_backends"]["rocksdb+unaligned"] = state_backends.large_state(
        spark, p["large_state_keys"], "rocksdb", steady_checkpoints=3, unaligned=True)


def run_files_vs_spark(spark, p: dict, results: dict) -> None:
    """W1 on the same Parquet files, streamsnap (1 s exactly-once checkpoints) against Spark
    Structured Streaming (processing-time trigger 1 s, checkpoint location): the Kafka
    benchmark's Spark side, on files because Spark's Kafka connector jar is not installable here
    (benchmarks/files_vs_spark.py says what each time includes)."""
    from benchmarks import files_vs_spark

    print(f"  W1 over {p['files_vs_spark']:,} rows of Parquet files, streamsnap / Spark SQL / Spark "
          f"transformWithStateInPandas, {p['runs']} rounds ...", flush=True)
    results["files_vs_spark"] = files_vs_spark.measure(spark, p["files_vs_spark"], runs=p["runs"])


RUNNERS = {"throughput": run_throughput, "per_row": run_per_row, "spark": run_spark, "ceiling": run_ceiling, "checkpoints": run_checkpoints,
           "backpressure": run_backpressure, "latency": run_latency, "recovery": run_recovery,
           "nexmark": run_nexmark, "window_latency": run_window_latency, "state_backends": run_state_backends,
           "files_vs_spark": run_files_vs_spark}


def nexmark_options(queries: str | None, states: str | None) -> dict:
    """`--only-queries` and `--nexmark-states` as profile entries, checked before Spark starts."""
    from benchmarks.nexmark import bench

    def split(text):
        return [x.strip() for x in text.split(",") if x.strip()] if text is not None else None

    names, chosen = bench.check_choice(split(queries), split(states) or bench.DEFAULT_STATES)
    return {"nexmark_queries": names, "nexmark_states": chosen}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the benchmarks and write benchmarks/results/<date>.md")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="smaller sizes (default)")
    mode.add_argument("--full", action="store_true", help="larger sizes, more runs, 10M-key state")
    run.add_argument("--only", default=",".join(BENCHMARKS),
                     help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    run.add_argument("--only-queries", default=None, metavar="q0,q5",
                     help="nexmark: comma-separated subset of the queries q0-q22 (default: all)")
    run.add_argument("--nexmark-states", default=None, metavar="rocksdb,heap",
                     help="nexmark: state backends, each a row (rocksdb, heap: checkpoints every 10 s; none: no "
                          "checkpoints); default rocksdb,heap")
    run.add_argument("--nexmark-spark-only", action="store_true",
                     help="nexmark: only the Spark SS comparison (Spark, and streamsnap over Spark's Parquet files), "
                          "not the generator-fed rows")
    run.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args(argv)
    profile = "full" if args.full else "quick"
    chosen = [b.strip() for b in args.only.split(",") if b.strip()]
    unknown = [b for b in chosen if b not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    p = dict(PROFILES[profile])
    try:
        p.update(nexmark_options(args.only_queries, args.nexmark_states), nexmark_spark_only=args.nexmark_spark_only)
    except ValueError as exc:
        parser.error(str(exc))
    if args.nexmark_spark_only:
        from benchmarks.nexmark import bench
        if "nexmark" not in chosen:
            parser.error("--nexmark-spark-only runs part of the nexmark benchmark: add nexmark to --only")
        if not set(p["nexmark_queries"]) & set(bench.SPARK_QUERIES):
            parser.error(f"--nexmark-spark-only: Spark SS expresses none of {', '.join(p['nexmark_queries'])}; "
                         f"choose among {', '.join(bench.SPARK_QUERIES)}")
    try:       # the report's plots: fail now, not after the hours the run takes
        import matplotlib  # noqa: F401
    except ImportError:
        parser.error("the benchmarks' report needs the bench extra: pip install -e '.[bench]'")
    spark = _spark_session()
    results: dict = {"profile": profile, "started": datetime.datetime.now().isoformat(timespec="seconds"),
                     "machine": report.machine_description(), "errors": {}}
    started = time.monotonic()
    for name in chosen:
        print(f"[{name}]", flush=True)
        try:
            RUNNERS[name](spark, p, results)
        except Exception as exc:  # one broken benchmark must not lose the others' figures
            traceback.print_exc()
            results["errors"][name] = f"{type(exc).__name__}: {exc}"
        finally:
            workloads.cleanup()  # the checkpoints this benchmark wrote (10 M-key state is ~100 MB each)
    results["seconds"] = time.monotonic() - started
    path = report.write(results, args.out)
    print()
    print(report.render_table(results))
    print(f"\nwritten to {path}")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
