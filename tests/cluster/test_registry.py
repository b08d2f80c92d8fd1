"""The job registry (cluster/registry.py): epochs fence older leaders; records and secrets."""

from __future__ import annotations

import os
import time
import stat
import threading

import pytest

from streamsnap.cluster import wire_objects
from streamsnap.cluster.registry import FencedError, JobRegistry, list_jobs
from streamsnap.errors import StreamsnapError


def test_epochs_are_taken_exclusively_even_by_racing_leaders(tmp_path):
    registry = JobRegistry(str(tmp_path), "job-1")
    taken, barrier = [], threading.Barrier(8)

    def lead():
        barrier.wait()
        taken.append(registry.take_epoch({"pid": os.getpid()}))
    threads = [threading.Thread(target=lead) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == list(range(8))
    assert registry.latest_epoch() == 7


def test_an_older_leader_is_fenced_once_a_newer_one_took_its_epoch(tmp_path):
    registry = JobRegistry(str(tmp_path), "job-1")
    old = registry.take_epoch({})
    registry.fence(old)                      # alone: may finalize
    new = registry.take_epoch({})
    registry.fence(new)
    with pytest.raises(FencedError, match=f"epoch {old} .* superseded by epoch {new}"):
        registry.fence(old)


def test_records_round_trip_and_are_listed_with_the_secret_private(tmp_path):
    a, b = JobRegistry(str(tmp_path), "job-a"), JobRegistry(str(tmp_path), "job-b")
    a.write({"job_name": "a", "status": "RUNNING", "submitted_at": 1.0})
    b.write({"job_name": "b", "status": "FINISHED", "submitted_at": 2.0})
    a.update(status="CANCELED")
    assert [r["job_name"] for r in list_jobs(str(tmp_path))] == ["b", "a"]
    assert a.read()["status"] == "CANCELED" and a.read()["job_id"] == "job-a"
    a.write_secret(b"\x01\x02secret")
    assert a.read_secret() == b"\x01\x02secret"
    assert stat.S_IMODE(os.stat(tmp_path / "job-a" / "job.secret").st_mode) == 0o600


def test_a_damaged_or_foreign_record_is_named(tmp_path):
    registry = JobRegistry(str(tmp_path), "job-1")
    assert registry.read() is None
    (tmp_path / "job-1").mkdir()
    (tmp_path / "job-1" / "job.json").write_text("{not json")
    with pytest.raises(StreamsnapError, match="job.json is not a job record"):
        registry.read()
    (tmp_path / "job-1" / "job.json").write_text('{"job_id": "other"}')
    with pytest.raises(StreamsnapError, match="not the record of job job-1"):
        registry.read()
    with pytest.raises(StreamsnapError, match="has no job.secret"):
        registry.read_secret()


def test_result_objects_travel_as_plain_values_and_nothing_else_is_rebuilt():
    from streamsnap.api.result import JobResult, OperatorMetrics, SubtaskInfo
    from streamsnap.checkpoint.stats import CheckpointStatsTracker

    result = JobResult("id", "name", "FINISHED", 1.5, {"u": OperatorMetrics("op", "u", 2, 10, 9)},
                       {"sink": [{"k": 1, "t": (1, 2)}]}, CheckpointStatsTracker().snapshot(), 1,
                       recoveries=({"cause": "x"},))
    back = wire_objects.decode(wire_objects.encode(result))
    assert back == result and isinstance(back.collected["sink"][0]["t"], tuple)
    info = [SubtaskInfo("v", 0, 3, "127.0.0.1", 42, "RUNNING", 0, ("127.0.0.1", 9))]
    assert wire_objects.decode(wire_objects.encode(info)) == info
    with pytest.raises(ValueError, match="only streamsnap result classes"):
        wire_objects.decode({"__object__": "os:system", "fields": {}})
    with pytest.raises(ValueError, match="only streamsnap result classes"):
        wire_objects.decode({"__enum__": "subprocess:Popen", "name": "x"})


def test_a_superseded_job_master_steps_down_without_touching_the_record(tmp_path):
    """Never two live JobMasters: once a newer epoch exists, the older one writes nothing more
    and ends (its stage attempt's tasks then fail: they see the newer epoch)."""
    import streamsnap as ss
    from streamsnap.cluster.in_cluster import ClusterJob, ClusterJobMaster
    from streamsnap.cluster.jobmaster import JobSettings, new_deployment
    from streamsnap.cluster.status import JobStatus
    from streamsnap.cluster.submitter import record_submission
    from streamsnap.graph.slot_sharing import plan_slots

    env = ss.StreamEnvironment(parallelism=1, checkpointing=ss.CheckpointConfig(directory=str(tmp_path)))
    env.from_collection([{"a": 1}]).sink_to(ss.sinks.Collect())
    graph = env._plan("steps down")
    settings = JobSettings("steps down", env.checkpointing, env.restart, env.network, job_id="steps-down")
    job = ClusterJob(new_deployment("steps-down", "run-1", settings, graph, b"s" * 32, plan_slots(graph, True), True),
                     settings, str(tmp_path), True)
    record_submission(job.registry, job, "steps down", "classic")
    master = ClusterJobMaster(job, task0_tid=7, host="127.0.0.1")
    master.start()
    deadline = time.monotonic() + 10
    while "control" not in (job.registry.read() or {}):        # epoch 0 published its attempt
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert job.registry.read()["epoch"] == 0
    newer = job.registry.take_epoch({"pid": 1})
    job.registry.update(epoch=newer, status="RUNNING", control=["127.0.0.1", 1])    # the newer leader's record
    master._post(lambda: master._set_status(JobStatus.FAILING))     # its next write of the record
    assert master.wait_terminal(10), "the superseded JobMaster did not stop"
    assert master.outcome[0] == "failover" and "superseded by epoch 1" in master.outcome[1]
    assert job.registry.read()["epoch"] == newer and job.registry.read()["status"] == "RUNNING"
