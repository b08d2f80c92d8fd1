"""The engine on real Spark: barrier tasks in Python worker processes, data over sockets."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter, defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import streamsnap as ss
from tests.integration.support import RunningSum, final_by_key, wait_status

pytestmark = pytest.mark.spark

WORDS = ["apple", "banana", "cherry", "date", "elder", "fig", "grape"]


def sentence(i: int) -> dict:
    return {"id": i, "text": " ".join(WORDS[(i * k + k) % len(WORDS)] for k in range(1, 4 + i % 3))}


def split_words(row):
    for word in row["text"].split():
        yield {"word": word}


class Count(ss.KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ss.ValueStateDescriptor("count", default=0))

    def process_element(self, row, ctx):
        n = self.count.value() + 1
        self.count.update(n)
        yield {"word": ctx.current_key, "count": n}


def event(i: int) -> dict:
    return {"key": i % 13, "value": i + 1}


def test_a_fused_per_row_chain_counts_per_operator_and_names_the_operator_that_raised(spark):
    """flat_map -> map -> filter chained into the source's task run fused (runtime/operators/row_chain.py):
    the result, each operator's records in and out, and a failure in the middle of the run."""
    n = 1500

    def run(lower):
        env = ss.StreamEnvironment(parallelism=2, spark=spark)
        (env.from_source(ss.sources.Generator(sentence, count=n), name="sentences")
            .flat_map(split_words, name="split").map(lower, name="lower")
            .filter(lambda r: r["word"][0] not in "fF", name="no-f")
            .key_by("word").process(Count(), name="count").sink_to(ss.sinks.Collect(), name="counts"))
        return env.execute("fused chain")

    result = run(lambda r: {"word": r["word"].upper()})
    words = [w.upper() for i in range(n) for w in sentence(i)["text"].split()]
    kept = [w for w in words if w[0] not in "fF"]
    assert final_by_key(result.rows(), "word", "count") == dict(Counter(kept))
    by_name = {m.name: m for m in result.operators.values()}
    assert (by_name["split"].records_in, by_name["split"].records_out) == (n, len(words))
    assert (by_name["lower"].records_in, by_name["lower"].records_out) == (len(words), len(words))
    assert (by_name["no-f"].records_in, by_name["no-f"].records_out) == (len(words), len(kept))

    def cursed(row):
        if row["word"] == "fig":
            raise ValueError("no figs")
        return row

    with pytest.raises(ss.JobExecutionError) as info:
        run(cursed)
    assert "operator 'lower'" in str(info.value) and "{'word': 'fig'}" in str(info.value)
    assert "ValueError: no figs" in str(info.value)


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_word_count_equals_a_plain_python_reference(spark, parallelism):
    n = 3000
    env = ss.StreamEnvironment(parallelism=parallelism, spark=spark)
    (env.from_source(ss.sources.Generator(sentence, count=n), name="sentences")
        .flat_map(split_words, name="split").key_by("word").process(Count(), name="count")
        .sink_to(ss.sinks.Collect(), name="counts"))
    result = env.execute(f"word count p{parallelism}")
    expected = Counter(w for i in range(n) for w in sentence(i)["text"].split())
    assert final_by_key(result.rows(), "word", "count") == dict(expected)
    assert len(result.rows()) == sum(expected.values())  # one update per word occurrence
    assert result.operators[next(u for u, m in result.operators.items() if m.name == "count")].records_in == sum(expected.values())


@pytest.mark.parametrize("parallelism, state_backend", [(1, "hashmap"), (2, "hashmap"), (3, "hashmap"), (2, "rocksdb")])
def test_keyed_running_sum_equals_a_plain_python_reference(spark, parallelism, state_backend):
    n = 5000
    env = ss.StreamEnvironment(parallelism=parallelism, spark=spark, state_backend=state_backend)
    (env.from_source(ss.sources.Generator(event, count=n), name="events")
        .key_by("key").process(RunningSum(), name="sum").sink_to(ss.sinks.Collect(), name="out"))
    rows = env.execute(f"running sum p{parallelism}").rows()
    assert len(rows) == n
    values = defaultdict(list)
    for i in range(n):
        values[event(i)["key"]].append(event(i)["value"])
    sums = defaultdict(list)
    for r in rows:
        sums[r["key"]].append(r["total"])
    assert set(sums) == set(values)
    for key, totals in sums.items():
        totals.sort()
        increments = [totals[0]] + [b - a for a, b in zip(totals, totals[1:])]
        # Running sums of distinct positive values: their increments are exactly the key's values.
        assert sorted(increments) == sorted(values[key])
    if parallelism == 1:  # one source subtask: per-key order is the generation order
        for key, totals in sums.items():
            expected, acc = [], 0
            for v in values[key]:
                acc += v
                expected.append(acc)
            assert totals == expected


def test_map_batches_and_per_row_paths_agree(spark):
    n = 4000

    def per_row(r):
        return {"key": r["key"], "value": r["value"] * 2 + 1}

    def vectorized(batch: pa.RecordBatch) -> pa.RecordBatch:
        doubled = pc.add(pc.multiply(batch.column("value"), 2), 1)
        return pa.RecordBatch.from_arrays([batch.column("key"), doubled], names=["key", "value"])

    results = []
    for fn, kind in ((per_row, "map"), (vectorized, "map_batches")):
        env = ss.StreamEnvironment(parallelism=2, spark=spark)
        stream = env.from_source(ss.sources.Generator(event, count=n), name="events")
        stream = stream.map(fn) if kind == "map" else stream.map_batches(fn)
        stream.key_by("key").process(RunningSum(), name="sum").sink_to(ss.sinks.Collect())
        results.append(final_by_key(env.execute(kind).rows(), "key", "total"))
    assert results[0] == results[1]
    assert sum(results[0].values()) == sum(2 * (i + 1) + 1 for i in range(n))


def test_vectorized_generator_feeds_the_same_pipeline(spark):
    n = 6000

    def batch_of(indices):
        return {"key": indices % 13, "value": indices + 1}

    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    (env.from_source(ss.sources.Generator(batch_of, count=n, vectorized=True), name="events")
        .key_by("key").process(RunningSum()).sink_to(ss.sinks.Collect()))
    final = final_by_key(env.execute("vectorized source").rows(), "key", "total")
    expected = defaultdict(int)
    for i in range(n):
        expected[i % 13] += i + 1
    assert final == dict(expected)


def test_union_and_a_second_keyed_shuffle(spark):
    n = 2000
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    a = env.from_source(ss.sources.Generator(event, count=n), name="a")
    b = env.from_source(ss.sources.Generator(lambda i: {"key": i % 7, "value": 1}, count=n), name="b")
    sums = a.union(b).key_by("key").process(RunningSum(), name="sum1")
    # second shuffle: re-key the running totals by parity and count updates per parity
    (sums.map(lambda r: {"parity": r["key"] % 2, "one": 1}, name="parity")
        .key_by("parity").process(Count(), name="count2").sink_to(ss.sinks.Collect()))
    rows = env.execute("union and two shuffles").rows()
    final = final_by_key(rows, "word", "count")  # Count emits "word" = the current key
    expected = Counter()
    for i in range(n):
        expected[event(i)["key"] % 2] += 1
        expected[(i % 7) % 2] += 1
    assert final == dict(expected)


def test_a_raising_user_function_fails_the_job_with_its_message(spark, no_leaked_threads):
    def cursed(row):
        if row["value"] == 778:
            raise ValueError("value 778 is cursed")
        return row

    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    (env.from_source(ss.sources.Generator(event, count=3000), name="events")
        .map(cursed, name="cursed-map").sink_to(ss.sinks.Collect()))
    with pytest.raises(ss.JobExecutionError) as info:
        env.execute("cursed")
    text = str(info.value)
    assert "operator 'cursed-map'" in text
    assert "'value': 778" in text
    assert "ValueError: value 778 is cursed" in text
    assert "(2/2)" in text or "(1/2)" in text  # the subtask
    assert "py4j" not in text and "org.apache.spark" not in text  # no Spark stack trace noise
    assert info.value.reason == "USER_FUNCTION"


def test_a_killed_task_fails_the_job_with_a_clear_error(spark, no_leaked_threads):
    import os
    import signal

    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    (env.from_source(ss.sources.Generator(event, rate=2000), name="endless")
        .key_by("key").process(RunningSum(), name="sum").sink_to(ss.sinks.Collect()))
    client = env.execute_async("to be killed")
    wait_status(client, "RUNNING")
    victim = [s for s in client.subtasks() if s.vertex.startswith("sum")][0]
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(ss.JobExecutionError) as info:
        client.wait(60)
    assert f"pid {victim.pid}" in str(info.value) and "killed" in str(info.value)
    assert client.status() == "FAILED"


def test_unauthenticated_and_garbage_connections_are_refused_and_the_job_goes_on(spark, caplog):
    n = 20000
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    (env.from_source(ss.sources.Generator(event, count=n, rate=20000), name="events")
        .key_by("key").process(RunningSum(), name="sum").sink_to(ss.sinks.Collect()))
    caplog.set_level(logging.WARNING, logger="streamsnap.network.acceptor")
    client = env.execute_async("under attack")
    wait_status(client, "RUNNING")
    targets = [client._master.control_address] + [s.data_address for s in client.subtasks() if s.data_address]
    assert len(targets) == 3
    attackers = []
    for address in targets:
        garbage = socket.create_connection(address)
        garbage.sendall(b"\x00\x00\x00\x05\x05hello, not a streamsnap peer" * 10)
        attackers.append(garbage)
        wrong = socket.create_connection(address)
        wrong.recv(40)
        wrong.sendall(b"x" * 64)  # a well-formed but wrong handshake reply
        attackers.append(wrong)
    result = client.wait(120)
    for s in attackers:
        s.close()
    assert final_by_key(result.rows(), "key", "total") == {
        k: sum(i + 1 for i in range(n) if i % 13 == k) for k in range(13)}
    assert result.network["refused_connections"] == 6
    assert any("control endpoint refused a connection" in r.getMessage() for r in caplog.records)


def test_a_slow_consumer_holds_the_producers_memory_bounded(spark):
    """Credit-based flow control: a slow sink stops the source instead of buffering."""
    n = 60000
    network = ss.NetworkConfig(batch_size=512, credits=2, output_queue_frames=2, buffer_timeout=0.05)

    def slow(row):
        if row["value"] % 200 == 0:
            time.sleep(0.002)
        return row

    env = ss.StreamEnvironment(parallelism=1, spark=spark, network=network)
    (env.from_source(ss.sources.Generator(lambda i: {"value": i, "pad": "x" * 40}, count=n), name="fast")
        .rebalance().map(slow, name="slow", parallelism=1).sink_to(ss.sinks.Collect()))
    result = env.execute("backpressure")
    net = result.network
    frame = net["max_frame_bytes"]
    assert len(result.rows()) == n
    assert frame > 0 and net["bytes_sent"] > 40 * frame  # far more data than the bound
    # Sender queue: at most `output_queue_frames` plus what one processing step may emit.
    assert net["peak_output_queued_bytes"] <= (network.output_queue_frames + 1) * frame
    # Receiver: never more than its credits.
    assert net["peak_input_buffered_bytes"] <= network.credits * frame


def test_nothing_is_left_running_after_execute(spark, no_leaked_threads):
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    env.from_collection([{"a": 1}, {"a": 2}]).map(lambda r: {"a": r["a"] + 1}).sink_to(ss.sinks.Collect())
    result = env.execute("tidy")
    assert sorted(r["a"] for r in result.rows()) == [2, 3]
    assert not [t for t in threading.enumerate() if t.name.startswith("jobmaster-")]


class VectorizedRunningSum(ss.KeyedBatchFunction):
    def open(self, ctx):
        self.total = ctx.get_state(ss.ValueStateDescriptor("total", default=0))

    def process_batch(self, batch, keys):
        start = self.total.get_many(keys)
        running, totals = ss.group_cumsum(batch.column("value").to_numpy(), keys.index,
                                          np.array(start, dtype=np.int64))
        self.total.put_many(keys, totals)
        return {"key": batch.column("key"), "total": running}


@pytest.mark.parametrize("parallelism", [1, 3])
def test_vectorized_keyed_state_equals_the_per_row_path(spark, parallelism):
    n = 6000
    results = {}
    for kind in ("process", "process_batches"):
        env = ss.StreamEnvironment(parallelism=parallelism, spark=spark)
        keyed = env.from_source(ss.sources.Generator(event, count=n), name="events").key_by("key")
        out = keyed.process(RunningSum()) if kind == "process" else keyed.process_batches(VectorizedRunningSum())
        out.sink_to(ss.sinks.Collect())
        rows = env.execute(kind).rows()
        assert len(rows) == n
        sums = defaultdict(list)
        for r in rows:
            sums[r["key"]].append(r["total"])
        for key, totals in sums.items():  # every row's value added exactly once, in some order
            totals.sort()
            increments = [totals[0]] + [b - a for a, b in zip(totals, totals[1:])]
            assert sorted(increments) == sorted(event(i)["value"] for i in range(n) if event(i)["key"] == key)
        results[kind] = {key: max(totals) for key, totals in sums.items()}
    assert results["process"] == results["process_batches"]
