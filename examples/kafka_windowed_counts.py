"""Kafka → one-minute page-view counts → Kafka, exactly-once.

Page views are JSON messages on a Kafka topic, keyed by page. The job reads them with
`ss.sources.Kafka` (each partition a split with its own watermark generator), counts views per
page in one-minute tumbling event-time windows with `aggregate_columns` (vectorized: Arrow and
numpy, no Python per row), and writes one message per page and minute to a second topic with
`ss.sinks.Kafka(..., semantic="exactly_once")`: each checkpoint interval's output is one Kafka
transaction per subtask, committed when the checkpoint completes, so a `read_committed` consumer
sees every count exactly once — also if the job fails and restores in between.

To have an end, the source reads each partition up to the offset it had when the job started
(`stop_at="latest"`); drop that argument to run continuously. The script creates both topics,
writes the input, runs the job and reads the committed output back.

Run it against a broker (any Kafka-protocol broker; the topics are created with a fresh suffix):

    pip install 'streamsnap[kafka]'
    python examples/kafka_windowed_counts.py localhost:9092
"""

from __future__ import annotations

import json
import sys
import tempfile
import uuid
from collections import Counter

import streamsnap as ss

PAGES = ["/home", "/search", "/product", "/cart", "/checkout"]
START = 1_795_000_020_000      # epoch milliseconds, on a minute boundary
WINDOW = 60                    # seconds


def page_view(i: int) -> dict:
    """View i, 250 ms after view i-1: 240 views a minute, spread unevenly over the pages."""
    return {"page": PAGES[(i * i + i // 7) % len(PAGES)], "user": f"u{i % 37}", "ts": START + i * 250}


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names])
    for future in futures.values():
        future.result(30)


def produce(bootstrap: str, topic: str, rows: list[dict]) -> None:
    """Writes the rows as JSON keyed by page: one page's views share a partition, in time order."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for row in rows:
        producer.produce(topic, json.dumps(row).encode(), row["page"].encode())
    assert producer.flush(30) == 0, "not every page view was delivered"


def read_committed(bootstrap: str, topic: str, partitions: int, timeout: float = 60.0) -> list[dict]:
    """Every committed message of the topic, read as an exactly-once consumer must read it."""
    import time

    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{uuid.uuid4().hex[:8]}",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    rows, at_end, deadline = [], set(), time.monotonic() + timeout
    while len(at_end) < partitions and time.monotonic() < deadline:
        for message in consumer.consume(1_000, 0.5):
            if message.error() is None:
                rows.append(json.loads(message.value()))
            elif message.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition())
    consumer.close()
    if len(at_end) < partitions:
        raise TimeoutError(f"did not reach the end of {topic} in {timeout} s")
    return rows


def main(bootstrap: str, spark=None, views: int = 2_400, partitions: int = 2, suffix: str | None = None) -> dict:
    """Writes `views` page views (250 ms apart) to a fresh topic, runs the job, and returns the
    committed counts {(page, window start): views} read back from the output topic."""
    suffix = suffix or uuid.uuid4().hex[:8]
    source_topic, sink_topic = f"page-views-{suffix}", f"page-view-counts-{suffix}"
    create_topics(bootstrap, [source_topic, sink_topic], partitions)
    rows = [page_view(i) for i in range(views)]
    produce(bootstrap, source_topic, rows)

    env = ss.StreamEnvironment(
        parallelism=2, spark=spark,
        checkpointing=ss.CheckpointConfig(interval=0.5, directory=tempfile.mkdtemp(prefix="kafka-counts-")))
    # Views are in time order per partition; a partition without data stops holding the
    # watermark back after 2 s of idleness.
    strategy = (ss.WatermarkStrategy.for_bounded_out_of_orderness(1)
                .with_timestamp_assigner("ts").with_idleness(2))
    views_stream = env.from_source(
        ss.sources.Kafka(bootstrap, topics=[source_topic], group_id=f"page-counts-{suffix}",
                         starting_offsets="earliest", stop_at="latest", format="json"),
        name="page views", uid="page-views", watermark_strategy=strategy)
    (views_stream.key_by("page")
        .window(ss.windows.TumblingEventTimeWindows.of(WINDOW))
        .aggregate_columns({"views": "count"}, name="views per minute", uid="views-per-minute")
        .sink_to(ss.sinks.Kafka(bootstrap, sink_topic, key="page", semantic="exactly_once"),
                 name="counts", uid="counts"))
    result = env.execute(f"page view counts {suffix}")

    messages = read_committed(bootstrap, sink_topic, partitions)
    counts = {(r["page"], r["window_start"]): r["views"] for r in messages}
    expected = Counter((r["page"], r["ts"] // 60_000 * 60_000) for r in rows)   # windows align to the epoch
    print(f"{result.summary()}\n")
    print(f"{len(counts)} committed counts in {sink_topic}, per minute:")
    for minute in sorted({start for _, start in counts}):
        line = "  ".join(f"{page} {counts.get((page, minute), 0):>3}" for page in PAGES)
        print(f"  +{(minute - START) // 60_000:>2} min  {line}")
    assert len(messages) == len(counts), "a count was committed twice"
    assert counts == dict(expected), "the committed counts differ from a plain Python count"
    return {"counts": counts, "messages": len(messages), "topics": (source_topic, sink_topic)}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/kafka_windowed_counts.py BOOTSTRAP_SERVERS")
    main(sys.argv[1])
