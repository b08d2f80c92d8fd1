"""The few calls streamsnap makes on a SparkSession, for a classic session and a Spark Connect one.

A classic session (py4j, `sparkContext`) and a Connect session (a gRPC client: no
`sparkContext`, no RDDs) reach the same cluster through different APIs. The JobMaster and the
pre-flight checks talk to a `SparkBridge` instead, so the engine is one engine on both:

* a barrier stage of n tasks running one function per slot — on classic the RDD barrier stage
  (`parallelize(...).barrier().mapPartitions`, the fastest to start: 0.33 s against 0.76 s for
  the DataFrame form, docs/architecture/deployment-decision.md), on Connect the DataFrame form
  `range(0, n, 1, n).mapInArrow(fn, schema, barrier=True)`;
* cancelling it: a job group on classic, a tag (`addTag` / `interruptTag`) on Connect;
* the cluster's master URL and settings (`spark.conf` on Connect);
* probing the executors' Python and shipping the package to them (`addPyFile` on classic,
  `addArtifacts(..., pyfile=True)` on Connect).

Classic and Connect sessions cannot be mixed in one Python process (PySpark decides per
process), so a process holds one kind.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Iterator

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 15.0   # seconds a Connect server may take to answer before execute() gives up

# What each barrier task returns to the submitter: one row per subtask it ran.
OUTCOME_COLUMNS = ("task_index", "vertex", "outcome")
OUTCOME_SCHEMA = "task_index long, vertex string, outcome string"
# With the JobMaster in task 0, its row (task_index -1) carries the job's end as msgpack bytes.
CLUSTER_OUTCOME_SCHEMA = OUTCOME_SCHEMA + ", payload binary"


def is_connect(spark) -> bool:
    """Whether `spark` is a Spark Connect session (pyspark.sql.connect), not a classic one."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def is_session(spark) -> bool:
    return hasattr(spark, "range") and hasattr(spark, "conf") and (is_connect(spark) or hasattr(spark, "sparkContext"))


class ClassicBridge:
    kind = "classic"

    def __init__(self, spark):
        self.spark = spark
        self._sc = spark.sparkContext

    @property
    def master(self) -> str:
        return self._sc.master

    def conf(self, key: str, default: str | None = None) -> str | None:
        return self._sc.getConf().get(key, default)

    @property
    def identity(self) -> str:
        """Names the running application (pre-flight checks run once per application)."""
        return str(self._sc.applicationId)

    def default_parallelism(self) -> int:
        return int(self._sc.defaultParallelism or 1)

    def run_barrier_stage(self, n: int, run_slot: Callable[[int, str], list[tuple]], tag: str,
                          description: str) -> list[tuple]:
        """Run `run_slot(slot, host)` in n gang-scheduled tasks; their outcomes. Cancelled by `cancel(tag)`."""
        self._sc.setJobGroup(tag, description, interruptOnCancel=True)
        return self._sc.parallelize(range(n), n).barrier().mapPartitions(_rdd_partition(run_slot)).collect()

    def run_cluster_stage(self, n: int, run_slot: Callable[[int, str, int], list[tuple]], tag: str,
                          description: str) -> list[tuple]:
        """The barrier stage of a job whose JobMaster runs in task 0 (cluster/in_cluster.py):
        followed by a shuffle, so it is a ShuffleMapStage that Spark re-runs when a task fails."""
        self._sc.setJobGroup(tag, description, interruptOnCancel=True)
        return (self._sc.parallelize(range(n), n).barrier().mapPartitions(_rdd_partition(run_slot, with_tid=True))
                .repartition(1).collect())

    def cancel(self, tag: str) -> None:
        self._sc.cancelJobGroup(tag)

    def active_jobs(self) -> str:
        return str(self._sc.statusTracker().getActiveJobsIds())

    def run_probe(self, probe: Callable[[Iterable], list], _arrow_probe, tasks: int) -> list:
        """Run the pre-flight probe (api/preflight.py) in `tasks` tasks; its rows."""
        return self._sc.parallelize(range(tasks), tasks).mapPartitions(probe).collect()

    def ship(self, zip_path: str) -> str:
        self._sc.addPyFile(zip_path)
        return "SparkContext.addPyFile"

    @property
    def python(self) -> str | None:
        return getattr(self._sc, "pythonExec", None)


class ConnectBridge:
    kind = "connect"

    def __init__(self, spark):
        self.spark = spark

    @property
    def master(self) -> str:
        return self.conf("spark.master", "") or ""

    def check_reachable(self, timeout: float = CONNECT_TIMEOUT) -> None:
        """ConfigurationError naming the server if it does not answer within `timeout` s (the
        client would otherwise retry for minutes before the first Spark job)."""
        import concurrent.futures
        import threading

        from streamsnap.errors import ConfigurationError

        answer: concurrent.futures.Future = concurrent.futures.Future()

        def ask():
            try:
                answer.set_result(self.master)
            except BaseException as exc:  # handed to the caller below
                answer.set_exception(exc)
        # A daemon thread: a client retrying against a dead server must not hold the process at exit.
        threading.Thread(target=ask, name="connect-check", daemon=True).start()
        where = getattr(getattr(self.spark.client, "_builder", None), "endpoint", "the Spark Connect server")
        try:
            answer.result(timeout)
        except concurrent.futures.TimeoutError:
            raise ConfigurationError(
                f"the Spark Connect server at {where} did not answer within {timeout:g} s: is it running and "
                f"reachable from here? (start one with scripts/spark-connect, or check the sc:// URL)") from None
        except Exception as exc:
            raise ConfigurationError(f"the Spark Connect server at {where} could not be asked for its settings: "
                                     f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc

    def conf(self, key: str, default: str | None = None) -> str | None:
        return self.spark.conf.get(key, default)

    @property
    def identity(self) -> str:
        return f"connect:{self.spark.session_id}"

    def default_parallelism(self) -> int | None:
        """Task slots of the cluster behind the server, as its settings state them (a Connect
        client cannot ask the scheduler): spark.default.parallelism, else spark.cores.max, else
        spark.executor.instances x spark.executor.cores; None when none of them is set."""
        for key in ("spark.default.parallelism", "spark.cores.max"):
            value = self.conf(key, None)
            if value:
                return int(value)
        instances, cores = self.conf("spark.executor.instances", None), self.conf("spark.executor.cores", None)
        return int(instances) * int(cores) if instances and cores else None

    def run_barrier_stage(self, n: int, run_slot: Callable[[int, str], list[tuple]], tag: str,
                          description: str) -> list[tuple]:
        self.spark.addTag(tag)   # this thread's operations carry it: cancel(tag) interrupts them
        try:
            rows = (self.spark.range(0, n, 1, n)
                    .mapInArrow(_arrow_partition(run_slot), OUTCOME_SCHEMA, barrier=True).collect())
        finally:
            self.spark.removeTag(tag)
        return [tuple(row) for row in rows]

    def run_cluster_stage(self, n: int, run_slot: Callable[[int, str, int], list[tuple]], tag: str,
                          description: str) -> list[tuple]:
        self.spark.addTag(tag)
        try:
            rows = (self.spark.range(0, n, 1, n)
                    .mapInArrow(_arrow_partition(run_slot, with_tid=True), CLUSTER_OUTCOME_SCHEMA, barrier=True)
                    .repartition(1).collect())
        finally:
            self.spark.removeTag(tag)
        return [tuple(row) for row in rows]

    def cancel(self, tag: str) -> None:
        self.spark.interruptTag(tag)

    def active_jobs(self) -> str:
        return "not visible from a Spark Connect client"

    def run_probe(self, _probe, arrow_probe: Callable[[Iterator], Iterator], tasks: int) -> list:
        schema = "status string, error string, executable string, version string"
        rows = self.spark.range(0, tasks, 1, tasks).mapInArrow(arrow_probe, schema).collect()
        return [tuple(row) for row in rows]

    def ship(self, zip_path: str) -> str:
        self.spark.addArtifacts(zip_path, pyfile=True)
        return "SparkSession.addArtifacts(pyfile=True)"

    @property
    def python(self) -> str | None:
        return self.conf("spark.pyspark.python", None)


def bridge_for(spark) -> ClassicBridge | ConnectBridge:
    return ConnectBridge(spark) if is_connect(spark) else ClassicBridge(spark)


def _task_host(context, slot: int) -> str:
    """"host" of this task's executor, as its Worker advertises it (SPARK_LOCAL_IP/--host, which
    the executor and its Python workers inherit), else as the driver saw the executor: a client-mode
    executor's address there is the source of its connection, 127.0.0.1 for every loopback alias."""
    from streamsnap.network.addresses import advertised_host

    return advertised_host(context.getTaskInfos()[slot].address.rsplit(":", 1)[0])


def _slot_args(context, with_tid: bool) -> tuple:
    """(slot, host[, Spark task id]) of the running barrier task."""
    slot = context.partitionId()
    args = (slot, _task_host(context, slot))
    return (*args, context.taskAttemptId(), len(context.getTaskInfos())) if with_tid else args


def _rdd_partition(run_slot, with_tid: bool = False):
    def run(_iterator):
        from pyspark import BarrierTaskContext

        yield from run_slot(*_slot_args(BarrierTaskContext.get(), with_tid))
    return run


def _arrow_partition(run_slot, with_tid: bool = False):
    def run(batches: Iterator):
        import pyarrow as pa
        from pyspark import BarrierTaskContext

        for _ in batches:   # the partition's one row: which slot it is comes from the context
            pass
        outcomes = list(run_slot(*_slot_args(BarrierTaskContext.get(), with_tid)))
        columns = [pa.array([int(o[0]) for o in outcomes], pa.int64()), pa.array([str(o[1]) for o in outcomes]),
                   pa.array([str(o[2]) for o in outcomes])]
        names = list(OUTCOME_COLUMNS)
        if with_tid:
            columns.append(pa.array([o[3] for o in outcomes], pa.binary()))
            names.append("payload")
        yield pa.RecordBatch.from_arrays(columns, names=names)
    return run


__all__ = ["ClassicBridge", "ConnectBridge", "bridge_for", "is_connect", "is_session", "OUTCOME_COLUMNS"]
