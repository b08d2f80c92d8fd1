"""streamsnap: stateful, exactly-once, low-latency stream processing for PySpark users.

Pipelines run on Apache Spark (one barrier stage per job) with Apache Flink's fault-tolerance
design: checkpoint barriers, alignment, asynchronous snapshots, a checkpoint coordinator,
savepoints and two-phase-commit sinks.

    import streamsnap as ss
    env = ss.StreamEnvironment(parallelism=2)
    env.from_collection(rows).key_by("word").process(Count()).sink_to(ss.sinks.Collect())
    result = env.execute("word count")
"""

from streamsnap.api.config import ChangelogConfig, CheckpointConfig, NetworkConfig, RestartStrategy, RocksDBConfig
from streamsnap.api.datastream import DataStream, KeyedStream
from streamsnap.api.environment import StreamEnvironment
from streamsnap.api.functions import (
    CheckpointedFunction, CheckpointListener, Context, Function, FunctionInitializationContext,
    FunctionSnapshotContext, KeyedBatchFunction, KeyedProcessFunction, OutputTag, ProcessFunction,
    RuntimeContext, TimerService, CoProcessFunction, KeyedCoProcessFunction, KeyedCoBatchFunction,
    ProcessJoinFunction,
    BroadcastProcessFunction, KeyedBroadcastProcessFunction,
)
from streamsnap.api.connected import BroadcastStream, ConnectedStreams
from streamsnap.api.vectorized import group_cumsum
from streamsnap.graph.keys import BatchKeys
from streamsnap.api.result import JobClient, JobResult
from streamsnap.api import jobs
from streamsnap.web.config import WebConfig
from streamsnap.connectors import sinks, sources
from streamsnap.errors import (
    ConfigurationError, DataError, FileReadError, JobExecutionError, NullKeyError, PreflightError, RestoreError,
    SchemaError, StreamsnapError, UsageError, UserFunctionError,
)
from streamsnap import errors, state, windows
from streamsnap.api.windowing import AggregateFunction, ProcessWindowFunction, WindowedStream
from streamsnap.api.all_windows import AllWindowedStream, ProcessAllWindowFunction
from streamsnap.time.timers import TimeDomain
from streamsnap.time.watermarks import WatermarkGenerator, WatermarkStrategy
from streamsnap.state.descriptors import (
    ListStateDescriptor, MapStateDescriptor, ReducingStateDescriptor, ValueStateDescriptor,
)
from streamsnap.state.ttl import StateTtlConfig, TtlStateVisibility, TtlUpdateType

__version__ = "0.1.0"

__all__ = [
    "jobs", "state", "errors",
    "StreamEnvironment", "DataStream", "KeyedStream", "CheckpointConfig", "RestartStrategy", "NetworkConfig", "RocksDBConfig", "ChangelogConfig",
    "KeyedProcessFunction", "KeyedBatchFunction", "BatchKeys", "group_cumsum", "Function", "Context", "RuntimeContext", "CheckpointedFunction",
    "CheckpointListener", "FunctionInitializationContext", "FunctionSnapshotContext",
    "ValueStateDescriptor", "ListStateDescriptor", "MapStateDescriptor", "ReducingStateDescriptor",
    "StateTtlConfig", "TtlUpdateType", "TtlStateVisibility",
    "JobResult", "JobClient", "WebConfig", "sources", "sinks",
    "StreamsnapError", "ConfigurationError", "JobExecutionError", "UserFunctionError", "RestoreError",
    "FileReadError", "DataError", "SchemaError", "UsageError", "NullKeyError", "PreflightError", "WatermarkStrategy", "WatermarkGenerator", "windows", "OutputTag", "TimeDomain",
    "ProcessFunction", "TimerService", "AggregateFunction", "ProcessWindowFunction", "WindowedStream",
    "AllWindowedStream", "ProcessAllWindowFunction",
    "CoProcessFunction", "KeyedCoProcessFunction", "KeyedCoBatchFunction", "ProcessJoinFunction", "ConnectedStreams",
    "BroadcastProcessFunction", "KeyedBroadcastProcessFunction", "BroadcastStream",
]


def __dir__() -> list[str]:
    """`dir(ss)` lists the public names (`__all__`), not the internal subpackages."""
    return sorted(__all__)
