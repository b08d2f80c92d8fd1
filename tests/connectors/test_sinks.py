"""The sinks' two-phase-commit logic, driven directly (no Spark)."""

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import streamsnap as ss
from streamsnap.connectors.sinks import Collector, FileSinkWriter
from streamsnap.network.frames import encode_batches
from streamsnap.runtime.operators.base import OperatorContext


class Checkpoint:
    def __init__(self, checkpoint_id):
        self.checkpoint_id = checkpoint_id


def data(rows):
    return {"op": "data", "ipc": encode_batches([pa.RecordBatch.from_pylist(rows)]).to_pybytes()}


def test_collector_makes_rows_visible_only_when_their_checkpoint_completes():
    c = Collector("out")
    c.on_message(0, data([{"v": 1}]))
    c.on_message(0, {"op": "precommit", "checkpoint_id": 1})
    c.on_message(1, data([{"v": 2}]))
    c.on_message(1, {"op": "precommit", "checkpoint_id": 1})
    c.on_message(0, data([{"v": 3}]))
    c.on_message(0, {"op": "precommit", "checkpoint_id": 2})
    c.on_message(0, data([{"v": 4}]))  # after the last pre-commit: not covered by any checkpoint
    assert c.rows() == []
    c.notify_checkpoint_aborted(2)
    c.notify_checkpoint_complete(Checkpoint(1))
    assert c.rows() == [{"v": 1}, {"v": 2}]
    c.notify_checkpoint_complete(Checkpoint(3))  # an aborted checkpoint's pre-commit goes with the next
    assert c.rows() == [{"v": 1}, {"v": 2}, {"v": 3}]
    c.on_failover()  # v=4 will be produced again after the restore
    c.on_finished(checkpointing=True)
    assert [r["v"] for r in c.rows()] == [1, 2, 3]


def test_collector_without_checkpoints_commits_at_the_end():
    c = Collector("out")
    c.on_message(0, data([{"v": 1}]))
    c.on_message(0, {"op": "end"})
    c.on_finished(checkpointing=False)
    assert c.rows() == [{"v": 1}]
    with pytest.raises(ValueError, match="unknown collect message"):
        c.on_message(0, {"op": "bogus"})


def writer(path, subtask=0, parallelism=1, attempt=0, job="job-a", checkpointing=True, fmt="parquet"):
    ctx = OperatorContext(name="files", uid="files", subtask_index=subtask, parallelism=parallelism,
                          max_parallelism=128, attempt=attempt, job_id=job, task_name="files (1/1)",
                          extra={"checkpointing": checkpointing})
    w = FileSinkWriter(ss.sinks.FileSink(str(path), format=fmt), ctx)
    w.open()
    return w


def visible(path):
    return sorted(f for f in os.listdir(path) if not f.startswith("."))


def read_all(path):
    return sorted(r["v"] for f in visible(path) for r in pq.read_table(os.path.join(path, f)).to_pylist())


def test_file_sink_commits_on_checkpoint_completion_only(tmp_path):
    w = writer(tmp_path)
    w.write([{"v": 1}, {"v": 2}])
    assert visible(tmp_path) == []  # in progress: hidden
    pending = w.prepare_commit(1)
    assert len(pending) == 1 and visible(tmp_path) == []
    w.write([{"v": 3}])
    w.prepare_commit(2)
    w.commit(1)
    assert read_all(tmp_path) == [1, 2]
    w.commit(2)
    assert read_all(tmp_path) == [1, 2, 3]
    w.commit(2)  # idempotent
    assert read_all(tmp_path) == [1, 2, 3]


def test_file_sink_recovery_commits_precommitted_and_deletes_the_rest(tmp_path):
    w = writer(tmp_path, attempt=0)
    w.write([{"v": 1}])
    committables = w.prepare_commit(1)  # checkpoint 1 completes, but the task dies before commit
    w.write([{"v": 2}])
    w.prepare_commit(2)                  # checkpoint 2 never completes
    w.write([{"v": 3}])                  # written after the last barrier
    w.close()
    assert visible(tmp_path) == [] and len(os.listdir(tmp_path)) == 3
    restored = writer(tmp_path, attempt=1)
    restored.recover(committables)
    assert read_all(tmp_path) == [1]
    assert os.listdir(tmp_path) == visible(tmp_path)  # the other attempt's in-progress files are gone
    restored.recover(committables)  # recovering twice is harmless
    assert read_all(tmp_path) == [1]


def test_file_sink_without_checkpoints_commits_at_end_of_input(tmp_path):
    w = writer(tmp_path, checkpointing=False, fmt="jsonl")
    w.write([{"v": 1}, {"v": 2}])
    w.end_input()
    (name,) = visible(tmp_path)
    assert name.endswith(".jsonl")
    assert open(os.path.join(tmp_path, name)).read().splitlines() == ['{"v": 1}', '{"v": 2}']


def test_file_sink_rolls_a_new_file_when_the_schema_changes(tmp_path):
    w = writer(tmp_path)
    w.write([{"v": 1}])
    w.write([{"v": "text"}])
    w.prepare_commit(1)
    w.commit(1)
    assert len(visible(tmp_path)) == 2


def test_committing_a_vanished_file_is_a_clear_error(tmp_path):
    w = writer(tmp_path)
    w.write([{"v": 1}])
    (committable,) = w.prepare_commit(1)
    os.unlink(committable["inprogress"][len("file://"):])
    with pytest.raises(FileNotFoundError, match="modified outside the job"):
        w.commit(1)
