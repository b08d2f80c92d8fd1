"""The README-way per-row benchmarks (benchmarks/per_row.py) run on Spark and count every row.

Tiny sizes: these check the plumbing (start stamps, end reports, output counts), never speed.
"""

from __future__ import annotations

import math

import pytest

from benchmarks import per_row, report, workloads

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True)
def _delete_checkpoints():
    yield
    workloads.cleanup()


@pytest.mark.parametrize("parallelism", [1, 2])
def test_w1_readme_emits_every_running_sum(spark, parallelism):
    result = per_row.run_w1_readme(spark, 20_000, 100, parallelism, checkpoint_interval=0.2)
    assert result["output_rows"] == 20_000
    assert result["per_second"] > 0 and math.isfinite(result["per_second"])
    assert 0 < result["seconds"] < result["job_seconds"]


def test_word_count_counts_every_word(spark):
    result = per_row.run_word_count(spark, 5_000, 2, checkpoint_interval=None)
    # 25 000 words over 16 distinct words: each passes 1000 once (1 562 or so per word).
    assert result["output_rows"] == per_row._expected_word_count_rows(5_000) == 16
    assert result["per_second"] > 0 and math.isfinite(result["per_second"])


def test_measure_reports_both_pipelines_per_parallelism(spark):
    results = per_row.measure(spark, 4_000, 1_000, k=10, runs=1, parallelisms=(2,), checkpoint_interval=None,
                              bytewax=False)
    assert set(results) == {"w1_row_readme_p2", "word_count_p2", "w1_row_readme_rocksdb_p2",
                            "w1_row_readme_rocksdb_no_write_cache_p2"}
    assert results["w1_row_readme_p2"]["events_per_second"] > 0
    assert results["w1_row_readme_rocksdb_p2"]["events_per_second"] > 0
    assert results["word_count_p2"]["words_per_second"] > 0
    table = report.render_table({**results, "errors": {}})
    assert "W1 per-row the README way" in table and "word count" in table and "on RocksDB" in table


def test_bytewax_w1_runs_two_processes_and_counts_every_sum():
    """The comparison flow itself (needs the bench extra: skipped where Bytewax is not installed)."""
    pytest.importorskip("bytewax")
    from benchmarks import bytewax_w1

    result = bytewax_w1.run(20_000, k=100)
    assert result["output_rows"] == 20_000
    assert result["per_second"] > 0 and math.isfinite(result["per_second"])
    rendered = report.per_row_rows({"w1_row_readme_p2": {"events_per_second": 3e6},
                                    "bytewax_w1_p2": {"events_per_second": 1e6}})
    assert any("Bytewax" in row[2] and row[3] == "3.0×" and row[5] == "met" for row in rendered)


def test_sentences_are_the_word_count_examples():
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "word_count.py")
    spec = importlib.util.spec_from_file_location("word_count_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert all(per_row.sentence(i) == example.sentence(i) for i in range(1000))


def test_readme_way_latency_job_runs_a_per_row_rate_limited_source(spark):
    """The README-way latency variant (per-row Generator function with rate=, per-row process,
    5 ms timeout): its max-rate run and a latency run at a small rate both see every sink row."""
    m = per_row.w1_latency_readme_max_rate(spark, 8_000, 50, runs=1)
    assert m["events_per_second"] > 0 and math.isfinite(m["events_per_second"])
    assert (m["buffer_timeout"], m["checkpoint_interval"]) == (0.005, 1.0)
    result = per_row.w1_latency_readme(spark, rate=4000, seconds=1.5, k=50, warmup=0.3)
    assert result["samples"] > 1000
    assert 0 < result["p50"] <= result["p99"] <= result["max"] < 5.0
    rendered = report.rows({"latency_readme": {"rate": 2000, "max_rate": m, "streamsnap_5ms": result}})
    assert any("README way" in row[0] and "per-row rate-limited Generator" in row[0] for row in rendered)
