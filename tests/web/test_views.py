"""The JSON views and Prometheus families, from plain stats values (no server, no Spark)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

import streamsnap as ss
from streamsnap.checkpoint.messages import CheckpointMetrics
from streamsnap.checkpoint.reasons import CheckpointFailureReason as R
from streamsnap.checkpoint.stats import CheckpointStatsTracker
from streamsnap.graph.ids import ExecutionAttemptId
from streamsnap.runtime.events import CheckpointType
from streamsnap.web import metrics, views
from streamsnap.web.progress import JobSample, OperatorSample, VertexSample

SRC0, SRC1 = ExecutionAttemptId("src", 0, 0), ExecutionAttemptId("src", 1, 0)
SUM0 = ExecutionAttemptId("sum", 0, 0)
VERTICES = [("src", "Source: events", 2), ("sum", "sum", 1)]


def history() -> CheckpointStatsTracker:
    """Checkpoint 1 completes in 2 s (30 bytes), 2 fails, 3 (unaligned) completes in 4 s (70
    bytes), savepoint 4 completes, 5 is in progress with one ack; restored from checkpoint 9."""
    t = CheckpointStatsTracker()
    t.report_restored(9, 50.0, "file:///ckpt/chk-9")
    t.report_pending(1, 100.0, CheckpointType.CHECKPOINT, 3)
    t.report_subtask(1, SRC0, 100.5, 10, CheckpointMetrics(0.010, 0.020, 0.0, 0.001))
    t.report_subtask(1, SRC1, 101.0, 10, CheckpointMetrics(0.012, 0.022, 0.0, 0.002))
    t.report_subtask(1, SUM0, 102.0, 10, CheckpointMetrics(0.1, 0.2, 0.3, 0.4, 1000, 0))
    t.report_completed(1, 102.0, 30, "file:///ckpt/chk-1")
    t.report_pending(2, 110.0, CheckpointType.CHECKPOINT, 3)
    t.report_failed(2, 111.0, R.CHECKPOINT_EXPIRED, "took too long")
    t.report_pending(3, 120.0, CheckpointType.CHECKPOINT, 3)
    t.report_subtask(3, SRC0, 121.0, 20, CheckpointMetrics())
    t.report_subtask(3, SRC1, 122.0, 20, CheckpointMetrics())
    t.report_subtask(3, SUM0, 124.0, 30, CheckpointMetrics(0.1, 0.2, 0.05, 0.5, 500, 4096, unaligned=True))
    t.report_completed(3, 124.0, 70, "file:///ckpt/chk-3")
    t.report_pending(4, 130.0, CheckpointType.SAVEPOINT, 3)
    t.report_completed(4, 131.0, 70, "file:///sp/savepoint-4")
    t.report_pending(5, 140.0, CheckpointType.CHECKPOINT, 3)
    t.report_subtask(5, SRC0, 140.5, 25, CheckpointMetrics())
    return t


def test_checkpoints_overview_counts_latest_summary_and_history():
    doc = views.checkpoints_overview(history().snapshot())
    assert doc["counts"] == {"total": 5, "triggered": 5, "in_progress": 1, "completed": 3, "failed": 1, "restored": 1,
                             "storage_retries": 0}
    assert [h["id"] for h in doc["history"]] == [5, 4, 3, 2, 1]
    assert [h["status"] for h in doc["history"]] == ["IN_PROGRESS", "COMPLETED", "COMPLETED", "FAILED", "COMPLETED"]
    latest = doc["latest"]
    assert latest["completed"]["id"] == 3 and latest["completed"]["end_to_end_duration"] == 4000
    assert latest["completed"]["trigger_timestamp"] == 120000 and latest["completed"]["latest_ack_timestamp"] == 124000
    assert latest["completed"]["unaligned"] is True and latest["completed"]["persisted_data"] == 4096
    assert latest["savepoint"]["id"] == 4 and latest["savepoint"]["is_savepoint"] is True
    assert latest["savepoint"]["external_path"] == "file:///sp/savepoint-4"
    assert latest["failed"]["id"] == 2 and latest["failed"]["failure_reason"] == "CHECKPOINT_EXPIRED"
    assert latest["failed"]["failure_message"] == "took too long"
    assert latest["restored"] == {"id": 9, "restore_timestamp": 50000, "is_savepoint": False,
                                  "external_path": "file:///ckpt/chk-9"}
    # durations 2000, 4000, 1000 ms; sizes 30, 70, 70 (the savepoint counts as completed)
    s = doc["summary"]
    assert (s["end_to_end_duration"]["min"], s["end_to_end_duration"]["max"]) == (1000, 4000)
    assert s["end_to_end_duration"]["avg"] == pytest.approx(7000 / 3, abs=1)
    assert s["end_to_end_duration"]["p50"] == 2000
    assert s["end_to_end_duration"]["p99"] == pytest.approx(2000 + 2000 * 0.98)
    assert (s["state_size"]["min"], s["state_size"]["max"], s["state_size"]["p50"]) == (30, 70, 70)
    assert s["checkpointed_size"] == s["state_size"]
    assert (s["processed_data"]["min"], s["processed_data"]["max"]) == (0, 1000)
    assert s["persisted_data"]["max"] == 4096 and s["persisted_data"]["p50"] == 0
    assert doc["failures_by_reason"] == {"CHECKPOINT_EXPIRED": 1}


def test_an_empty_history_has_zero_statistics_and_no_latest():
    doc = views.checkpoints_overview(CheckpointStatsTracker().snapshot())
    assert doc["counts"]["total"] == 0 and doc["history"] == []
    assert doc["summary"]["end_to_end_duration"] == {"min": 0, "max": 0, "avg": 0, "p50": 0, "p99": 0}
    assert doc["latest"] == {"completed": None, "savepoint": None, "failed": None, "restored": None}


def test_checkpoint_details_per_vertex_and_subtask():
    stats = next(s for s in history().snapshot().history if s.checkpoint_id == 1)
    doc = views.checkpoint_details(stats, VERTICES)
    assert doc["id"] == 1 and set(doc["tasks"]) == {"src", "sum"}
    src = doc["tasks"]["src"]
    assert (src["num_subtasks"], src["num_acknowledged_subtasks"], src["state_size"]) == (2, 2, 20)
    assert src["end_to_end_duration"] == 1000 and src["latest_ack_timestamp"] == 101000
    assert [e["index"] for e in src["subtasks"]] == [0, 1]
    assert src["subtasks"][1]["checkpoint"] == {"sync": 12, "async": 22}
    assert src["summary"]["checkpoint_duration"]["sync"]["max"] == 12
    sub = doc["tasks"]["sum"]["subtasks"][0]
    assert sub["alignment"] == {"duration": 300, "processed": 1000, "persisted": 0}
    assert (sub["start_delay"], sub["end_to_end_duration"], sub["unaligned_checkpoint"]) == (400, 2000, False)


def test_checkpoint_details_lists_subtasks_that_did_not_acknowledge():
    stats = next(s for s in history().snapshot().history if s.checkpoint_id == 5)
    doc = views.checkpoint_details(stats, VERTICES)
    assert doc["status"] == "IN_PROGRESS" and doc["end_to_end_duration"] is None
    assert [e["status"] for e in doc["tasks"]["src"]["subtasks"]] == ["completed", "pending_or_failed"]
    assert doc["tasks"]["sum"]["subtasks"] == [{"index": 0, "status": "pending_or_failed"}]
    assert doc["tasks"]["sum"]["end_to_end_duration"] is None


def test_checkpoint_config_document():
    config = ss.CheckpointConfig(interval=5, directory="/tmp/ckpt", timeout=60, min_pause=0.5, unaligned=True,
                                 aligned_timeout=0.25, retention="retain_on_cancellation")
    doc = views.checkpoint_config(config, "hashmap")
    assert (doc["interval"], doc["timeout"], doc["min_pause"], doc["aligned_checkpoint_timeout"]) == \
        (5000, 60000, 500, 250)
    assert doc["unaligned_checkpoints"] is True and doc["externalization"]["enabled"] is True
    assert doc["checkpoint_storage"] == "/tmp/ckpt" and doc["state_backend"] == "hashmap"
    assert views.checkpoint_config(ss.CheckpointConfig(interval=None, directory="/x"),
                                   ss.RocksDBConfig())["interval"] == -1


def sample() -> JobSample:
    src = OperatorSample("events", "Source: events", "src", 2, {0: 0, 1: 0}, {0: 40, 1: 60}, 0.0, 25.0)
    total = OperatorSample("sum", "sum", "sum", 1, {0: 100}, {0: 100}, 25.0, 25.0, {0: 5_000}, {0: 4_000},
                           {0: {"compactions_running": 1, "compaction_pending": 0, "live_sst_bytes": 4096,
                                "block_cache_bytes": 512}})
    out = OperatorSample("out", "Sink: out", "sum", 1, {0: 100}, {0: 0}, 25.0, 0.0)
    return JobSample("j1", "my job", "RUNNING", 1000.0, 1010.5, 1,
                     ({"failed_at": 1005.0, "cause": "lost subtask"},),
                     (VertexSample("src", "Source: events", 2, {0: "RUNNING", 1: "RUNNING"}, (src,), (),
                                   {0: 0, 1: 0}, {0: 4000, 1: 6000},
                                   {0: {"idle": 50.0, "backpressured": 900.0, "busy": 50.0},
                                    1: {"idle": 800.0, "backpressured": 0.0, "busy": 200.0}}),
                      VertexSample("sum", "sum -> Sink: out", 1, {0: "INITIALIZING"}, (total, out), ("src",))))


def test_job_details_and_jobs_overview():
    assert views.jobs_overview([sample()]) == {"jobs": [{"id": "j1", "status": "RUNNING"}]}
    doc = views.job_details(sample())
    assert (doc["jid"], doc["name"], doc["state"], doc["restarts"]) == ("j1", "my job", "RUNNING", 1)
    assert (doc["start-time"], doc["duration"]) == (1_000_000, 10_500)
    assert doc["exceptions"] == [{"timestamp": 1_005_000, "exception": "lost subtask"}]
    src, chain = doc["vertices"]
    assert (src["parallelism"], src["status"]) == (2, "RUNNING")
    assert src["metrics"] == {"read-records": 0, "write-records": 100, "read-bytes": 0, "write-bytes": 10000,
                              "read-records-per-second": 0.0, "write-records-per-second": 25.0}
    assert doc["checkpointing"] is True
    assert chain["inputs"] == ["src"] and chain["status"] == "INITIALIZING"
    assert chain["metrics"] == {"read-records": 100, "write-records": 0, "read-bytes": 0, "write-bytes": 0,
                                "read-records-per-second": 25.0, "write-records-per-second": 0.0}
    # The chain's output watermark is its last operator's (none yet), its input its head's.
    assert chain["watermark"] == {"input": 5_000, "output": None, "lag": None}
    assert src["watermark"] == {"input": None, "output": None, "lag": None}
    ops = {op["uid"]: op for op in chain["operators"]}
    assert ops["sum"]["read-records-per-second"] == 25.0 and ops["sum"]["subtasks"] == [
        {"subtask": 0, "read-records": 100, "write-records": 100, "input-watermark": 5000, "output-watermark": 4000}]
    assert ops["out"]["subtasks"][0]["input-watermark"] is None   # none reported yet
    assert src["backpressure"] == {"level": "high", "ratio": 0.9, "busyRatio": 0.2}
    assert chain["backpressure"]["level"] == "unknown"   # no two readings yet


def test_backpressure_and_watermarks_of_a_vertex():
    s = sample()
    doc = views.vertex_backpressure(s, views.find_vertex(s, "src"))
    assert doc["backpressure-level"] == "high" and doc["end-timestamp"] == 1_010_500
    assert doc["subtasks"][0] == {"subtask": 0, "backpressure-level": "high", "ratio": 0.9, "idleRatio": 0.05,
                                  "busyRatio": 0.05, "backPressuredTimeMsPerSecond": 900,
                                  "idleTimeMsPerSecond": 50, "busyTimeMsPerSecond": 50}
    assert doc["subtasks"][1]["backpressure-level"] == "ok"
    marks = views.vertex_watermarks(views.find_vertex(s, "sum"))
    assert {"id": "0.currentInputWatermark", "value": "5000"} in marks
    assert {"id": "0.sum.currentOutputWatermark", "value": "4000"} in marks
    assert views.find_vertex(s, "nope") is None


class _Values(Collector):
    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


def test_prometheus_families_use_flinks_names():
    snap = history().snapshot()
    registry = CollectorRegistry()
    registry.register(_Values(metrics.job_families(sample()) + metrics.checkpoint_families(snap, ["my job", "j1"])))
    text = generate_latest(registry).decode()
    job = 'job="my job",job_id="j1"'
    for line in [f"numberOfCompletedCheckpoints{{{job}}} 3.0", f"numberOfFailedCheckpoints{{{job}}} 1.0",
                 f"numberOfInProgressCheckpoints{{{job}}} 1.0", f"totalNumberOfCheckpoints{{{job}}} 5.0",
                 f"lastCheckpointDuration{{{job}}} 4000.0", f"lastCheckpointSize{{{job}}} 70.0",
                 f"lastCheckpointRestoreTimestamp{{{job}}} 50000.0", f"numRestarts{{{job}}} 1.0",
                 f"uptime{{{job}}} 10500.0",
                 f'numRecordsOut{{{job},operator="Source: events",operator_uid="events",subtask="1"}} 60.0',
                 f'numRecordsIn{{{job},operator="sum",operator_uid="sum",subtask="0"}} 100.0',
                 f'numRecordsInPerSecond{{{job},operator="sum",operator_uid="sum"}} 25.0',
                 f'checkpointAlignmentTime{{{job},subtask="0",task="sum"}} 50.0',
                 f'numBytesOut{{{job},subtask="1",task="src"}} 6000.0',
                 f'backPressuredTimeMsPerSecond{{{job},subtask="0",task="src"}} 900.0',
                 f'busyTimeMsPerSecond{{{job},subtask="1",task="src"}} 200.0',
                 f'idleTimeMsPerSecond{{{job},subtask="1",task="src"}} 800.0',
                 f'currentInputWatermark{{{job},operator="sum",operator_uid="sum",subtask="0"}} 5000.0',
                 f'currentOutputWatermark{{{job},operator="sum",operator_uid="sum",subtask="0"}} 4000.0',
                 f'rocksdbNumRunningCompactions{{{job},operator="sum",operator_uid="sum",subtask="0"}} 1.0',
                 f'rocksdbCompactionPending{{{job},operator="sum",operator_uid="sum",subtask="0"}} 0.0',
                 f'rocksdbLiveSstFilesSize{{{job},operator="sum",operator_uid="sum",subtask="0"}} 4096.0',
                 f'rocksdbBlockCacheUsage{{{job},operator="sum",operator_uid="sum",subtask="0"}} 512.0']:
        assert line in text.splitlines(), line
    # Operators without RocksDB state (the source, the sink) have no RocksDB series.
    assert not [line for line in text.splitlines() if line.startswith("rocksdb") and 'operator_uid="out"' in line]


def test_rates_between_two_readings():
    from streamsnap.web.progress import rates

    before = {"a": (100, 50), "b": (1000, 1000)}
    after = {"a": (300, 150), "b": (10, 0), "c": (40, 20)}   # b restarted, c is new
    assert rates(before, after, 2.0) == {"a": (100.0, 50.0), "b": (0.0, 0.0), "c": (20.0, 10.0)}


def test_percentile_interpolates_between_ranks():
    assert views.percentile([], 0.5) == 0.0
    assert views.percentile([7], 0.99) == 7
    assert views.percentile([4, 1, 3, 2], 0.5) == 2.5
    assert views.percentile(list(range(101)), 0.99) == 99
