"""State as Spark DataFrames on real Spark: read a job's checkpoint, bootstrap a savepoint a job
continues from, and the errors for bad inputs."""

from __future__ import annotations

import glob
import shutil
from collections import defaultdict

import pyarrow as pa
import pytest

import streamsnap as ss
from tests.integration.support import RunningSum, both_backends, final_by_key, wait_completed

pytestmark = pytest.mark.spark

KEYS = 13


def event(i: int) -> dict:
    return {"key": i % KEYS, "value": i}


FAR = 10**13     # a processing-time timer that never fires during the test


class SumWithTimer(RunningSum):
    """The running sum, and a timer per key: timers are keyed state the reader shows too."""

    def process_element(self, row, ctx):
        ctx.timer_service().register_processing_time_timer(FAR)
        yield from super().process_element(row, ctx)


def spark_jobs(spark, action) -> int:
    """How many Spark jobs `action()` ran."""
    sc = spark.sparkContext
    group = f"count-{id(action)}"
    sc.setJobGroup(group, "counting the jobs of one action")
    try:
        action()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return len(sc.statusTracker().getJobIdsForGroup(group))


def latest_checkpoint(directory) -> str:
    return max(glob.glob(f"{directory}/*/chk-*"), key=lambda p: int(p.rsplit("-", 1)[1]))


@both_backends
def test_state_read_from_a_checkpoint_equals_the_state_its_source_positions_imply(spark, tmp_path, state_backend):
    """The checkpoint's keyed state, read with Spark, is exactly the running sums of the rows its
    source splits had emitted (read from the same checkpoint's operator state)."""
    config = ss.CheckpointConfig(interval=0.3, directory=str(tmp_path / "ckpt"), retention="retain_on_cancellation")
    env = ss.StreamEnvironment(parallelism=2, spark=spark, state_backend=state_backend, checkpointing=config)
    (env.from_source(ss.sources.Generator(event, rate=20_000), uid="gen")
        .key_by("key").process(SumWithTimer(), uid="sum").sink_to(ss.sinks.Discard(), uid="out"))
    client = env.execute_async("state reader")
    wait_completed(client, 2)
    client.cancel()     # waits until the job ended; the checkpoint is retained
    checkpoint = latest_checkpoint(tmp_path / "ckpt")

    expected = defaultdict(int)
    positions = ss.state.read(spark, checkpoint, "gen", "source-splits").collect()
    assert sorted(r.subtask for r in positions) == [0, 1]
    for row in positions:
        split, splits, emitted = row.value
        for k in range(emitted):
            expected[(split + splits * k) % KEYS] += split + splits * k
    state = ss.state.read(spark, checkpoint, "sum", "total")
    assert state.columns == ["key", "value"]
    assert spark_jobs(spark, state.collect) == 1
    assert {r.key: r.value for r in state.collect()} == dict(expected)

    timers = ss.state.read(spark, checkpoint, "sum", "_timers.user-timers.processing_time").collect()
    assert sorted(r.key for r in timers) == sorted(expected) and {r.map_key._1 for r in timers} == {FAR}

    described = {(r.uid, r.state_name): r for r in ss.state.metadata(spark, checkpoint).collect()}
    total = described[("sum", "total")]
    assert (total.state_type, total.kind, total.keys, total.parallelism, total.max_parallelism) == \
        ("keyed", "value", KEYS, 2, 128)
    assert total.operator_bytes > 0
    assert described[("gen", "source-splits")].kind == "split"


@pytest.fixture(scope="module")
def bootstrapped(spark, tmp_path_factory) -> str:
    """A savepoint of operator "sum" whose value state "total" holds key * 1000 for every key."""
    start = spark.range(0, KEYS, 1, 2).selectExpr("id as key", "id * 1000 as total")
    return ss.state.bootstrap(start, "key", uid="sum", state_name="total", value_column="total",
                              path=str(tmp_path_factory.mktemp("bootstrap") / "savepoint"), parallelism=3)


@both_backends
def test_a_savepoint_bootstrapped_from_a_dataframe_restores_into_a_job_that_continues(spark, bootstrapped, state_backend):
    path = bootstrapped
    env = ss.StreamEnvironment(parallelism=2, spark=spark, state_backend=state_backend)
    (env.from_source(ss.sources.Generator(event, count=1300), uid="gen")
        .key_by("key").process(RunningSum(), uid="sum").sink_to(ss.sinks.Collect()))
    result = env.execute("bootstrapped", restore_from=path)
    assert final_by_key(result.rows(), "key", "total") == \
        {k: k * 1000 + sum(i for i in range(1300) if i % KEYS == k) for k in range(KEYS)}


def test_list_and_map_state_with_composite_keys_round_trip_through_a_savepoint(spark, tmp_path):
    rows = spark.createDataFrame([("a", 1, "x", 10), ("a", 1, "y", 11), ("b", 2, "x", 20)],
                                 "user string, shard long, item string, qty long").coalesce(1)
    lists = ss.state.bootstrap(rows, ["user", "shard"], uid="op", state_name="items", kind="list",
                               value_column=["item", "qty"], path=str(tmp_path / "lists"), parallelism=2)
    got = {(r.key["_1"], r.key["_2"]): sorted((v["item"], v["qty"]) for v in r.value)
           for r in ss.state.read(spark, lists, "op", "items").collect()}
    assert got == {("a", 1): [("x", 10), ("y", 11)], ("b", 2): [("x", 20)]}
    maps = ss.state.bootstrap(rows, "user", uid="op", state_name="qty", kind="map", map_key_column="item",
                              value_column="qty", path=str(tmp_path / "maps"), parallelism=2)
    read = ss.state.read(spark, maps, "op", "qty")
    assert read.columns == ["key", "map_key", "value"]
    assert sorted(tuple(r) for r in read.collect()) == [("a", "x", 10), ("a", "y", 11), ("b", "x", 20)]


def test_bad_inputs_are_named_with_what_exists(spark, tmp_path, bootstrapped):
    df = spark.range(0, 4, 1, 2).selectExpr("id % 2 as key", "id as v")
    with pytest.raises(ss.ConfigurationError, match="key [01] is in more than one row"):
        ss.state.bootstrap(df, "key", uid="op", state_name="s", value_column="v", path=str(tmp_path / "dup"),
                           parallelism=2)
    assert not (tmp_path / "dup").exists(), "a failed write leaves no partial savepoint behind"
    (tmp_path / "given").mkdir()
    with pytest.raises(ss.ConfigurationError, match="more than one row"):
        ss.state.bootstrap(df, "key", uid="op", state_name="s", value_column="v", path=str(tmp_path / "given"))
    assert list((tmp_path / "given").iterdir()) == [], "a directory the user made stays, emptied"
    with pytest.raises(ss.ConfigurationError, match="'nope' not in the DataFrame; its columns: key, v"):
        ss.state.bootstrap(df, "nope", uid="op", state_name="s", value_column="v", path=str(tmp_path / "x"))
    with pytest.raises(ss.ConfigurationError, match="already a savepoint or checkpoint"):
        ss.state.bootstrap(df, "v", uid="op", state_name="s", value_column="key", path=bootstrapped)
    with pytest.raises(ss.ConfigurationError, match="no operator with uid 'other'; its operators: 'sum'"):
        ss.state.read(spark, bootstrapped, "other", "total")
    with pytest.raises(ss.ConfigurationError, match="no state named 'count'; its keyed states: 'total'"):
        ss.state.read(spark, bootstrapped, "sum", "count")
    with pytest.raises(ss.ConfigurationError, match="'value' column does not fit string.*pass value_type="):
        ss.state.read(spark, bootstrapped, "sum", "total", value_type=pa.string())
    with pytest.raises(ss.ConfigurationError, match="uid must be a non-empty str"):
        ss.state.read(spark, bootstrapped, None, "total")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ss.RestoreError, match="empty.*not a completed checkpoint or savepoint"):
        ss.state.metadata(spark, str(tmp_path / "empty"))


def test_a_damaged_savepoint_is_named_on_the_driver_or_by_the_task_that_finds_it(spark, tmp_path, bootstrapped):
    """A file of the wrong size fails before any Spark job; a corrupt block of the right size can
    only be found by the task reading it, whose error names the file and the fix."""
    copy = tmp_path / "copy"
    shutil.copytree(bootstrapped, copy)
    keyed = sorted(p for p in copy.iterdir() if "keyed" in p.name)
    data = keyed[0].read_bytes()
    keyed[0].write_bytes(data[:-3])
    with pytest.raises(ss.RestoreError, match=f"is damaged: the keyed state file .*{keyed[0].name}.*has "
                                              f"{len(data) - 3} bytes.*read another checkpoint"):
        ss.state.read(spark, str(copy), "sum", "total")
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    keyed[0].write_bytes(bytes(flipped))
    df = ss.state.read(spark, str(copy), "sum", "total", value_type=pa.int64(), key_type=pa.int64())
    with pytest.raises(Exception, match="corrupt: checksum mismatch.*restore from an older checkpoint"):
        df.collect()


class Shift(ss.CheckpointedFunction):
    """Adds the sum of its union operator state "bases" to each row's value."""

    def initialize_state(self, ctx):
        self.bases = ctx.get_union_list_state("bases")
        self.shift = sum(self.bases.get())

    def snapshot_state(self, ctx):
        self.bases.update([self.shift])     # (restored once here: union copies would add up)

    def __call__(self, row):
        return {"key": row["key"], "value": row["value"] + self.shift}


def test_a_savepoint_of_several_operators_and_operator_state_restores_into_a_job_that_uses_them(spark, tmp_path):
    totals = spark.range(0, KEYS, 1, 2).selectExpr("id as key", "id * 1000 as total")
    firsts = spark.range(0, KEYS, 1, 1).selectExpr("id as key", "concat('k', id) as first")
    path = (ss.state.SavepointWriter()
            .keyed_state(totals, "key", uid="sum", state_name="total", value_column="total", parallelism=3)
            .keyed_state(firsts, "key", uid="sum", state_name="first", value_column="first")
            .operator_state([3, 4], uid="shift", state_name="bases", mode="union", parallelism=2)
            .operator_state([10, 11, 12], uid="shift", state_name="parts")
            .write(str(tmp_path / "composed")))
    assert sorted(tuple(r) for r in ss.state.read(spark, path, "shift", "parts").collect()) == \
        [(0, 10), (0, 12), (1, 11)]
    assert {r.key: r.value for r in ss.state.read(spark, path, "sum", "first").collect()} == \
        {k: f"k{k}" for k in range(KEYS)}
    with pytest.raises(ss.ConfigurationError, match="operator 'sum' has parallelism 3 from an earlier state"):
        ss.state.SavepointWriter().keyed_state(totals, "key", uid="sum", state_name="a", value_column="total",
                                               parallelism=3).operator_state([1], uid="sum", state_name="b",
                                                                             parallelism=2)

    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    (env.from_source(ss.sources.Generator(event, count=1300), uid="gen")
        .map(Shift(), uid="shift").key_by("key").process(RunningSum(), uid="sum").sink_to(ss.sinks.Collect()))
    result = env.execute("composed", restore_from=path)
    # both subtasks of "shift" got the union state's elements 3 and 4: every value is shifted by 7
    assert final_by_key(result.rows(), "key", "total") == \
        {k: k * 1000 + sum(i + 7 for i in range(1300) if i % KEYS == k) for k in range(KEYS)}


def test_metadata_takes_key_counts_from_the_handles_and_surveys_only_files_that_recorded_none(
        spark, tmp_path, bootstrapped, monkeypatch):
    from dataclasses import replace

    from streamsnap.checkpoint.metadata import write_metadata
    from streamsnap.state_processor import reader

    surveys = []     # the files each Spark survey job read (counting Spark jobs is not exact:
    run = reader._run  # a collect() may run one or several)

    def recording_run(spark_, tasks, fn, schema):
        if fn is reader._survey_task:
            surveys.append(len(tasks))
        return run(spark_, tasks, fn, schema)

    monkeypatch.setattr(reader, "_run", recording_run)
    rows = ss.state.metadata(spark, bootstrapped).collect()
    assert [(r.uid, r.state_name, r.kind, r.keys) for r in rows] == [("sum", "total", "value", KEYS)]
    assert surveys == [], "key counts recorded in the handles need no survey"
    # The same savepoint as a checkpoint written before handles counted keys: surveyed with Spark.
    old = str(tmp_path / "old-savepoint")
    shutil.copytree(bootstrapped, old)
    meta, _ = reader.load(old)
    uncounted = {uid: replace(op, subtask_states={
        s: replace(st, keyed=tuple(replace(h, keys=None) for h in st.keyed)) for s, st in op.subtask_states.items()})
        for uid, op in meta.operators.items()}
    write_metadata("file://" + old, replace(meta, operators=uncounted))
    surveyed = ss.state.metadata(spark, old).collect()
    assert len(surveys) == 1 and surveys[0] >= 1, f"one survey job over the uncounted files, got {surveys}"
    assert surveyed == rows


def test_keyed_state_of_a_changelog_checkpoint_is_listed_as_such_and_its_read_names_the_way_out(spark, tmp_path):
    from streamsnap.checkpoint.handles import OperatorSubtaskState
    from streamsnap.checkpoint.metadata import CheckpointMetadata, OperatorState, write_metadata
    from streamsnap.runtime.events import CheckpointType
    from streamsnap.state.backends.changelog import ChangelogConfig
    from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
    from streamsnap.state.backends.rocksdb.config import RocksDBConfig
    from tests.state.test_rocksdb_incremental import FULL, MAX_P, checkpoint, put_counts

    (tmp_path / "job" / "shared").mkdir(parents=True)
    config = RocksDBConfig(local_dir=str(tmp_path / "db"), changelog=ChangelogConfig(materialization_interval=3600.0))
    backend = RocksDBKeyedStateBackend("op", MAX_P, FULL, config)
    try:
        put_counts(backend, range(100), lambda k: k)
        _, handle = checkpoint(backend, tmp_path / "job", 1)
    finally:
        backend.dispose()
    operator = OperatorState("op", 1, MAX_P, {0: OperatorSubtaskState(keyed=(handle,))})
    write_metadata("file://" + str(tmp_path / "job" / "chk-1"),
                   CheckpointMetadata("job", 1, CheckpointType.CHECKPOINT, 0.0, 0.0, {"op": operator}))
    path = str(tmp_path / "job" / "chk-1")
    rows = [r.asDict() for r in ss.state.metadata(spark, path).collect()]
    assert [(r["uid"], r["state_type"], r["kind"], r["state_name"], r["keys"]) for r in rows] == \
        [("op", "keyed", "changelog", None, None)]
    with pytest.raises(ss.ConfigurationError, match="changelog.*savepoint"):
        ss.state.read(spark, path, "op", "count")


RULES = ss.MapStateDescriptor("rules")


class JudgeByRules(ss.BroadcastProcessFunction):
    def process_broadcast_element(self, row, ctx):
        ctx.get_broadcast_state(RULES).put(row["category"], row["limit"])

    def process_element(self, row, ctx):
        yield {"id": row["id"], "limit": ctx.get_broadcast_state(RULES).get(row["category"])}


def test_a_bootstrapped_broadcast_state_reaches_every_subtask_of_the_job(spark, tmp_path):
    rules = spark.createDataFrame([("food", 5), ("toys", 40)], "category string, limit long")
    path = (ss.state.SavepointWriter()
            .operator_state(rules, uid="judge", state_name="rules", mode="broadcast")
            .write(str(tmp_path / "rules")))
    assert sorted(tuple(r) for r in ss.state.read(spark, path, "judge", "rules").collect()) == \
        [("food", 5), ("toys", 40)]
    with pytest.raises(ss.ConfigurationError, match="broadcast state 'rules' takes a dict"):
        ss.state.SavepointWriter().operator_state([1, 2], uid="judge", state_name="rules", mode="broadcast")

    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    items = env.from_source(ss.sources.Generator(
        lambda i: {"id": i, "category": ("food", "toys")[i % 2]}, count=200), uid="items")
    updates = env.from_collection([{"category": "other", "limit": 1}], name="updates")
    items.connect(updates.broadcast(RULES)).process(JudgeByRules(), uid="judge").sink_to(ss.sinks.Collect())
    result = env.execute("bootstrapped rules", restore_from=path)
    assert sorted((r["id"], r["limit"]) for r in result.rows()) == [(i, (5, 40)[i % 2]) for i in range(200)]


def test_the_state_a_bounded_job_finished_with_is_read_back_exactly_when_retained(spark, tmp_path):
    """retain_on_finish keeps the final checkpoint of a FINISHED job: its state is every row's
    sum. Without it, reading the job's directory names why nothing is there and the setting."""
    n = 5_000
    expected = {k: sum(i for i in range(n) if i % KEYS == k) for k in range(KEYS)}

    def run(retention: str, name: str):
        config = ss.CheckpointConfig(interval=60.0, directory=str(tmp_path / "ckpt"), retention=retention)
        env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config)
        (env.from_source(ss.sources.Generator(event, count=n), uid="gen")
            .key_by("key").process(RunningSum(), uid="sum").sink_to(ss.sinks.Collect(), uid="out"))
        result = env.execute(name)
        assert final_by_key(result.rows(), "key", "total") == expected
        return str(tmp_path / "ckpt" / result.job_id)

    kept = run("retain_on_finish", "finished, state kept")
    state = ss.state.read(spark, kept, "sum", "total")          # the job's directory: its final checkpoint
    assert {r.key: r.value for r in state.collect()} == expected
    assert run("retain_on_finish", "finished, state kept") == kept  # a new run started fresh (the same sums)

    gone = run("delete_on_cancellation", "finished, state deleted")
    with pytest.raises(ss.RestoreError, match=r"the job finished and deleted its checkpoints: set "
                                              r"CheckpointConfig\(retention='retain_on_finish'\)"):
        ss.state.read(spark, gone, "sum", "total")
