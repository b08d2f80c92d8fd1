"""How a job ended, kept in its directory so `streamsnap ui DIR` shows it after the fact.

Checkpoint files say nothing of a job's end: a FINISHED job's retention deletes them, and the
ones kept do not know whether the job later finished, was cancelled or failed, nor how many
records it processed. So the JobMaster writes `<job dir>/_job_summary.json` as the job ends
(any status): status and time, restarts, records in/out per operator (the tasks' last reported
counts of the final attempt), the checkpoint statistics as the REST API showed them, and the
exception history. `web/archive.py` serves it in place of guesses.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time

from streamsnap.checkpoint import filesystem
from streamsnap.cluster.exception_history import ConcurrentFailure, ExceptionHistoryEntry

log = logging.getLogger(__name__)

SUMMARY_FILE = "_job_summary.json"
_VERSION = 1


def describe_graph(job_graph, name: str) -> dict:
    """The job graph as checkpoints' `_metadata` and the summary record it: tasks, their
    operators, and their inputs with the partitioning of each edge."""
    return {"name": name, "vertices": [
        {"id": v.id, "name": v.name, "parallelism": v.parallelism,
         "inputs": list(dict.fromkeys(e.source_vertex for e in v.inputs)),
         "input_edges": [list(e) for e in dict.fromkeys((e.source_vertex, e.partitioner.name) for e in v.inputs)],
         "operators": [{"uid": job_graph.node(n).uid, "name": job_graph.node(n).name} for n in v.nodes]}
        for v in job_graph.vertices.values()]}


def summary_of(master, status: str, stats) -> dict:
    """The end of `master`'s job as a JSON-ready dict (`stats`: its checkpoint stats snapshot or None)."""
    from streamsnap.web import views

    records: dict[str, dict[str, dict[str, int]]] = {}   # uid → in/out → subtask index → count
    for (_vertex, index), metrics in master.operator_metrics().items():
        for uid, m in (metrics.get("operators") or {}).items():
            entry = records.setdefault(uid, {"in": {}, "out": {}})
            entry["in"][str(index)] = int(m["records_in"])
            entry["out"][str(index)] = int(m["records_out"])
    now = time.time()
    return {"version": _VERSION, "job_id": master.job_id, "job_name": master.settings.job_name, "status": status,
            "started_at": now - (time.monotonic() - master.started_at), "ended_at": now,
            "restarts": master.restarts, "records": records,
            "job_graph": describe_graph(master.job_graph, master.settings.job_name),
            "checkpoints": views.checkpoints_overview(stats) if stats is not None else None,
            "exceptions": [dataclasses.asdict(e) for e in master.exceptions.entries()]}


def write_summary(job_directory: str, summary: dict) -> None:
    """Write the summary; a storage error is logged with what it costs (the job's end is not at stake)."""
    url = filesystem.join(job_directory, SUMMARY_FILE)
    try:
        filesystem.write_atomic(url, json.dumps(summary).encode())
    except OSError as exc:
        log.warning("job '%s': could not write %s (%s); `streamsnap ui` will not show how it ended",
                    summary.get("job_name"), filesystem.user_path(url), exc)


def read_summary(job_directory: str) -> dict | None:
    """The summary of the job's last run, or None (still running, or its driver died)."""
    url = filesystem.join(job_directory, SUMMARY_FILE)
    data = filesystem.read_if_exists(url)
    if data is None:
        return None
    try:
        summary = json.loads(data)
        if summary.get("version") != _VERSION:
            raise ValueError(f"unknown version {summary.get('version')!r}")
        return summary
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"{filesystem.user_path(url)} is not a streamsnap job summary ({exc}); delete it") from None


def exceptions_of(summary: dict) -> tuple[ExceptionHistoryEntry, ...]:
    return tuple(ExceptionHistoryEntry(**{**e, "concurrent": tuple(ConcurrentFailure(**c) for c in e["concurrent"])})
                 for e in summary.get("exceptions", ()))
