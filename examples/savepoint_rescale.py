"""Savepoint → rescale → resume: stop a running job, look inside its savepoint, resume wider.

A ledger job keeps a running balance per account (keyed `ValueState`) over a rate-limited
stream of transfers and emits every new balance to an exactly-once `Collect` sink. The
walk-through:

1. start it at parallelism 2 with `execute_async` and wait for its first completed checkpoint;
2. `client.stop_with_savepoint(dir)`: the sources stop, a savepoint's barrier flows through the
   job, the sink commits everything the savepoint covers, and the job finishes;
3. list the savepoint's operators and states with `ss.state.metadata(spark, path)` (the
   operators are found again by their `uid=`);
4. build the same job at parallelism 3 and `execute(..., restore_from=path)`: the key groups
   of the balances are dealt out to three subtasks, the generator's splits resume where the
   savepoint left them, and the job runs to the end.

The two runs together emitted one balance per transfer — none lost, none twice — and the
final balances are exactly those of a plain Python sum, wherever the stop happened.

Run it:

    python examples/savepoint_rescale.py
"""

from __future__ import annotations

import tempfile
import time

import streamsnap as ss

ACCOUNTS = 12


def transfer(i: int) -> dict:
    return {"seq": i, "account": f"acct-{i * 5 % ACCOUNTS:02d}", "cents": (i * 7_919) % 2_000 - 500}


class Ledger(ss.KeyedProcessFunction):
    def open(self, ctx):
        self.balance = ctx.get_state(ss.ValueStateDescriptor("balance", default=0))

    def process_element(self, row, ctx):
        balance = self.balance.value() + row["cents"]
        self.balance.update(balance)
        yield {"seq": row["seq"], "account": ctx.current_key, "balance": balance}


def build(parallelism: int, transfers: int, rate: float, checkpoints: str, spark=None) -> ss.StreamEnvironment:
    """The job; both runs build it the same way, only the parallelism differs."""
    env = ss.StreamEnvironment(parallelism=parallelism, spark=spark,
                               checkpointing=ss.CheckpointConfig(interval=0.3, directory=checkpoints))
    (env.from_source(ss.sources.Generator(transfer, count=transfers, rate=rate), name="transfers", uid="transfers")
        .key_by("account")
        .process(Ledger(), name="ledger", uid="ledger")
        .sink_to(ss.sinks.Collect(), name="balances", uid="balances"))
    return env


def main(spark=None, transfers: int = 8_000, rate: float = 2_000) -> dict:
    """Runs `transfers` transfers at `rate` a second; stops at parallelism 2, resumes at 3."""
    checkpoints, savepoints = tempfile.mkdtemp(prefix="ledger-ckpt-"), tempfile.mkdtemp(prefix="ledger-sp-")

    # 1. Run at parallelism 2 until a checkpoint has completed.
    env = build(2, transfers, rate, checkpoints, spark)
    client = env.execute_async("ledger")
    while client.checkpoint_stats().counts.completed < 1:
        time.sleep(0.05)

    # 2. Stop with a savepoint: returns its path once the job has finished.
    path = client.stop_with_savepoint(savepoints)
    first = client.wait()
    print(f"stopped at parallelism 2 after {len(first.rows())} transfers; savepoint {path}")

    # 3. What the savepoint holds.
    if spark is None:
        from pyspark.sql import SparkSession
        spark = SparkSession.getActiveSession()
    states = (ss.state.metadata(spark, path).where("state_name IS NOT NULL")
              .select("uid", "parallelism", "state_name", "state_type", "kind"))
    for row in states.collect():
        print(f"  operator {row['uid']:<10} parallelism {row['parallelism']}: "
              f"{row['state_type']} {row['kind']} state {row['state_name']!r}")

    # 4. Resume at parallelism 3.
    env = build(3, transfers, rate, checkpoints, spark)
    second = env.execute("ledger", restore_from=path)
    print(f"resumed at parallelism 3 and processed the other {len(second.rows())} transfers")

    rows = first.rows() + second.rows()
    final = {}
    for row in sorted(rows, key=lambda r: r["seq"]):
        final[row["account"]] = row["balance"]
    print("final balances:", ", ".join(f"{a} {b / 100:.2f}" for a, b in sorted(final.items())))
    return {"first": first, "second": second, "rows": rows, "final": final,
            "operators": sorted({(r["uid"], r["state_name"], r["kind"]) for r in states.collect()},
                                key=lambda t: tuple(x or "" for x in t))}


if __name__ == "__main__":
    main()
