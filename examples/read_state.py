"""Reading a job's state back with Spark (`ss.state.read`, `ss.state.metadata`).

A sensor-monitoring job keeps, per sensor, summary statistics in a `ValueState` (a dict: count,
min, max, sum of the readings in tenths of a degree) and a histogram of readings per hour in a
`MapState`. Instead of adding an output for every question someone might ask later, the job's
state is queried as it is:

1. the job runs on an unbounded stream — the sensors' readings, then only heartbeats, which
   the job filters out — and writes one row per reading to a Parquet `FileSink`, whose files
   become visible when the checkpoint covering them completes;
2. once every reading is in the committed output, every reading is also in the state of a
   completed checkpoint: the script stops the job with a savepoint;
3. `ss.state.metadata(spark, path)` lists the savepoint's operators and states, and
   `ss.state.read(spark, path, uid=..., state_name=...)` returns each state as a DataFrame —
   Value state as `key, value` (a dict value becomes a struct), Map state as
   `key, map_key, value` — queried here with Spark SQL.

Run it:

    python examples/read_state.py
"""

from __future__ import annotations

import os
import tempfile
import time

import streamsnap as ss

SENSORS = 6
START = 1_795_000_000_000       # epoch milliseconds, on an hour boundary
HOUR = 3_600_000


def message(i: int) -> dict:
    """Message i of the sensor gateway: readings, 15 s apart, for i < readings (see main), then heartbeats."""
    return {"sensor": f"s{i % SENSORS}", "tenths": 150 + (i * 37) % 200 + (i % SENSORS) * 10,
            "ts": START + i * 15_000, "seq": i}


class SensorStats(ss.KeyedProcessFunction):
    def open(self, ctx):
        self.stats = ctx.get_state(ss.ValueStateDescriptor("stats"))
        self.per_hour = ctx.get_state(ss.MapStateDescriptor("per_hour"))     # hour index -> readings

    def process_element(self, row, ctx):
        t = row["tenths"]
        s = self.stats.value() or {"count": 0, "min": t, "max": t, "sum": 0}
        self.stats.update({"count": s["count"] + 1, "min": min(s["min"], t), "max": max(s["max"], t),
                           "sum": s["sum"] + t})
        hour = (row["ts"] - START) // HOUR
        self.per_hour.put(hour, (self.per_hour.get(hour) or 0) + 1)
        yield {"seq": row["seq"], "sensor": ctx.current_key, "tenths": t}


def committed_rows(directory: str) -> int:
    """Rows in the sink's committed Parquet files (files in progress are hidden: '.inprogress-...')."""
    import pyarrow.parquet as pq

    total = 0
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        if name.startswith((".", "_")):
            continue
        try:
            total += pq.read_metadata(os.path.join(directory, name)).num_rows
        except FileNotFoundError:
            pass
    return total


def main(spark=None, readings: int = 1_200, rate: float = 2_000) -> dict:
    """Processes `readings` readings (then heartbeats at `rate` a second), stops with a
    savepoint and queries its state; returns the per-sensor summary from Spark."""
    directory = tempfile.mkdtemp(prefix="sensors-")
    output = os.path.join(directory, "readings")
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=ss.CheckpointConfig(
        interval=0.3, directory=os.path.join(directory, "checkpoints")))
    gateway = ss.sources.Generator(lambda i: {**message(i), "kind": "reading" if i < readings else "heartbeat"},
                                   rate=rate)                                 # unbounded
    (env.from_source(gateway, name="gateway", uid="gateway")
        .filter(lambda m: m["kind"] == "reading", name="readings only")
        .key_by("sensor")
        .process(SensorStats(), name="sensor stats", uid="sensor-stats")
        .sink_to(ss.sinks.FileSink(output, format="parquet", mode="overwrite"), name="readings", uid="readings"))
    client = env.execute_async("sensor stats")
    deadline = time.monotonic() + 120
    while committed_rows(output) < readings:
        assert time.monotonic() < deadline, "the readings were not all committed in 2 minutes"
        time.sleep(0.1)
    path = client.stop_with_savepoint(os.path.join(directory, "savepoints"))
    print(f"savepoint {path}")

    if spark is None:                                    # the session the job ran on
        from pyspark.sql import SparkSession
        spark = SparkSession.getActiveSession()
    ss.state.metadata(spark, path).select("uid", "state_name", "state_type", "kind", "keys").show()

    ss.state.read(spark, path, uid="sensor-stats", state_name="stats").createOrReplaceTempView("stats")
    ss.state.read(spark, path, uid="sensor-stats", state_name="per_hour").createOrReplaceTempView("per_hour")
    summary = spark.sql("""
        SELECT s.key AS sensor, s.value.count AS readings, s.value.min / 10 AS min_c, s.value.max / 10 AS max_c,
               round(s.value.sum / s.value.count / 10, 2) AS mean_c, h.hours
        FROM stats s
        JOIN (SELECT key, count(*) AS hours FROM per_hour GROUP BY key) h ON h.key = s.key
        ORDER BY sensor""")
    rows = [r.asDict() for r in summary.collect()]
    print("sensor  readings  min °C  max °C  mean °C  hours")
    for r in rows:
        print(f"{r['sensor']:<7} {r['readings']:>8} {r['min_c']:>7} {r['max_c']:>7} {r['mean_c']:>8} {r['hours']:>6}")
    per_hour = spark.sql("SELECT map_key AS hour, sum(value) AS readings FROM per_hour GROUP BY map_key")
    return {"summary": rows, "per_hour": {r["hour"]: r["readings"] for r in per_hour.collect()},
            "output_rows": committed_rows(output)}


if __name__ == "__main__":
    main()
