"""Kafka → W1 (vectorized keyed running sum) → Kafka, exactly-once, 1 s checkpoints, parallelism 2.

`python -m benchmarks.kafka [events] [runs]` starts the local broker (scripts/kafka-broker),
fills a 2-partition input topic with JSON events {"key": i % 1000, "value": i, "ts": i}, and runs, in
turn (A B C ... A B C ...), the same pipeline in the `VARIANTS`: the exactly-once Kafka sink with
both connectors columnar (the defaults), both on librdkafka (`fetcher=`/`producer="librdkafka"`),
and the columnar source with the librdkafka producer; the at-least-once sink; a discarding sink
(what reading Kafka alone costs, on each fetcher); and the client ceiling
(`client_ceiling`: the same copy with bare confluent-kafka consumers and transactional
producers, no engine, no decoding — what librdkafka and the broker alone reach here). Before them it measures the CPU
time per message of the source reader (each fetcher, alternated) and the exactly-once sink writer (each producer) alone (`profile`), and
of encoding and decoding the same rows as Avro instead of JSON (no broker). Throughput is events over the time
from the job running to the job finished — for exactly-once that includes the final checkpoint
and the last commit, i.e. until every row is visible to read_committed consumers. The output
topic's committed row count is checked after each Kafka-sink run.

Spark Structured Streaming's side is not run here: its Kafka source needs the spark-sql-kafka
connector jar, which PySpark's wheel does not ship and no reachable repository offers here.
benchmarks/files_vs_spark.py compares the same W1 pipeline on both engines over Parquet files.
"""

from __future__ import annotations

import resource
import statistics
import sys
import tempfile
import time
import uuid

import numpy as np
import pyarrow as pa

import streamsnap as ss
from benchmarks.workloads import BatchRunningSum, _checkpoint_dir, cleanup
from streamsnap.connectors.kafka.avro import AvroCodec
from streamsnap.connectors.kafka.sink import encode_json
from benchmarks import local_kafka

KEYS = 1000
FETCHERS = ("columnar", "librdkafka")      # ss.sources.Kafka(fetcher=...)
PRODUCERS = ("librdkafka", "columnar")     # ss.sinks.Kafka(producer=...)
# The runs of each round: name -> (sink semantic or "discard", source fetcher, sink producer).
VARIANTS = {"exactly_once": ("exactly_once", "columnar", "columnar"),
            "exactly_once_librdkafka": ("exactly_once", "librdkafka", "librdkafka"),
            "exactly_once_librdkafka_producer": ("exactly_once", "columnar", "librdkafka"),
            "at_least_once": ("at_least_once", "columnar", "librdkafka"),
            "discard": ("discard", "columnar", None), "discard_librdkafka": ("discard", "librdkafka", None)}
SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.int64()), ("ts", pa.int64())])  # ts: W1 carries it
AVRO_SCHEMA = {"type": "record", "name": "Event", "fields": [{"name": c, "type": "long"} for c in SCHEMA.names]}


def fill(bootstrap: str, topic: str, n: int) -> float:
    """Write n events to `topic` (keyed, so a key stays in one partition); returns seconds taken."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000,
                         "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_097_151})
    started = time.monotonic()
    for start in range(0, n, 100_000):
        i = np.arange(start, min(n, start + 100_000), dtype=np.int64)
        batch = pa.RecordBatch.from_arrays([pa.array(i % KEYS), pa.array(i), pa.array(i)], schema=SCHEMA)
        keys = pa.compute.cast(pa.compute.cast(batch.column("key"), pa.string()), pa.binary()).to_pylist()
        for value, key in zip(encode_json(batch), keys):
            try:
                producer.produce(topic, value, key)
            except BufferError:
                producer.poll(0.1)
                producer.produce(topic, value, key)
        producer.poll(0)
    assert producer.flush(120) == 0
    return time.monotonic() - started


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def profile(bootstrap: str, topic: str) -> dict:
    """CPU seconds per message of the connectors alone, in this process (no Spark): one source
    reader reading the whole topic, then one exactly-once sink writer writing it back with a
    transaction per 10 batches, and the JSON encoding alone. CPU time, so a busy machine
    changes these less than the wall-clock throughput."""
    from streamsnap.runtime.operators.base import OperatorContext

    def ctx(uid):
        return OperatorContext(name=uid, uid=uid, subtask_index=0, parallelism=1, max_parallelism=128, attempt=0,
                               job_id=f"bench-{uuid.uuid4().hex[:8]}", task_name=uid,
                               extra={"checkpointing": True})

    read: dict[str, list[float]] = {fetcher: [] for fetcher in FETCHERS}
    for fetcher in [*FETCHERS, *FETCHERS]:                   # alternated, twice each: the lower counts
        source = ss.sources.Kafka(bootstrap, [topic], stop_at="latest", schema=SCHEMA, batch_size=50_000,
                                  fetcher=fetcher)
        reader = source.create_reader(ctx("source"))
        reader.assign_splits(source.splits(1))
        reader.open()
        started, batches = _cpu(), []
        while not reader.is_finished():
            batch = reader.poll()
            if batch is not None:
                batches.append(batch)
        read[fetcher].append(_cpu() - started)
        reader.close()
    n = sum(b.num_rows for b in batches)
    written: dict[str, float] = {}
    for producer in PRODUCERS:
        out = f"bench-profile-{uuid.uuid4().hex[:8]}"
        local_kafka.create_topic(bootstrap, out, 2)
        writer = ss.sinks.Kafka(bootstrap, out, key="key", producer=producer).create_writer(ctx("sink"))
        writer.open()
        started = _cpu()
        for i, batch in enumerate(batches):
            writer.write(batch)
            if i % 10 == 9:
                writer.prepare_commit(i)
                writer.commit(i)
        writer.prepare_commit(len(batches))
        writer.commit(len(batches))
        written[producer] = _cpu() - started
    started = _cpu()
    for batch in batches:
        encode_json(batch)
    encoded = _cpu() - started
    codec = AvroCodec(AVRO_SCHEMA)
    started = _cpu()
    avro = [codec.encode(batch) for batch in batches]
    avro_encoded = _cpu() - started
    started = _cpu()
    for values in avro:
        codec.decode(values)
    avro_decoded = _cpu() - started
    return {"messages": n, **{f"source_{f}_us_per_message": min(t) / n * 1e6 for f, t in read.items()},
            **{f"sink_{p}_us_per_message": t / n * 1e6 for p, t in written.items()},
            "json_encode_us_per_message": encoded / n * 1e6, "avro_encode_us_per_message": avro_encoded / n * 1e6,
            "avro_decode_us_per_message": avro_decoded / n * 1e6}


def _raw_copy(bootstrap: str, source_topic: str, partition: int, out_topic: str, start, done) -> None:
    """One process of the client ceiling: partition `partition` copied to `out_topic` as it is."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from streamsnap.connectors.kafka.sink import _PRODUCER_DEFAULTS

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ceiling-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.wait.max.ms": 20, "fetch.queue.backoff.ms": 5})
    _, end = consumer.get_watermark_offsets(TopicPartition(source_topic, partition), timeout=30)
    consumer.assign([TopicPartition(source_topic, partition, 0)])
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"ceiling-{out_topic}-{partition}",
                         **_PRODUCER_DEFAULTS})
    producer.init_transactions(30)
    start.wait()
    producer.begin_transaction()
    interval_end, position = time.monotonic() + 1.0, 0
    while position < end:
        for m in consumer.consume(50_000, 0.1):
            try:
                producer.produce(out_topic, m.value(), m.key())
            except BufferError:
                producer.poll(0.05)
                producer.produce(out_topic, m.value(), m.key())
            position = m.offset() + 1
        producer.poll(0)
        if time.monotonic() >= interval_end:       # a transaction per second, as the job's checkpoints
            producer.commit_transaction(60)
            producer.begin_transaction()
            interval_end = time.monotonic() + 1.0
    producer.commit_transaction(60)
    consumer.close()
    done.put(partition)


def client_ceiling(bootstrap: str, source_topic: str, n: int) -> dict:
    """The same copy with nothing but confluent-kafka: one process per input partition (2, as the
    job's parallelism) consuming it (the source's consumer settings) and producing every message's
    value and key unchanged to a 2-partition output topic in one transaction per second (the
    sink's producer settings). No JSON decoding or encoding, no shuffle, no W1, no Spark: what
    librdkafka and the broker alone do on this machine. Events/s from the start signal until both
    processes committed their last transaction; the output's committed count is checked."""
    import multiprocessing

    out_topic = f"bench-ceiling-{uuid.uuid4().hex[:8]}"
    local_kafka.create_topic(bootstrap, out_topic, 2)
    context = multiprocessing.get_context("spawn")
    start, done = context.Event(), context.Queue()
    processes = [context.Process(target=_raw_copy, args=(bootstrap, source_topic, p, out_topic, start, done))
                 for p in range(2)]
    for process in processes:
        process.start()
    time.sleep(2.0)                                  # both initialized (imports, init_transactions)
    started = time.monotonic()
    start.set()
    for _ in processes:
        done.get(timeout=600)
    seconds = time.monotonic() - started
    for process in processes:
        process.join(60)
    checked = len(local_kafka.read_committed(bootstrap, out_topic, 2))
    assert checked == n, f"client ceiling: {checked} committed rows in {out_topic}, expected {n}"
    return {"sink": "client_ceiling", "events_per_second": n / seconds, "seconds": seconds, "checkpoints": 0,
            "committed_rows": checked}


def run_once(spark, bootstrap: str, source_topic: str, sink: str, n: int, fetcher: str = "columnar",
             producer: str | None = None) -> dict:
    out_topic = None
    if sink == "discard":
        target = ss.sinks.Discard()
    else:
        out_topic = f"bench-out-{uuid.uuid4().hex[:8]}"
        local_kafka.create_topic(bootstrap, out_topic, 2)
        target = ss.sinks.Kafka(bootstrap, out_topic, key="key", semantic=sink, producer=producer)
    config = ss.CheckpointConfig(interval=1.0, directory=_checkpoint_dir("kafka-"),
                                 mode="at_least_once" if sink == "at_least_once" else "exactly_once")
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config)
    (env.from_source(ss.sources.Kafka(bootstrap, [source_topic], stop_at="latest", schema=SCHEMA,
                                      batch_size=50_000, fetcher=fetcher), name="kafka", uid="kafka")
        .key_by("key").process_batches(BatchRunningSum(), name="w1", uid="w1")
        .sink_to(target, name="out", uid="out"))
    client = env.execute_async(f"kafka bench {sink}")
    while client.status() != "RUNNING":
        time.sleep(0.005)
    running = time.monotonic()
    result = client.wait(1800)
    seconds = time.monotonic() - running
    checked = None
    if out_topic is not None:
        checked = len(local_kafka.read_committed(bootstrap, out_topic, 2))
        assert checked == n, f"{sink}: {checked} committed rows in {out_topic}, expected {n}"
    return {"sink": sink, "fetcher": fetcher, "producer": producer, "events_per_second": n / seconds, "seconds": seconds,
            "checkpoints": result.checkpoints.counts.completed if result.checkpoints else 0, "committed_rows": checked}


def main(n: int = 2_000_000, runs: int = 2) -> dict:
    from streamsnap.cluster.spark_session import embedded_session

    directory = tempfile.mkdtemp(prefix="ssbench-broker-")
    bootstrap = local_kafka.start_broker(directory)
    spark = embedded_session(16)
    try:
        topic = f"bench-in-{uuid.uuid4().hex[:8]}"
        local_kafka.create_topic(bootstrap, topic, 2)
        print(f"filling {topic} with {n} events: {fill(bootstrap, topic, n):.1f} s", flush=True)
        costs = profile(bootstrap, topic)
        print("connector CPU per message (one process, no Spark): " + ", ".join(
            f"{k.removesuffix('_us_per_message')} {v:.2f} us" for k, v in costs.items() if k != "messages"),
            flush=True)
        run_once(spark, bootstrap, topic, "discard", n)          # warm workers and imports
        measured: dict[str, list[dict]] = {name: [] for name in [*VARIANTS, "client_ceiling"]}
        for _ in range(runs):
            for sink in measured:
                m = (client_ceiling(bootstrap, topic, n) if sink == "client_ceiling"
                     else run_once(spark, bootstrap, topic, *VARIANTS[sink][:1], n, *VARIANTS[sink][1:]))
                measured[sink].append(m)
                print(f"  {sink:14s} {m['events_per_second'] / 1e6:.2f} M events/s ({m['seconds']:.1f} s, "
                      f"{m['checkpoints']} checkpoints)", flush=True)
        summary = {sink: statistics.median(m["events_per_second"] for m in ms) for sink, ms in measured.items()}
        print("median events/s: " + ", ".join(f"{s} {v / 1e6:.2f} M" for s, v in summary.items()))
        print(f"exactly-once / client ceiling: {summary['exactly_once'] / summary['client_ceiling']:.2f}; "
              f"columnar / librdkafka fetcher: exactly-once "
              f"{summary['exactly_once'] / summary['exactly_once_librdkafka']:.2f}, discard "
              f"{summary['discard'] / summary['discard_librdkafka']:.2f}; exactly-once, both columnar / columnar "
              f"source + librdkafka producer: "
              f"{summary['exactly_once'] / summary['exactly_once_librdkafka_producer']:.2f}")
        return {"summary": summary, "runs": measured, "connector_cpu": costs}
    finally:
        spark.stop()
        local_kafka.stop_broker(directory)
        cleanup()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
