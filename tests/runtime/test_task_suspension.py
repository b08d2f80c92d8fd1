"""A source stopped by a stop-with-savepoint's barrier resumes only if that savepoint aborts.

The task is built from a real deployment but not set up (no operators, no connections): its
mailbox handling is driven directly, message by message; its messages go to a recording link.
"""

from __future__ import annotations

import streamsnap as ss
from streamsnap.graph.execution_graph import build_execution_graph
from streamsnap.graph.job_graph import build_job_graph
from streamsnap.network import auth
from streamsnap.runtime.deployment import Deployment
from streamsnap.runtime.barriers import AlignmentMetrics
from streamsnap.runtime.events import CheckpointOptions, CheckpointType
from streamsnap.runtime.task import AsyncCheckpointRunner, DriverLink, StreamTask


class RecordingConnection:
    def __init__(self):
        self.sent = []

    def send(self, message):
        self.sent.append(message)
        return True


def source_task(tmp_path) -> StreamTask:
    env = ss.StreamEnvironment(parallelism=1)
    env.from_collection([{"a": 1}]).sink_to(ss.sinks.Collect())
    graph = build_execution_graph(build_job_graph(env._graph))
    deployment = Deployment("job", "suspension", 0, graph, auth.new_secret(), ("127.0.0.1", 1), "127.0.0.1",
                            ss.NetworkConfig(), checkpointing=True)
    task = StreamTask(deployment, 0)
    task.is_source = True  # what setup() derives from the head operator, without connecting
    task.driver = DriverLink(RecordingConnection(), task.attempt_id.to_wire())
    task._async = AsyncCheckpointRunner(task.name, on_error=lambda exc: None)
    return task


def test_only_the_abort_of_the_stopping_savepoint_resumes_the_source(tmp_path):
    task = source_task(tmp_path)
    try:
        options = CheckpointOptions(CheckpointType.TERMINATING_SAVEPOINT, str(tmp_path / "sp"))
        task.perform_checkpoint(7, 0.0, options, AlignmentMetrics(0.0, 0, 0.0))
        assert task._suspended_by == 7
        assert task._step() is False                       # suspended: emits nothing
        task._handle_mail({"type": "notify_aborted", "checkpoint_id": 6})  # an older checkpoint expires
        assert task._suspended_by == 7 and task._step() is False
        task._handle_mail({"type": "notify_aborted", "checkpoint_id": 7})
        assert task._suspended_by is None
    finally:
        task._async.shutdown(5)
