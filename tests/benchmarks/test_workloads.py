"""The streamsnap workloads of the benchmark suite run on Spark and report sane figures.

Tiny sizes: these check that every workload runs end to end (a broken one would only show up
ten minutes into `python -m benchmarks run`), never how fast anything is.
"""

from __future__ import annotations

import math

import pytest

from benchmarks import workloads

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True)
def _delete_checkpoints():
    yield
    workloads.cleanup()


@pytest.mark.parametrize("form", ["row", "batch"])
def test_w1_run_counts_every_row_and_checkpoints(spark, form):
    result = workloads.run_w1(spark, 200_000, 100, form, checkpoint_interval=0.2)
    assert result["events_per_second"] > 0 and math.isfinite(result["events_per_second"])
    assert result["checkpoints"] >= 1


def test_w1_latency_collects_samples_from_every_sink_subtask(spark):
    result = workloads.w1_latency(spark, rate=4000, seconds=2.0, k=100, form="row",
                                  buffer_timeout=0.005, warmup=0.5)
    assert result["samples"] > 1000
    assert 0 < result["p50"] <= result["p99"] <= result["p999"] <= result["max"] < 5.0


def test_w1_latency_max_rate_runs_the_latency_job_unthrottled_with_its_settings(spark):
    from benchmarks import report

    m = workloads.w1_latency_max_rate(spark, 60_000, 100, runs=1)
    assert m["events_per_second"] > 0 and math.isfinite(m["events_per_second"])
    assert (m["buffer_timeout"], m["checkpoint_interval"], m["source_batch"]) == (0.005, 1.0, workloads.LATENCY_SOURCE_BATCH)
    half = {"p50": 0.01, "p99": 0.02}
    rendered = report.rows({"latency": {"rate": m["events_per_second"] / 2, "max_rate": m, "streamsnap_5ms": half}})
    assert "half of the same job's max" in rendered[0][0] and "5 ms timeout and 1 s checkpoints" in rendered[0][0]


def test_w1_rejects_an_unknown_form(spark):
    with pytest.raises(ValueError, match="form"):
        workloads.run_w1(spark, 10, 10, "columnar", checkpoint_interval=None)


def test_window_latency_measures_from_the_window_end_and_max_rate_from_the_source(spark):
    from benchmarks import window_latency

    rate = window_latency.max_rate(spark, 100_000, k=50)
    assert rate > 0 and math.isfinite(rate)
    result = window_latency.window_latency(spark, rate=3000, seconds=2.0, k=50, delay=0.1, size=0.2, warmup=0.5)
    # A window result can only exist once the watermark passed its end, at least the delay after
    # it — except the last windows, which the bounded input's end-of-time fires early: at most the
    # windows of the last delay + one window size, 50 keys each.
    assert result["results"] > 100 and result["delay_ms"] <= result["p50_ms"] + 1 <= result["p99_ms"] + 1
    assert result["fired_at_end_of_input"] <= 2 * 50
    assert result["target_ms"] == 150


@pytest.mark.parametrize("changelog", [False, True], ids=["incremental", "changelog"])
def test_large_state_measures_steady_checkpoints_and_a_recovery(spark, changelog):
    import streamsnap as ss
    from benchmarks import report, state_backends

    backend = ss.RocksDBConfig(changelog=True) if changelog \
        else "rocksdb"
    label = "rocksdb+changelog+local" if changelog else "rocksdb+local"
    r = state_backends.large_state(spark, 50_000, backend, steady_checkpoints=2, changed=0.02, interval=0.5,
                                   local_recovery=True)
    assert r["checkpoints"] == 2 and 0 < r["p50"] <= r["p99"] < 30
    assert 0 < r["largest_written_bytes"] <= max(row[6] for row in r["timeline"])
    # 2 % of the keys changed per interval: an incremental checkpoint writes a fraction of the state.
    assert 0 < r["written_bytes"] < r["full_bytes"] and r["written_share"] < 0.5
    assert 0 < r["recovery_running"] <= r["recovery_first_output"] < 60
    # With local recovery the restore read the task-local copies, nothing from storage.
    assert r["restore"]["local_bytes"] > 0 and r["restore"]["remote_files"] == 0, r["restore"]
    rendered = report.state_backend_rows({"state_backends": {label: r}})
    assert f"50,000 keys on {label}" in rendered[0][0]
    assert "locally" in rendered[1][3]
    # Where the duration went: each part of it per measured checkpoint, their medians rendered.
    assert len(r["timeline"]) <= 2 and all(len(row) == 8 for row in r["timeline"])
    assert all(r[f"{part}_p50"] >= 0 for part in ("start_delay", "alignment_duration", "sync_duration",
                                                   "async_duration"))
    assert "barrier reaches the keyed subtask" in rendered[0][1]


def test_recovery_time_names_its_victims():
    with pytest.raises(ValueError, match="victim must be 'subtask' or 'slot'"):
        workloads.recovery_time(None, victim="host")
