"""Slot sharing on real Spark: slot i runs subtask i of every vertex, each in its own process;
a killed slot takes all its subtasks down (a new Spark stage), a killed subtask is restarted in
the slots that survived (no new stage), and the job recovers exactly-once either way."""

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


def _slots(client) -> dict[int, list]:
    by_index: dict[int, list] = {}
    for subtask in client.subtasks():
        by_index.setdefault(subtask.index, []).append(subtask)
    return by_index


def _held_job(spark, tmp_path, name: str):
    out, gate = tmp_path / "out", tmp_path / "gate"
    config = ss.CheckpointConfig(interval=0.3, directory=str(tmp_path / "ckpt"))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               restart=ss.RestartStrategy.fixed_delay(attempts=1, delay=0.1))
    # The splits hold at 40% of the input until the kill: on a slow machine the input cannot end first.
    (env.from_source(HeldGenerator(event, count=N, rate=3000, gate=gate, hold_at=N * 2 // 5), name="events",
                     uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.FileSink(str(out), format="parquet"), name="files", uid="files"))
    client = env.execute_async(name)
    assert client.slots == 2            # not 4: parallelism, not the sum over vertices
    wait_status(client, "RUNNING")
    by_index = _slots(client)
    assert sorted(by_index) == [0, 1]
    for subtasks in by_index.values():
        # The slot's Spark task (its Python worker) forked both subtasks and supervises them.
        parents = {psutil.Process(s.pid).ppid() for s in subtasks}
        assert len(parents) == 1 and parents != {s.pid for s in subtasks}, subtasks
    wait_completed(client, 1)
    return client, out, gate, by_index


def test_a_slot_hosts_one_subtask_of_each_vertex_and_dies_whole(spark, tmp_path):
    """A lost slot (its Spark task's Python worker SIGKILLed) takes its subtasks with it and
    costs a new Spark stage: the slots that survived are not enough for the attempt."""
    client, out, gate, by_index = _held_job(spark, tmp_path, "slot sharing")
    # The handles are taken before the kill: the subtasks may be gone (and reaped) by the time
    # the test looks them up afterwards.
    subtasks = [psutil.Process(s.pid) for s in by_index[0]]
    slot = psutil.Process(subtasks[0].ppid())
    slot.kill()
    # The forked subtasks go with their slot (parent-death signal), not orphaned.
    gone, alive = psutil.wait_procs(subtasks, timeout=10)
    assert alive == [] and all(p.returncode in (-signal.SIGKILL, None) for p in gone)
    release(gate)
    wait_restarted(client, 1)
    result = client.wait(120)
    assert result.restarts == 1
    assert [r.get("restart") for r in result.recoveries] == ["new stage"], result.recoveries
    assert sorted(read_output(out)) == sorted(expected_rows(N))


def test_a_lost_subtask_restarts_in_the_slots_that_survived(spark, tmp_path):
    """A subtask SIGKILLed alone: every slot stops the attempt and runs the next one itself —
    no new Spark stage, the same slot processes — and the output is exactly-once."""
    client, out, gate, by_index = _held_job(spark, tmp_path, "slot restart")
    slots = {i: psutil.Process(subtasks[0].pid).ppid() for i, subtasks in by_index.items()}
    old = [psutil.Process(s.pid) for subtasks in by_index.values() for s in subtasks]
    victim = next(s for s in by_index[1] if s.vertex.startswith("sum"))
    os.kill(victim.pid, signal.SIGKILL)
    wait_restarted(client, 1)
    wait_status(client, "RUNNING")
    # Nothing of the old attempt runs once the new one does (the slots reaped it first).
    assert not [p.pid for p in old if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    now = _slots(client)
    assert {i: psutil.Process(subtasks[0].pid).ppid() for i, subtasks in now.items()} == slots
    assert not {s.pid for subtasks in now.values() for s in subtasks} & {p.pid for p in old}
    release(gate)
    result = client.wait(120)
    assert result.restarts == 1
    assert [r.get("restart") for r in result.recoveries] == ["in place"], result.recoveries
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
