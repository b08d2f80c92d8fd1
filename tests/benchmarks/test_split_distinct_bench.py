"""Tiny sizes: the split distinct benchmark's jobs run end to end, split and unsplit, and agree
(the hot-key run checks its one window's counts, q16 that both give the same rows); never speed."""

from __future__ import annotations

import pytest

from benchmarks import split_distinct

pytestmark = pytest.mark.spark


def test_the_benchmark_runs_both_jobs_split_and_unsplit(spark):
    rows = split_distinct.measure(spark, 20_000, 4, ["rocksdb"], 20_000)
    assert [(r["job"], r["state"], r["buckets"]) for r in rows] == [("hot key", "rocksdb", 4),
                                                                     ("nexmark q16", "rocksdb", 4)]
    assert all(r["unsplit"] > 0 and r["split"] > 0 for r in rows)
    table = split_distinct.table(rows)
    assert "| hot key | rocksdb | 20,000 |" in table and "≥ 1.3" in table

