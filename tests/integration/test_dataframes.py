"""from_dataframe across a SIGKILL: the restored readers continue their Parquet splits exactly."""

from __future__ import annotations

import pytest

from tests.integration.support import kill_a_reader_mid_input

pytestmark = pytest.mark.spark


def test_a_dataframe_source_is_exactly_once_across_a_sigkill(spark, tmp_path):
    n = 18_000
    df = spark.range(0, n, 1, 6).selectExpr("id % 11 as key", "1 as value", "id as i")
    kill_a_reader_mid_input(
        spark, tmp_path, lambda env: env.from_dataframe(df, name="frame", uid="reader", batch_size=256), n)
