"""A checkpoint directory seen after the fact: what `streamsnap ui DIR` serves, read-only.

Every completed checkpoint's `_metadata` (checksums verified, by `checkpoint.listing`) is fed
to a `CheckpointStatsTracker`, so the REST views, the UI and `/metrics` show the directory's
checkpoints exactly as they showed the running job's: sizes, per-subtask sync/async/alignment
figures and the job graph, which `_metadata` records (files of older versions without them
still list, per operator, with sizes only). The directory is listed again on each request —
a job may still be writing to it — while a parsed `_metadata` is kept, as it never changes.
Nothing here can trigger anything: the endpoint answers POSTs with 405.

How the job ended comes from its summary (`web/job_summary.py`, written as it ends): its real
final status, records per operator, every checkpoint it completed (also those its retention
deleted since: their rows say `retained: false`) and its exception history. A job without one
is still running or lost its driver: it shows as ARCHIVED, with what its checkpoints hold.
"""

from __future__ import annotations

import threading
from http import HTTPStatus

from streamsnap.checkpoint.listing import list_checkpoints
from streamsnap.checkpoint.messages import CheckpointMetrics
from streamsnap.checkpoint.metadata import CheckpointMetadata, read_metadata
from streamsnap.checkpoint.stats import CheckpointStatsSnapshot, CheckpointStatsTracker
from streamsnap.checkpoint.storage import METADATA_FILE_NAME
from streamsnap.checkpoint import filesystem
from streamsnap.graph.ids import ExecutionAttemptId
from streamsnap.web import views
from streamsnap.web.job_summary import SUMMARY_FILE, exceptions_of, read_summary
from streamsnap.web.progress import JobSample, OperatorSample, VertexSample

ARCHIVED = "ARCHIVED"


def job_vertices(metadata: CheckpointMetadata) -> list[dict]:
    """The job graph `_metadata` recorded, or one vertex per operator when it has none."""
    if metadata.job_graph is not None:
        return list(metadata.job_graph["vertices"])
    return [{"id": uid, "name": uid, "parallelism": op.parallelism, "inputs": [],
             "operators": [{"uid": uid, "name": uid}]} for uid, op in sorted(metadata.operators.items())]


def tracker_from(checkpoints: list[CheckpointMetadata], paths: list[str]) -> CheckpointStatsTracker:
    """The statistics of these completed checkpoints (oldest first), as the coordinator had them."""
    tracker = CheckpointStatsTracker(history_size=max(1, len(checkpoints)))
    for metadata, path in zip(checkpoints, paths):
        vertices = job_vertices(metadata)
        num_subtasks = sum(int(v["parallelism"]) for v in vertices)
        tracker.report_pending(metadata.checkpoint_id, metadata.trigger_timestamp, metadata.checkpoint_type,
                               num_subtasks)
        for vertex in vertices:
            uids = [op["uid"] for op in vertex["operators"]]
            for index in range(int(vertex["parallelism"])):
                states = [metadata.operators[u].subtask_states.get(index) for u in uids if u in metadata.operators]
                states = [s for s in states if s is not None]
                recorded = metadata.subtask_metrics.get(f"{vertex['id']}#{index}")
                attempt, ack, metrics = (recorded[0], recorded[1], CheckpointMetrics.from_wire(list(recorded[2]))) \
                    if recorded is not None else (0, metadata.completion_timestamp, CheckpointMetrics())
                tracker.report_subtask(metadata.checkpoint_id, ExecutionAttemptId(vertex["id"], index, attempt), ack,
                                       sum(s.state_size for s in states), metrics,
                                       sum(s.incremental_size for s in states))
        tracker.report_completed(metadata.checkpoint_id, metadata.completion_timestamp, metadata.state_size, path,
                                 metadata.incremental_size)
    return tracker


class ArchivedJob:
    """One job's checkpoints in the directory; the same reads as `rest.JobEndpoint`, no writes."""

    read_only = True

    def __init__(self, directory: str, job_id: str):
        self.directory = directory
        self.job_id = job_id
        self._lock = threading.Lock()
        self._parsed: dict[str, CheckpointMetadata] = {}

    def _completed(self) -> tuple[list[CheckpointMetadata], list[str]]:
        summaries = [s for s in list_checkpoints(self.directory) if s.job_id == self.job_id and s.is_completed]
        checkpoints = []
        for s in summaries:
            with self._lock:
                metadata = self._parsed.get(s.path)
            if metadata is None:
                metadata = read_metadata(filesystem.join(s.path, METADATA_FILE_NAME))
                with self._lock:
                    self._parsed[s.path] = metadata
            checkpoints.append(metadata)
        return checkpoints, [s.path for s in summaries]

    def checkpoint_stats(self) -> CheckpointStatsSnapshot:
        return tracker_from(*self._completed()).snapshot()

    def stats_or_none(self) -> CheckpointStatsSnapshot:
        return self.checkpoint_stats()

    @property
    def job_directory(self) -> str:
        base = filesystem.normalize(self.directory).rstrip("/")
        return base if base.rsplit("/", 1)[-1] == self.job_id else filesystem.join(base, self.job_id)

    def summary(self) -> dict | None:
        return read_summary(self.job_directory)

    def sample(self) -> JobSample:
        checkpoints, _ = self._completed()
        summary = self.summary()
        graph = summary["job_graph"] if summary else (checkpoints[-1].job_graph if checkpoints else None)
        if summary is None and not checkpoints:
            return JobSample(self.job_id, self.job_id, ARCHIVED, 0.0, 0.0, 0, (), (), True, read_only=True)
        name = graph.get("name", self.job_id) if graph else self.job_id
        status = summary["status"] if summary else ARCHIVED
        records = summary["records"] if summary else {}
        vertices = job_vertices(checkpoints[-1]) if graph is None else list(graph["vertices"])

        def counts(uid: str, direction: str) -> dict[int, int]:
            return {int(i): n for i, n in records.get(uid, {}).get(direction, {}).items()}
        samples = tuple(VertexSample(
            v["id"], v["name"], int(v["parallelism"]), {i: status for i in range(int(v["parallelism"]))},
            tuple(OperatorSample(op["uid"], op["name"], v["id"], int(v["parallelism"]), counts(op["uid"], "in"),
                                 counts(op["uid"], "out")) for op in v["operators"]),
            tuple(v.get("inputs", ())), input_edges=tuple(tuple(e) for e in v.get("input_edges", ())))
            for v in vertices)
        if summary is not None:
            return JobSample(self.job_id, name, status, summary["started_at"], summary["ended_at"],
                             summary["restarts"], (), samples, summary["checkpoints"] is not None, read_only=True,
                             exceptions=exceptions_of(summary), ended_at=summary["ended_at"])
        return JobSample(self.job_id, name, ARCHIVED, checkpoints[0].trigger_timestamp,
                         checkpoints[-1].completion_timestamp, 0, (), samples, True, read_only=True)

    def checkpoints_document(self) -> dict:
        """The summary's checkpoint statistics when the job ended (each history row saying
        whether its files are still here), else what the retained checkpoints show."""
        summary = self.summary()
        checkpoints, _ = self._completed()
        if summary is None or summary["checkpoints"] is None:
            return views.checkpoints_overview(tracker_from(*self._completed()).snapshot())
        retained = {c.checkpoint_id for c in checkpoints}
        document = dict(summary["checkpoints"])
        document["history"] = [dict(h, retained=h["id"] in retained) for h in document["history"]]
        return document

    def vertices(self) -> list[tuple[str, str, int]]:
        checkpoints, _ = self._completed()
        if not checkpoints:
            return []
        return [(v["id"], v["name"], int(v["parallelism"])) for v in job_vertices(checkpoints[-1])]

    def checkpoint_config(self) -> dict:
        return {"checkpoint_storage": self.directory, "read_only": True}

    def trigger_checkpoint(self) -> str:
        raise self._refused("trigger a checkpoint")

    def trigger_savepoint(self, body: dict, stop: bool = False) -> str:
        raise self._refused("stop the job with a savepoint" if stop else "take a savepoint")

    def cancel(self) -> None:
        raise self._refused("cancel the job")

    def _refused(self, what: str):
        from streamsnap.web.rest import HttpError

        return HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"cannot {what}: this endpoint shows the checkpoint "
                                                        f"directory {self.directory} after the fact (streamsnap ui), "
                                                        f"read-only; a running job's own endpoint can")


def archived_jobs(directory: str) -> list[ArchivedJob]:
    """One `ArchivedJob` per job id under `directory` with checkpoints (see `list_checkpoints`)
    or a summary of how it ended (a finished job may have deleted all its checkpoints)."""
    job_ids = dict.fromkeys(s.job_id for s in list_checkpoints(directory))
    base = filesystem.normalize(directory).rstrip("/")
    fs, path = filesystem.filesystem(base)
    for found in sorted(fs.glob(f"{path.rstrip('/')}/*/{SUMMARY_FILE}")):
        job_ids.setdefault(found.rstrip("/").rsplit("/", 2)[-2], None)
    if fs.isfile(f"{path.rstrip('/')}/{SUMMARY_FILE}"):   # DIR is one job's directory
        job_ids.setdefault(base.rsplit("/", 1)[-1], None)
    return [ArchivedJob(directory, job_id) for job_id in job_ids]
