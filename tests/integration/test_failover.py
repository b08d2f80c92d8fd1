"""Failover on real Spark: subtasks SIGKILLed, the job restores and the output stays exact."""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import sys
import time
from collections import defaultdict

import pyarrow.parquet as pq
import pytest

import streamsnap as ss
from streamsnap.api.environment import TEST_HOOKS_ENV
from tests.integration import support
from tests.integration.support import final_by_key, wait_completed, wait_status

pytestmark = pytest.mark.spark

N = 40_000       # 20 s of input at RATE
# The chaos runs: 8 s of input at RATE, each split held near its end until the three kills are
# done (support.HeldGenerator), so the kills land mid-input however slow the machine, and the
# run does not wait out input it has no use for.
CHAOS_N = 16_000
CHAOS_HOLD_AT = 7_000   # of each split's 8,000 rows
RATE = 2_000
KEYS = 50


def event(i: int) -> dict:
    # Split i % 2 feeds keys 0..49, split 1 keys 100..149: a key's rows come from one source
    # split, so its running sums are deterministic — any replay error shows in the totals.
    return {"key": (i % 2) * 100 + (i // 2) % KEYS, "value": i + 1, "i": i}


class RunningSum(support.RunningSum):
    def __init__(self):
        super().__init__(carry=("i",))


def expected_rows(n: int) -> set[tuple]:
    totals = defaultdict(int)
    rows = set()
    for i in range(n):
        e = event(i)
        totals[e["key"]] += e["value"]
        rows.add((e["key"], totals[e["key"]], i))
    return rows


def read_output(path) -> list[tuple]:
    files = sorted(glob.glob(os.path.join(str(path), "part-*.parquet")))
    rows = []
    for f in files:
        table = pq.read_table(f)
        rows.extend(zip(table.column("key").to_pylist(), table.column("total").to_pylist(),
                        table.column("i").to_pylist()))
    return rows


def causes(client) -> str:
    return "; ".join(r["cause"] for r in client.recoveries())


def diagnose(client) -> str:
    """State worth seeing when a restart does not happen: JobMaster, Spark, task processes."""
    import subprocess

    import psutil

    master = client._master
    lines = [f"failing={master._failing} spark_running={master._spark_running} status={master.status} "
             f"attempt={master._attempt} active Spark jobs={master._spark.sparkContext.statusTracker().getActiveJobsIds()}",
             f"causes: {causes(client)}"]
    for s in client.subtasks():
        alive = s.pid is not None and psutil.pid_exists(s.pid)
        lines.append(f"{s.vertex}#{s.index} attempt {s.attempt} pid {s.pid} {s.state} {'alive' if alive else 'gone'}")
        spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
        if alive and os.path.exists(spy):
            dump = subprocess.run([spy, "dump", "-p", str(s.pid)], capture_output=True, text=True).stdout
            lines += ["    " + line for line in dump.splitlines()[:30]]
    return "\n".join(lines)


def sigkill_one_subtask_and_finish(env, name: str, seed: int, checkpoints: int = 3, timeout: float = 120):
    """Run `env` as `name`, SIGKILL one subtask's process (picked by `seed`) once `checkpoints`
    completed, and wait for the restart and the end: one restart, from a restored checkpoint."""
    client = env.execute_async(name)
    wait_status(client, "RUNNING")
    wait_completed(client, checkpoints)
    os.kill(random.Random(seed).choice(client.subtasks()).pid, signal.SIGKILL)
    wait_restarted(client, 1)
    result = client.wait(timeout)
    assert result.restarts == 1 and result.checkpoints.latest_restored is not None, causes(client)
    return result


def wait_restarted(client, attempt, timeout=60):
    """Until every subtask of `attempt` runs (and no other failure happened meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        subtasks = client.subtasks()
        assert not subtasks or subtasks[0].attempt <= attempt, f"unexpected extra restart: {causes(client)}"
        if subtasks and all(s.attempt == attempt and s.state == "RUNNING" for s in subtasks):
            return
        assert client.status() not in ("FAILED", "CANCELED"), (client.status(), causes(client))
        assert time.monotonic() < deadline, f"attempt {attempt} did not start:\n{diagnose(client)}"
        time.sleep(0.02)


def three_kills(client, rng, phase_dir: str, first_within: float = 4.0, then_within: float = 2.0) -> None:
    """SIGKILL three times, each on a running attempt: any subtask at a random moment, a task in
    its checkpoint's asynchronous phase, and the sink's task ("sum" chain) after a checkpoint
    completed, before it committed (pre-commit → commit). Needs the phase hooks (TEST_HOOKS_ENV)."""
    wait_status(client, "RUNNING")
    time.sleep(rng.uniform(1.0, first_within))
    victim = rng.choice(client.subtasks())
    os.kill(victim.pid, signal.SIGKILL)
    wait_restarted(client, 1)
    # Rows reach a sink again before the next kill (on a loaded machine a restore can take long
    # enough that the next kill would come first, and that recovery would have no first output).
    deadline = time.monotonic() + 60
    while "first_output_at" not in client.recoveries()[0]:
        assert time.monotonic() < deadline, f"no output after the first restore: {client.recoveries()}"
        time.sleep(0.02)
    time.sleep(rng.uniform(0.5, then_within))
    support.kill_in_phase(client, phase_dir, "async", rng.choice(["events", "sum"]))
    wait_restarted(client, 2)
    time.sleep(rng.uniform(0.5, then_within))
    support.kill_in_phase(client, phase_dir, "commit", "sum")


def run_chaos(spark, tmp_path, monkeypatch, seed: int, mode: str, state_backend: str = "hashmap",
              checkpointing: dict | None = None):
    """Three SIGKILLs, each on a running attempt, with a budget of exactly three restarts: the job
    must finish (a kill charged twice would exhaust it)."""
    rng = random.Random(seed)
    out, ckpt, phases, gate = tmp_path / "out", tmp_path / "ckpt", tmp_path / "phases", tmp_path / "gate"
    phases.mkdir()
    monkeypatch.setenv(TEST_HOOKS_ENV, json.dumps({
        "phase_dir": str(phases), "async_delay": 0.2, "notify_delay": 0.2}))
    config = ss.CheckpointConfig(interval=0.5, directory=str(ckpt), mode=mode, num_retained=2,
                                 **(checkpointing or {}))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, state_backend=state_backend,
                               restart=ss.RestartStrategy.fixed_delay(attempts=3, delay=0.1))
    source = support.HeldGenerator(event, count=CHAOS_N, rate=RATE, gate=gate, hold_at=CHAOS_HOLD_AT)
    (env.from_source(source, name="events", uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.FileSink(str(out), format="parquet"), name="files", uid="files"))
    client = env.execute_async(f"chaos {mode} seed {seed}")
    three_kills(client, rng, str(phases))
    assert not any(p.startswith("release") for p in os.listdir(gate))
    support.release(gate)
    result = client.wait(180)
    assert result.restarts == 3 and len(result.recoveries) == 3, causes(client)
    # The first kill comes seconds into the input, so rows follow its restore (three_kills waits
    # for them); a later one may restore a checkpoint taken during the hold, after which no row
    # reaches the sink until the release.
    assert "first_output_at" in result.recoveries[0]
    # After aborts, expiries and three failovers the directory holds no abandoned state.
    assert support.stray_checkpoint_files(ckpt) == []
    return result, read_output(out), out


@pytest.mark.parametrize("seed, state_backend, checkpointing", [
    (1, "hashmap", None), (2, "rocksdb", None),
    (4, "hashmap", {"unaligned": True}), (5, "rocksdb", {"unaligned": True, "aligned_timeout": 0.05}),
], ids=["hashmap", "rocksdb", "hashmap-unaligned", "rocksdb-aligned-timeout"])
def test_chaos_exactly_once_output_equals_a_failure_free_run(spark, tmp_path, monkeypatch, seed, state_backend,
                                                             checkpointing):
    result, rows, out = run_chaos(spark, tmp_path, monkeypatch, seed, "exactly_once", state_backend,
                                  checkpointing)
    expected = expected_rows(CHAOS_N)
    assert len(rows) == len(set(rows)), "duplicates in the committed output"
    assert set(rows) == expected, (f"missing {len(expected - set(rows))}, "
                                   f"unexpected {len(set(rows) - expected)}")
    # No uncommitted leftovers, and Spark reads exactly the committed files.
    assert not [f for f in os.listdir(out) if f.startswith(".inprogress")]
    assert spark.read.parquet(str(out)).count() == CHAOS_N


def test_chaos_at_least_once_loses_nothing(spark, tmp_path, monkeypatch):
    _, rows, _ = run_chaos(spark, tmp_path, monkeypatch, 3, "at_least_once")
    assert {i for _, _, i in rows} == set(range(CHAOS_N))


class CountingMap(ss.CheckpointedFunction):
    """Counts rows in operator state; remembers whether it was restored."""

    def initialize_state(self, ctx):
        self.state = ctx.get_list_state("count")
        self.restored = ctx.is_restored
        self.count = sum(self.state.get())

    def snapshot_state(self, ctx):
        self.state.update([self.count])

    def __call__(self, row):
        self.count += 1
        return {"i": row["i"], "count": self.count, "restored": self.restored}


def test_restore_gives_user_functions_their_operator_state_and_is_restored(spark, tmp_path):
    n = 6000
    config = ss.CheckpointConfig(interval=0.3, directory=str(tmp_path))
    env = ss.StreamEnvironment(parallelism=1, spark=spark, checkpointing=config,
                               restart=ss.RestartStrategy.fixed_delay(3, 0.1))
    # The input holds at 80% until the kill: on a slow machine it cannot end first.
    gate = tmp_path / "gate"
    (env.from_source(support.HeldGenerator(lambda i: {"i": i}, count=n, rate=3000, gate=gate, hold_at=n * 4 // 5),
                     name="rows")
        .map(CountingMap(), name="count", uid="count").sink_to(ss.sinks.Collect()))
    client = env.execute_async("operator state")
    wait_status(client, "RUNNING")
    wait_completed(client, 2, timeout=60)
    os.kill(client.subtasks()[0].pid, signal.SIGKILL)
    support.release(gate)
    rows = client.wait(60).rows()
    assert sorted(r["i"] for r in rows) == list(range(n))
    assert max(r["count"] for r in rows) == n  # the count continued from the checkpoint
    assert any(r["restored"] for r in rows) and not all(r["restored"] for r in rows)
    stats = client.checkpoint_stats()
    assert stats.latest_restored is not None
    assert stats.latest_completed.checkpoint_id > stats.latest_restored.checkpoint_id  # ids continue


def test_when_restarts_run_out_the_job_fails_with_the_root_cause(spark, tmp_path):
    def always_fails(row):
        if row["i"] == 500:
            raise RuntimeError("the disk is on fire")
        return row

    config = ss.CheckpointConfig(interval=0.3, directory=str(tmp_path))
    env = ss.StreamEnvironment(parallelism=1, spark=spark, checkpointing=config,
                               restart=ss.RestartStrategy.fixed_delay(attempts=2, delay=0.05))
    (env.from_source(ss.sources.Generator(lambda i: {"i": i}, count=2000), name="rows")
        .map(always_fails, name="fragile").sink_to(ss.sinks.Collect()))
    with pytest.raises(ss.JobExecutionError) as info:
        env.execute("doomed")
    text = str(info.value)
    assert "after 2 restart(s)" in text and "RuntimeError: the disk is on fire" in text
    assert "operator 'fragile'" in text


def test_a_failure_is_noticed_fast_and_recovery_is_timed(spark, tmp_path):
    config = ss.CheckpointConfig(interval=0.5, directory=str(tmp_path))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               restart=ss.RestartStrategy.fixed_delay(3, 0.0))
    gate = tmp_path / "gate"    # the input holds at 80% until the kill: it cannot end first
    (env.from_source(support.HeldGenerator(event, count=8000, rate=2000, gate=gate, hold_at=3200), name="events")
        .key_by("key").process(RunningSum(), name="sum").sink_to(ss.sinks.Collect()))
    client = env.execute_async("timed recovery")
    wait_status(client, "RUNNING")
    time.sleep(1.0)
    victim = [s for s in client.subtasks() if s.vertex.startswith("sum")][0]
    killed_at = time.time()
    os.kill(victim.pid, signal.SIGKILL)
    support.release(gate)
    result = client.wait(60)
    (recovery,) = result.recoveries
    # noticed through the dropped connection (well under 1 s when quiet; 5 s leaves room for a loaded CI)
    assert recovery["failed_at"] - killed_at < 5.0
    assert killed_at < recovery["running_at"] < recovery["first_output_at"]
    assert len(result.rows()) == 8000


def test_a_file_source_resumes_from_its_split_offsets_after_a_kill(spark, tmp_path):
    import pyarrow as pa

    data = tmp_path / "in"
    data.mkdir()
    n_files, per_file = 6, 3000
    for f in range(n_files):
        rows = [{"key": (f * per_file + j) % 11, "value": 1, "i": f * per_file + j} for j in range(per_file)]
        pq.write_table(pa.Table.from_pylist(rows), str(data / f"part-{f:02d}.parquet"), row_group_size=300)
    support.kill_a_reader_mid_input(
        spark, tmp_path, lambda env: env.read_files(str(data), format="parquet", batch_size=256, uid="reader"), n_files * per_file)


def test_a_failure_after_a_completed_stop_with_savepoint_restores_from_it(spark, tmp_path, monkeypatch):
    """The savepoint's commit was notified; a task dies before the job FINISHED. Restoring from
    the checkpoint before the savepoint would replay committed rows: it must restore from the
    savepoint, run on, and the stop must report that it did not stop."""

    n = 6000
    out, phases = tmp_path / "out", tmp_path / "phases"
    phases.mkdir()
    monkeypatch.setenv(TEST_HOOKS_ENV, json.dumps({"phase_dir": str(phases), "notify_delay": 0.3}))
    config = ss.CheckpointConfig(interval=None, directory=str(tmp_path / "ckpt"))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               restart=ss.RestartStrategy.fixed_delay(attempts=1, delay=0.0))
    # The splits hold half-way until the failover: the stop lands mid-input, rows after checkpoint 1.
    gate = tmp_path / "gate"
    (env.from_source(support.HeldGenerator(event, count=n, rate=2000, gate=gate, hold_at=n // 4), name="events",
                     uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.FileSink(str(out), format="parquet"), name="files", uid="files"))
    client = env.execute_async("fails after stop-with-savepoint")
    wait_status(client, "RUNNING")
    assert client.trigger_checkpoint().checkpoint_id == 1
    support.wait_held(gate, 2, client)
    stopper, stop = support.stop_in_background(client, tmp_path / "sp")
    # Its commit is being notified (notify_delay keeps each task in that phase for 0.3 s).
    savepoint, pid = support.pid_committing_savepoint(client, phases, timeout=30)
    os.kill(pid, signal.SIGKILL)
    stopper.join(60)
    support.release(gate)
    assert isinstance(stop.get("error"), ss.StreamsnapError), stop
    assert "restores from that savepoint and runs on" in str(stop["error"])
    result = client.wait(60)
    assert result.restarts == 1
    assert result.checkpoints.latest_restored.checkpoint_id == savepoint.checkpoint_id
    rows = read_output(out)
    assert len(rows) == len(set(rows)), "rows committed by the savepoint were committed again"
    assert set(rows) == expected_rows(n)
