"""Rows that do not fit their stream, on Spark: named errors at once, never a silent drop."""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from decimal import Decimal

import pyarrow.parquet as pq
import pytest

import streamsnap as ss
from tests.integration.support import HeldGenerator, RunningSum, final_by_key, wait_held

pytestmark = pytest.mark.spark

N = 3000
DRIFT_AT = 1500
# "Fails at once" is asserted as no restart (fails_at_once), not as seconds: 0.9-1.7 s from
# RUNNING to FAILED on an idle machine, up to 31 s with the machine's 2 cores under load 27.


def drifting(row):
    """Adds a field from row DRIFT_AT on: the case of issue 10 (a map that grows mid-stream)."""
    out = {"key": row["key"], "value": row["value"]}
    if row["value"] >= DRIFT_AT:
        out["extra"] = "x"
    return out


def event(i):
    return {"key": i % 7, "value": i}


def failing_job(spark, build, name, parallelism=2, **settings):
    """Runs a job that must fail with a data error; returns (error, seconds it took)."""
    env = ss.StreamEnvironment(parallelism=parallelism, spark=spark, restart=ss.RestartStrategy.fixed_delay(3, 1.0),
                               **settings)
    build(env)
    started = time.monotonic()
    with pytest.raises(ss.JobExecutionError) as info:
        env.execute(name)
    return info.value, time.monotonic() - started


class _StatusTimes(logging.Handler):
    """When the JobMaster logged each status change of a job ("job 'x' A -> B") and its first
    failure ("job 'x' attempt 0 failed (REASON in TASK); ...")."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.times: dict[str, float] = {}

    def emit(self, record):
        message = record.getMessage().split("\n", 1)[0]
        if " attempt 0 failed" in message:
            self.times.setdefault("first failure", record.created)
        elif " -> " in message:
            self.times.setdefault(message.rsplit(" -> ", 1)[1], record.created)


def fails_at_once(spark, build, name):
    """Runs a job that must fail with a data error: (error, seconds from RUNNING — or from the
    first failure, when that came first — to FAILED, seconds of the whole execute(), which adds
    the checks of a user's session before the run).

    Asserts the job failed at its first failure: FAILED with no RESTARTING in between, where
    `failing_job`'s fixed-delay strategy would restart it three times (no timed assertion: the
    seconds are returned for the caller to print)."""
    jobmaster = logging.getLogger("streamsnap.cluster.jobmaster")
    handler, level = _StatusTimes(), jobmaster.level
    jobmaster.addHandler(handler)
    jobmaster.setLevel(logging.INFO)
    try:
        error, total = failing_job(spark, build, name)
    finally:
        jobmaster.removeHandler(handler)
        jobmaster.setLevel(level)
    assert "first failure" in handler.times and "FAILED" in handler.times, handler.times
    assert "RESTARTING" not in handler.times, handler.times
    # A subtask may fail on its first row before every other one is deployed: the job then
    # goes from CREATED to FAILING without ever RUNNING; the seconds count from that failure.
    started = handler.times.get("RUNNING", handler.times["first failure"])
    return error, handler.times["FAILED"] - started, total


@pytest.mark.parametrize("sink", ["collect", "parquet"])
def test_a_field_added_mid_stream_fails_every_sink_alike_naming_field_row_and_fix(spark, tmp_path, sink):
    def build(env):
        target = ss.sinks.Collect() if sink == "collect" else ss.sinks.FileSink(str(tmp_path / "out"))
        # Batches of 500: the first batch of each subtask (which the schema is inferred from) ends before the drift.
        (env.from_source(ss.sources.Generator(event, count=N, batch_size=500), name="events")
            .map(drifting, name="enrich").sink_to(target, name="out"))

    error, seconds = failing_job(spark, build, f"drift into {sink}")
    text = str(error)
    assert error.reason == "DATA_ERROR"
    assert "operator 'out' (subtask Source: events -> enrich -> out (" in text   # the sink and its subtask
    assert "field 'extra', which the stream's schema lacks" in text
    assert "'extra': 'x'" in text and "'value': 150" in text  # the row (1500 or 1501)
    assert "on 'enrich'" in text and 'schema="widen"' in text and "schema=pa.schema" in text  # the fix
    assert "without a restart (0 earlier restart(s))" in text  # the restart budget is not burnt
    print(f"drift into {sink}: failed after {seconds:.1f} s")
    if sink == "parquet":  # nothing committed without the field
        assert not [p for p in (tmp_path / "out").iterdir() if not p.name.startswith(".")]


def test_a_type_change_mid_stream_names_the_operator_field_and_row(spark):
    def build(env):
        (env.from_source(ss.sources.Generator(event, count=N, batch_size=500), name="events")
            .map(lambda r: {"key": r["key"], "code": r["value"] if r["value"] < 2000 else f"c{r['value']}"},
                 name="parse")
            .rebalance().map(lambda r: r, name="relay").sink_to(ss.sinks.Collect()))

    # Small network batches: the schema is inferred from a first batch before the change.
    error, seconds = failing_job(spark, build, "int then str", network=ss.NetworkConfig(batch_size=200))
    text = str(error)
    assert "operator 'parse'" in text and "Source: events -> parse" in text
    assert "of field 'code' does not fit its type int64" in text and "'c20" in text
    assert "str(value)" not in text and "int(value)" in text   # cast to the field's type
    assert "ArrowInvalid" not in text and "Traceback" not in text
    assert error.reason == "DATA_ERROR" and "without a restart (0 earlier restart(s))" in text, text


# At parallelism 1 the hash edge has one channel and the sender does not hash (the keyed
# `process` receiver refuses the null key itself); at 2 the sender's partitioner does.
@pytest.mark.parametrize("parallelism", [1, 2])
def test_a_null_key_names_the_keyed_operator_field_and_row_and_can_be_allowed(spark, parallelism):
    def with_null(i):
        return {"key": None if i % 500 == 7 else i % 5, "value": 1}

    def build(env):
        (env.from_source(ss.sources.Generator(with_null, count=N), name="events")
            .key_by("key").process(RunningSum(), name="sum").sink_to(ss.sinks.Collect()))

    error, seconds = failing_job(spark, build, "null key", parallelism)
    text = str(error)
    assert "key_by('key') in front of operator 'sum'" in text and "field 'key' is None" in text
    assert "'key': None, 'value': 1" in text and "allow_null_keys=True" in text
    assert error.reason == "DATA_ERROR" and "without a restart (0 earlier restart(s))" in text, text

    env = ss.StreamEnvironment(parallelism=parallelism, spark=spark)
    (env.from_source(ss.sources.Generator(with_null, count=N), name="events")
        .key_by("key", allow_null_keys=True).process(RunningSum(), name="sum").sink_to(ss.sinks.Collect()))
    totals = final_by_key(env.execute("null keys allowed").rows(), "key", "total")
    nulls = sum(1 for i in range(N) if i % 500 == 7)
    assert totals[None] == nulls and sum(totals.values()) == N


def test_widening_keeps_every_field_in_collect_and_file_sink_alike(spark, tmp_path):
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    grown = (env.from_source(ss.sources.Generator(event, count=N), name="events")
             .map(drifting, name="enrich", schema="widen"))
    grown.sink_to(ss.sinks.Collect(), name="rows")
    grown.sink_to(ss.sinks.FileSink(str(tmp_path / "out")), name="files")
    result = env.execute("widening")
    collected = sorted(result.rows("rows"), key=lambda r: r["value"])
    written = sorted((r for p in sorted((tmp_path / "out").glob("part-*")) for r in pq.read_table(p).to_pylist()),
                     key=lambda r: r["value"])
    assert len(collected) == len(written) == N
    for rows in (collected, written):
        assert all(r["extra"] == "x" for r in rows if r["value"] >= DRIFT_AT)   # nothing dropped
        assert all(r.get("extra") is None for r in rows if r["value"] < DRIFT_AT)


def test_savepoint_target_checked_at_call_time_and_a_resumed_job_continues_its_file_output(spark, tmp_path):
    import pyarrow.dataset as ds

    n = 4000
    out, blocker, gate = tmp_path / "out", tmp_path / "a-file", tmp_path / "gate"
    blocker.write_text("not a directory")
    config = ss.CheckpointConfig(interval=None, directory=str(tmp_path / "ckpt"))

    def build(env, first_run):
        # The first run's splits hold half-way: rows are on their way and the input has not ended
        # when the savepoint stops it.
        source = (HeldGenerator(event, count=n, rate=2000, gate=gate, hold_at=n // 4) if first_run else
                  ss.sources.Generator(event, count=n))
        (env.from_source(source, name="events", uid="events")
            .key_by("key").process(RunningSum(), name="sum", uid="sum")
            .sink_to(ss.sinks.FileSink(str(out)), name="files", uid="files"))

    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config)
    build(env, first_run=True)
    client = env.execute_async("first run")
    with pytest.raises(ss.PreflightError, match=f"the savepoint directory '{blocker}/sp' is not usable"):
        client.trigger_savepoint(str(blocker / "sp"))
    # Refused at the call, not as a failed savepoint: the job never saw one.
    assert client.checkpoint_stats().counts.triggered == 0 and client.status() in ("CREATED", "RUNNING")
    wait_held(gate, 2, client)
    savepoint = client.stop_with_savepoint(str(tmp_path / "sp"))

    again = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config)
    build(again, first_run=False)
    with pytest.raises(ss.ConfigurationError, match="already holds"):   # a fresh run into that output
        again.execute("second run, not resumed")
    result = again.execute("resumed", restore_from=savepoint)   # the same job resumed: not refused
    assert result.restored_checkpoint is not None and "record counts below: attempt 1 only" in result.summary()
    rows = ds.dataset(str(out), format="parquet").to_table().to_pylist()
    assert final_by_key(rows, "key", "total") == {k: sum(i for i in range(n) if i % 7 == k) for k in range(7)}
    assert len(rows) == n   # each row once across the two runs


def timed(i):
    """Event `i`, its timestamp None at i = 1_001 (split 1 of 2, offset 500 at parallelism 2)."""
    return {"key": i % 7, "value": i, "ts": None if i == 1_001 else i * 10}


@pytest.mark.parametrize("where", ["source", "downstream"])
def test_a_missing_event_timestamp_fails_at_once_naming_the_row_and_its_source_position(spark, where):
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")

    def build(env):
        source = ss.sources.Generator(timed, count=N, batch_size=200)
        if where == "source":
            stream = env.from_source(source, name="events", watermark_strategy=strategy)
        else:   # assigned after a rebalance: the row no longer knows where it came from
            stream = (env.from_source(source, name="events").rebalance()
                      .assign_timestamps_and_watermarks(strategy))
        stream.key_by("key").process(RunningSum(), name="sum").sink_to(ss.sinks.Collect())

    error, seconds, total = fails_at_once(spark, build, f"None timestamp at the {where}")
    text = str(error)
    assert error.reason == "DATA_ERROR" and "without a restart (0 earlier restart(s))" in text
    assert "'value': 1001, 'ts': None" in text and "filter" in text   # the row, the fix
    assert "row 1 " not in text and "row 100" not in text     # no position inside a batch
    if where == "source":   # rows as the Generator made them: checked one by one
        assert "operator 'Source: events'" in text and "subtask: Source: events (2/2)" in text
        assert "timestamp field 'ts' is None" in text and "int(dt.timestamp() * 1000)" in text
        assert "source position: split 1 of 2, offset 500 (index 1001 of the Generator)" in text
    else:   # an Arrow batch off the network: checked column-wise
        assert "operator 'Timestamps/Watermarks'" in text and "subtask: Timestamps/Watermarks (" in text
        assert "timestamp column 'ts' is null" in text and "source position" not in text
    print(f"{seconds:.1f} s running ({total:.1f} s in execute())")


class Opaque:
    """A value the state serializer has no faithful encoding for."""

    def __init__(self, n):
        self.n = n


class KeepsOpaque(ss.KeyedProcessFunction):
    def open(self, ctx):
        self.last = ctx.get_state(ss.ValueStateDescriptor("last_seen"))

    def process_element(self, row, ctx):
        self.last.update(Opaque(row["value"]) if row["value"] == 1234 else row["value"])
        yield {"key": ctx.current_key, "value": row["value"]}


def test_a_state_value_the_serializer_cannot_keep_fails_at_once_naming_state_type_row_and_fix(spark):
    def build(env):
        (env.from_source(ss.sources.Generator(event, count=N), name="events")
            .key_by("key").process(KeepsOpaque(), name="remember").sink_to(ss.sinks.Collect()))

    error, seconds, total = fails_at_once(spark, build, "opaque state value")
    text = str(error)
    assert error.reason == "DATA_ERROR" and "without a restart (0 earlier restart(s))" in text
    assert "operator 'remember' (subtask " in text and "state 'last_seen'" in text        # operator, subtask, state
    assert "'tests.integration.test_data_errors.Opaque'" in text                           # the type
    assert "row: {'key': 2, 'value': 1234}" in text                                        # the row
    assert "@dataclass" in text and "PickleSerializer()" in text                           # the fixes
    assert "test_data_errors.py" in text and "in process_element" in text                  # the user's line
    print(f"{seconds:.1f} s running ({total:.1f} s in execute())")


def test_a_function_returning_no_row_is_a_configuration_error_found_at_run_time(spark):
    def build(env):
        (env.from_source(ss.sources.Generator(event, count=N, batch_size=250), name="events")
            .map(lambda r: r if r["value"] != 2_222 else [r], name="wrap").sink_to(ss.sinks.Collect()))

    error, seconds, total = fails_at_once(spark, build, "map returns a list")
    text = str(error)
    assert error.reason == "DATA_ERROR" and "without a restart (0 earlier restart(s))" in text
    assert "operator 'wrap' (subtask Source: events -> wrap" in text
    assert "map function returned list; it must return a dict (a row)" in text
    assert "row: {'key': 3, 'value': 2222}" in text
    # The map ran chained to the source on the source's own row: its exact position.
    assert "source position: split 0 of 2, offset 1111 (index 2222 of the Generator)" in text
    print(f"{seconds:.1f} s running ({total:.1f} s in execute())")


@dataclass(frozen=True)
class FirstSeen:
    """A state value of the kinds users keep (issue 30: a datetime failed 3 restarts and 15-17 s):
    the earliest time, a running Decimal, the (smallest, largest) value."""

    at: dt.datetime
    total: Decimal
    values: tuple


class RemembersFirst(ss.KeyedProcessFunction):
    def open(self, ctx):
        self.first = ctx.get_state(ss.ValueStateDescriptor("first"))
        self.days = ctx.get_state(ss.ValueStateDescriptor("days", default=frozenset()))

    def process_element(self, row, ctx):
        at = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=row["value"])
        first = self.first.value()
        v = row["value"]
        first = FirstSeen(at, Decimal("0.01"), (v, v)) if first is None else FirstSeen(
            min(first.at, at), first.total + Decimal("0.01"), (min(first.values[0], v), max(first.values[1], v)))
        self.first.update(first)
        self.days.update(self.days.value() | {at.date()})
        yield {"key": ctx.current_key, "first": first.at.isoformat(), "cents": str(first.total),
               "pair": list(first.values), "days": len(self.days.value())}


def test_datetimes_decimals_tuples_sets_and_dataclasses_in_state_need_no_pickle(spark, tmp_path):
    config = ss.CheckpointConfig(interval=0.2, directory=str(tmp_path / "ckpt"), retention="retain_on_finish")
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               restart=ss.RestartStrategy.none())   # any failure fails the test
    (env.from_source(ss.sources.Generator(event, count=N, rate=12_000), name="events")
        .key_by("key").process(RemembersFirst(), name="first").sink_to(ss.sinks.Collect()))
    result = env.execute("rich state")
    assert result.checkpoints.counts.completed >= 1     # the state went through checkpoints (the final one, at least)
    last = {}
    for row in result.rows():
        last[row["key"]] = row
    for key in range(7):
        values = [i for i in range(N) if i % 7 == key]
        assert last[key]["first"] == "2024-01-01T00:00:%02d+00:00" % key
        assert last[key]["cents"] == str(Decimal("0.01") * len(values))
        assert last[key]["pair"] == [values[0], values[-1]]
        assert last[key]["days"] == 1
