"""What the per-row latency tail is made of: the latency job traced (streamsnap/runtime/trace.py).

`python -m benchmarks.latency_trace [rate] [seconds]` runs `workloads.w1_latency` (per-row W1,
buffer timeout 5 ms, 1 s checkpoints) at `rate` events/s — by default half of the job's max rate,
measured first — with every task traced, then prints per task: CPU per row, the input batches
(rows, time from the oldest row's creation to the start of its processing, processing time),
the time spent runnable but waiting for a CPU, network flushes (rows, age of the oldest row),
garbage collections, checkpoints' synchronous parts; and for the slowest 1 % of input batches
(by creation-to-done time of their oldest row) how much of it was waiting before processing,
processing, waiting for a CPU, and how many had a collection or a checkpoint in the 100 ms before.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from benchmarks import workloads


def _p(values, q) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def summarize(directory: str) -> list[dict]:
    """One summary per trace file in `directory` (see the module docstring)."""
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "*.jsonl"))):
        records = [json.loads(line) for line in open(path)]
        kinds: dict[str, list] = {}
        for record in records:
            kinds.setdefault(record[0], []).append(record)
        s: dict = {"task": os.path.basename(path).rsplit("-", 1)[0]}
        cpu, wall = kinds["total"][0][1:3] if "total" in kinds else (float("nan"), float("nan"))
        s["cpu_seconds"], s["wall_seconds"] = round(cpu, 2), round(wall, 2)
        batches = [r for r in kinds.get("batch", []) if r[3][0] > 0]
        if batches:
            start = np.array([r[1] for r in batches])
            duration = np.array([r[2] for r in batches]) * 1e3
            rows = np.array([r[3][0] for r in batches])
            age = np.array([(r[1] - r[3][1]) * 1e3 if r[3][1] is not None else np.nan for r in batches])
            waited = np.array([r[5] for r in batches]) * 1e3
            s.update(batches=len(batches), rows=int(rows.sum()), cpu_us_per_row=round(cpu / rows.sum() * 1e6, 3),
                     rows_per_batch=round(float(rows.mean())), batch_ms_p50=round(_p(duration, 50), 2),
                     batch_ms_p99=round(_p(duration, 99), 2), batch_ms_max=round(float(duration.max()), 1),
                     busy=round(duration.sum() / 1e3 / max(1e-9, start[-1] - start[0]), 2),
                     cpu_wait_ms_in_batches=round(float(waited.sum())))
            done = age + duration
            if np.isfinite(age).any():
                s.update(age_at_start_ms_p50=round(float(np.nanpercentile(age, 50)), 1),
                         age_at_start_ms_p99=round(float(np.nanpercentile(age, 99)), 1),
                         done_ms_p99=round(float(np.nanpercentile(done, 99)), 1))
                slow = done >= np.nanpercentile(done, 99)
                events = [r[1] for r in kinds.get("gc", [])] + [r[1] for r in kinds.get("checkpoint", [])]
                near = [any(0 <= t0 - e <= 0.1 for e in events) for t0 in start[slow]]
                s["slowest_1pct"] = {"age_at_start_ms": round(float(np.nanmean(age[slow])), 1),
                                     "processing_ms": round(float(duration[slow].mean()), 1),
                                     "cpu_wait_ms_in_processing": round(float(waited[slow].mean()), 1),
                                     "with_gc_or_checkpoint_100ms_before": f"{sum(near)}/{len(near)}"}
        emits = kinds.get("emit", [])
        if emits:
            duration = np.array([r[2] for r in emits]) * 1e3
            s.update(emits=len(emits), emit_ms_p50=round(_p(duration, 50), 3), emit_ms_p99=round(_p(duration, 99), 2),
                     cpu_wait_ms_in_emits=round(float(sum(r[5] for r in emits) * 1e3)))
        polls = kinds.get("poll", [])
        s["cpu_wait_ms_in_polls"] = round(float(sum(r[5] for r in polls) * 1e3))
        flushes = kinds.get("flush", [])
        if flushes:
            rows = np.array([r[3] for r in flushes])
            age = np.array([r[4] for r in flushes]) * 1e3
            s.update(flushes=len(flushes), flush_rows_p50=int(_p(rows, 50)), flush_rows_max=int(rows.max()),
                     flush_age_ms_p50=round(_p(age, 50), 1), flush_age_ms_p99=round(_p(age, 99), 1),
                     flush_age_ms_max=round(float(age.max()), 1))
        for generation in (0, 1, 2):
            pauses = [r[2] * 1e3 for r in kinds.get("gc", []) if r[3] == generation]
            if pauses:
                s[f"gc{generation}"] = {"count": len(pauses), "max_ms": round(max(pauses), 2),
                                        "total_ms": round(sum(pauses), 1)}
        checkpoints = [r[2] * 1e3 for r in kinds.get("checkpoint", [])]
        if checkpoints:
            s.update(checkpoints=len(checkpoints), checkpoint_sync_ms_p50=round(_p(checkpoints, 50), 2),
                     checkpoint_sync_ms_max=round(max(checkpoints), 2))
        out.append(s)
    return out


def main(argv: list[str]) -> None:
    directory = tempfile.mkdtemp(prefix="ssbench-trace-")
    os.environ["STREAMSNAP_TRACE_DIR"] = directory     # before the session: workers inherit it
    os.environ["STREAMSNAP_TRACE_STAMP"] = "ts"
    from streamsnap.cluster.spark_session import embedded_session

    spark = embedded_session(16)
    seconds = float(argv[1]) if len(argv) > 1 else 10.0
    if argv:
        rate = float(argv[0])
    else:
        rate = workloads.w1_latency_max_rate(spark, 4_000_000, 1000, "row", 0.005, 1.0)["events_per_second"] / 2
    try:
        workloads.w1_latency(spark, rate, 3.0, 1000, "row", 0.005)      # warm
        for path in glob.glob(os.path.join(directory, "*")):
            os.unlink(path)
        result = workloads.w1_latency(spark, rate, seconds, 1000, "row", 0.005)
        print(json.dumps({"rate": rate, "p50_ms": round(result["p50"] * 1e3, 1),
                          "p99_ms": round(result["p99"] * 1e3, 1), "load": os.getloadavg()[0]}))
        for summary in summarize(directory):
            print(json.dumps(summary))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
