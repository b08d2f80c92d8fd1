"""Savepoints, restore, relocation, rescaling and bad restore input — on real Spark."""

from __future__ import annotations

import logging
import os
import shutil
import signal
from collections import defaultdict

import pytest

import streamsnap as ss
from tests.integration.support import (HeldGenerator, both_backends, checkpoint_dirs, release, stray_checkpoint_files,
                                       wait_completed, wait_held, wait_status)

pytestmark = pytest.mark.spark

N = 12_000
KEYS = 40
SPLITS = 4


def event(i: int) -> dict:
    return {"key": i % KEYS, "value": i + 1, "i": i}


class RunningSum(ss.KeyedProcessFunction):
    def open(self, ctx):
        self.total = ctx.get_state(ss.ValueStateDescriptor("total", default=0))
        self.count = ctx.get_state(ss.ValueStateDescriptor("count", default=0))

    def process_element(self, row, ctx):
        total = self.total.value() + row["value"]
        self.total.update(total)
        self.count.update(self.count.value() + 1)
        yield {"key": ctx.current_key, "total": total, "count": self.count.value(), "i": row["i"]}


def build(env, rate=4000, stateful_uid="sum", parallelism=None, gate=None, hold_at=N // SPLITS // 2):
    """With a `gate`, each split holds before its row `hold_at` until released (HeldGenerator):
    a stop, savepoint or kill then lands mid-input, never after the input ended."""
    source = (ss.sources.Generator(event, count=N, rate=rate, splits=SPLITS) if gate is None else
              HeldGenerator(event, count=N, rate=rate, splits=SPLITS, gate=gate, hold_at=hold_at))
    stream = env.from_source(source, name="events", uid="events", parallelism=parallelism)
    (stream.key_by("key").process(RunningSum(), name="sum", uid=stateful_uid, parallelism=parallelism)
        .sink_to(ss.sinks.Collect(), name="out", uid="out", parallelism=parallelism))


def expected_finals() -> dict:
    finals = defaultdict(int)
    for i in range(N):
        finals[i % KEYS] += i + 1
    return dict(finals)


def finals_of(rows) -> dict:
    out = {}
    for r in rows:
        if r["count"] > out.get(r["key"], (0, 0))[0]:
            out[r["key"]] = (r["count"], r["total"])
    return {k: total for k, (_, total) in out.items()}


def start(env, name, **kwargs):
    client = env.execute_async(name, **kwargs)
    wait_status(client, "RUNNING")
    return client


def config(tmp_path, **kwargs):
    return ss.CheckpointConfig(interval=kwargs.pop("interval", 0.5), directory=str(tmp_path / "ckpt"), **kwargs)


def stop_when_held(client, gate, savepoints):
    wait_held(gate, SPLITS, client)
    path = client.stop_with_savepoint(str(savepoints))
    assert client.status() == "FINISHED"
    return path


def test_stop_with_savepoint_then_restore_equals_an_uninterrupted_run(spark, tmp_path):
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config(tmp_path))
    build(env, gate=tmp_path / "gate")
    first = start(env, "first half")
    savepoint = stop_when_held(first, tmp_path / "gate", tmp_path / "savepoints")
    assert os.path.basename(savepoint).startswith("savepoint-") and os.path.exists(os.path.join(savepoint, "_metadata"))
    rows_before = first.wait(10).rows()
    assert 0 < len(rows_before) < N

    # The second half runs on RocksDB: a savepoint is canonical, so backends switch through it.
    env2 = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config(tmp_path), state_backend="rocksdb")
    build(env2, rate=None)
    second = env2.execute("second half", restore_from=savepoint)
    rows = rows_before + second.rows()
    assert sorted(r["i"] for r in rows) == list(range(N))  # nothing lost, nothing twice
    assert finals_of(rows) == expected_finals()
    assert second.checkpoints.latest_restored is not None


@both_backends
def test_a_relocated_savepoint_restores(spark, tmp_path, state_backend):
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config(tmp_path), state_backend=state_backend)
    build(env, gate=tmp_path / "gate")
    client = start(env, "to relocate")
    wait_held(tmp_path / "gate", SPLITS, client)
    original = client.trigger_savepoint(str(tmp_path / "savepoints"))  # the job keeps running
    assert client.status() == "RUNNING"
    client.cancel()
    moved = str(tmp_path / "elsewhere" / "my-savepoint")
    shutil.copytree(original, moved)
    shutil.rmtree(original)
    env2 = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config(tmp_path), state_backend=state_backend)
    build(env2, rate=None)
    result = env2.execute("from the relocated savepoint", restore_from=moved)
    # The restored run continues every key from its savepoint total up to the full total.
    assert finals_of(result.rows()) == expected_finals()


def test_rescaling_two_to_three_to_one_keeps_per_key_results(spark, tmp_path):
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config(tmp_path))
    build(env, rate=3000, gate=tmp_path / "gate-1", hold_at=N // SPLITS // 3)
    rows = []
    first = start(env, "p2")
    sp1 = stop_when_held(first, tmp_path / "gate-1", tmp_path / "sp")
    rows += first.wait(10).rows()

    # p3 runs on RocksDB (rescaled heap state in, RocksDB state out), p1 on the heap again.
    env3 = ss.StreamEnvironment(parallelism=3, spark=spark, checkpointing=config(tmp_path), state_backend="rocksdb")
    build(env3, rate=3000, gate=tmp_path / "gate-2", hold_at=N // SPLITS * 2 // 3)
    second = start(env3, "p3", restore_from=sp1)
    sp2 = stop_when_held(second, tmp_path / "gate-2", tmp_path / "sp")
    rows += second.wait(10).rows()
    assert len(second.subtasks()) == 6  # 3 sources + 3 of the chained sum -> out

    env1 = ss.StreamEnvironment(parallelism=1, spark=spark, checkpointing=config(tmp_path))
    build(env1, rate=None)
    third = env1.execute("p1", restore_from=sp2)
    rows += third.rows()
    assert sorted(r["i"] for r in rows) == list(range(N))
    assert finals_of(rows) == expected_finals()
    # Every key's row count went up by one per row, across all three runs: state followed each key.
    counts = defaultdict(list)
    for r in rows:
        counts[r["key"]].append(r["count"])
    assert all(sorted(c) == list(range(1, len(c) + 1)) for c in counts.values())


@both_backends
def test_a_retained_checkpoint_survives_cancel_and_restores(spark, tmp_path, state_backend):
    env = ss.StreamEnvironment(parallelism=2, spark=spark, state_backend=state_backend,
                               checkpointing=config(tmp_path, retention="retain_on_cancellation"))
    build(env, gate=tmp_path / "gate")   # held: the job cannot finish before the cancel
    client = start(env, "retained")
    wait_completed(client, 2, timeout=60)
    client.cancel()
    assert client.status() == "CANCELED"
    job_dir = tmp_path / "ckpt" / client.job_id
    retained = checkpoint_dirs(job_dir)
    assert len(retained) == 1
    before = sorted(p.relative_to(job_dir) for p in job_dir.rglob("*") if p.is_file())
    env2 = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config(tmp_path, interval=0.2),
                                state_backend=state_backend)
    build(env2, rate=20_000)
    result = env2.execute("from retained", restore_from=str(retained[0]))
    assert finals_of(result.rows()) == expected_finals()
    assert result.checkpoints.counts.completed >= 2
    # The restored job's checkpoints never touch the checkpoint it was restored from: it is the
    # user's (incremental ones upload its files again into the new job's own shared/, as Flink's
    # NO_CLAIM restore does, instead of depending on them).
    assert sorted(p.relative_to(job_dir) for p in job_dir.rglob("*") if p.is_file()) == before
    assert stray_checkpoint_files(tmp_path / "ckpt") == []


def test_restoring_state_of_a_missing_operator_fails_unless_allowed(spark, tmp_path):
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config(tmp_path))
    build(env, gate=tmp_path / "gate")
    savepoint = stop_when_held(start(env, "original"), tmp_path / "gate", tmp_path / "sp")
    renamed = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config(tmp_path))
    build(renamed, rate=None, stateful_uid="sum-v2")
    with pytest.raises(ss.RestoreError) as info:
        renamed.execute("renamed operator", restore_from=savepoint)
    assert "operator(s) sum " in str(info.value)  # names the operator whose state would be lost
    assert "no longer has" in str(info.value) and "allow_non_restored_state=True" in str(info.value)
    result = renamed.execute("renamed operator", restore_from=savepoint, allow_non_restored_state=True)
    # The source resumed from the savepoint; the renamed operator started from empty state.
    assert 0 < len(result.rows()) < N


def test_restoring_from_something_that_is_not_a_checkpoint_fails_clearly(spark, tmp_path):
    env = ss.StreamEnvironment(parallelism=1, spark=spark, checkpointing=config(tmp_path))
    build(env)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ss.RestoreError, match="not a completed checkpoint or savepoint"):
        env.execute("bad", restore_from=str(tmp_path / "empty"))
    with pytest.raises(ss.RestoreError):
        env.execute("bad", restore_from=str(tmp_path / "does-not-exist"))


def test_a_corrupted_metadata_file_fails_clearly(spark, tmp_path):
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config(tmp_path))
    build(env, gate=tmp_path / "gate")
    savepoint = stop_when_held(start(env, "to corrupt"), tmp_path / "gate", tmp_path / "sp")
    metadata = os.path.join(savepoint, "_metadata")
    data = bytearray(open(metadata, "rb").read())
    data[len(data) // 2] ^= 0x20
    with open(metadata, "wb") as f:
        f.write(bytes(data))
    env2 = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config(tmp_path))
    build(env2)
    with pytest.raises(ss.RestoreError, match="checksum"):
        env2.execute("from corrupt", restore_from=savepoint)


def corrupt_newest_and_kill(client, tmp_path) -> int:
    """Three triggered checkpoints while the source holds mid-input; corrupt the newest one's
    _metadata, fail a task, let the source go on. No periodic checkpoint: none can complete (or
    be half-written, its directory taken for the newest) between the corruption and the kill."""
    wait_held(tmp_path / "gate", SPLITS, client)
    for _ in range(3):
        client.trigger_checkpoint()
    newest = checkpoint_dirs(tmp_path / "ckpt" / client.job_id)[-1]
    (newest / "_metadata").write_bytes(b"garbage")
    os.kill([s for s in client.subtasks() if s.vertex == "sum"][0].pid, signal.SIGKILL)
    release(tmp_path / "gate")
    return int(newest.name[4:])


def test_at_least_once_falls_back_from_a_corrupted_latest_checkpoint(spark, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    env = ss.StreamEnvironment(parallelism=2, spark=spark,
                               checkpointing=config(tmp_path, num_retained=3, interval=None, mode="at_least_once"),
                               restart=ss.RestartStrategy.fixed_delay(3, 0.0))
    build(env, rate=3000, gate=tmp_path / "gate")
    client = start(env, "fallback")
    newest = corrupt_newest_and_kill(client, tmp_path)
    result = client.wait(60)
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert f"checkpoint {newest}" in messages and "falling back" in messages.lower()
    assert result.checkpoints.latest_restored.checkpoint_id < newest
    assert finals_of(result.rows()) == expected_finals()


def test_exactly_once_refuses_to_fall_back_and_says_how_to_go_on(spark, tmp_path):
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config(tmp_path, num_retained=3, interval=None),
                               restart=ss.RestartStrategy.fixed_delay(3, 0.0))
    build(env, rate=3000, gate=tmp_path / "gate")
    client = start(env, "no unsafe fallback")
    newest = corrupt_newest_and_kill(client, tmp_path)
    with pytest.raises(ss.JobExecutionError) as info:
        client.wait(60)
    text = str(info.value)
    assert f"newest completed checkpoint {newest}" in text and "a second time" in text and "restore_from=" in text
