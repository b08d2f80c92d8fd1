"""Slot sharing on real Spark: slot i runs subtask i of every vertex, each in its own process,
and a killed slot takes all its subtasks down and the job recovers exactly-once."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

import streamsnap as ss
from tests.integration.support import HeldGenerator, release, wait_completed, wait_status
from tests.integration.test_failover import RunningSum, event, expected_rows, read_output, wait_restarted

pytestmark = pytest.mark.spark

N = 6000


def test_a_slot_hosts_one_subtask_of_each_vertex_and_dies_whole(spark, tmp_path):
    out = tmp_path / "out"
    config = ss.CheckpointConfig(interval=0.3, directory=str(tmp_path / "ckpt"))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               restart=ss.RestartStrategy.fixed_delay(attempts=1, delay=0.1))
    # The splits hold at 80% of the input until the kill: on a slow machine the input cannot end first.
    gate = tmp_path / "gate"
    (env.from_source(HeldGenerator(event, count=N, rate=3000, gate=gate, hold_at=N * 2 // 5), name="events",
                     uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.FileSink(str(out), format="parquet"), name="files", uid="files"))
    client = env.execute_async("slot sharing")
    assert client.slots == 2            # not 4: parallelism, not the sum over vertices
    wait_status(client, "RUNNING")
    by_index: dict[int, list] = {}
    for subtask in client.subtasks():
        by_index.setdefault(subtask.index, []).append(subtask)
    assert sorted(by_index) == [0, 1]
    for index, subtasks in by_index.items():
        source = next(s for s in subtasks if s.vertex.startswith("events"))
        keyed = next(s for s in subtasks if not s.vertex.startswith("events"))
        # The slot's Spark task runs the source itself and forked the keyed subtask.
        assert source.pid != keyed.pid and psutil.Process(keyed.pid).ppid() == source.pid
    wait_completed(client, 1)
    slot = by_index[0]
    # The handle is taken before the kill: the keyed process may be gone (and reaped) by the
    # time the test looks it up afterwards.
    keyed = psutil.Process(next(s.pid for s in slot if not s.vertex.startswith("events")))
    os.kill(next(s.pid for s in slot if s.vertex.startswith("events")), signal.SIGKILL)
    # The forked subtask goes with its slot (parent-death signal), not orphaned.
    gone, alive = psutil.wait_procs([keyed], timeout=10)
    assert alive == [] and gone[0].returncode in (-signal.SIGKILL, None)
    release(gate)
    wait_restarted(client, 1)
    result = client.wait(120)
    assert result.restarts == 1
    assert sorted(read_output(out)) == sorted(expected_rows(N))


def test_without_slot_sharing_every_subtask_is_a_slot(spark):
    env = ss.StreamEnvironment(parallelism=2, spark=spark, slot_sharing=False)
    (env.from_source(ss.sources.Generator(event, count=200, rate=100), name="events")
        .key_by("key").process(RunningSum(), name="sum").sink_to(ss.sinks.Collect()))
    client = env.execute_async("no slot sharing")
    assert client.slots == 4
    pids: dict = {}          # while they run (an ended subtask reports no pid)
    while client.status() not in ("FINISHED", "FAILED", "CANCELED"):
        pids.update({(s.vertex, s.index): s.pid for s in client.subtasks() if s.state == "RUNNING" and s.pid})
        time.sleep(0.02)
    result = client.wait(60)
    assert len(result.rows()) == 200
    assert len(pids) == 4 and len(set(pids.values())) == 4, pids
