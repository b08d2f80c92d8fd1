"""The Spark Structured Streaming baselines: correct results at tiny sizes, clean-up afterwards."""

from __future__ import annotations

import os
from collections import defaultdict

import numpy as np
import pyarrow.parquet as pq
import pytest

from benchmarks import spark_baselines as sb

pytestmark = pytest.mark.spark

N, K = 2000, 10
CONFS = (sb.PROVIDER_CONF, sb.SHUFFLE_CONF, sb.PROGRESS_RETENTION_CONF)


def reference_sums(n: int, k: int) -> dict[int, int]:
    sums: dict[int, int] = defaultdict(int)
    for i in range(n):
        sums[i % k] += i
    return dict(sums)


def explicit_confs(spark) -> dict:
    return {key: spark.conf.get(key, None) for key in CONFS}


class Collect:
    """A foreachBatch sink keeping every output row."""

    def __init__(self):
        self.batches: list[tuple[int, list]] = []

    def __call__(self, batch_df, batch_id):
        self.batches.append((batch_id, batch_df.collect()))

    @property
    def rows(self) -> list:
        return [row for _, rows in sorted(self.batches, key=lambda b: b[0]) for row in rows]


@pytest.fixture(scope="module")
def w1_input(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("w1") / "in")
    sb.write_w1_input(directory, N, K, files=4)
    return directory


@pytest.fixture
def clean(spark):
    """Every baseline leaves no stream running and the session's conf as it found it."""
    before = explicit_confs(spark)
    yield
    assert spark.streams.active == []
    assert explicit_confs(spark) == before


def test_write_w1_input(w1_input, tmp_path):
    names = sorted(os.listdir(w1_input))
    assert names == [f"part-{j:05d}.parquet" for j in range(4)]
    mtimes = [os.stat(os.path.join(w1_input, f)).st_mtime_ns for f in names]
    assert mtimes == sorted(mtimes) and len(set(mtimes)) == 4
    tables = [pq.read_table(os.path.join(w1_input, f)) for f in names]
    for t in tables:
        assert [(f.name, str(f.type)) for f in t.schema] == [
            ("key", "int64"), ("value", "int64"), ("ts", "double")]
    values = np.concatenate([t.column("value").to_numpy() for t in tables])
    assert np.array_equal(values, np.arange(N))  # file order = row order
    keys = np.concatenate([t.column("key").to_numpy() for t in tables])
    assert np.array_equal(keys, np.arange(N) % K)
    assert all((t.column("ts").to_numpy() == 0.0).all() for t in tables)
    with pytest.raises(FileExistsError, match="already holds Parquet files"):
        sb.write_w1_input(w1_input, 10, 2)
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        sb.write_w1_input(str(tmp_path / "other"), 10, 0)


def test_errors_name_the_directory(spark, w1_input, tmp_path, clean):
    missing = str(tmp_path / "no-such-input")
    baselines = [sb.run_sql_aggregation]
    if not sb.missing_tws_dependencies():
        baselines.append(sb.run_transform_with_state_in_pandas)  # else it stops at the import check
    for fn in baselines:
        with pytest.raises(FileNotFoundError) as info:
            fn(spark, missing, str(tmp_path / "ckpt"))
        assert missing in str(info.value)
    used = tmp_path / "used-ckpt"
    used.mkdir()
    (used / "offsets").mkdir()
    with pytest.raises(FileExistsError, match="used-ckpt"):
        sb.run_sql_aggregation(spark, w1_input, str(used))


def test_sql_aggregation_sums(spark, w1_input, tmp_path, clean):
    sink = Collect()
    result = sb.run_sql_aggregation(spark, w1_input, str(tmp_path / "ckpt"), sink=sink)
    assert result["rows"] == N and result["batches"] == 1 and result["seconds"] > 0
    assert {row["key"]: row["sum"] for row in sink.rows} == reference_sums(N, K)


def test_sql_aggregation_keeps_state_across_batches(spark, w1_input, tmp_path, clean):
    sink = Collect()
    result = sb.run_sql_aggregation(spark, w1_input, str(tmp_path / "ckpt"), shuffle_partitions=3,
                                    max_files_per_trigger=1, sink=sink)
    assert result["rows"] == N and result["batches"] == 4
    final = {}
    for row in sink.rows:  # update mode: the last update of a key is its sum so far
        final[row["key"]] = row["sum"]
    assert final == reference_sums(N, K)


def test_sql_aggregation_noop_and_conf_restored(spark, w1_input, tmp_path, clean):
    spark.conf.set(sb.PROVIDER_CONF,
                   "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider")
    try:
        result = sb.run_sql_aggregation(spark, w1_input, str(tmp_path / "ckpt"))
        assert spark.conf.get(sb.PROVIDER_CONF).endswith("HDFSBackedStateStoreProvider")
    finally:
        spark.conf.unset(sb.PROVIDER_CONF)
    assert result["rows"] == N and result["batches"] == 1


def test_failing_sink_cleans_up(spark, w1_input, tmp_path, clean):
    def broken(batch_df, batch_id):
        raise ValueError("sink broke")

    with pytest.raises(Exception, match="sink broke"):
        sb.run_sql_aggregation(spark, w1_input, str(tmp_path / "ckpt"), sink=broken)


def test_transform_with_state_in_pandas(spark, w1_input, tmp_path, clean):
    pytest.importorskip("pandas")
    pytest.importorskip("google.protobuf", reason="transformWithStateInPandas needs protobuf")
    sink = Collect()
    result = sb.run_transform_with_state_in_pandas(spark, w1_input, str(tmp_path / "ckpt"),
                                                   max_files_per_trigger=2, sink=sink)
    assert result["rows"] == N and result["batches"] == 2
    rows = sink.rows
    assert len(rows) == N  # one output row per input row
    assert sorted(row["value"] for row in rows) == list(range(N))
    by_key = defaultdict(list)
    for row in rows:
        assert row["key"] == row["value"] % K
        by_key[row["key"]].append(row)
    expected = reference_sums(N, K)
    for key, key_rows in by_key.items():
        # Running sums are the prefix sums of the order the rows were processed in (shuffle
        # order within a batch): sorted, their steps are exactly the key's values, and the last
        # one, which the state carried across both batches, is the key's total.
        sums = np.sort([row["running_sum"] for row in key_rows])
        steps = np.diff(sums, prepend=0)
        assert sorted(steps.tolist()) == sorted(row["value"] for row in key_rows)
        assert sums[-1] == expected[key]


def test_microbatch_latency(spark, tmp_path, clean):
    # 8 s: on a loaded machine (two suites side by side on 2 cores) the query's first micro-batch
    # with data took more than 4 s to come (planning, code generation).
    result = sb.run_microbatch_latency(spark, 200, 8.0, str(tmp_path / "ckpt"), k=K, warmup=0.0)
    assert result["batches"] >= 1
    assert result["samples"] >= 200 and result["samples"] % 200 == 0  # whole rate-source seconds
    assert 0 < result["p50"] <= result["p99"] < 10
    assert 0 < result["p50_after_release"] <= result["p99_after_release"] <= result["p99"]


def test_rate_source_timestamps_match_the_latency_model(spark, tmp_path, clean):
    """run_microbatch_latency derives each row's creation time as start + v / rate, with start
    read from the source's checkpoint metadata: check that against the stamped rows."""
    seen = Collect()
    ckpt = str(tmp_path / "ckpt")
    query = (spark.readStream.format("rate").option("rowsPerSecond", 50)
             .option("numPartitions", 2).load()
             .writeStream.foreachBatch(seen).option("checkpointLocation", ckpt).start())
    try:
        query.awaitTermination(2.5)
    finally:
        query.stop()
    rows = seen.rows
    assert rows, "the rate source produced no row in 2.5 s"
    start_ms = sb._rate_source_start_ms(ckpt)
    for row in rows:
        stamped_ms = row["timestamp"].timestamp() * 1000
        assert abs(stamped_ms - (start_ms + row["value"] * 1000 / 50)) <= 1.0


def test_a_processing_time_query_runs_until_it_has_read_the_input(spark, w1_input, tmp_path, clean):
    stream = sb.sql_aggregation_stream(spark, w1_input, max_files_per_trigger=1)
    result = sb.run_processing_time(spark, stream, "update", w1_input, str(tmp_path / "ckpt"), trigger_seconds=0.2)
    assert result["rows"] == N and result["batches"] == 4 and result["seconds"] > 0


def test_files_vs_spark_runs_streamsnap_on_the_same_files(spark, w1_input):
    from benchmarks import files_vs_spark, report

    run = files_vs_spark.run_streamsnap(spark, w1_input, N)        # raises unless it read all N rows
    assert run["events_per_second"] > 0
    figures = {"rows": N, "streamsnap": 2.0, "spark_sql": 1.0, "spark_tws": 0.5, "ratio_vs_spark_sql": 2.0,
               "ratio_vs_spark_tws": 4.0}
    assert [r[3] for r in report.files_vs_spark_rows({"files_vs_spark": figures})] == ["2.0×", "4.0×"]
