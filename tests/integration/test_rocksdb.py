"""The RocksDB state backend on real Spark: a keyed job with checkpoints (incremental, and full)
survives a SIGKILL and its output equals a failure-free run's."""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict

import pytest

import streamsnap as ss
from streamsnap.api.config import RocksDBConfig
from tests.integration import support
from tests.integration.support import wait_completed, wait_status

pytestmark = pytest.mark.spark

N = 12_000       # 6 s of input at RATE
RATE = 2_000
KEYS = 40


def event(i: int) -> dict:
    return {"key": (i % 2) * 100 + (i // 2) % KEYS, "value": i + 1, "i": i}


class SumAndRecent(support.RunningSum):
    """A running sum (ValueState) plus the key's last three values (ListState)."""

    def __init__(self):
        super().__init__(carry=("i",))

    def open(self, ctx):
        super().open(ctx)
        self.recent = ctx.get_state(ss.ListStateDescriptor("recent"))

    def process_element(self, row, ctx):
        recent = (self.recent.get() + [row["value"]])[-3:]
        self.recent.update(recent)
        for out in super().process_element(row, ctx):
            out["recent"] = sum(recent)
            yield out


def expected_rows(n: int) -> set[tuple]:
    totals, recent, rows = defaultdict(int), defaultdict(list), set()
    for i in range(n):
        e = event(i)
        totals[e["key"]] += e["value"]
        recent[e["key"]] = (recent[e["key"]] + [e["value"]])[-3:]
        rows.add((e["key"], totals[e["key"]], sum(recent[e["key"]]), i))
    return rows


@pytest.mark.parametrize("mode", ["incremental", "full", "changelog"])
def test_rocksdb_job_survives_a_sigkill_with_exact_output(spark, tmp_path, mode):
    local = tmp_path / "rocksdb"
    config = ss.CheckpointConfig(interval=0.5, directory=str(tmp_path / "ckpt"))
    incremental = mode != "full"
    # Changelog: a materialization every second, so the restore has a materialization and
    # segments after it.
    changelog = ss.ChangelogConfig(materialization_interval=1.0) if mode == "changelog" else None
    backend = RocksDBConfig(block_cache_size=8 << 20, write_buffer_size=1 << 20,
                            local_dir=str(local), incremental=incremental, changelog=changelog)
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               state_backend=backend,
                               restart=ss.RestartStrategy.fixed_delay(attempts=2, delay=0.1))
    # The splits hold at 80% of the input until the kill: on a slow machine it cannot end first.
    gate = tmp_path / "gate"
    (env.from_source(support.HeldGenerator(event, count=N, rate=RATE, gate=gate, hold_at=N * 2 // 5), name="events",
                     uid="events")
        .key_by("key").process(SumAndRecent(), name="sum", uid="sum")
        .sink_to(ss.sinks.Collect(), name="out", uid="out"))
    client = env.execute_async("rocksdb failover")
    wait_status(client, "RUNNING")
    wait_completed(client, 2, timeout=30)
    assert any(p.name.startswith("streamsnap-rocksdb-") for p in local.iterdir())
    shared = tmp_path / "ckpt" / client.job_id / "shared"
    # Incremental checkpoints put SST files into the job's shared directory; full ones do not;
    # changelog ones put log segments there (and SST files once a materialization ran).
    if mode != "changelog":
        assert any(p.suffix == ".sst" for p in shared.iterdir()) == incremental
    else:
        assert any("-changelog-" in p.name for p in shared.iterdir())
        deadline = time.monotonic() + 20
        while not any(p.suffix == ".sst" for p in shared.iterdir()):   # a materialization ran
            assert time.monotonic() < deadline, "no materialization within 20 s"
            time.sleep(0.05)
        wait_completed(client, client.checkpoint_stats().counts.completed + 2, timeout=30)
    victim = next(s for s in client.subtasks() if "sum" in s.vertex)
    os.kill(victim.pid, signal.SIGKILL)
    support.release(gate)
    result = client.wait(120)
    assert result.restarts == 1, client.recoveries()
    rows = [(r["key"], r["total"], r["recent"], r["i"]) for r in result.rows()]
    assert len(rows) == len(set(rows)), "duplicates in the exactly-once output"
    expected = expected_rows(N)
    assert set(rows) == expected, (f"missing {len(expected - set(rows))}, "
                                   f"unexpected {len(set(rows) - expected)}")
    # The databases are gone: the finished subtasks deleted theirs, the restarted attempt
    # deleted the killed task's.
    assert [p.name for p in local.iterdir() if p.name.startswith("streamsnap-rocksdb-")] == []
    # The finished job's checkpoints were discarded, and with them every shared file.
    assert list(shared.iterdir()) == []
