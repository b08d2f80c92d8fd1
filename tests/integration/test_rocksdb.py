"""The RocksDB state backend on real Spark: a keyed job with checkpoints (incremental, and full)
survives a SIGKILL and its output equals a failure-free run's."""

from __future__ import annotations

import os
import signal
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


@pytest.mark.parametrize("incremental", [True, False], ids=["incremental", "full"])
def test_rocksdb_job_survives_a_sigkill_with_exact_output(spark, tmp_path, incremental):
    local = tmp_path / "rocksdb"
    config = ss.CheckpointConfig(interval=0.5, directory=str(tmp_path / "ckpt"))
    backend = RocksDBConfig(block_cache_size=8 << 20, write_buffer_size=1 << 20,
                            local_dir=str(local), incremental=incremental)
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               state_backend=backend,
                               restart=ss.RestartStrategy.fixed_delay(attempts=2, delay=0.1))
    (env.from_source(ss.sources.Generator(event, count=N, rate=RATE), name="events", uid="events")
        .key_by("key").process(SumAndRecent(), name="sum", uid="sum")
        .sink_to(ss.sinks.Collect(), name="out", uid="out"))
    client = env.execute_async("rocksdb failover")
    wait_status(client, "RUNNING")
    wait_completed(client, 2, timeout=30)
    assert any(p.name.startswith("streamsnap-rocksdb-") for p in local.iterdir())
    shared = tmp_path / "ckpt" / client.job_id / "shared"
    # Incremental checkpoints put SST files into the job's shared directory; full ones do not.
    assert any(p.suffix == ".sst" for p in shared.iterdir()) == incremental
    victim = next(s for s in client.subtasks() if "sum" in s.vertex)
    os.kill(victim.pid, signal.SIGKILL)
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
