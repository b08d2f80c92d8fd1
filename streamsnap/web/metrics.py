"""Prometheus `/metrics` for one job, with Flink's metric names where Flink has them.

A collector reads each job's sample and checkpoint stats at scrape time (nothing is updated
in between); each job has its own CollectorRegistry, never the process-global one, so several
jobs in one process (tests, notebooks) do not collide. Like Flink's Prometheus reporter every
figure is a gauge; durations are milliseconds, timestamps epoch milliseconds, sizes bytes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from streamsnap.checkpoint.stats import CheckpointStatsSnapshot
from streamsnap.web.progress import JobSample

JOB_LABELS = ["job", "job_id"]


def _gauge(name: str, documentation: str, value: float, job: list[str]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=JOB_LABELS)
    family.add_metric(job, value)
    return family


def job_families(sample: JobSample) -> list[GaugeMetricFamily]:
    job = [sample.name, sample.job_id]
    families = [
        _gauge("uptime", "Milliseconds since the job was submitted.", sample.uptime * 1000, job),
        _gauge("numRestarts", "Restarts (full failovers) of the job so far.", sample.restarts, job),
    ]
    labels = JOB_LABELS + ["operator", "operator_uid", "subtask"]
    # Per operator subtask: (name, help, the OperatorSample field holding {subtask index: value}).
    per_subtask = [GaugeMetricFamily(name, documentation, labels=labels) for name, documentation in [
        ("numRecordsIn", "Records the operator subtask received in the current attempt (since the checkpoint "
                         "it restored)."),
        ("numRecordsOut", "Records the operator subtask emitted in the current attempt."),
        ("currentInputWatermark", "Event time (epoch ms) the operator subtask was last told; Long.MIN_VALUE "
                                  "while there is none."),
        ("currentOutputWatermark", "Event time (epoch ms) the operator subtask last emitted; Long.MIN_VALUE "
                                   "while there is none.")]]
    fields = ("records_in", "records_out", "input_watermarks", "output_watermarks")
    rate_labels = JOB_LABELS + ["operator", "operator_uid"]
    rate_in = GaugeMetricFamily("numRecordsInPerSecond", "Records per second into the operator "
                                "(all subtasks) over the last poll interval.", labels=rate_labels)
    rate_out = GaugeMetricFamily("numRecordsOutPerSecond", "Records per second out of the operator "
                                 "(all subtasks) over the last poll interval.", labels=rate_labels)
    for vertex in sample.vertices:
        for op in vertex.operators:
            for family, name in zip(per_subtask, fields):
                for index, value in getattr(op, name).items():
                    family.add_metric(job + [op.name, op.uid, str(index)], value)
            rate_in.add_metric(job + [op.name, op.uid], op.records_in_per_second)
            rate_out.add_metric(job + [op.name, op.uid], op.records_out_per_second)
    task_labels = JOB_LABELS + ["task", "subtask"]
    bytes_in = GaugeMetricFamily("numBytesIn", "Network bytes the task subtask received.", labels=task_labels)
    bytes_out = GaugeMetricFamily("numBytesOut", "Network bytes the task subtask sent.", labels=task_labels)
    for vertex in sample.vertices:
        for index, value in vertex.bytes_in.items():
            bytes_in.add_metric(job + [vertex.id, str(index)], value)
        for index, value in vertex.bytes_out.items():
            bytes_out.add_metric(job + [vertex.id, str(index)], value)
    shares = {key: GaugeMetricFamily(name, documentation, labels=task_labels) for key, name, documentation in [
        ("backpressured", "backPressuredTimeMsPerSecond", "Milliseconds per second the task subtask waited for "
         "room in a full output (downstream gave no credit), over the last poll interval."),
        ("idle", "idleTimeMsPerSecond", "Milliseconds per second the task subtask waited for input."),
        ("busy", "busyTimeMsPerSecond", "Milliseconds per second the task subtask was neither idle nor "
         "backpressured.")]}
    for vertex in sample.vertices:
        for index, values in vertex.time_shares.items():
            for key, family in shares.items():
                family.add_metric(job + [vertex.id, str(index)], values[key])
    return families + per_subtask + [rate_in, rate_out, bytes_in, bytes_out, *shares.values(),
                                     *rocksdb_families(sample, job)]


# RocksDB native metrics (Flink's state.backend.rocksdb.metrics.*), per operator subtask.
_ROCKSDB = [
    ("compactions_running", "rocksdbNumRunningCompactions", "Compactions RocksDB is running now."),
    ("compaction_pending", "rocksdbCompactionPending", "1 when RocksDB has at least one compaction to do."),
    ("pending_compaction_bytes", "rocksdbEstimatePendingCompactionBytes",
     "Bytes RocksDB estimates its pending compactions rewrite."),
    ("flushes_running", "rocksdbNumRunningFlushes", "Memtable flushes RocksDB is running now."),
    ("flush_pending", "rocksdbMemTableFlushPending", "1 when a memtable flush is pending."),
    ("live_sst_bytes", "rocksdbLiveSstFilesSize", "Bytes of the SST files of the current version."),
    ("estimate_keys", "rocksdbEstimateNumKeys", "RocksDB's estimate of its entries (all states)."),
    ("block_cache_bytes", "rocksdbBlockCacheUsage", "Bytes in RocksDB's block cache."),
    ("memtables_bytes", "rocksdbCurSizeAllMemTables", "Bytes in RocksDB's memtables."),
    ("write_cache_bytes", "rocksdbWriteCacheSize", "Bytes in streamsnap's write cache in front of RocksDB."),
]


def rocksdb_families(sample: JobSample, job: list[str]) -> list[GaugeMetricFamily]:
    labels = JOB_LABELS + ["operator", "operator_uid", "subtask"]
    families = {key: GaugeMetricFamily(name, documentation, labels=labels) for key, name, documentation in _ROCKSDB}
    for vertex in sample.vertices:
        for op in vertex.operators:
            for index, values in op.rocksdb.items():
                for key, family in families.items():
                    if key in values:
                        family.add_metric(job + [op.name, op.uid, str(index)], values[key])
    return [f for f in families.values() if f.samples]


def checkpoint_families(stats: CheckpointStatsSnapshot, job: list[str]) -> list[GaugeMetricFamily]:
    c = stats.counts
    latest = stats.latest_completed
    restored = stats.latest_restored
    families = [
        _gauge("totalNumberOfCheckpoints", "Checkpoints triggered (including savepoints).", c.triggered, job),
        _gauge("numberOfCompletedCheckpoints", "Checkpoints completed.", c.completed, job),
        _gauge("numberOfFailedCheckpoints", "Checkpoints failed or expired.", c.failed, job),
        _gauge("numberOfInProgressCheckpoints", "Checkpoints in progress.", c.in_progress, job),
        _gauge("lastCheckpointDuration", "End-to-end milliseconds of the latest completed checkpoint (-1: none).",
               latest.end_to_end_duration * 1000 if latest and latest.end_to_end_duration is not None else -1, job),
        _gauge("lastCheckpointSize", "Bytes the latest completed checkpoint wrote (incremental snapshots: "
               "their new files only; -1: none).", latest.checkpointed_size if latest else -1, job),
        _gauge("lastCheckpointFullSize", "Bytes the latest completed checkpoint references, files shared with "
               "earlier checkpoints included (-1: none).", latest.state_size if latest else -1, job),
        _gauge("lastCheckpointRestoreTimestamp", "Epoch milliseconds of the latest restore (-1: none).",
               restored.restore_timestamp * 1000 if restored else -1, job),
    ]
    alignment = GaugeMetricFamily("checkpointAlignmentTime", "Milliseconds the subtask aligned barriers for in "
                                  "the latest completed checkpoint.", labels=JOB_LABELS + ["task", "subtask"])
    start_delay = GaugeMetricFamily("checkpointStartDelayNanos", "Nanoseconds from the trigger to the first "
                                    "barrier at the subtask, latest completed checkpoint.",
                                    labels=JOB_LABELS + ["task", "subtask"])
    for s in latest.subtasks if latest else ():
        alignment.add_metric(job + [s.vertex_id, str(s.index)], s.alignment_duration * 1000)
        start_delay.add_metric(job + [s.vertex_id, str(s.index)], s.start_delay * 1e9)
    return families + [alignment, start_delay]


class _JobCollector(Collector):
    def __init__(self, endpoint):
        self._endpoint = endpoint

    def collect(self):
        sample = self._endpoint.sample()
        yield from job_families(sample)
        stats = self._endpoint.stats_or_none()
        if stats is not None:
            yield from checkpoint_families(stats, [sample.name, sample.job_id])


def metrics_registry(endpoints) -> CollectorRegistry:
    """The registry `/metrics` renders: the jobs of one server (`web.rest.JobEndpoint`s, or the
    `web.archive.ArchivedJob`s of a checkpoint directory)."""
    registry = CollectorRegistry(auto_describe=False)
    for endpoint in endpoints:
        registry.register(_JobCollector(endpoint))
    return registry
