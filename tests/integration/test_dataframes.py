"""from_dataframe across a SIGKILL: the restored readers continue their Parquet splits exactly."""

from __future__ import annotations

import glob
import time

import pytest

import streamsnap as ss
from tests.integration.support import SlowRunningSum, kill_a_reader_mid_input, wait_status

pytestmark = pytest.mark.spark


def test_a_dataframe_source_is_exactly_once_across_a_sigkill(spark, tmp_path):
    n = 18_000
    df = spark.range(0, n, 1, 6).selectExpr("id % 11 as key", "1 as value", "id as i")
    kill_a_reader_mid_input(
        spark, tmp_path, lambda env: env.from_dataframe(df, name="frame", uid="reader", batch_size=256), n)


class SlowerSum(SlowRunningSum):
    def process_element(self, row, ctx):
        time.sleep(0.0005)  # 12 000 rows: ~3 s of work per subtask, so the stop comes mid-input
        yield from super().process_element(row, ctx)


def test_a_job_restored_from_a_savepoint_continues_the_same_copy_at_another_parallelism(spark, tmp_path):
    n = 12_000
    df = spark.range(0, n, 1, 6).selectExpr("id % 11 as key", "1 as value", "id as i")
    checkpoints = ss.CheckpointConfig(interval=0.3, directory=str(tmp_path / "ckpt"))

    def job(parallelism):
        # Small network buffers: the savepoint's barrier must not queue behind the whole input.
        env = ss.StreamEnvironment(parallelism=parallelism, spark=spark, checkpointing=checkpoints,
                                   network=ss.NetworkConfig(batch_size=256, credits=1, output_queue_frames=1))
        (env.from_dataframe(df, name="frame", uid="frame", batch_size=256)
            .key_by("key").process(SlowerSum(), uid="sum").sink_to(ss.sinks.Collect()))
        return env

    client = job(2).execute_async("dataframe savepoint")
    wait_status(client, "RUNNING")
    time.sleep(0.5)
    savepoint = client.stop_with_savepoint(str(tmp_path / "savepoints"))
    before = client.wait(60).rows()
    assert len(before) < n
    after = job(3).execute("dataframe savepoint", restore_from=savepoint).rows()
    assert sorted(r["i"] for r in before + after) == list(range(n))
    # The restored run read the copy its splits name; it wrote none of its own.
    assert len(glob.glob(str(tmp_path / "ckpt" / "*" / "inputs" / "frame-*"))) == 1
