"""The plugin's `run_to_completion` on the suite's Spark session: a README function gives the
same result in a job as in the harness, and a job that cannot end is cancelled, saying why."""

from __future__ import annotations

import pytest

import streamsnap as ss
from streamsnap.testing import harness
from streamsnap.testing.pytest_plugin import run_to_completion, streamsnap_spark  # noqa: F401 (fixtures)
from tests.testing.test_harness import BucketSums

pytestmark = pytest.mark.spark


def event(i: int) -> dict:
    return {"key": i % 5, "value": i, "ts": (i * 7_919) % 60_000}


def test_a_job_gives_what_the_harness_gives(spark, streamsnap_spark, run_to_completion):
    assert streamsnap_spark is spark          # the session already active is the one shared
    strategy = ss.WatermarkStrategy.for_bounded_out_of_orderness(120).with_timestamp_assigner("ts")
    env = ss.StreamEnvironment(parallelism=2)
    (env.from_source(ss.sources.Generator(event, count=400), name="events", watermark_strategy=strategy)
        .key_by("key").process(BucketSums()).sink_to(ss.sinks.Collect()))
    rows = run_to_completion(env, "bucket sums").rows()

    h = harness(BucketSums(), key_by="key", timestamps="ts")
    h.process_batch([event(i) for i in range(400)])
    h.end_input()
    key = lambda r: (r["key"], r["bucket"])     # noqa: E731
    assert sorted(rows, key=key) == sorted(h.output, key=key) and len(rows) == 30


def test_a_job_that_does_not_end_is_cancelled_and_named(spark, run_to_completion):
    env = ss.StreamEnvironment(parallelism=1)
    env.from_source(ss.sources.Generator(lambda i: {"i": i}, rate=100), name="endless").sink_to(ss.sinks.Collect())
    with pytest.raises(TimeoutError, match=r"job 'endless job' was still \w+ after 3 s and was cancelled.*count="):
        run_to_completion(env, "endless job", timeout=3)


def test_run_to_completion_takes_an_environment():
    from streamsnap.testing import run_to_completion as run

    with pytest.raises(ss.ConfigurationError, match="takes the ss.StreamEnvironment"):
        run(object())
