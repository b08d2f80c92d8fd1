"""StreamEnvironment: where a pipeline is defined and executed (Flink's StreamExecutionEnvironment).

Configuration is validated in the constructor; the pipeline is validated as it is built and
again, as a whole, at `execute()` — before anything is submitted to Spark.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys

from streamsnap.api.config import CheckpointConfig, NetworkConfig, RestartStrategy, validate_state_backend
from streamsnap.api import preflight
from streamsnap.api.datastream import DataStream
from streamsnap.api.result import JobClient, JobResult
from streamsnap.errors import ConfigurationError
from streamsnap.graph.execution_graph import build_execution_graph
from streamsnap.graph.slot_sharing import plan_slots
from streamsnap.graph.ids import check_job_id, job_id_for_name
from streamsnap.graph.job_graph import build_job_graph
from streamsnap.graph.stream_graph import NodeKind, StreamGraph

log = logging.getLogger(__name__)

MAX_MAX_PARALLELISM = 32768
# Tests set this to a JSON object of task-side test hooks (slow a subtask down, delay phases).
TEST_HOOKS_ENV = "STREAMSNAP_TEST_HOOKS"
# Set by `streamsnap run --from PATH`: the restore point for jobs that do not name one, and
# where finished jobs' results are reported back to the CLI for its summary.
CLI_DEFAULTS: dict = {"restore_from": None, "allow_non_restored_state": False}


def _use_checkpoint_storage(checkpointing: CheckpointConfig) -> None:
    """Fail here when this Python cannot open the checkpoint directory's protocol; else let
    every checkpoint file of this process open with the config's storage options (the
    executors get them with the deployment)."""
    from streamsnap.checkpoint import filesystem

    directory = checkpointing.directory
    assert directory is not None, "checked by the caller"
    problem = filesystem.missing_implementation(directory)
    if problem is not None:
        raise ConfigurationError(f"CheckpointConfig.directory {directory!r} cannot be used: {problem}")
    filesystem.configure(directory, checkpointing.storage_options)


def _check_local_recovery(enabled, directory, checkpointing) -> tuple[bool, str | None]:
    from streamsnap.state.local_recovery import check_directory_option

    if not isinstance(enabled, bool):
        raise ConfigurationError(f"StreamEnvironment.local_recovery must be True or False, got {enabled!r}")
    directory = check_directory_option(directory)
    if enabled and checkpointing is None:
        raise ConfigurationError("StreamEnvironment.local_recovery=True needs checkpointing: the local "
                                 "copies are of checkpoints; pass checkpointing=CheckpointConfig(...) or "
                                 "leave local_recovery=False")
    if directory is not None and not enabled:
        raise ConfigurationError("StreamEnvironment.local_recovery_dir is set but local_recovery is False; "
                                 "pass local_recovery=True to keep local copies there")
    return enabled, directory


class StreamEnvironment:
    """Defines a streaming job and runs it on Spark.

    parallelism: default parallelism of every operator (sources from collections use 1).
    max_parallelism: number of key groups; the upper bound for rescaling keyed state.
    checkpointing: a CheckpointConfig, or None for no checkpoints (and no exactly-once).
    state_backend: "hashmap" (keyed state on the heap), "rocksdb" (keyed state in an embedded
      RocksDB per subtask, needs the rocksdict package), or a RocksDBConfig to size the RocksDB
      backend's memory (block cache, write buffers), choose its local directory, and turn on
      changelog checkpoints (`RocksDBConfig(changelog=True)` or a ChangelogConfig).
    restart: what to do when a task fails; default: no restarts without checkpointing,
      RestartStrategy.fixed_delay(3, 1.0) with it.
    spark: a SparkSession, classic or Spark Connect; None uses the active one or starts an
      embedded local[N] session.
    network: data-plane tuning (buffer timeout, batch size, flow-control credits).
    auto_watermark_interval: seconds (or timedelta) between periodic watermark emissions of
      sources and timestamp assigners (Flink's auto-watermark interval); 0 disables periodic
      emission (only generators that emit per event then advance event time).
    local_recovery: task-local recovery — every keyed snapshot of a checkpoint is also kept on
      the task's local disk, and a restarted subtask restores from those copies, reading from
      checkpoint storage only what is missing or corrupt (see `streamsnap.state.local_recovery`).
      Needs checkpointing.
    local_recovery_dir: the local directory for those copies; None: under the executor's
      scratch directory (SPARK_LOCAL_DIRS), else the system temp directory.
    slot_sharing: Flink's slot sharing — Spark task slot i runs subtask i of every operator, so
      a job needs as many slots as its largest parallelism (each subtask still gets a process
      of its own). False: one slot per subtask (the sum of all operators' parallelism).
    web: the job's REST API, Prometheus `/metrics` and web UI, served from the driver while it
      runs. True (the default): on 127.0.0.1, a free port, its URL logged at INFO and printed on
      a terminal as the job is submitted (`JobClient.web_url`, `.ui_url`); an ss.WebConfig to
      choose port, address and token; False (or None) serves nothing. A JobMaster in the cluster
      (job_master="cluster") serves only with an explicit WebConfig.
    job_master: where the job's JobMaster (checkpoint coordinator, restarts) runs — "cluster":
      inside the job's own barrier stage, hosted by its task 0, so nothing in the cluster
      connects back to this process and Spark's stage retry restarts it if its process dies;
      "client": in this process. None (the default): "cluster" for Spark Connect sessions with
      checkpointing, else "client" (docs/architecture/deployment-decision.md). "cluster" needs checkpointing:
      the job's registry lives in its checkpoint directory.
    log_level: "DEBUG", "INFO", "WARNING" (default) or "ERROR": the tasks' log level; their
      records at it and above reach the driver's `logging` under `streamsnap.task.<task>.<subtask>`
      (`streamsnap.runtime.log_relay`).
    """

    def __init__(self, parallelism: int = 2, *, max_parallelism: int = 128,
                 checkpointing: CheckpointConfig | None = None, state_backend="hashmap",
                 restart: RestartStrategy | None = None, spark=None, network: NetworkConfig | None = None,
                 buffer_timeout: float | None = None, log_level: str = "WARNING",
                 auto_watermark_interval=0.2, local_recovery: bool = False,
                 local_recovery_dir: str | None = None, slot_sharing: bool = True, web=True,
                 job_master: str | None = None):
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
            raise ConfigurationError(f"StreamEnvironment.parallelism must be an integer >= 1, got {parallelism!r}")
        if (isinstance(max_parallelism, bool) or not isinstance(max_parallelism, int)
                or not 1 <= max_parallelism <= MAX_MAX_PARALLELISM):
            raise ConfigurationError(
                f"StreamEnvironment.max_parallelism must be an integer in 1..{MAX_MAX_PARALLELISM}, "
                f"got {max_parallelism!r}")
        if max_parallelism < parallelism:
            raise ConfigurationError(
                f"StreamEnvironment.max_parallelism ({max_parallelism}) must be >= parallelism ({parallelism}): "
                f"it is the number of key groups, and every subtask needs at least one")
        if checkpointing is not None and not isinstance(checkpointing, CheckpointConfig):
            raise ConfigurationError(
                f"StreamEnvironment.checkpointing must be a CheckpointConfig or None, got {type(checkpointing).__name__}")
        if checkpointing is not None and checkpointing.directory is None:
            raise ConfigurationError(
                "CheckpointConfig.directory is required: where checkpoints are written "
                "(a local path or fsspec URL such as file:///tmp/ckpt or s3://bucket/ckpt)")
        if checkpointing is not None:
            _use_checkpoint_storage(checkpointing)
        self.local_recovery, self.local_recovery_dir = _check_local_recovery(
            local_recovery, local_recovery_dir, checkpointing)
        if not isinstance(slot_sharing, bool):
            raise ConfigurationError(f"StreamEnvironment.slot_sharing must be True or False, got {slot_sharing!r}")
        self.slot_sharing = slot_sharing
        state_backend = validate_state_backend(state_backend)
        if state_backend != "hashmap":
            from streamsnap.state.backends.rocksdb.config import import_rocksdict
            import_rocksdict()      # fail here, on the driver, not later inside a Spark task
        if restart is not None and not isinstance(restart, RestartStrategy):
            raise ConfigurationError(f"StreamEnvironment.restart must be a RestartStrategy, got {restart!r}")
        if network is not None and not isinstance(network, NetworkConfig):
            raise ConfigurationError(f"StreamEnvironment.network must be a NetworkConfig, got {network!r}")
        network = network or NetworkConfig()
        if buffer_timeout is not None:
            network = dataclasses.replace(network, buffer_timeout=buffer_timeout)
        if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigurationError(f"StreamEnvironment.log_level must be DEBUG, INFO, WARNING or ERROR, got {log_level!r}")
        from streamsnap.cluster.spark_bridge import is_session

        if spark is not None and not is_session(spark):
            raise ConfigurationError(
                f"StreamEnvironment.spark must be a SparkSession (classic, or Spark Connect from "
                f"SparkSession.builder.remote(...)), got {type(spark).__module__}.{type(spark).__name__}")
        from streamsnap.web.config import WebConfig

        if web is not None and not isinstance(web, (WebConfig, bool)):
            raise ConfigurationError(f"StreamEnvironment.web must be True (a UI on 127.0.0.1, the default), False "
                                     f"(none) or an ss.WebConfig(port=..., bind=..., token=...), got {web!r}")
        # True: the default UI of a JobMaster in this process; a cluster JobMaster's needs a WebConfig.
        self._web_by_default = web is True
        self.web = WebConfig() if web is True else (web or None)
        if job_master not in (None, "client", "cluster"):
            raise ConfigurationError(f"StreamEnvironment.job_master must be 'client', 'cluster' or None, got {job_master!r}")
        if job_master == "cluster" and checkpointing is None:
            raise ConfigurationError(
                "StreamEnvironment(job_master='cluster') needs checkpointing=CheckpointConfig(directory=...): the "
                "job's registry and its restarts live in the checkpoint directory (use job_master='client' without)")
        self.job_master = job_master
        from streamsnap.time.durations import to_millis

        self.auto_watermark_interval = to_millis(auto_watermark_interval,
                                                 "StreamEnvironment.auto_watermark_interval") / 1000.0
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.checkpointing = checkpointing
        self.state_backend = state_backend
        if restart is None:
            restart = RestartStrategy.fixed_delay(3, 1.0) if checkpointing else RestartStrategy.none()
        self.restart = restart
        self.network = network
        self.log_level = log_level
        self._spark = spark
        self._graph = StreamGraph()

    # ------------------------------------------------------------------ sources
    def _check_parallelism(self, value, what: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"{what} must be an integer >= 1, got {value!r}")
        if value > self.max_parallelism:
            raise ConfigurationError(f"{what} ({value}) exceeds max_parallelism ({self.max_parallelism})")

    def from_source(self, source, *, name: str | None = None, uid: str | None = None,
                    parallelism: int | None = None, watermark_strategy=None) -> DataStream:
        """A stream of the source's rows.

        watermark_strategy: an ss.WatermarkStrategy for event time; each split of the source
          gets its own watermark generator, the source's watermark is their minimum. None (or
          WatermarkStrategy.no_watermarks()): the source's own strategy if it has one (e.g. a
          table source's `event_time=` column), else no event-time progress until a bounded
          source ends (then every event-time timer fires).
        """
        from streamsnap.api.datastream import check_watermark_strategy
        from streamsnap.connectors.base import Source, SourceOperatorFactory

        if not isinstance(source, Source):
            raise ConfigurationError(
                f"from_source takes a source such as ss.sources.Generator(...), got {source!r}")
        source.validate()
        if watermark_strategy is None:
            watermark_strategy = source.default_watermark_strategy()
        if watermark_strategy is not None:
            check_watermark_strategy(watermark_strategy, source.schema,
                                     f"from_source '{name or type(source).__name__}'")
        parallelism = self.parallelism if parallelism is None else parallelism
        self._check_parallelism(parallelism, f"parallelism of source '{name or 'Source'}'")
        label = f"Source: {name}" if name else "Source"
        factory = SourceOperatorFactory(source, watermark_strategy, self.auto_watermark_interval)
        node = self._graph.add_node(NodeKind.SOURCE, label, uid, factory,
                                    parallelism, self.max_parallelism, source.schema)
        node.schema_mode = source.schema_mode   # declared, inferred or widen (runtime/schemas.py)
        if watermark_strategy is not None:
            node.timestamps = watermark_strategy.timestamp_assigner
        return DataStream(self, (node,))

    def from_collection(self, rows: list, schema=None, *, name: str | None = None,
                        uid: str | None = None) -> DataStream:
        """A bounded stream of the given rows (dicts), in order, from one subtask."""
        from streamsnap.connectors.sources import CollectionSource

        return self.from_source(CollectionSource(rows, schema), name=name or "collection", uid=uid,
                                parallelism=1)

    def read_files(self, path: str, format: str = "parquet", *, name: str | None = None, uid: str | None = None,
                   parallelism: int | None = None, schema=None, monitor_interval: float | None = None,
                   batch_size: int = 4096, csv_options: dict | None = None) -> DataStream:
        """Rows of the Parquet / JSON-lines / CSV files in a directory (fsspec URL or local path).

        format: "parquet", "jsonl" or "csv" (with a header row). Every visible file directly in
        the directory is read (names starting with "." or "_" are skipped). Without
        `monitor_interval` the stream is bounded: the files present now are read, then it ends.
        With it, the directory is listed every `monitor_interval` seconds and new files are
        read as they appear (unbounded); writers must move complete files in atomically
        (rename). Exactly-once: each file's read position is checkpointed. See
        `streamsnap.connectors.files.FileSource`.
        """
        from streamsnap.connectors.files import FileSource

        source = FileSource(path, format, schema=schema, monitor_interval=monitor_interval,
                            batch_size=batch_size, csv_options=csv_options)
        return self.from_source(source, name=name or "files", uid=uid, parallelism=parallelism)

    def from_dataframe(self, df, *, name: str | None = None, uid: str | None = None,
                       parallelism: int | None = None, batch_size: int = 4096,
                       staging_dir: str | None = None) -> DataStream:
        """A bounded stream of a Spark DataFrame's rows, read in parallel and replayable.

        The DataFrame is written once as Parquet (one file per partition) when the job executes,
        into the job's checkpoint storage (`<dir>/<job id>/inputs/`; without checkpointing into
        `staging_dir` or a local temporary directory); its files are then the splits of a bounded
        file source, each checkpointed with its row position, so a restore continues exactly
        where the checkpoint left off. See `streamsnap.connectors.dataframes`.
        """
        from streamsnap.connectors.dataframes import DataFrameSource

        label = name or "dataframe"
        return self._from_data(DataFrameSource(df, name=label, batch_size=batch_size, staging_dir=staging_dir),
                               label, uid, parallelism)

    def from_arrow(self, table, *, name: str | None = None, uid: str | None = None,
                   parallelism: int | None = None, splits: int | None = None, batch_size: int = 4096,
                   staging_dir: str | None = None) -> DataStream:
        """A bounded stream of a pyarrow Table's rows, cut into `splits` ranges (default: one per
        subtask) written as Parquet files when the job executes; otherwise as `from_dataframe`."""
        from streamsnap.connectors.dataframes import DataFrameSource

        label = name or "arrow"
        return self._from_data(DataFrameSource(table, name=label, batch_size=batch_size, splits=splits,
                                               staging_dir=staging_dir), label, uid, parallelism)

    def _from_data(self, source, name: str, uid: str | None, parallelism: int | None) -> DataStream:
        source.parallelism = self.parallelism if parallelism is None else parallelism
        return self.from_source(source, name=name, uid=uid, parallelism=parallelism)

    # ------------------------------------------------------------------ execution
    def _plan(self, job_name: str):
        self._graph.job_name = job_name
        job_graph = build_job_graph(self._graph)
        return build_execution_graph(job_graph)

    def explain(self) -> str:
        """The tasks and channels this pipeline would run as (after chaining)."""
        eg = self._plan(self._graph.job_name)
        lines = []
        for vertex in eg.job_graph.vertices.values():
            outs = ", ".join(f"{e.partitioner} -> {eg.job_graph.vertices[e.target_vertex].name}" for e in vertex.outputs)
            lines.append(f"[{vertex.parallelism}x] {vertex.name}" + (f"  => {outs}" if outs else ""))
        return "\n".join(lines)

    def _start(self, job_name: str, restore_from: str | None, allow_non_restored_state: bool,
               job_id: str | None = None, detached: bool = False):
        if restore_from is None and CLI_DEFAULTS.get("restore_from"):
            restore_from = CLI_DEFAULTS["restore_from"]
            allow_non_restored_state = allow_non_restored_state or CLI_DEFAULTS["allow_non_restored_state"]

        if not isinstance(job_name, str) or not job_name:
            raise ConfigurationError(f"execute() needs a job name, got {job_name!r}")
        job_id = check_job_id(job_id) if job_id is not None else job_id_for_name(job_name)
        execution_graph = self._plan(job_name)
        restored_uids: set[str] = set()
        if restore_from is not None:
            if not isinstance(restore_from, str) or not restore_from:
                raise ConfigurationError(f"restore_from must be a checkpoint or savepoint path, got {restore_from!r}")
            from streamsnap.checkpoint.metadata import read_metadata
            from streamsnap.checkpoint.restore import plan_restore
            from streamsnap.checkpoint.storage import resolve_restore_path

            metadata_url, base = resolve_restore_path(restore_from)
            # Fail now, not in a Spark task, if the state does not fit this job.
            metadata = read_metadata(metadata_url)
            plan_restore(metadata, base, execution_graph.job_graph, allow_non_restored_state)
            restored_uids = set(metadata.operators)
        elif self.checkpointing is not None and self.checkpointing.resume == "latest" \
                and self.checkpointing.directory is not None:
            # A new run of a job whose driver died resumes its own output (cluster/jobmaster.py).
            # Its latest restore point: the newest chk-<n>, or a stop-with-savepoint it recorded.
            from streamsnap.checkpoint.metadata import read_metadata
            from streamsnap.checkpoint import filesystem
            from streamsnap.checkpoint.storage import METADATA_FILE_NAME, CheckpointStorage, latest_restore_point

            resumed = latest_restore_point(CheckpointStorage(self.checkpointing.directory, job_id).job_directory)
            if resumed is not None:
                restored_uids = set(read_metadata(filesystem.join(resumed, METADATA_FILE_NAME)).operators)
        # Directories, pickling, sink output: before any Spark job (api/preflight.py).
        preflight.run(self._graph, self.checkpointing, restored_uids)
        web = None
        # A JobMaster in the cluster serves its own UI; an embedded session is classic: client.
        in_cluster = self._job_master_in_cluster(self._spark) if self._spark is not None else self.job_master == "cluster"
        if self.web is not None and not detached and not in_cluster:
            from streamsnap.web.rest import WebServer

            # Listening now, before a cold Spark session takes its seconds: the URL is printed at
            # once and the page says what the job waits for. A taken port fails here.
            web = WebServer(self.web)
            web.starting(job_id, job_name, execution_graph, self.checkpointing is not None,
                         "starting Spark" if self._spark is None and not _spark_active() else "deploying")
            _announce_web(job_name, web.ui_url)
        try:
            return self._start_with(job_name, job_id, execution_graph, restore_from, allow_non_restored_state,
                                    restored_uids, detached, web)
        except BaseException:
            if web is not None:
                web.close()
            raise

    def _start_with(self, job_name, job_id, execution_graph, restore_from, allow_non_restored_state, restored_uids,
                    detached, web):
        from streamsnap.cluster.jobmaster import JobMaster, JobSettings
        from streamsnap.cluster.spark_session import align_executor_python, embedded_session, require_slots

        slots = len(plan_slots(execution_graph, self.slot_sharing))
        spark = self._spark or embedded_session(slots)
        from streamsnap.cluster.spark_bridge import ConnectBridge, is_connect

        if is_connect(spark):
            ConnectBridge(spark).check_reachable()   # a silent server fails here, not after minutes
        require_slots(spark, slots, execution_graph.num_tasks)
        if self._spark is not None:
            align_executor_python(spark)       # a user's session: its workers' Python, as meant
            preflight.check_executors(spark)   # can executors import us?
        # After every check: a failed one leaves no copy of a DataFrame behind.
        self._prepare_sources(job_id, restored_uids)
        hooks = json.loads(os.environ.get(TEST_HOOKS_ENV, "{}"))
        settings = JobSettings(job_name, self.checkpointing, self.restart, self.network, self.state_backend,
                               restore_from, allow_non_restored_state, self.log_level, hooks, job_id=job_id,
                               local_recovery=self.local_recovery,
                               local_recovery_dir=self.local_recovery_dir, slot_sharing=self.slot_sharing)
        if detached:
            self._check_detachable(spark)
        if detached or self._job_master_in_cluster(spark):
            if web is not None:   # decided before the session existed; its JobMaster serves the UI
                web.close()
            return self._start_in_cluster(spark, execution_graph, settings, detached), None
        master = JobMaster(spark, execution_graph, settings)
        master.start()
        if web is not None:
            web.serve(master)
        if CLI_DEFAULTS.get("on_job_started"):   # `streamsnap run`: its live status line
            CLI_DEFAULTS["on_job_started"](master)
        return master, web

    def _job_master_in_cluster(self, spark) -> bool:
        from streamsnap.cluster.spark_bridge import is_connect

        if self.job_master is not None:
            return self.job_master == "cluster"
        return is_connect(spark) and self.checkpointing is not None

    def _check_detachable(self, spark) -> None:
        from streamsnap.cluster.spark_bridge import is_connect

        if not is_connect(spark):
            raise ConfigurationError(
                "execute_async(detached=True) needs a Spark Connect session: a classic session's jobs run in its "
                "driver, this process. To detach on a classic cluster submit the job file itself: "
                "spark-submit --deploy-mode cluster --supervise $(which streamsnap) run job.py")
        if self.job_master == "client" or self.checkpointing is None:
            raise ConfigurationError(
                "a detached job's JobMaster runs in the cluster: it needs checkpointing=CheckpointConfig(directory=...) "
                "and job_master='cluster' (or None)")

    def _start_in_cluster(self, spark, execution_graph, settings, detached: bool = False):
        """Submit the job with its JobMaster in task 0 of its barrier stage (cluster/in_cluster.py)."""
        import dataclasses
        import uuid

        from streamsnap.cluster.in_cluster import ClusterJob
        from streamsnap.cluster.jobmaster import new_deployment
        from streamsnap.cluster.spark_session import is_local
        from streamsnap.cluster.submitter import SubmittedJob
        from streamsnap.network import auth

        local = is_local(spark)
        # Served by the JobMaster, in the cluster: only when asked for (its loopback is the executor's).
        settings = dataclasses.replace(settings, web=None if self._web_by_default else self.web)
        template = new_deployment(settings.job_id, uuid.uuid4().hex[:12], settings, execution_graph, auth.new_secret(),
                                  plan_slots(execution_graph, self.slot_sharing), local)
        directory = self.checkpointing.directory if self.checkpointing is not None else None
        if directory is None:   # StreamEnvironment(job_master="cluster") refused this already
            raise ConfigurationError("a JobMaster in the cluster needs CheckpointConfig(directory=...)")
        job = ClusterJob(template, settings, directory, local)
        _refuse_running_twice(job.registry)
        if detached:
            from streamsnap.cluster.detached import launch

            return launch(spark, job, settings.job_name)
        submitted = SubmittedJob(spark, job, settings.job_name)
        submitted.start()
        if CLI_DEFAULTS.get("on_job_started"):   # `streamsnap run`: its live status line
            CLI_DEFAULTS["on_job_started"](submitted)
        return submitted

    def _prepare_sources(self, job_id: str, restored_uids: set[str]) -> None:
        """Let sources write what their readers need (DataFrames: a Parquet copy) into the job's
        directory in checkpoint storage, where every Spark task can read it; a source whose
        state is restored reads the files its checkpointed splits name."""
        job_directory = None
        if self.checkpointing is not None and self.checkpointing.directory is not None:
            from streamsnap.checkpoint.storage import CheckpointStorage

            job_directory = CheckpointStorage(self.checkpointing.directory, job_id).job_directory
        for node in self._graph.nodes.values():
            source = getattr(node.operator, "source", None)
            if source is not None:
                source.prepare(job_directory, node.uid in restored_uids)

    def execute(self, job_name: str = "streamsnap job", *, restore_from: str | None = None,
                allow_non_restored_state: bool = False, job_id: str | None = None) -> JobResult:
        """Run the job and block until it ends; returns its JobResult or raises JobExecutionError.

        job_id: the job's identity across runs (default: derived from `job_name`); it names the
        job's directory under `CheckpointConfig.directory`, so running the same job again after
        its driver died resumes from its latest checkpoint (see `CheckpointConfig.resume`).
        """
        if CLI_DEFAULTS.get("detached"):    # `streamsnap run --detach`: submit, report, do not wait
            raise DetachedSubmission(self.execute_async(
                job_name, restore_from=restore_from, allow_non_restored_state=allow_non_restored_state, job_id=job_id,
                detached=True))
        master, _web = self._start(job_name, restore_from, allow_non_restored_state, job_id)
        try:
            result = master.wait()
            if "results" in CLI_DEFAULTS:
                CLI_DEFAULTS["results"].append(result)
            return result
        except KeyboardInterrupt:
            master.cancel()
            master.wait_terminal(30)
            raise

    def execute_async(self, job_name: str = "streamsnap job", *, restore_from: str | None = None,
                      allow_non_restored_state: bool = False, job_id: str | None = None,
                      detached: bool = False) -> JobClient:
        """Start the job and return a JobClient to watch and control it (arguments as `execute`).

        detached: the job outlives this process (Spark Connect sessions only): a submitter in
        the cluster owns its Spark job, and the call returns once the job is RUNNING. Find it
        again with `ss.jobs.list(directory)` / `ss.jobs.attach(directory, job_id)` or the CLI
        (`streamsnap list DIR`, `savepoint`, `stop`, `cancel`)."""
        if not isinstance(detached, bool):
            raise ConfigurationError(f"execute_async(detached=...) must be True or False, got {detached!r}")
        master, web = self._start(job_name, restore_from, allow_non_restored_state, job_id, detached)
        return JobClient(master, web)


class DetachedSubmission(BaseException):
    """`execute()` under `streamsnap run --detach`, once the job runs detached: the job file
    stops there (its job now belongs to the cluster) and the CLI reports the job. A
    BaseException, so a job file's own `except Exception` does not swallow it."""

    def __init__(self, client: JobClient):
        super().__init__(client.job_id)
        self.client = client


def _spark_active() -> bool:
    """Whether a SparkSession is already up in this process (else the job waits for one to start)."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() is not None


def _announce_web(job_name: str, url: str) -> None:
    """Say where the job's UI is: `streamsnap run`'s console, else the log (INFO) and a terminal."""
    log.info("job '%s': web UI at %s", job_name, url)
    if CLI_DEFAULTS.get("on_web_url"):
        CLI_DEFAULTS["on_web_url"](job_name, url)
    elif sys.stderr is not None and sys.stderr.isatty():
        print(f"streamsnap: job '{job_name}' web UI at {url}", file=sys.stderr, flush=True)


def _refuse_running_twice(registry) -> None:
    """A second submission of a job whose JobMaster still answers is refused: one job id, one
    leader (a dead one's record says RUNNING too, so ask its control port)."""
    from streamsnap.cluster.registry import TERMINAL
    from streamsnap.cluster.submitter import RemoteJob

    record = registry.read()
    if record is None or record.get("status") in TERMINAL or "control" not in record:
        return
    try:
        status = RemoteJob(registry).call("describe", timeout=5.0)["status"]
    except Exception as exc:   # nobody answers: the old run is gone, its record is stale
        log.info("job %s: earlier record in %s is stale (%s)", registry.job_id, registry, exc)
        return
    raise ConfigurationError(
        f"job {registry.job_id} is already running ({status}, epoch {record.get('epoch')}, JobMaster at "
        f"{record['control'][0]}:{record['control'][1]}) under {registry}: cancel it first "
        f"(`streamsnap cancel DIR {registry.job_id}`) or give this run another job_id")
