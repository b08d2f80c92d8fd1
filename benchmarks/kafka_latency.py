"""End-to-end latency as the field measures it: Kafka → streamsnap → Kafka at a fixed rate.

`python -m benchmarks.kafka_latency [--rate 10000] [--seconds 20] [--only stateless,count,join]
[--modes alo,eo100,eo1000] [--buffer-timeout S]` starts the local broker (scripts/kafka-broker),
then for each job and delivery mode: fresh 2-partition input and output topics, the job started
and RUNNING, then a producer process writing `rate` JSON events/s ({"k", "v", "ts_ns"}: the
producer's wall clock just before the message is handed to librdkafka, linger 0) and a consumer
process reading the output topic (for exactly-once: a row counts as received when its commit
marker is read, polled every millisecond — local_kafka.CommittedTail says why not librdkafka's
read_committed). Latency = the consumer's wall clock at receipt − the event's `ts_ns`: producer
client, broker, the job's Kafka source, the pipeline, its Kafka sink, broker, consumer. The first `WARMUP` seconds are dropped.

The jobs are written the way the docs teach (per-row functions, parallelism 2, the default
connectors, checkpoints on): (a) `stateless`: filter + projection; (b) `count`: a keyed
running count (`key_by` + `KeyedProcessFunction` with ValueState); (c) `join`: enrichment of
the stream from a static Spark DataFrame (`from_dataframe`, connected and keyed, the catalog
row kept in keyed state, as docs/examples/dataframe-enrichment shows).

`broker` is no job at all: the consumer reads the input topic as the producer writes it — the
share of every figure that is the local broker's and the clients' (printed first: the latency
targets can only be judged against it).

Modes: `alo` at-least-once sink (rows leave as soon as produced; checkpoints every 1 s),
`eo100`/`eo1000` exactly-once Kafka transactions committed when a checkpoint completes, every
100 ms / 1 s: a row is visible to read_committed consumers only after the checkpoint after it
completes, so the interval is the floor of exactly-once latency (p99 ≈ interval + commit).

Everything runs on this machine: producer, broker, Spark's workers and the consumer share its
cores, which is part of what the figures include.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
import time
import uuid

import numpy as np

import streamsnap as ss
from benchmarks import local_kafka
from benchmarks.workloads import _checkpoint_dir, cancel_and_wait, cleanup

WARMUP = 3.0        # seconds of output dropped at the start
LINGER_MS = 2      # the producer batches for 2 ms: with 0 the local broker took one request per message and fell behind at 5,000/s
KEYS = 1000
BROKER = "broker"   # producer → broker → consumer, no job: what the broker alone adds
JOBS = (BROKER, "stateless", "count", "join")
MODES = {"alo": ("at_least_once", 1.0), "eo100": ("exactly_once", 0.1), "eo1000": ("exactly_once", 1.0)}


# ====================================================================== the jobs, as the docs write them
def keep(row) -> bool:
    return row["v"] % 10 != 9


def project(row) -> dict:
    return {"k": row["k"], "v": row["v"], "ts_ns": row["ts_ns"]}


class RunningCount(ss.KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ss.ValueStateDescriptor("count", default=0))

    def process_element(self, row, ctx):
        n = self.count.value() + 1
        self.count.update(n)
        yield {"k": row["k"], "count": n, "ts_ns": row["ts_ns"]}


class Enrich(ss.KeyedCoProcessFunction):
    """Input 1: the catalog (one row per key, from a DataFrame); input 2: the events."""

    def open(self, ctx):
        self.entry = ctx.get_state(ss.ValueStateDescriptor("entry"))
        self.waiting = ctx.get_state(ss.ListStateDescriptor("waiting"))

    def process_element1(self, row, ctx):
        self.entry.update(row)
        for event in self.waiting.get():
            yield self.enrich(event, row)
        self.waiting.clear()

    def process_element2(self, row, ctx):
        entry = self.entry.value()
        if entry is None:
            self.waiting.add(row)
            return
        yield self.enrich(row, entry)

    @staticmethod
    def enrich(event, entry):
        return {"k": event["k"], "v": event["v"], "segment": entry["segment"], "ts_ns": event["ts_ns"]}


def build(env, spark, job: str, bootstrap: str, source_topic: str, sink):
    events = env.from_source(ss.sources.Kafka(bootstrap, [source_topic], starting_offsets="earliest"),
                             name="events", uid="events")
    if job == "stateless":
        out = events.filter(keep, name="keep").map(project, name="project")
    elif job == "count":
        out = events.key_by("k").process(RunningCount(), name="count", uid="count")
    else:
        catalog = spark.createDataFrame([(k, f"segment-{k % 7}") for k in range(KEYS)], "k long, segment string")
        out = (env.from_dataframe(catalog, name="catalog").key_by("k")
               .connect(events.key_by("k")).process(Enrich(), name="enrich", uid="enrich"))
    out.sink_to(sink, name="out", uid="out")


# ====================================================================== producer and consumer processes
def _produce(bootstrap: str, topic: str, rate: int, seconds: float, started, achieved) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": LINGER_MS, "acks": "1"})
    started.set()
    begin = time.monotonic()
    sent, total = 0, int(rate * seconds)
    while sent < total:
        due = min(total, int((time.monotonic() - begin) * rate))
        while sent < due:
            try:
                producer.produce(topic, json.dumps({"k": sent % KEYS, "v": sent, "ts_ns": time.time_ns()}).encode(),
                                 key=str(sent % KEYS).encode())
            except BufferError:      # librdkafka's queue is full: the broker is behind; wait for it
                producer.poll(0.005)
                continue
            sent += 1
        producer.poll(0)
        time.sleep(0.0005)
    achieved.value = sent / (time.monotonic() - begin)    # below `rate`: this machine could not keep up
    producer.flush(30)


def _consume(bootstrap: str, topic: str, isolation: str, expected: int, seconds: float, out_path: str,
             ready) -> None:
    """Read until `expected` rows arrived or `seconds` passed (a slow machine's last rows are
    waited for, not taken for lost). read_committed: a row is received when its transaction's
    commit marker is read (local_kafka.CommittedTail: the local broker's last stable offset can
    stall, so librdkafka's read_committed is not used); otherwise librdkafka, read_uncommitted."""
    latencies = []
    deadline = time.monotonic() + seconds
    if isolation == "read_committed":
        tail = local_kafka.CommittedTail(bootstrap, topic, 2, max_wait_ms=1)
        ready.set()
        while len(latencies) < expected and time.monotonic() < deadline:
            rows = tail.poll()
            received = time.time_ns()
            latencies += [received - json.loads(value)["ts_ns"] for _, _, value in rows]
        tail.close()
    else:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"latency-{uuid.uuid4().hex[:8]}",
                             "isolation.level": isolation, "enable.auto.commit": False,
                             "fetch.wait.max.ms": 1, "fetch.min.bytes": 1})
        consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])   # no group rebalance to wait for
        ready.set()
        while len(latencies) < expected and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.05):
                if message.error():
                    raise RuntimeError(f"consumer of {topic}: {message.error()}")
                received = time.time_ns()
                latencies.append(received - json.loads(message.value())["ts_ns"])
        consumer.close()
    np.save(out_path, np.asarray(latencies, dtype=np.int64))


# ====================================================================== one measurement
def run_once(spark, bootstrap: str, job: str, mode: str, rate: int, seconds: float,
             buffer_timeout: float | None) -> dict:
    semantic, interval = MODES[mode]
    source_topic, out_topic = f"lat-in-{uuid.uuid4().hex[:8]}", f"lat-out-{uuid.uuid4().hex[:8]}"
    local_kafka.create_topic(bootstrap, source_topic, 2)
    client = None
    if job == BROKER:     # no job: the consumer reads what the producer wrote, the broker's own share
        out_topic, semantic = source_topic, "at_least_once"
    else:
        local_kafka.create_topic(bootstrap, out_topic, 2)
        env = ss.StreamEnvironment(parallelism=2, spark=spark, buffer_timeout=buffer_timeout,
                                   checkpointing=ss.CheckpointConfig(interval=interval,
                                                                     directory=_checkpoint_dir("latency-")))
        build(env, spark, job, bootstrap, source_topic,
              ss.sinks.Kafka(bootstrap, out_topic, key="k", semantic=semantic))
        client = env.execute_async(f"latency {job} {mode}")
        while client.status() != "RUNNING":
            time.sleep(0.01)
    context = multiprocessing.get_context("spawn")
    produced, ready = context.Event(), context.Event()
    out_path = tempfile.mktemp(suffix=".npy", prefix="latency-")
    total = int(rate * seconds)
    expected = total - total // 10 if job == "stateless" else total     # the filter drops v % 10 == 9
    consumer = context.Process(target=_consume, args=(bootstrap, out_topic, "read_committed" if semantic ==
                                                      "exactly_once" else "read_uncommitted", expected,
                                                      seconds + 120, out_path, ready))
    consumer.start()
    ready.wait(60)
    achieved = context.Value("d", 0.0)
    producer = context.Process(target=_produce, args=(bootstrap, source_topic, rate, seconds, produced, achieved))
    producer.start()
    producer.join()
    consumer.join()
    if client is not None:
        cancel_and_wait(client, 60)
    latencies_ms = np.load(out_path) / 1e6
    if len(latencies_ms) == 0:
        raise RuntimeError(f"latency {job} {mode}: the consumer read no rows from {out_topic}")
    # Drop the warm-up: the first WARMUP seconds of output (by position; the rate is fixed).
    measured = latencies_ms[int(len(latencies_ms) * WARMUP / seconds):]
    p50, p99, p999 = (float(np.percentile(measured, q)) for q in (50, 99, 99.9))
    return {"job": job, "mode": mode, "rows": int(len(latencies_ms)), "expected": expected,
            "produced_per_second": achieved.value,
            "p50_ms": p50, "p99_ms": p99, "p999_ms": p999, "max_ms": float(measured.max())}


def main(argv=None) -> list[dict]:
    from streamsnap.cluster.spark_session import embedded_session

    parser = argparse.ArgumentParser(prog="python -m benchmarks.kafka_latency")
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--only", default=",".join(JOBS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--buffer-timeout", type=float, default=None,
                        help="StreamEnvironment(buffer_timeout=...) in seconds (default: the engine's)")
    args = parser.parse_args(argv)
    jobs, modes = args.only.split(","), args.modes.split(",")
    for name in jobs:
        if name not in JOBS:
            parser.error(f"unknown job {name!r}: one of {', '.join(JOBS)}")
    for name in modes:
        if name not in MODES:
            parser.error(f"unknown mode {name!r}: one of {', '.join(MODES)}")
    directory = tempfile.mkdtemp(prefix="ssbench-broker-")
    bootstrap = local_kafka.start_broker(directory)
    spark = embedded_session(16)
    results = []
    try:
        run_once(spark, bootstrap, "stateless", "alo", 1000, 4.0, args.buffer_timeout)    # warm workers, imports
        print(f"Kafka → streamsnap → Kafka at {args.rate:,} events/s, {args.seconds:g} s each (first {WARMUP:g} s "
              f"dropped), parallelism 2, buffer_timeout {args.buffer_timeout}", flush=True)
        print(f"{'job':10s} {'mode':7s} {'rows':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'p99.9 ms':>9s} {'max ms':>8s}")
        for job in jobs:
            for mode in (["alo"] if job == BROKER else modes):
                m = run_once(spark, bootstrap, job, mode, args.rate, args.seconds, args.buffer_timeout)
                results.append(m)
                print(f"{job:10s} {mode:7s} {m['rows']:8,d} {m['p50_ms']:8.1f} {m['p99_ms']:8.1f} {m['p999_ms']:9.1f} "
                      f"{m['max_ms']:8.1f}" + ("" if m["rows"] >= m["expected"] else
                                               f"  (only {m['rows']:,} of {m['expected']:,} rows read)")
                      + ("" if m["produced_per_second"] >= 0.98 * args.rate else
                         f"  (produced only {m['produced_per_second']:,.0f} events/s)"), flush=True)
        return results
    finally:
        spark.stop()
        local_kafka.stop_broker(directory)
        cleanup()


if __name__ == "__main__":
    main()
