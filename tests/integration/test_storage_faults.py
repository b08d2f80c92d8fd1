"""Checkpoint storage faults on real Spark (issue 33): checkpoints on an S3-compatible server with
a subtask SIGKILLed, a savepoint there resumed from; and a checkpoint disk that fills up. The
committed output stays exact in each, and restarts never exceed the faults injected."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import time

import pytest

import streamsnap as ss
from streamsnap.checkpoint import filesystem
from tests.integration import fault_figures, support
from tests.integration.test_failover import RunningSum, causes, event, expected_rows, read_output, wait_restarted

pytestmark = [pytest.mark.spark, pytest.mark.faults]

N = 6_000          # rows, over 2 source splits (event(i): a key's rows come from one split)
RATE = 2_000
HOLD_AT = 2_400    # of each split's 3,000 rows


def chaos_shape(env, source, out):
    """The chaos job's shape, lean: a source, a keyed running sum, a transactional file sink."""
    (env.from_source(source, name="events", uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.FileSink(str(out), format="parquet"), name="files", uid="files"))


def assert_exact(rows):
    expected = expected_rows(N)
    assert len(rows) == len(set(rows)), "duplicates in the committed output"
    assert set(rows) == expected, f"missing {len(expected - set(rows))}, unexpected {len(set(rows) - expected)}"


def s3_objects(prefix: str) -> list[str]:
    fs, path = filesystem.filesystem(prefix)
    return sorted(p[len(path) + 1:] for p in fs.find(path))


def test_checkpoints_and_a_savepoint_on_s3_with_a_subtask_killed(spark, tmp_path, s3_server):
    """RocksDB incremental checkpoints on the S3-compatible server; a `sum` subtask SIGKILLed
    after a checkpoint completed restores from S3 (the executors open it with the storage
    options the job carries); then stop-with-savepoint to s3:// and a new job resumes from it."""
    bucket = s3_server.new_bucket()
    config = ss.CheckpointConfig(interval=0.3, directory=f"s3://{bucket}/ckpt", num_retained=2,
                                 storage_options=s3_server.storage_options)
    gate = tmp_path / "gate"
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, state_backend="rocksdb",
                               restart=ss.RestartStrategy.fixed_delay(attempts=1, delay=0.1))
    chaos_shape(env, support.HeldGenerator(event, count=N, rate=RATE, gate=gate, hold_at=HOLD_AT), tmp_path / "out1")
    client = env.execute_async("s3 checkpoints with a kill")
    support.wait_status(client, "RUNNING")
    support.wait_completed(client, 2, timeout=60)
    assert any("/shared/" in p for p in s3_objects(f"s3://{bucket}/ckpt")), "incremental: SST files in shared/"
    for marker in gate.glob("held-*"):     # the first attempt's holds (it marks each once): the
        marker.unlink()                    # restored attempt's own say when it holds
    victim = random.Random(33).choice([s for s in client.subtasks() if s.vertex.startswith("sum")])
    killed_at = time.time()
    os.kill(victim.pid, signal.SIGKILL)
    wait_restarted(client, 1)
    assert client.checkpoint_stats().latest_restored is not None, "restored from the checkpoint on S3"
    support.wait_held(gate, 2, client)
    savepoint = client.stop_with_savepoint(f"s3://{bucket}/savepoints")
    first = client.wait(60)
    fault_figures.report("s3 slot killed", faults=1, restarts=first.restarts, fault_at=killed_at,
                         recoveries=first.recoveries)
    assert first.restarts == 1 and len(first.recoveries) == 1, causes(client)
    assert savepoint.startswith(f"s3://{bucket}/savepoints/savepoint-")
    assert "_metadata" in s3_objects(savepoint)
    # Retention and cleanup on S3: the finished job's checkpoints and their shared SST files are gone.
    left = s3_objects(f"s3://{bucket}/ckpt")
    assert not [p for p in left if "/chk-" in p or "/shared/" in p], left

    env2 = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, state_backend="rocksdb")
    chaos_shape(env2, ss.sources.Generator(event, count=N), tmp_path / "out2")
    second = env2.execute("s3 resumed from a savepoint", restore_from=savepoint)
    assert second.restarts == 0 and second.checkpoints.latest_restored.external_path == savepoint
    rows_before = read_output(tmp_path / "out1")
    assert 0 < len(rows_before) < N
    assert_exact(rows_before + read_output(tmp_path / "out2"))


@pytest.fixture
def small_disk(tmp_path):
    """A test-owned 16 MiB tmpfs (root only: mount(8)); unmounted afterwards."""
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mountpoint)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=True)


def fill(directory) -> str:
    """Write a file until the disk is full (ENOSPC), to the last block; returns its path."""
    path = os.path.join(str(directory), "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 20, 1 << 12, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    finally:
        os.close(fd)
    return path


def test_a_full_checkpoint_disk_fails_checkpoints_not_the_output(spark, tmp_path, small_disk):
    """The checkpoint disk fills up (ENOSPC) for a while: checkpoints fail and count against
    tolerable_failures (2); the third in a row fails the job over once, to the last completed
    checkpoint. Space comes back and the job finishes with exactly its output."""
    config = ss.CheckpointConfig(interval=0.3, directory=str(small_disk / "ckpt"), tolerable_failures=2)
    gate = tmp_path / "gate"
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               restart=ss.RestartStrategy.fixed_delay(attempts=1, delay=0.5))
    chaos_shape(env, support.HeldGenerator(event, count=N, rate=RATE, gate=gate, hold_at=HOLD_AT), tmp_path / "out")
    client = env.execute_async("checkpoint disk full")
    support.wait_status(client, "RUNNING")
    support.wait_completed(client, 1, timeout=60)
    filler = fill(small_disk)
    full_at = time.time()
    deadline = time.monotonic() + 60
    while not client.recoveries():
        assert time.monotonic() < deadline, f"no failover while the disk was full: {client.checkpoint_stats()}"
        assert client.status() == "RUNNING", client.status()
        fill(small_disk)     # retention deletes old checkpoints: take what they free, or the next fits
        time.sleep(0.02)
    os.remove(filler)                    # space again
    stats = client.checkpoint_stats()
    assert stats.counts.failed >= 3 and sum(stats.failures_by_reason.values()) >= 3, stats.describe()
    assert "3 consecutive checkpoint failure(s), tolerable_failures=2" in causes(client), causes(client)
    support.release(gate)
    result = client.wait(120)
    # detection: until the third failed checkpoint in a row failed the job over
    fault_figures.report("enospc", faults=1, restarts=result.restarts, fault_at=full_at,
                         recoveries=result.recoveries)
    assert result.restarts == 1, causes(client)
    assert result.checkpoints.counts.completed >= 2
    assert_exact(read_output(tmp_path / "out"))
