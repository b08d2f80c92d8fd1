"""benchmarks/kafka.py on a small topic: the job's output is complete and the figures are there."""

from __future__ import annotations

import uuid

import pytest

from benchmarks import kafka as bench
from benchmarks import local_kafka


@pytest.mark.spark
def test_a_small_kafka_benchmark_run_commits_every_row_and_reports_rates(spark, kafka_broker):
    topic = f"bench-test-{uuid.uuid4().hex[:8]}"
    local_kafka.create_topic(kafka_broker, topic, 2)
    bench.fill(kafka_broker, topic, 5000)
    costs = bench.profile(kafka_broker, topic)
    assert costs["messages"] == 5000 and all(v > 0 for v in costs.values())
    run = bench.run_once(spark, kafka_broker, topic, "exactly_once", 5000)   # asserts 5000 committed rows
    assert run["committed_rows"] == 5000 and run["events_per_second"] > 0


@pytest.mark.spark
def test_the_latency_benchmark_measures_every_row_of_the_join_end_to_end(spark, kafka_broker):
    """benchmarks/kafka_latency.py, small: the stream-static join exactly-once at 100 ms
    checkpoints, 500 events/s for 4 s — every produced row comes back enriched and committed,
    each with a latency."""
    from benchmarks import kafka_latency

    m = kafka_latency.run_once(spark, kafka_broker, "join", "eo100", rate=500, seconds=4.0, buffer_timeout=None)
    assert m["rows"] == m["expected"] == 2000, m
    assert 0 < m["p50_ms"] <= m["p99_ms"] <= m["p999_ms"] <= m["max_ms"], m
