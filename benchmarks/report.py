"""Turning one benchmark run into a table (markdown), plots (PNG) and raw figures (JSON)."""

from __future__ import annotations

import datetime
import json
import os
import platform

import streamsnap

TARGETS = {
    "row": 650_000, "batch": 10_000_000, "ceiling_fraction": 0.40, "overhead": 0.05,
    "latency_p99": 0.050, "latency_vs_spark": 10.0, "recovery": 0.5,
    "row_readme": 1_000_000, "word_count": 1_000_000,
    "unaligned_duration": 0.100, "unaligned_start_delay": 0.050,
}


def machine_description() -> str:
    import pyspark

    cpus = os.cpu_count()
    return (f"{platform.machine()} {cpus} cores, Python {platform.python_version()}, "
            f"PySpark {pyspark.__version__}, streamsnap {streamsnap.__version__}")


def _rate(results: dict, key: str):
    return results.get(key, {}).get("events_per_second")


def _fmt_rate(x) -> str:
    if x is None:
        return "–"
    return f"{x / 1e6:.2f} M/s" if x >= 1e6 else f"{x / 1e3:.0f} K/s"


def _fmt_s(x) -> str:
    if x is None or x != x:
        return "–"
    return f"{x * 1000:.0f} ms" if x < 10 else f"{x:.1f} s"


def _verdict(ok) -> str:
    return "–" if ok is None else ("met" if ok else "**missed**")


def rows(results: dict) -> list[tuple[str, str, str, str, str, str]]:
    """(figure, streamsnap, comparison, ratio, target, verdict) rows of the summary table."""
    out = []
    row, batch = _rate(results, "w1_row_no_checkpoints"), _rate(results, "w1_batch_no_checkpoints")
    row_ck, batch_ck = _rate(results, "w1_row_checkpoints_1s"), _rate(results, "w1_batch_checkpoints_1s")
    if row is not None:
        out.append(("W1 per-row, events/s", _fmt_rate(row), "", "", "≥ 650 K/s", _verdict(row >= TARGETS["row"])))
    if batch is not None:
        out.append(("W1 vectorized, events/s", _fmt_rate(batch), "", "", "≥ 10 M/s",
                    _verdict(batch >= TARGETS["batch"])))
    for form, key, base, ck in (("per-row", "row", row, row_ck), ("vectorized", "batch", batch, batch_ck)):
        if base and ck:
            paired = results.get(f"w1_{key}_overhead")
            overhead = paired["overhead"] if paired else 1 - ck / base
            out.append((f"checkpoint overhead, {form} (1 s)", _fmt_rate(ck), f"{_fmt_rate(base)} without",
                        f"{overhead:+.1%}" + (" (median of paired runs)" if paired else ""), "≤ 5 %",
                        _verdict(overhead <= TARGETS["overhead"])))
    out += per_row_rows(results)
    sql, tws = _rate(results, "spark_sql_aggregation"), _rate(results, "spark_transform_with_state_in_pandas")
    if sql and batch:
        per_batch = results["spark_sql_aggregation"].get("rows_per_batch")
        batches = f", {per_batch / 1e6:g} M-row micro-batches" if per_batch else ""
        out.append((f"vs Spark SQL groupBy/sum (update, RocksDB{batches}; emits per-key totals, not per-row sums)",
                    _fmt_rate(batch), _fmt_rate(sql),
                    f"{batch / sql:.1f}×", "> 1× (aim 3×)", _verdict(batch > sql)))
    tws_batch = results.get("spark_transform_with_state_in_pandas", {}).get("rows_per_batch")
    tws_label = f" ({tws_batch / 1e3:g} K-row micro-batches)" if tws_batch else ""
    for form, ours in (("per-row", row), ("vectorized", batch)):
        if tws and ours:
            out.append((f"{form} vs Spark transformWithStateInPandas{tws_label}", _fmt_rate(ours), _fmt_rate(tws),
                        f"{ours / tws:.1f}×", "> 1×", _verdict(ours > tws)))
    ceiling = _rate(results, "ceiling")
    if ceiling and batch:
        out.append(("vectorized vs ceiling (Arrow IPC + numpy, no engine)", _fmt_rate(batch), _fmt_rate(ceiling),
                    f"{batch / ceiling:.0%}", "≥ 40 %", _verdict(batch / ceiling >= TARGETS["ceiling_fraction"])))
    for c in results.get("checkpoint_cost", []):
        out.append((f"checkpoint duration, {c['keys']:,} keys", f"p50 {_fmt_s(c['p50'])} / p99 {_fmt_s(c['p99'])}",
                    f"{c['state_bytes'] / 1e6:.1f} MB state", f"sync ≤ {_fmt_s(c['sync_max'])}", "", "–"))
    bp = results.get("backpressure")
    if bp:
        free, slow = bp["free"], bp["backpressured"]
        out.append(("alignment under backpressure (slow sink)",
                    f"p50 {_fmt_s(slow['alignment_p50'])} / max {_fmt_s(slow['alignment_max'])}",
                    f"p50 {_fmt_s(free['alignment_p50'])} unthrottled", "", "", "–"))
        if "start_delay_p50" in slow:
            out.append(("barrier start delay under backpressure (trigger → first barrier at the keyed task)",
                        f"p50 {_fmt_s(slow['start_delay_p50'])}",
                        f"p50 {_fmt_s(free['start_delay_p50'])} unthrottled", "", "", "–"))
        out.append(("checkpoint duration under backpressure",
                    f"p50 {_fmt_s(slow['duration_p50'])} / max {_fmt_s(slow['duration_max'])}",
                    f"p50 {_fmt_s(free['duration_p50'])} unthrottled", "", "", "–"))
        una = bp.get("unaligned")
        if una:
            out.append(("unaligned checkpoint duration under backpressure",
                        f"p50 {_fmt_s(una['duration_p50'])} / max {_fmt_s(una['duration_max'])}",
                        f"aligned p50 {_fmt_s(slow['duration_p50'])}", "", "≤ 100 ms",
                        _verdict(una["duration_p50"] <= TARGETS["unaligned_duration"])))
        deb = bp.get("debloated")
        if deb:
            out.append((f"aligned checkpoint duration under backpressure, buffer debloating "
                        f"(target {deb.get('debloat_target', 0.2):g} s)",
                        f"p50 {_fmt_s(deb['duration_p50'])} / max {_fmt_s(deb['duration_max'])}",
                        f"without p50 {_fmt_s(slow['duration_p50'])}",
                        f"barrier start delay p50 {_fmt_s(deb['start_delay_p50'])} (without "
                        f"{_fmt_s(slow['start_delay_p50'])})", "", "–"))
        tmo = bp.get("aligned_timeout")
        if tmo:
            out.append((f"checkpoint duration under backpressure, aligned timeout "
                        f"{tmo.get('aligned_timeout', 0.1) * 1000:g} ms",
                        f"p50 {_fmt_s(tmo['duration_p50'])} / max {_fmt_s(tmo['duration_max'])}",
                        f"aligned p50 {_fmt_s(slow['duration_p50'])}",
                        f"barrier start delay p50 {_fmt_s(tmo['start_delay_p50'])}; "
                        f"{tmo.get('unaligned_subtasks', 0)} of {tmo.get('keyed_subtasks', 0)} keyed "
                        f"snapshots unaligned", "", "–"))
        if una:
            out.append(("unaligned barrier start delay under backpressure",
                        f"p50 {_fmt_s(una['start_delay_p50'])}",
                        f"aligned p50 {_fmt_s(slow['start_delay_p50'])}",
                        f"in-flight persisted p50 {una['persisted_in_flight_bytes_p50'] / 1e3:.0f} KB / "
                        f"max {una['persisted_in_flight_bytes_max'] / 1e3:.0f} KB", "≤ 50 ms",
                        _verdict(una["start_delay_p50"] <= TARGETS["unaligned_start_delay"])))
    lat = results.get("latency")
    if lat:
        spark = lat.get("spark_microbatch")
        of_max = _latency_max_note(lat)
        for label in ("100ms", "5ms"):
            s = lat.get(f"streamsnap_{label}")
            if not s:
                continue
            comparison = f"Spark p50 {_fmt_s(spark['p50'])} / p99 {_fmt_s(spark['p99'])}" if spark else ""
            ratio = f"{spark['p99'] / s['p99']:.0f}× lower p99" if spark and s["p99"] > 0 else ""
            ok = None
            if label == "5ms":
                ok = s["p99"] <= TARGETS["latency_p99"] and (not spark or spark["p99"] / s["p99"] >= TARGETS["latency_vs_spark"])
            out.append((f"per-row `process` latency behind a vectorized rate-limited Generator, at {lat['rate'] / 1e3:.0f} K/s (half {of_max}), buffer timeout {label}",
                        f"p50 {_fmt_s(s['p50'])} / p99 {_fmt_s(s['p99'])}", comparison, ratio,
                        "p99 ≤ 50 ms, ≥ 10× below Spark" if label == "5ms" else "", _verdict(ok)))
        quarter = lat.get("streamsnap_5ms_quarter_rate")
        if quarter:
            out.append((f"per-row `process` latency behind a vectorized rate-limited Generator, at {lat['rate'] / 2e3:.0f} K/s (a quarter {of_max}), buffer timeout 5ms",
                        f"p50 {_fmt_s(quarter['p50'])} / p99 {_fmt_s(quarter['p99'])}", "", "",
                        "p99 ≤ 50 ms", _verdict(quarter["p99"] <= TARGETS["latency_p99"])))
    readme = results.get("latency_readme")
    if readme and readme.get("streamsnap_5ms"):
        s = readme["streamsnap_5ms"]
        out.append((f"per-row W1 latency the README way (per-row rate-limited Generator function → per-row "
                    f"`process`), at {readme['rate'] / 1e3:.0f} K/s (half {_latency_max_note(readme)}), "
                    f"buffer timeout 5ms", f"p50 {_fmt_s(s['p50'])} / p99 {_fmt_s(s['p99'])}", "", "",
                    "p99 ≤ 50 ms", _verdict(s["p99"] <= TARGETS["latency_p99"])))
    out += files_vs_spark_rows(results)
    out += window_latency_rows(results)
    out += state_backend_rows(results)
    rec = results.get("recovery")
    if rec:
        out.append(("recovery, a subtask SIGKILLed → first output after restore (in the slots that survived)",
                    f"median {_fmt_s(rec['median'])}", f"{len(rec['runs'])} kills, max {_fmt_s(max(rec['runs']))}",
                    "", "≤ 0.5 s", _verdict(rec["median"] <= TARGETS["recovery"])))
    slot = results.get("recovery_slot")
    if slot:
        out.append(("recovery, a slot SIGKILLed → first output after restore (a new Spark stage)",
                    f"median {_fmt_s(slot['median'])}", f"{len(slot['runs'])} kills, max {_fmt_s(max(slot['runs']))}",
                    "", "–", "–"))
    return out


def files_vs_spark_rows(results: dict) -> list[tuple]:
    """W1 on the same Parquet files against Spark Structured Streaming's file source
    (benchmarks/files_vs_spark.py): wall time from start to the last row, both checkpointing."""
    f = results.get("files_vs_spark")
    if not f:
        return []
    label = (f"W1 on {f['rows'] / 1e6:g} M rows of Parquet files, start → last row, 1 s checkpoints, vs Spark "
             f"Structured Streaming's file source (processingTime 1 s)")
    return [(f"{label}: Spark SQL groupBy/sum (per-key totals)", _fmt_rate(f["streamsnap"]),
             _fmt_rate(f["spark_sql"]), f"{f['ratio_vs_spark_sql']:.1f}×", "> 1×",
             _verdict(f["ratio_vs_spark_sql"] > 1)),
            (f"{label}: Spark transformWithStateInPandas (per-row sums)", _fmt_rate(f["streamsnap"]),
             _fmt_rate(f["spark_tws"]), f"{f['ratio_vs_spark_tws']:.1f}×", "> 1×",
             _verdict(f["ratio_vs_spark_tws"] > 1))]


def per_row_rows(results: dict) -> list[tuple]:
    """The README-way per-row figures (benchmarks/per_row.py), at each parallelism measured."""
    out = []
    for p in (1, 2):
        w1 = results.get(f"w1_row_readme_p{p}")
        if w1:
            target = p == 2
            out.append((f"W1 per-row the README way (per-row Generator fn, process emits every sum), p={p}, "
                        f"events/s", _fmt_rate(w1["events_per_second"]), "", "",
                        "≥ 1 M/s" if target else "",
                        _verdict(w1["events_per_second"] >= TARGETS["row_readme"]) if target else "–"))
        bw = results.get(f"bytewax_w1_p{p}")
        if w1 and bw:
            ratio = w1["events_per_second"] / bw["events_per_second"]
            out.append((f"W1 per-row the README way vs Bytewax 0.21 ({p} processes x 1 worker, 1 s snapshots, "
                        f"same flow), p={p}, events/s", _fmt_rate(w1["events_per_second"]),
                        f"Bytewax {_fmt_rate(bw['events_per_second'])}", f"{ratio:.1f}×", "≥ 3×",
                        _verdict(ratio >= 3)))
        rdb = results.get(f"w1_row_readme_rocksdb_p{p}")
        if w1 and rdb:
            share = rdb["events_per_second"] / w1["events_per_second"]
            out.append((f"W1 per-row the README way on RocksDB (state_backend='rocksdb', 1 s incremental "
                        f"checkpoints), p={p}, events/s", _fmt_rate(rdb["events_per_second"]),
                        f"heap {_fmt_rate(w1['events_per_second'])}", f"{share:.0%}", "≥ 50 % of heap",
                        _verdict(share >= 0.5)))
        direct = results.get(f"w1_row_readme_rocksdb_no_write_cache_p{p}")
        if w1 and direct:
            share = direct["events_per_second"] / w1["events_per_second"]
            out.append((f"W1 per-row the README way on RocksDB without its write cache "
                        f"(RocksDBConfig(write_cache_size=0)), p={p}, events/s",
                        _fmt_rate(direct["events_per_second"]),
                        f"heap {_fmt_rate(w1['events_per_second'])}", f"{share:.0%}", "", "–"))
        wc = results.get(f"word_count_p{p}")
        if wc:
            target = p == 2
            out.append((f"word count (per-row Generator fn → flat_map → map → filter → key_by → process), p={p}, "
                        f"words/s", _fmt_rate(wc["words_per_second"]), "", "",
                        "≥ 1 M/s" if target else "",
                        _verdict(wc["words_per_second"] >= TARGETS["word_count"]) if target else "–"))
    return out


NEXMARK_STATES = {"rocksdb": "RocksDB", "heap": "heap", "none": "no checkpoints"}
NEXMARK_TARGETS = {"Flink": 5.0, "Feldera": 1.0, "Spark SS": 3.0}   # issue 34: ≥ 5× Flink, ≥ Feldera, ≥ 3× Spark SS


def _ratio_cell(mine, theirs, target: float) -> str:
    if mine is None or theirs is None:
        return "–"
    ratio = mine / theirs
    return f"{ratio:.1f}× {_verdict(ratio >= target)}"


def _checkpoints_cell(r: dict) -> str:
    counts = r.get("checkpoints") or [d["checkpoints"] for d in r.get("details", [])]
    if not counts:
        return "–"
    low, high = min(counts), max(counts)
    return f"{low}" if low == high else f"{low}–{high}"


def nexmark_rows(results: dict) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The Nexmark table (results["nexmark"], benchmarks/nexmark/bench.py): its header and one row
    per query — streamsnap's events/s per core per state measured, the checkpoints each completed,
    the generator's share, Spark SS's per core or why it cannot express the query, Flink's and
    Feldera's published per-core figures (benchmarks/nexmark/field.py), and the ratios of the
    RocksDB row to each with issue 34's targets (≥ 5× Flink, ≥ Feldera, ≥ 3× Spark SS)."""
    from benchmarks.nexmark import catalog, field, spark_queries

    nx = results.get("nexmark") or {}
    measured = nx.get("queries", {})
    spark = nx.get("spark", {})
    errors = results.get("errors", {})
    states = [s for s in NEXMARK_STATES if s in nx.get("states", ()) or any(s in m for m in measured.values())]
    checkpointed = [s for s in states if s != "none"]
    header = ("query", *(f"streamsnap {NEXMARK_STATES[s]} /core" for s in states),
              *((f"checkpoints ({' / '.join(NEXMARK_STATES[s] for s in checkpointed)})",) if checkpointed else ()),
              "generator share", "streamsnap RocksDB /core on Spark's input", "Spark SS /core",
              "Flink 1.13 /core (published)", "Feldera /core (published)",
              "vs Flink (≥ 5×)", "vs Feldera (≥ 1×)", "vs Spark SS (≥ 3×)")
    generator = nx.get("generator", {}).get("events_per_cpu_second")
    out = []
    for q in catalog.QUERIES:
        per_state = measured.get(q, {})
        failed = {s for s in states if f"nexmark {q} {s}" in errors}
        if not per_state and not failed and q not in spark:
            continue
        rates = [_fmt_rate(per_state[s]["per_core"]) if s in per_state else "failed" if s in failed else "–"
                 for s in states]
        ckpts = [_checkpoints_cell(per_state[s]) if s in per_state else "–" for s in checkpointed]
        shares = [f"{per_state[s]['per_core'] / generator:.0%}" for s in states if s in per_state and generator]
        theirs = spark.get(q, {}).get("per_core")
        # The like-for-like figure: streamsnap over Spark's own Parquet files (results before
        # 2026-11-29's same-input runs lack it; their ratio is of the generator-fed row).
        same_input = spark.get(q, {}).get("streamsnap", {}).get("per_core")
        why = spark_queries.NOT_EXPRESSIBLE.get(q)
        spark_cell = _fmt_rate(theirs) if theirs else f"not expressible: {why}" if why else "not run"
        flink, feldera = field.flink_per_core(q), field.feldera_per_core(q)
        gaps = field.missing(q)
        main = per_state.get("rocksdb", {}).get("per_core")
        out.append((q, *rates, *((" / ".join(ckpts),) if checkpointed else ()), " / ".join(shares) or "–",
                    _fmt_rate(same_input) if same_input else "–", spark_cell, _fmt_rate(flink) if flink else f"– ({gaps['Flink']})",
                    _fmt_rate(feldera) if feldera else f"– ({gaps['Feldera']})",
                    _ratio_cell(main, flink, NEXMARK_TARGETS["Flink"]),
                    _ratio_cell(main, feldera, NEXMARK_TARGETS["Feldera"]),
                    _ratio_cell(same_input or main, theirs, NEXMARK_TARGETS["Spark SS"])))
    return header, out


def nexmark_note(results: dict) -> str:
    """How the Nexmark table was measured, in this run's terms, and where the field's figures come from."""
    from benchmarks.nexmark import field

    nx = results.get("nexmark") or {}
    generator = nx.get("generator", {})
    spark = next(iter(nx.get("spark", {}).values()), {}).get("spark")
    gen = (f"The generator alone makes {_fmt_rate(generator['events_per_cpu_second']).replace('/s', '')} events "
           f"per CPU second (batches of {generator['batch']:,}); generator share = a row's events/s per core / "
           f"that, the part of each core the generator takes. " if generator.get("events_per_cpu_second") else "")
    ours = (f"streamsnap: one job per query and state over "
            f"{nx.get('events', 0):,} events of the default NexmarkConfig (standard sizes, in order), median of "
            f"{nx.get('runs', 1)} run(s) after a warm-up, timed from the generator's first batch to the end of "
            f"input at the query's sink (generation, every operator, shuffles and the final window firing "
            f"included; deployment and teardown not), with exactly-once checkpoints every "
            f"{nx.get('interval', 10.0):g} s on RocksDB (incremental) or the heap (checkpoints: how many each run "
            f"completed; 0 means the run ended within one interval). {gen}The targets are judged on the RocksDB "
            f"row. ") if nx.get("queries") else "Only the comparison with Spark SS ran. "
    return (f"Nexmark: events/s per core = events/s at parallelism {nx.get('parallelism', 2)} on "
            f"{nx.get('cores', 2)} cores / {nx.get('cores', 2)}. {ours}Spark SS{f' {spark}' if spark else ''}: "
            f"the same events as Parquet (generation not timed, reading and decoding timed), one file per "
            f"micro-batch, Spark's trigger-to-commit time over micro-batches 2.., for every query it expresses "
            f"(benchmarks/nexmark/spark_queries.py says why not the others); output to the noop sink, q10's to "
            f"Spark's Parquet file sink partitioned as streamsnap's. Beside it, streamsnap over those very files "
            f"(its FileSource reading the columns the query reads, as Spark's plan does; state on RocksDB, "
            f"checkpoints every {nx.get('interval', 10.0):g} s, timed from the first reader's first poll to the "
            f"end of input at the sink): the vs Spark SS ratio is of that figure where measured, of the RocksDB "
            f"row otherwise. Published, not measured here: Flink from {field.FLINK_SOURCE}; Feldera from "
            f"{field.FELDERA_SOURCE}.")


def render_nexmark_table(results: dict) -> str:
    """The Nexmark table in Markdown, followed by its note; empty without Nexmark results."""
    header, body = nexmark_rows(results)
    if not body:
        return ""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines) + "\n\n" + nexmark_note(results)


def state_backend_rows(results: dict) -> list[tuple]:
    """Large keyed state per backend (benchmarks/state_backends.py): issue 13's targets."""
    out = []
    targets = {"hashmap": (0.5, None, "p50 ≤ 0.5 s"), "rocksdb": (0.3, 0.05, "p50 ≤ 0.3 s, written ≤ 5 % of full"),
               "rocksdb+changelog": (0.3, 0.05, "p50 ≤ 0.3 s, written ≤ 5 % of full")}
    for backend, r in results.get("state_backends", {}).items():
        duration_target, share_target, text = targets.get(backend, (None, None, ""))
        share = r.get("written_share_mean", r["written_share"])
        ok = None if duration_target is None else (
            r["p50"] <= duration_target and (share_target is None or share <= share_target))
        out.append((f"checkpoint, {r['keys']:,} keys on {backend}, {r['changed_per_interval']:.0%} of keys changed per interval",
                    f"p50 {_fmt_s(r['p50'])} / p99 {_fmt_s(r['p99'])}"
                    # Where it went (medians, slowest keyed subtask): results before 2026-11-26 lack it.
                    + ("" if "start_delay_p50" not in r else
                       f" (barrier reaches the keyed subtask {_fmt_s(r['start_delay_p50'])}, alignment "
                       f"{_fmt_s(r['alignment_duration_p50'])}, sync {_fmt_s(r['sync_duration_p50'])}, "
                       f"async {_fmt_s(r['async_duration_p50'])})"),
                    f"writes {r['written_bytes'] / 1e6:.1f} of {r['full_bytes'] / 1e6:.1f} MB (median)",
                    f"{share:.1%} written on average over {r['checkpoints']}"
                    + (f", measured once the keyed operator had consumed the load "
                       f"({_fmt_s(r['load_drained_after'])} after the source finished it)"
                       if "load_drained_after" in r else "")
                    + (f" (of them {r['materialized']} with a new materialization)" if r.get("materialized") else "")
                    + (f"; largest single upload {r['largest_written_bytes'] / 1e6:.1f} MB "
                       f"({r['largest_written_share']:.0%} of its checkpoint)"
                       if r.get("largest_written_bytes") is not None and backend == "rocksdb" else "")
                    + (f", of it in-flight data {r['in_flight_bytes'] / 1e6:.1f} MB (median)" if r.get("unaligned") else ""),
                    text, _verdict(ok)))
        restore = r.get("restore")
        read = "" if not restore else (f"read {restore['local_bytes'] / 1e6:.1f} MB locally, "
                                       f"{restore['remote_bytes'] / 1e6:.1f} MB from storage")
        local = r.get("local_recovery", False)
        out.append((f"recovery of {r['keys']:,} keys on {backend}, SIGKILL → first output",
                    _fmt_s(r["recovery_first_output"]), f"running after {_fmt_s(r['recovery_running'])}", read,
                    "≤ 3 s (with local recovery)",
                    _verdict(r["recovery_first_output"] <= 3.0) if local else "–"))
    return out


def _latency_max_note(lat: dict) -> str:
    """What the latency rate is a share of: the same job's max with the same settings (results
    from before 2026-11-25 took it from the throughput run, another configuration)."""
    m = lat.get("max_rate")
    if not m:
        return "of the per-row W1 max"
    return (f"of the same job's max, {_fmt_rate(m['events_per_second'])}, with a "
            f"{m['buffer_timeout'] * 1000:g} ms timeout and {m['checkpoint_interval']:g} s checkpoints")


def window_latency_rows(results: dict) -> list[tuple]:
    """Keyed event-time window count (benchmarks/window_latency.py): window end -> result."""
    wl = results.get("window_latency")
    if not wl:
        return []
    out = []
    for share in (0.5, 0.25):
        r = wl.get(f"at_{share:g}_max")
        if not r:
            continue
        out.append((f"window count latency (window end → result) at {share:g} × its max ({_fmt_rate(wl['max_rate'])}), "
                    f"{r['window_ms']:.0f} ms windows, watermark delay {r['delay_ms']:.0f} ms",
                    f"p50 {r['p50_ms']:.0f} ms / p99 {r['p99_ms']:.0f} ms", "", "",
                    f"p99 ≤ delay + 50 ms = {r['target_ms']:.0f} ms" if share == 0.5 else "",
                    _verdict(r["met"]) if share == 0.5 else "–"))
    return out


def render_table(results: dict) -> str:
    header = ("figure", "streamsnap", "comparison", "ratio", "target", "")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(results)]
    for name, error in results.get("errors", {}).items():
        lines.append(f"| {name} | failed: {error} | | | | |")
    nexmark = render_nexmark_table(results)
    return "\n".join(lines) + (f"\n\n{nexmark}" if nexmark else "")


def _plots(results: dict, directory: str, stem: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    bars = [(label, _rate(results, key)) for label, key in (
        ("streamsnap\nper-row", "w1_row_no_checkpoints"), ("streamsnap\nper-row +ckpt", "w1_row_checkpoints_1s"),
        ("streamsnap\nvectorized", "w1_batch_no_checkpoints"),
        ("streamsnap\nvectorized +ckpt", "w1_batch_checkpoints_1s"),
        ("Spark SQL\ngroupBy/sum", "spark_sql_aggregation"),
        ("Spark transformWith-\nStateInPandas", "spark_transform_with_state_in_pandas"),
        ("ceiling\n(Arrow+numpy)", "ceiling"))]
    bars = [(l, v) for l, v in bars if v]
    if bars:
        fig, ax = plt.subplots(figsize=(10, 4.5))
        ax.bar([l for l, _ in bars], [v for _, v in bars], color=["#3b7dd8" if "streamsnap" in l else "#999999"
                                                                  for l, _ in bars])
        ax.set_yscale("log")
        ax.set_ylabel("events / s (log)")
        ax.set_title("W1 keyed running sum, parallelism 2")
        for i, (_, v) in enumerate(bars):
            ax.text(i, v, _fmt_rate(v), ha="center", va="bottom", fontsize=8)
        plt.xticks(fontsize=8)
        written.append(_save(plt, fig, directory, f"{stem}-throughput.png"))
    costs = results.get("checkpoint_cost")
    if costs:
        fig, ax = plt.subplots(figsize=(6, 4))
        keys = [c["keys"] for c in costs]
        ax.plot(keys, [c["p50"] for c in costs], "o-", label="p50")
        ax.plot(keys, [c["p99"] for c in costs], "s--", label="p99")
        ax.set_xscale("log")
        ax.set_xlabel("keys in state")
        ax.set_ylabel("checkpoint duration (s)")
        for c in costs:
            ax.annotate(f"{c['state_bytes'] / 1e6:.1f} MB", (c["keys"], c["p99"]), fontsize=8)
        ax.legend()
        ax.set_title("checkpoint duration vs state size")
        written.append(_save(plt, fig, directory, f"{stem}-checkpoints.png"))
    lat = results.get("latency")
    if lat:
        series = [(k.replace("streamsnap_", "streamsnap ").replace("_", " "), v) for k, v in lat.items()
                  if isinstance(v, dict) and "p99" in v]
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = range(len(series))
        ax.bar([x - 0.2 for x in xs], [v["p50"] * 1000 for _, v in series], width=0.4, label="p50")
        ax.bar([x + 0.2 for x in xs], [v["p99"] * 1000 for _, v in series], width=0.4, label="p99")
        ax.set_xticks(list(xs), [s for s, _ in series], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("event → sink latency (ms, log)")
        ax.set_title(f"latency at {lat['rate'] / 1e3:.0f} K events/s")
        ax.legend()
        written.append(_save(plt, fig, directory, f"{stem}-latency.png"))
    return written


def _save(plt, fig, directory: str, name: str) -> str:
    fig.tight_layout()
    path = os.path.join(directory, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(results: dict, directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    stem = datetime.date.today().isoformat()
    with open(os.path.join(directory, f"{stem}.json"), "w") as f:   # first: the figures outlive a plot's failure
        json.dump(results, f, indent=1, default=str)
    plots = _plots(results, directory, stem)
    lines = [f"# Benchmarks {stem} ({results['profile']})", "",
             f"{results['machine']}; run took {results.get('seconds', 0) / 60:.1f} min. "
             f"streamsnap throughput is timed inside the job (first to last row at the sink), Spark's from its "
             f"own per-micro-batch timings (trigger to commit) after the first batch; every figure is a median over runs made in the same run as its comparison. Reproduce: `python -m benchmarks run --{results['profile']}`.", "",
             render_table(results), ""]
    for path in plots:
        lines.append(f"![{os.path.basename(path)}]({os.path.basename(path)})")
    for key, what in (("recovery", "a subtask"), ("recovery_slot", "a slot")):
        rec = results.get(key)
        if rec:
            lines += ["", f"Recovery phases per kill of {what} (seconds after SIGKILL: noticed / all running / "
                          f"first output; restart):", ""]
            lines += [f"- {p['noticed']:.3f} / {p['running']:.3f} / {p['first_output']:.3f}; {p.get('restart')}"
                      for p in rec["phases"]]
    lines += ["", f"Raw figures: [{stem}.json]({stem}.json)"]
    path = os.path.join(directory, f"{stem}.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path
