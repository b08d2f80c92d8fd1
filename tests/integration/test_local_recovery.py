"""Task-local recovery on real Spark: a SIGKILLed job restores its keyed state from the local
copies (the recovery's metrics count them, nothing is read from checkpoint storage); after the
local copies are deleted or corrupted, the next kill restores from checkpoint storage; the
output stays exact throughout, and the local copies are gone when the job ends."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import streamsnap as ss
from tests.integration.support import HeldGenerator, release, wait_status
from tests.integration.test_failover import RunningSum, event, expected_rows

pytestmark = pytest.mark.spark

N = 8_000        # 4 s of input at RATE
RATE = 2_000


def kill_and_wait_for_restore(client, recoveries: int) -> dict:
    """SIGKILL a subtask of the keyed operator; wait until the job runs again; its recovery."""
    victim = next(s for s in client.subtasks() if s.vertex.startswith("sum"))
    os.kill(victim.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while len(client.recoveries()) < recoveries or "running_at" not in client.recoveries()[-1]:
        assert time.monotonic() < deadline, f"no restore: {client.recoveries()}"
        time.sleep(0.05)
    return client.recoveries()[-1]


def wait_for_retention(local_job: Path) -> None:
    """Until the tasks, told the checkpoint completed, deleted the older checkpoints' copies."""
    deadline = time.monotonic() + 30
    while len(list(local_job.glob("chk-*"))) > 1:
        assert time.monotonic() < deadline, sorted(p.name for p in local_job.iterdir())
        time.sleep(0.05)


def spoil(local_job: Path) -> int:
    """Delete every other local copy and corrupt the rest (same size, one byte flipped; the file
    is replaced, since an SST copy is a hard link to the live database's file)."""
    files = sorted(p for p in local_job.rglob("*") if p.is_file())
    for i, path in enumerate(files):
        data = bytearray(path.read_bytes())
        path.unlink()
        if i % 2:
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
    return len(files)


# RocksDB in changelog mode: materializations every second, so the local copies are segments,
# manifests, materialization bundles and SST files.
CHANGELOG = ss.RocksDBConfig(changelog=ss.ChangelogConfig(materialization_interval=1.0))


@pytest.mark.parametrize("state_backend", ["hashmap", "rocksdb", CHANGELOG], ids=["hashmap", "rocksdb", "changelog"])
def test_a_killed_job_restores_from_local_copies_then_from_storage_when_they_are_spoiled(
        spark, tmp_path, state_backend):
    local = tmp_path / "local"
    config = ss.CheckpointConfig(interval=None, directory=str(tmp_path / "ckpt"))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               state_backend=state_backend, local_recovery=True,
                               local_recovery_dir=str(local),
                               restart=ss.RestartStrategy.fixed_delay(attempts=2, delay=0.0))
    # The splits hold at 3/4 of the input until the second kill: the input cannot end first.
    gate = tmp_path / "gate"
    (env.from_source(HeldGenerator(event, count=N, rate=RATE, gate=gate, hold_at=N * 3 // 8), name="events",
                     uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.Collect(), name="out", uid="out"))
    client = env.execute_async("local recovery")
    wait_status(client, "RUNNING")
    local_job = local / client.job_id
    deadline = time.monotonic() + 30
    # A checkpoint taken before the first row reached the keyed operator has no keyed files.
    while not any(p.is_file() for p in local_job.rglob("*")):
        assert time.monotonic() < deadline, "no checkpoint left a local copy"
        time.sleep(0.3)
        client.trigger_checkpoint()

    first = kill_and_wait_for_restore(client, 1)["restore"]
    assert first["local_files"] >= 2 and first["local_bytes"] > 0, first
    assert (first["remote_files"], first["local_missing"], first["local_rejected"]) == (0, 0, 0), first
    keyed = {name: s for name, s in first["subtasks"].items() if name.startswith("sum")}
    assert len(keyed) == 2, first          # both keyed subtasks, each from its local copies
    assert all(s["local_files"] >= 1 and s["remote_files"] == 0 for s in keyed.values()), first

    wait_status(client, "RUNNING")
    client.trigger_checkpoint()
    wait_for_retention(local_job)
    assert spoil(local_job) >= 2
    second = kill_and_wait_for_restore(client, 2)["restore"]
    release(gate)
    assert second["local_files"] == 0 and second["remote_files"] >= 2, second
    assert second["local_missing"] >= 1 and second["local_rejected"] >= 1, second

    result = client.wait(120)
    assert result.restarts == 2, client.recoveries()
    rows = [(r["key"], r["total"], r["i"]) for r in result.rows()]
    assert len(rows) == len(set(rows)), "duplicates in the exactly-once output"
    assert set(rows) == expected_rows(N)
    assert not local_job.exists()       # the finished tasks deleted the job's local copies
    totals = result.local_recovery
    assert totals["written_files"] >= 2 and totals["written_bytes"] > 0, totals
    assert totals["write_failures"] == 0 and totals["restored"]["remote_files"] >= 2, totals
