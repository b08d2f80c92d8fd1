"""The vectorized two-input keyed function (`connect(...).process_batches`) on real Spark:
both inputs update one key's state a batch at a time and its event-time timers emit; a
subtask SIGKILLed mid-input is restored from the last checkpoint (state and timers, on either
backend) and the committed output is exactly the reference's, each row once."""

from __future__ import annotations

import os
import signal
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import streamsnap as ss
from tests.integration import support
from tests.integration.support import both_backends, wait_completed, wait_status

pytestmark = pytest.mark.spark

N = 6_000           # rows per input: 30 s of event time, 3 s of input at RATE
RATE = 2_000
HOLD_AT = 2_000     # of each split's 3,000 rows


def deposit(i: int) -> dict:
    return {"key": i % 7, "amount": i % 13 + 1, "ts": i * 5}


def withdrawal(i: int) -> dict:
    return {"key": i % 5, "amount": i % 3 + 1, "ts": i * 5 + 2}


def reference() -> dict:
    """(key, second) -> (deposits - withdrawals in that second, rows)."""
    out: dict = defaultdict(lambda: [0, 0])
    for sign, fn in ((1, deposit), (-1, withdrawal)):
        for row in map(fn, range(N)):
            cell = out[(row["key"], row["ts"] // 1000 * 1000)]
            cell[0] += sign * row["amount"]
            cell[1] += 1
    return {k: tuple(v) for k, v in out.items()}


OUT = pa.schema([("key", pa.int64()), ("second", pa.int64()), ("net", pa.int64()), ("rows", pa.int64())])


class NetPerSecond(ss.KeyedCoBatchFunction):
    """Per key, the open seconds' (net, rows) in keyed state, from both inputs; a timer at each
    second's end emits it."""

    def open(self, ctx):
        self.seconds = ctx.get_state(ss.ValueStateDescriptor("seconds"))
        self.timers = ctx.timer_service()

    def _add(self, batch, keys, sign: int) -> None:
        second = batch.column("ts").to_numpy() // 1000 * 1000
        amount = sign * batch.column("amount").to_numpy()
        held = [dict(h) if h else {} for h in self.seconds.get_many(keys)]
        for k, s, a in zip(keys.index.tolist(), second.tolist(), amount.tolist()):
            net, rows = held[k].get(s, (0, 0))
            held[k][s] = (net + a, rows + 1)
        self.seconds.put_many(keys, held)
        for s in np.unique(second).tolist():
            positions = np.unique(keys.index[second == s]).tolist()
            some = ss.BatchKeys([keys.unique[p] for p in positions], np.arange(len(positions)),
                                [keys.key_groups[p] for p in positions])
            self.timers.register_event_time_timers(some, s + 999)

    def process_batch1(self, batch, keys):
        self._add(batch, keys, 1)

    def process_batch2(self, batch, keys):
        self._add(batch, keys, -1)

    def on_timers(self, timers, ctx):
        held = [dict(h) for h in self.seconds.get_many(timers.keys)]
        rows = []
        for key, at, seconds in zip(timers.keys.unique, timers.timestamps.tolist(), held):
            net, count = seconds.pop(at - 999)
            rows.append({"key": key, "second": at - 999, "net": net, "rows": count})
        self.seconds.put_many(timers.keys, [s or None for s in held])
        return pa.RecordBatch.from_pylist(rows, schema=OUT)


@both_backends
def test_a_killed_two_input_batch_function_restores_state_and_timers_exactly_once(spark, tmp_path, state_backend):
    env = ss.StreamEnvironment(parallelism=2, spark=spark, state_backend=state_backend, auto_watermark_interval=0.05,
                               checkpointing=ss.CheckpointConfig(interval=0.2, directory=str(tmp_path / "ckpt")),
                               restart=ss.RestartStrategy.fixed_delay(1, 0.0))
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(0.2).with_timestamp_assigner("ts")
    gates = tmp_path / "deposits", tmp_path / "withdrawals"
    inputs = [env.from_source(support.HeldGenerator(fn, count=N, rate=RATE, splits=2, batch_size=100, gate=gate,
                                                    hold_at=HOLD_AT), name=name, uid=name, watermark_strategy=strategy)
              for fn, gate, name in ((deposit, gates[0], "deposits"), (withdrawal, gates[1], "withdrawals"))]
    (inputs[0].key_by("key").connect(inputs[1].key_by("key"))
        .process_batches(NetPerSecond(), name="net", uid="net", output_schema=OUT)
        .sink_to(ss.sinks.FileSink(str(tmp_path / "out")), name="files", uid="files"))
    client = env.execute_async("two-input batches")
    wait_status(client, "RUNNING")
    for gate in gates:
        support.wait_held(gate, 2, client)
    wait_completed(client, 1)
    victim = [s for s in client.subtasks() if s.vertex.startswith("net")][0]
    os.kill(victim.pid, signal.SIGKILL)
    for gate in gates:
        support.release(gate)
    result = client.wait(180)
    assert result.restarts == 1, result.recoveries
    rows = pq.read_table(tmp_path / "out").to_pylist()
    got = {(r["key"], r["second"]): (r["net"], r["rows"]) for r in rows}
    assert len(got) == len(rows), "a second was emitted twice"
    assert got == reference()
