"""DataFrames and Arrow tables in, sink output back out as DataFrames, on real Spark."""

from __future__ import annotations

import glob

import pyarrow as pa
import pytest

import streamsnap as ss
from tests.integration.support import RunningSum, final_by_key

pytestmark = pytest.mark.spark


def test_a_dataframe_is_materialized_once_into_the_job_storage_and_read_in_parallel(spark, tmp_path):
    df = spark.range(0, 6000, 1, 4).selectExpr("id % 7 as key", "id as value")
    env = ss.StreamEnvironment(parallelism=2, spark=spark,
                               checkpointing=ss.CheckpointConfig(interval=0.5, directory=str(tmp_path / "ckpt")))
    out = ss.sinks.FileSink(str(tmp_path / "out"))
    env.from_dataframe(df, name="numbers", uid="numbers").key_by("key").process(RunningSum(), uid="sum").sink_to(out)
    result = env.execute("from dataframe")
    # One Parquet file per DataFrame partition, under the job's directory in checkpoint storage.
    assert len(glob.glob(str(tmp_path / "ckpt" / "*" / "inputs" / "numbers-*" / "part-*.parquet"))) == 4
    assert result.records_in == 6000
    committed = [r.asDict() for r in out.to_dataframe(spark).collect()]
    assert len(committed) == 6000
    assert final_by_key(committed, "key", "total") == {k: sum(range(k, 6000, 7)) for k in range(7)}


def test_an_arrow_table_is_cut_into_splits_and_collect_output_becomes_a_dataframe(spark, tmp_path):
    table = pa.table({"key": [i % 3 for i in range(900)], "value": list(range(900))})
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    env.from_arrow(table, splits=3, staging_dir=str(tmp_path / "staging")).key_by("key") \
        .process(RunningSum(), uid="sum").sink_to(ss.sinks.Collect())
    result = env.execute("from arrow")
    assert len(glob.glob(str(tmp_path / "staging" / "arrow-*" / "part-*.parquet"))) == 3
    assert final_by_key(result.rows(), "key", "total") == {k: sum(range(k, 900, 3)) for k in range(3)}
    frame = result.to_dataframe(spark)
    assert frame.columns == ["key", "total"] and frame.count() == 900


def test_bad_inputs_say_what_to_pass(spark):
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    with pytest.raises(ss.ConfigurationError, match="takes a pyspark DataFrame or a pyarrow Table, got list"):
        env.from_dataframe([{"a": 1}])
    with pytest.raises(ss.ConfigurationError, match="splits must be an integer >= 1"):
        env.from_arrow(pa.table({"a": [1]}), splits=0)
    stream = spark.readStream.format("rate").load()
    with pytest.raises(ss.ConfigurationError, match="is a streaming one.*read_files"):
        env.from_dataframe(stream)
