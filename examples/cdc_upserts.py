"""CDC-style upserts into a Parquet table, exactly-once.

A change-data-capture feed of a `customers` table (inserts, updates and deletes, each with the
log sequence number `lsn` of the source database) is turned into a Parquet table:

1. The stream job keys the changes by customer id and keeps each customer's current row and
   the last applied `lsn` in keyed state. A change at or below that `lsn` is a replay (the CDC
   connector re-sends a few changes after it restarts) and is skipped, so applying the feed is
   idempotent. Every applied change becomes one row of a changelog — an upsert with the new
   row, or a delete with the row it removed — written by a `FileSink` with two-phase commit:
   Parquet files become visible only when the checkpoint that covers them completes.
2. Spark reads the committed changelog and compacts it into the table — the latest change per
   id, deletes dropped (merge-on-read) — and writes that as the table's current snapshot.

Run it:

    python examples/cdc_upserts.py
"""

from __future__ import annotations

import os
import tempfile

import streamsnap as ss

TIERS = ["free", "plus", "pro"]


def change_feed(changes: int, customers: int = 40) -> list[dict]:
    """The CDC feed in log order: `changes` changes to the customers table, and after every
    50th change a replay of the three changes before it."""
    table, feed = {}, []
    for i in range(changes):
        cid = i * 7 % customers + 1
        lsn = 1_000 + i
        if cid not in table:
            row = {"id": cid, "name": f"customer {cid}", "email": f"c{cid}@example.com", "tier": "free"}
            op = "c"
        elif i % 11 == 0:
            row, op = table[cid], "d"
        else:
            row = {**table[cid], "tier": TIERS[i % 3]}
            if i % 4 == 0:
                row["email"] = f"c{cid}.{i}@example.net"
            op = "u"
        if op == "d":
            del table[cid]
        else:
            table[cid] = row
        feed.append({"op": op, "lsn": lsn, **row})
        if i % 50 == 49:
            feed.extend(feed[-4:-1])      # the connector restarted and re-sent three changes
    return feed


class ApplyChange(ss.KeyedProcessFunction):
    """Keyed by customer id: applies each change once, in lsn order, and emits the changelog."""

    def open(self, ctx):
        self.current = ctx.get_state(ss.ValueStateDescriptor("current"))
        self.last_lsn = ctx.get_state(ss.ValueStateDescriptor("last_lsn", default=0))

    def process_element(self, change, ctx):
        if change["lsn"] <= self.last_lsn.value():
            return                                  # a replay of a change already applied
        self.last_lsn.update(change["lsn"])
        row = {k: change[k] for k in ("id", "name", "email", "tier")}
        if change["op"] == "d":
            before = self.current.value() or row
            self.current.clear()
            yield {**before, "lsn": change["lsn"], "deleted": True}
        else:
            self.current.update(row)
            yield {**row, "lsn": change["lsn"], "deleted": False}


def compact(spark, changelog_dir: str, table_dir: str):
    """The table's current snapshot: the latest change per id, without deleted ids."""
    from pyspark.sql import Window, functions as F

    changes = spark.read.parquet(changelog_dir)          # committed files only
    latest = Window.partitionBy("id").orderBy(F.col("lsn").desc())
    snapshot = (changes.withColumn("n", F.row_number().over(latest))
                .where((F.col("n") == 1) & ~F.col("deleted"))
                .select("id", "name", "email", "tier", "lsn"))
    snapshot.write.mode("overwrite").parquet(table_dir)
    return spark.read.parquet(table_dir)


def main(spark=None, changes: int = 400, directory: str | None = None) -> dict:
    """Applies `changes` changes; returns the compacted table's rows and the changelog size."""
    directory = directory or tempfile.mkdtemp(prefix="cdc-")
    changelog_dir, table_dir = os.path.join(directory, "changelog"), os.path.join(directory, "customers")
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=ss.CheckpointConfig(
        interval=0.5, directory=os.path.join(directory, "checkpoints")))
    feed = env.from_collection(change_feed(changes), name="cdc feed", uid="cdc-feed")   # one subtask, in log order
    (feed.key_by("id")
        .process(ApplyChange(), name="apply", uid="apply")
        .sink_to(ss.sinks.FileSink(changelog_dir, format="parquet", mode="overwrite"),
                 name="changelog", uid="changelog"))
    env.execute("customers cdc")

    if spark is None:                                     # the session the job ran on
        from pyspark.sql import SparkSession
        spark = SparkSession.getActiveSession()
    table = sorted((r.asDict() for r in compact(spark, changelog_dir, table_dir).collect()), key=lambda r: r["id"])
    logged = spark.read.parquet(changelog_dir).count()
    print(f"{logged} changes applied; table {table_dir} has {len(table)} customers, e.g.:")
    for row in table[:5]:
        print(f"  {row['id']:>3} {row['name']:<12} {row['email']:<24} {row['tier']:<5} (lsn {row['lsn']})")
    return {"table": table, "changelog_rows": logged}


if __name__ == "__main__":
    main()
