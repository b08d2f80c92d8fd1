"""The Spark scenario both table sources run: a table appended to while a continuous job reads
it (with event time from a column), a reader SIGKILLed and restored. (Bounded reads run on Spark
in the docs' snippets, docs/how-to/lakehouse.md.)"""

from __future__ import annotations

import os
import signal
import threading
import time

import pyarrow.dataset as ds

import streamsnap as ss
from tests.integration.support import wait_completed, wait_status


class EventTimes(ss.KeyedProcessFunction):
    """Each row's id with the event time the runtime gave it."""

    def process_element(self, row, ctx):
        yield {"i": row["i"], "at": ctx.timestamp()}


class Ids(ss.KeyedProcessFunction):
    """Each row's id and the event time the runtime gave it, through keyed state (so the source
    is its own task, killable alone)."""

    def open(self, ctx):
        self.count = ctx.get_state(ss.ValueStateDescriptor("count", default=0))

    def process_element(self, row, ctx):
        self.count.update(self.count.value() + 1)
        yield {"i": row["i"], "at": ctx.timestamp()}


def committed_ids(out: str) -> list[int]:
    """The `i` column of the FileSink's committed files (hidden in-progress files are skipped)."""
    if not os.path.isdir(out) or not any(not n.startswith((".", "_")) for n in os.listdir(out)):
        return []
    return ds.dataset(out, format="parquet").to_table(columns=["i"]).column("i").to_pylist()


def committed_times(out: str) -> list[tuple[int, int]]:
    return sorted(zip(*ds.dataset(out, format="parquet").to_table(columns=["i", "at"]).to_pydict().values()))


def appended_while_running(spark, tmp_path, source, append, first: int, per_append: int, appends: int) -> None:
    """`source` (continuous, event_time="ms" = i seconds) starts on a table of ids 0..first-1;
    `append(first_id, n)` commits a version of n more rows. Versions are appended while the job runs, a reader subtask is
    SIGKILLed after the first completed checkpoint, more versions follow the restore: the job's
    committed output holds every id exactly once, with its event time."""
    total = first + per_append * appends
    out = str(tmp_path / "out")
    config = ss.CheckpointConfig(interval=0.3, directory=str(tmp_path / "ckpt"))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               restart=ss.RestartStrategy.fixed_delay(3, 0.0),
                               network=ss.NetworkConfig(batch_size=64, credits=2, output_queue_frames=2))
    (env.from_source(source, name="table", uid="reader")
        .key_by("key").process(Ids(), name="ids", uid="ids")
        .sink_to(ss.sinks.FileSink(out), name="files", uid="files"))
    client = env.execute_async("table appended while running")
    appended = threading.Event()
    errors: list[BaseException] = []

    def appender():
        try:
            for n in range(appends):
                append(first + n * per_append, per_append)
                if n == appends // 2 - 1:
                    appended.set()
                    killed.wait(120)
                time.sleep(0.2)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)
            appended.set()

    killed = threading.Event()
    thread = threading.Thread(target=appender, daemon=True)
    try:
        wait_status(client, "RUNNING")
        thread.start()
        wait_completed(client, 1, timeout=60)
        assert appended.wait(120) and not errors, errors
        reader = [s for s in client.subtasks() if s.vertex == "reader" and s.state == "RUNNING"][0]
        os.kill(reader.pid, signal.SIGKILL)
        killed.set()
        thread.join(120)
        assert not errors, errors
        deadline = time.monotonic() + 120
        while len(ids := committed_ids(out)) < total:
            assert client.status() in ("RUNNING", "FAILING", "RESTARTING", "CREATED"), f"job {client.status()} with {len(ids)}/{total} rows committed"
            assert time.monotonic() < deadline, f"only {len(ids)}/{total} rows committed"
            time.sleep(0.2)
        assert len(client.recoveries()) >= 1
    finally:
        killed.set()
        client.cancel()
    ids = committed_ids(out)
    assert sorted(ids) == list(range(total)), "rows lost or read twice"
    assert committed_times(out) == [(i, i * 1000) for i in range(total)]
