"""The lakehouse benchmark (benchmarks/lakehouse.py) on a tiny input: the Delta side writes exactly
the rows it read and records its commits (the discarding side is the same job, W1 as
benchmarks/workloads.py builds it); a side of another name is refused; the table prints."""

from __future__ import annotations

import pytest

from benchmarks import lakehouse

pytestmark = pytest.mark.spark

N = 10_000


def test_the_delta_side_writes_every_row_once_and_records_its_commits(spark, tmp_path):
    delta = lakehouse.run_streamsnap(spark, N, "delta", str(tmp_path))   # raises unless the table holds N rows
    assert delta["commits"] >= 1 and delta["commit_seconds"] > 0 and delta["checkpoint_seconds"] > 0
    assert delta["events_per_second"] > 0


def test_a_side_that_is_not_delta_or_discard_is_refused_by_name(spark, tmp_path):
    with pytest.raises(ValueError, match="sink must be 'delta' or 'discard', got 'kafka'"):
        lakehouse.run_streamsnap(spark, N, "kafka", str(tmp_path))


def test_the_table_shows_the_ratios_and_what_spark_cannot_write():
    figures = {"delta": 2e6, "discard": 4e6, "spark_parquet": 1e6, "delta_vs_discard": 0.5,
               "delta_vs_spark_parquet": 2.0, "spark_delta": lakehouse.SPARK_DELTA, "commit_seconds": 0.01,
               "checkpoint_seconds": 0.09, "commit_share": 0.1}
    text = lakehouse.table(figures)
    assert "Delta = 50% of it" in text and "Delta = 2.0×" in text and "Maven" in text and "10%" in text
