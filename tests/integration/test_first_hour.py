"""Small things a new user meets in their first hour (issue 30)."""

from __future__ import annotations

import time

import pytest

import streamsnap as ss

pytestmark = pytest.mark.spark


def test_finished_subtasks_say_so_and_name_no_pid_to_kill(spark):
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    (env.from_source(ss.sources.Generator(lambda i: {"k": i % 3, "v": i}, count=1_000), name="rows")
        .key_by("k").map(lambda r: r, name="same").sink_to(ss.sinks.Collect(), name="out"))
    client = env.execute_async("finishes")
    running = []
    while client.status() not in ("FINISHED", "FAILED", "CANCELED"):
        running += [s for s in client.subtasks() if s.state == "RUNNING"]
        time.sleep(0.02)
    result = client.wait()
    assert result.status == "FINISHED" and len(result.rows("out")) == 1_000
    ended = client.subtasks()
    assert len(ended) == 4 and {s.state for s in ended} == {"FINISHED"}
    assert all(s.pid is None for s in ended), ended       # their processes are idle Spark workers now
    assert all(s.pid for s in running)

