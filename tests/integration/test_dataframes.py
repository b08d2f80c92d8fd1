"""from_dataframe across a SIGKILL: the restored readers continue their Parquet splits exactly."""

from __future__ import annotations

import os
import signal
import time

import pytest

import streamsnap as ss
from tests.integration.support import RunningSum, final_by_key, wait_completed, wait_status

pytestmark = pytest.mark.spark


class SlowSum(RunningSum):
    def __init__(self):
        super().__init__(carry=("i",))

    def process_element(self, row, ctx):
        if row["i"] % 10 == 0:
            time.sleep(0.002)   # ~2 s of work: the readers are mid-file when one is killed
        yield from super().process_element(row, ctx)


def test_a_dataframe_source_is_exactly_once_across_a_sigkill(spark, tmp_path):
    n = 18_000
    df = spark.range(0, n, 1, 6).selectExpr("id % 11 as key", "1 as value", "id as i")
    config = ss.CheckpointConfig(interval=0.3, directory=str(tmp_path / "ckpt"))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               restart=ss.RestartStrategy.fixed_delay(3, 0.0),
                               network=ss.NetworkConfig(batch_size=256, credits=2, output_queue_frames=2))
    (env.from_dataframe(df, name="frame", uid="frame", batch_size=256)
        .key_by("key").process(SlowSum(), name="sum", uid="sum").sink_to(ss.sinks.Collect()))
    client = env.execute_async("dataframe with a failure")
    wait_status(client, "RUNNING")
    wait_completed(client, 1, timeout=30)
    reader = [s for s in client.subtasks() if s.vertex == "frame"][0]
    assert reader.state == "RUNNING"
    os.kill(reader.pid, signal.SIGKILL)
    result = client.wait(120)
    assert result.restarts == 1
    rows = result.rows()
    assert sorted(r["i"] for r in rows) == list(range(n))
    assert sum(final_by_key(rows, "key", "total").values()) == n
