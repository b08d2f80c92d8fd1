"""Bad configuration fails where it is written, naming the field — never inside a Spark task."""

import pyarrow as pa
import pytest

import streamsnap as ss


def gen():
    return ss.sources.Generator(lambda i: {"key": i % 3, "value": i}, count=10)


@pytest.mark.parametrize("kwargs, message", [
    ({"parallelism": 0}, "StreamEnvironment.parallelism must be an integer >= 1, got 0"),
    ({"parallelism": "2"}, "StreamEnvironment.parallelism"),
    ({"parallelism": 4, "max_parallelism": 2}, "max_parallelism (2) must be >= parallelism (4)"),
    ({"max_parallelism": 0}, "StreamEnvironment.max_parallelism must be an integer in 1..32768"),
    ({"state_backend": "mongo"}, "StreamEnvironment.state_backend must be one of 'hashmap', 'rocksdb', got 'mongo'"),
    ({"checkpointing": ss.CheckpointConfig(interval=1.0)}, "CheckpointConfig.directory is required"),
    ({"checkpointing": "yes"}, "StreamEnvironment.checkpointing must be a CheckpointConfig"),
    ({"restart": 3}, "StreamEnvironment.restart must be a RestartStrategy"),
    ({"local_recovery": "yes"}, "StreamEnvironment.local_recovery must be True or False, got 'yes'"),
    ({"local_recovery": True}, "StreamEnvironment.local_recovery=True needs checkpointing"),
    ({"local_recovery_dir": "/tmp/local", "checkpointing": ss.CheckpointConfig(directory="/tmp/c")},
     "StreamEnvironment.local_recovery_dir is set but local_recovery is False"),
    ({"local_recovery": True, "local_recovery_dir": "s3://bucket/local",
      "checkpointing": ss.CheckpointConfig(directory="/tmp/c")},
     "StreamEnvironment.local_recovery_dir must be a path on the task's local disk, not a URL"),
])
def test_environment_settings(kwargs, message):
    with pytest.raises(ss.ConfigurationError) as info:
        ss.StreamEnvironment(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"interval": 0}, "CheckpointConfig.interval must be > 0"),
    ({"interval": -1.0}, "CheckpointConfig.interval must be > 0"),
    ({"mode": "twice"}, "CheckpointConfig.mode must be one of 'exactly_once', 'at_least_once'"),
    ({"timeout": 0}, "CheckpointConfig.timeout must be > 0"),
    ({"min_pause": -1}, "CheckpointConfig.min_pause must be >= 0"),
    ({"max_concurrent": 0}, "CheckpointConfig.max_concurrent must be an integer >= 1"),
    ({"tolerable_failures": -1}, "CheckpointConfig.tolerable_failures must be an integer >= 0"),
    ({"num_retained": 0}, "CheckpointConfig.num_retained must be an integer >= 1"),
    ({"retention": "forever"}, "CheckpointConfig.retention must be one of"),
    ({"directory": ""}, "CheckpointConfig.directory must be a non-empty path"),
    ({"aligned_timeout": 1.0}, "aligned_timeout only applies to unaligned checkpoints"),
])
def test_checkpoint_config(kwargs, message):
    with pytest.raises(ss.ConfigurationError) as info:
        ss.CheckpointConfig(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "NetworkConfig.batch_size must be an integer >= 1"),
    ({"credits": 0}, "NetworkConfig.credits must be an integer >= 1"),
    ({"merge_rows": 0}, "NetworkConfig.merge_rows must be an integer >= 1"),
    ({"merge_rows": 2.5}, "NetworkConfig.merge_rows must be an integer >= 1"),
    ({"debloat_target": 0}, "NetworkConfig.debloat_target must be > 0, got 0"),
    ({"debloat_target": "1s"}, "NetworkConfig.debloat_target must be a number of seconds, got '1s'"),
    ({"debloat_target": float("inf")}, "NetworkConfig.debloat_target must be a finite number of seconds"),
    ({"peer_timeout": 1}, "NetworkConfig.peer_timeout must be a finite number of seconds >= 2"),
    ({"peer_timeout": float("inf")}, "NetworkConfig.peer_timeout must be a finite number of seconds >= 2"),
    ({"peer_timeout": "5s"}, "NetworkConfig.peer_timeout must be a number of seconds, got '5s'"),
])
def test_network_config(kwargs, message):
    with pytest.raises(ss.ConfigurationError) as info:
        ss.NetworkConfig(**kwargs)
    assert message in str(info.value)
    assert ss.NetworkConfig(debloat_target=1.0).debloat_target == 1.0
    assert ss.NetworkConfig().peer_timeout == 5.0 and ss.NetworkConfig(peer_timeout=None).peer_timeout is None
    assert ss.NetworkConfig(batch_size=100).merge_limit == 400
    assert ss.NetworkConfig(batch_size=100, merge_rows=150).merge_limit == 150


def test_buffer_timeout_keeps_every_other_network_option():
    network = ss.NetworkConfig(peer_timeout=7, debloat_target=1.0, credits=8)
    env = ss.StreamEnvironment(buffer_timeout=0.2, network=network, web=False)
    assert env.network == ss.NetworkConfig(buffer_timeout=0.2, peer_timeout=7, debloat_target=1.0, credits=8)


def test_restart_strategies_validate_their_arguments():
    with pytest.raises(ss.ConfigurationError, match="attempts must be an integer >= 0"):
        ss.RestartStrategy.fixed_delay(attempts=-1)
    with pytest.raises(ss.ConfigurationError, match=r"max \(1\) must be >= initial \(2\)"):
        ss.RestartStrategy.exponential_delay(initial=2, max=1)
    with pytest.raises(ss.ConfigurationError, match="multiplier must be a number >= 1"):
        ss.RestartStrategy.exponential_delay(multiplier=0.5)


def test_unknown_sink_format():
    with pytest.raises(ss.ConfigurationError, match="FileSink.format must be one of 'parquet', 'jsonl', got 'csv'"):
        ss.sinks.FileSink("/tmp/out", format="csv")


def test_key_by_on_a_missing_column_names_it_and_the_columns_there_are():
    env = ss.StreamEnvironment()
    stream = env.from_source(gen(), name="events")
    with pytest.raises(ss.ConfigurationError) as info:
        stream.key_by("user")
    assert "no column 'user'" in str(info.value) and "key, value" in str(info.value)
    with pytest.raises(ss.ConfigurationError, match="no column 'user'"):
        stream.key_by(["key", "user"])
    # a declared output schema is checked too
    mapped = stream.map(lambda r: r, output_schema=pa.schema([("k", pa.int64())]))
    with pytest.raises(ss.ConfigurationError, match="no column 'key'"):
        mapped.key_by("key")


def test_key_by_a_column_no_key_can_be_fails_at_build_naming_it_and_the_cast():
    """A date, timestamp or decimal column cannot be hashed into key groups: refused when the
    job is built, naming the column and its type, not inside a Spark task; keyable ones pass."""
    env = ss.StreamEnvironment()
    schema = pa.schema([("user", pa.int64()), ("day", pa.date32()), ("at", pa.timestamp("ms")),
                        ("tag", pa.dictionary(pa.int32(), pa.string())), ("price", pa.float64())])
    stream = env.from_source(gen(), name="events").map(lambda r: r, output_schema=schema)
    for key, column, kind in [("day", "day", "date32"), (["user", "at"], "at", "timestamp")]:
        with pytest.raises(ss.ConfigurationError, match=f"key column '{column}' is of type {kind}.*int64"):
            stream.key_by(key)
    stream.key_by(["user", "tag", "price"])


def test_operator_arguments():
    env = ss.StreamEnvironment(parallelism=2, max_parallelism=8)
    stream = env.from_source(gen())
    with pytest.raises(ss.ConfigurationError, match="parallelism of 'Map' must be an integer >= 1"):
        stream.map(lambda r: r, parallelism=0)
    with pytest.raises(ss.ConfigurationError, match=r"exceeds max_parallelism \(8\)"):
        stream.map(lambda r: r, parallelism=9)
    with pytest.raises(ss.ConfigurationError, match="map needs a function"):
        stream.map("not callable")
    with pytest.raises(ss.ConfigurationError, match="process takes a KeyedProcessFunction"):
        stream.key_by("key").process(lambda r: r)
    with pytest.raises(ss.ConfigurationError, match="sink_to takes a sink"):
        stream.sink_to(print)
    with pytest.raises(ss.ConfigurationError, match="key_by takes a column name"):
        stream.key_by(42)


def test_sources_validate_their_arguments():
    with pytest.raises(ss.ConfigurationError, match="Generator.count must be an integer >= 0"):
        ss.sources.Generator(lambda i: {}, count=-5)
    with pytest.raises(ss.ConfigurationError, match="Generator.rate must be"):
        ss.sources.Generator(lambda i: {}, rate=0)
    with pytest.raises(ss.ConfigurationError, match="Generator function failed on index 0"):
        ss.StreamEnvironment().from_source(ss.sources.Generator(lambda i: 1 / 0, count=3))
    with pytest.raises(ss.ConfigurationError, match="every element must be a dict"):
        ss.StreamEnvironment().from_collection([1, 2])


def test_execute_refuses_a_job_bigger_than_the_spark_session():
    """The slot check needs no Spark job: a session-like object with too few slots."""
    from streamsnap.cluster.spark_session import require_slots

    class Context:
        master = "local[2]"
        defaultParallelism = 2

    class Session:
        sparkContext = Context()

    with pytest.raises(ss.ConfigurationError,
                       match=r"runs 10 subtasks in 5 task slots of one Spark barrier stage, but the Spark "
                             r"session has only 2 task slots \(local\[2\]\); use local\[5\]"):
        require_slots(Session(), 5, 10)
    require_slots(Session(), 2, 4)


def test_slot_sharing_must_be_a_bool():
    with pytest.raises(ss.ConfigurationError, match="slot_sharing must be True or False, got 'yes'"):
        ss.StreamEnvironment(slot_sharing="yes")
