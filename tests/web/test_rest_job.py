"""The monitoring endpoint of a running Spark job: REST and /metrics checked against the job's
own checkpoint history (JobClient.checkpoint_stats()), triggers over REST, and the token."""

from __future__ import annotations

import os
import re
import signal
import urllib.parse

import pytest

import streamsnap as ss
from tests.web.support import TOKEN, call, refused, start_job, wait_for

pytestmark = pytest.mark.spark


def _ms(seconds):
    return int(round(seconds * 1000))


def _metric(text: str, name: str, **labels) -> float:
    """The value of one sample in Prometheus text format."""
    for line in text.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            return float(match.group(2))
    raise AssertionError(f"no sample {name}{labels} in:\n{text}")


def test_rest_and_metrics_match_the_jobs_checkpoint_history(spark, tmp_path, no_leaked_threads):
    client = start_job(spark, tmp_path, ss.WebConfig(port=0, bind="0.0.0.0", token=TOKEN), "web rest job",
                       state_backend="rocksdb")
    port = urllib.parse.urlsplit(client.web_url).port
    base = f"http://127.0.0.1:{port}"
    jobs = f"{base}/jobs/{client.job_id}"

    # Non-loopback binding with a token: a request without it (or with a wrong one) is refused.
    assert call(f"{base}/jobs", token=None)[0] == 401
    assert call(f"{base}/jobs", token=TOKEN[:-1] + "x")[0] == 401
    assert call(f"{base}/metrics", token=None)[0] == 401
    assert call(f"{jobs}/checkpoints", method="POST", token=None)[0] == 401

    status, body = call(f"{base}/jobs")
    assert status == 200 and body == {"jobs": [{"id": client.job_id, "status": "RUNNING"}]}

    for _ in range(3):
        client.trigger_checkpoint()
    stats = client.checkpoint_stats()
    assert stats.counts.completed == 3

    status, cps = call(f"{jobs}/checkpoints")
    assert status == 200
    c = stats.counts
    assert cps["counts"] == {"total": c.triggered, "triggered": c.triggered, "in_progress": c.in_progress,
                             "completed": 3, "failed": c.failed, "restored": c.restored,
                             "storage_retries": stats.storage_retries}
    assert [h["id"] for h in cps["history"]] == [s.checkpoint_id for s in stats.history] == [3, 2, 1]
    latest = stats.latest_completed
    assert cps["latest"]["completed"]["id"] == latest.checkpoint_id == 3
    assert cps["latest"]["completed"]["state_size"] == latest.state_size > 0
    assert cps["latest"]["completed"]["end_to_end_duration"] == _ms(latest.end_to_end_duration)
    assert cps["latest"]["completed"]["num_acknowledged_subtasks"] == latest.num_acknowledged == len(client.subtasks()) == 4
    assert cps["latest"]["failed"] is None and cps["latest"]["savepoint"] is None
    durations = [_ms(s.end_to_end_duration) for s in stats.history]
    summary = cps["summary"]["end_to_end_duration"]
    assert (summary["min"], summary["max"]) == (min(durations), max(durations))
    assert summary["p50"] == sorted(durations)[1]
    sizes = [s.state_size for s in stats.history]
    assert cps["summary"]["state_size"]["max"] == max(sizes)
    assert cps["summary"]["persisted_data"]["max"] == 0     # aligned checkpoints persist no in-flight data

    status, config = call(f"{jobs}/checkpoints/config")
    assert status == 200 and config["mode"] == "exactly_once" and config["interval"] == -1
    assert config["checkpoint_storage"] == str(tmp_path / "ckpt")

    status, details = call(f"{jobs}/checkpoints/details/2")
    assert status == 200 and details["id"] == 2
    second = next(s for s in stats.history if s.checkpoint_id == 2)
    assert details["state_size"] == second.state_size
    assert sorted(details["tasks"]) == sorted({s.vertex_id for s in second.subtasks})
    for vertex_id, task in details["tasks"].items():
        expected = sorted((s for s in second.subtasks if s.vertex_id == vertex_id), key=lambda s: s.index)
        assert task["num_acknowledged_subtasks"] == len(expected) == task["num_subtasks"] == 2
        for got, want in zip(task["subtasks"], expected):
            assert got["index"] == want.index and got["state_size"] == want.state_size
            assert got["checkpoint"] == {"sync": _ms(want.sync_duration), "async": _ms(want.async_duration)}
            assert got["alignment"]["duration"] == _ms(want.alignment_duration)
            assert got["start_delay"] == _ms(want.start_delay)
            assert got["unaligned_checkpoint"] is False
    assert call(f"{jobs}/checkpoints/details/99")[0] == 404

    # Records per operator arrive from the subtasks every poll interval.
    job = wait_for(lambda: (d := call(jobs)[1]) and all(
        op["read-records"] > 0 for v in d["vertices"] for op in v["operators"] if op["uid"] != "events") and d,
        "records in every operator")
    assert job["state"] == "RUNNING" and job["restarts"] == 0
    ops = {op["uid"]: op for v in job["vertices"] for op in v["operators"]}
    assert ops["events"]["parallelism"] == ops["sum"]["parallelism"] == 2
    assert ops["events"]["write-records"] > 0 and len(ops["sum"]["subtasks"]) == 2
    assert sum(v["parallelism"] for v in job["vertices"]) == len(client.subtasks())
    source, chain = sorted(job["vertices"], key=lambda v: len(v["inputs"]))
    assert source["metrics"]["write-bytes"] > 0 and chain["metrics"]["read-bytes"] > 0
    assert job["checkpointing"] is True

    # POST: a checkpoint, then a savepoint; both polled to completion by request id.
    status, posted = call(f"{jobs}/checkpoints", method="POST")
    assert status == 202
    done = wait_for(lambda: (r := call(f"{jobs}/checkpoints/{posted['request-id']}")[1])["status"]["id"] == "COMPLETED"
                    and r, "the triggered checkpoint")
    assert done["operation"] == {"checkpointId": 4}
    assert call(f"{jobs}/savepoints", method="POST", body={})[0] == 400
    status, posted = call(f"{jobs}/savepoints", method="POST", body={"target-directory": str(tmp_path / "sp")})
    assert status == 202
    done = wait_for(lambda: (r := call(f"{jobs}/savepoints/{posted['request-id']}")[1])["status"]["id"] == "COMPLETED"
                    and r, "the savepoint")
    assert done["operation"]["location"].startswith(str(tmp_path / "sp"))
    stats = client.checkpoint_stats()
    cps = call(f"{jobs}/checkpoints")[1]
    assert cps["latest"]["savepoint"]["id"] == stats.latest_savepoint.checkpoint_id == 5
    assert cps["latest"]["savepoint"]["external_path"] == stats.latest_savepoint.external_path

    # Prometheus, same figures.
    labels = {"job": "web rest job", "job_id": client.job_id}
    # Each subtask reports its counters every poll interval: wait until both keyed subtasks have
    # (the earlier wait was for the operator's sum, which one busy subtask satisfies alone).
    text = wait_for(lambda: (r := call(f"{base}/metrics"))[0] == 200 and all(
        _metric(r[1], "numRecordsIn", operator="sum", subtask=str(i), **labels) > 0 for i in (0, 1)) and r[1],
        "records in both subtasks of the keyed operator")
    assert _metric(text, "numberOfCompletedCheckpoints", **labels) == stats.counts.completed == 5
    assert _metric(text, "numberOfFailedCheckpoints", **labels) == 0
    assert _metric(text, "numberOfInProgressCheckpoints", **labels) == 0
    # RocksDB checkpoints are incremental: the size written vs the full size referenced.
    assert _metric(text, "lastCheckpointSize", **labels) == stats.latest_completed.checkpointed_size
    assert _metric(text, "lastCheckpointFullSize", **labels) == stats.latest_completed.state_size
    assert _metric(text, "lastCheckpointDuration", **labels) == pytest.approx(
        stats.latest_completed.end_to_end_duration * 1000)
    assert _metric(text, "lastCheckpointRestoreTimestamp", **labels) == -1
    assert _metric(text, "numRestarts", **labels) == 0
    assert _metric(text, "uptime", **labels) > 0
    assert _metric(text, "numRecordsIn", operator="sum", subtask="0", **labels) > 0
    assert _metric(text, "numRecordsOut", operator="Source: events", subtask="1", **labels) > 0
    assert _metric(text, "numBytesIn", task=chain["id"], subtask="0", **labels) > 0
    # RocksDB's native metrics, for the keyed operator only.
    assert _metric(text, "rocksdbEstimateNumKeys", operator="sum", subtask="0", **labels) >= 0
    assert _metric(text, "rocksdbNumRunningCompactions", operator="sum", subtask="1", **labels) >= 0
    assert _metric(text, "rocksdbBlockCacheUsage", operator="sum", subtask="1", **labels) > 0
    assert not re.search(r'^rocksdb\w+\{[^}]*operator="Source: events"', text, re.M)
    vertex = stats.latest_completed.subtasks[0]
    assert _metric(text, "checkpointAlignmentTime", task=vertex.vertex_id, subtask=str(vertex.index),
                   **labels) == pytest.approx(vertex.alignment_duration * 1000)

    # A failover: restarts with their cause, the restore in counts, latest and metrics.
    os.kill(client.subtasks()[-1].pid, signal.SIGKILL)
    job = wait_for(lambda: (d := call(jobs)[1])["restarts"] == 1 and d["state"] == "RUNNING" and d,
                   "the job to run again", timeout=120)
    assert len(job["exceptions"]) == 1 and job["exceptions"][0]["timestamp"] >= job["start-time"]
    assert job["exceptions"][0]["exception"]
    restored = client.checkpoint_stats().latest_restored
    cps = call(f"{jobs}/checkpoints")[1]
    assert cps["counts"]["restored"] == 1
    assert cps["latest"]["restored"] == {"id": restored.checkpoint_id, "restore_timestamp": _ms(restored.restore_timestamp),
                                         "is_savepoint": False, "external_path": restored.external_path}
    text = call(f"{base}/metrics")[1]
    assert _metric(text, "numRestarts", **labels) == 1
    assert _metric(text, "lastCheckpointRestoreTimestamp", **labels) == pytest.approx(restored.restore_timestamp * 1000)

    client.cancel()
    wait_for(lambda: refused(base), "the endpoint to close with the job")
