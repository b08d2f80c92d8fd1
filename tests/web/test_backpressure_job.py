"""Backpressure and watermarks of a running Spark job, as measured in its tasks: a slow sink
keeps its upstream waiting for output room (high backpressure ratio) while the sink itself is
busy, and the event time of the job advances in REST and /metrics."""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

import streamsnap as ss
from streamsnap.cli import app
from streamsnap.web.discovery import live_jobs
from streamsnap.time.watermarks import MIN_WATERMARK
from tests.web.support import call, wait_for

pytestmark = pytest.mark.spark


def slow_sink(batch):
    time.sleep(0.05)   # each small batch takes 50 ms: the sink cannot keep up with the source
    return batch


def test_a_slow_sink_backpressures_its_upstream_and_event_time_advances(spark, tmp_path, no_leaked_threads):
    directory = str(tmp_path / "ckpt")
    env = ss.StreamEnvironment(parallelism=1, spark=spark, web=ss.WebConfig(port=0),
                               checkpointing=ss.CheckpointConfig(interval=None, directory=directory),
                               network=ss.NetworkConfig(batch_size=64, credits=1, output_queue_frames=1))
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    (env.from_source(ss.sources.Generator(lambda i: {"key": i % 10, "ts": 1_000_000 + i}, batch_size=64),
                     name="events", uid="events", watermark_strategy=strategy)
        .key_by("key").map_batches(slow_sink, name="slow", uid="slow")
        .sink_to(ss.sinks.Print(), name="out", uid="out"))
    client = env.execute_async("backpressure job")
    try:
        jobs = f"{client.web_url}/jobs/{client.job_id}"
        source, sink = "events", "slow"
        assert {v["id"] for v in call(jobs)[1]["vertices"]} == {source, sink}

        def pressure():
            up = call(f"{jobs}/vertices/{source}/backpressure")[1]
            down = call(f"{jobs}/vertices/{sink}/backpressure")[1]
            return (up["subtasks"] and down["subtasks"] and up["subtasks"][0]["ratio"] > 0.5
                    and down["subtasks"][0]["busyRatio"] > 0.5 and (up, down))
        up, down = wait_for(pressure, "the source backpressured and the sink busy", timeout=60)
        assert up["backpressure-level"] == "high" and up["status"] == "ok"
        assert down["subtasks"][0]["ratio"] < 0.5   # the sink has no downstream to wait for

        def watermark():
            marks = {m["id"]: int(m["value"]) for m in call(f"{jobs}/vertices/{sink}/watermarks")[1]}
            return marks.get("0.currentInputWatermark", MIN_WATERMARK)
        first = wait_for(lambda: (w := watermark()) > 1_000_000 and w, "a watermark at the sink")
        wait_for(lambda: watermark() > first, "the watermark to advance")

        job = call(jobs)[1]
        head = {v["id"]: v for v in job["vertices"]}
        assert head[source]["backpressure"]["level"] in ("low", "high")
        assert head[sink]["operators"][0]["input-watermark"] >= first
        # The graph's per-task watermark: the chain's output (its last operator's) and its lag.
        mark = head[sink]["watermark"]
        assert mark["output"] >= first and mark["lag"] == job["now"] - mark["output"]
        text = call(f"{client.web_url}/metrics")[1]
        assert f'backPressuredTimeMsPerSecond{{job="backpressure job",job_id="{client.job_id}",subtask="0",task="events"}}' in text
        assert 'currentOutputWatermark{' in text and 'busyTimeMsPerSecond{' in text

        # `streamsnap ui DIR` finds the running job's endpoint through its checkpoint directory.
        # Its UI's URL with the token for actions: for whoever can read the job's directory.
        assert live_jobs(directory) == [{"job_id": client.job_id, "job_name": "backpressure job",
                                         "url": client.web_url, "ui_url": client.ui_url, "live": True}]
        shown = CliRunner().invoke(app, ["ui", directory], env={"COLUMNS": "300"})
        assert shown.exit_code == 0, shown.output
        assert f"job 'backpressure job' ({client.job_id}) running, live UI at {client.ui_url}" in shown.output
    finally:
        client.cancel()
    wait_for(lambda: live_jobs(directory) == [], "the ended job's endpoint to withdraw its announcement")
