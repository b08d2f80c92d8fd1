"""Task tracing (runtime/trace.py): off without STREAMSNAP_TRACE_DIR; with it, timed units of
work land in a JSON-lines file that benchmarks/latency_trace.py sums up."""

from __future__ import annotations

import gc
import time

import pyarrow as pa

from benchmarks.latency_trace import summarize
from streamsnap.runtime import trace
from tests.runtime.test_row_chain import _chain


def test_tracing_is_off_without_the_variable(monkeypatch):
    monkeypatch.delenv(trace.DIR_ENV, raising=False)
    assert trace.install(object()) is None


def test_timed_batches_gcs_and_totals_are_written_and_summed_up(tmp_path):
    traced = trace.TaskTrace(str(tmp_path), "sum -> sink (1/2)", stamp="ts")
    operators, sink, _ = _chain([("map", lambda r: {**r, "v": r["v"] + 1})], fused=False)
    head = operators[0]
    head.process = traced._timed("batch", head.process, lambda args: traced._rows_and_oldest(args[0]))
    gc.callbacks.append(traced._on_gc)
    created = time.time() - 0.5
    head.process(pa.RecordBatch.from_pylist([{"v": 1, "ts": created}, {"v": 2, "ts": created + 0.1}]))
    head.process([{"v": 3, "ts": created}])
    gc.collect()
    path = traced.close()
    assert traced._on_gc not in gc.callbacks
    assert [r["v"] for r in sink.rows()] == [2, 3, 4]
    assert path.endswith(".jsonl") and "sum_-_sink_1_2" in path
    (summary,) = summarize(str(tmp_path))
    assert summary["batches"] == 2 and summary["rows"] == 3
    assert 450 < summary["age_at_start_ms_p50"] < 5000     # from the oldest row's stamp
    assert summary["gc2"]["count"] >= 1
    assert "slowest_1pct" in summary
