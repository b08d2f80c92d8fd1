"""Flink-shaped JSON documents from plain stats values (no I/O, no threads: unit-testable).

Inputs are the immutable values other modules hand out — `checkpoint.stats` snapshots,
`CheckpointConfig`, `web.progress.JobSample` — and outputs are dicts ready for `json.dumps`.
Field names follow Flink's REST API where it has one, so its tooling reads ours; like Flink,
times are epoch milliseconds and durations milliseconds, sizes bytes.
"""

from __future__ import annotations

import math
from typing import Iterable

from streamsnap.checkpoint.stats import (
    CheckpointStats, CheckpointStatsSnapshot, CheckpointStatus, RestoredCheckpointStats, SubtaskCheckpointStats,
)
from streamsnap.runtime.task_time import backpressure_level
from streamsnap.time.watermarks import MIN_WATERMARK
from streamsnap.web import graph_layout
from streamsnap.web.progress import JobSample, VertexSample


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(round(seconds * 1000))


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between closest ranks; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def statistic(values: Iterable[float]) -> dict:
    """min / max / avg / p50 / p99 of a series (Flink's summary statistics)."""
    values = list(values)
    if not values:
        return {"min": 0, "max": 0, "avg": 0, "p50": 0, "p99": 0}
    return {"min": min(values), "max": max(values), "avg": sum(values) / len(values),
            "p50": percentile(values, 0.5), "p99": percentile(values, 0.99)}


# ====================================================================== jobs
def jobs_overview(samples: Iterable[JobSample]) -> dict:
    return {"jobs": [{"id": s.job_id, "status": s.status} for s in samples]}


def job_details(sample: JobSample) -> dict:
    vertices = []
    for v in sample.vertices:
        operators = [{
            "uid": op.uid, "name": op.name, "parallelism": op.parallelism,
            "read-records": op.total_in, "write-records": op.total_out,
            "read-records-per-second": op.records_in_per_second,
            "write-records-per-second": op.records_out_per_second,
            "input-watermark": _watermark(min(op.input_watermarks.values(), default=MIN_WATERMARK)),
            "output-watermark": _watermark(min(op.output_watermarks.values(), default=MIN_WATERMARK)),
            "subtasks": [{"subtask": i, "read-records": op.records_in.get(i, 0),
                          "write-records": op.records_out.get(i, 0),
                          "input-watermark": _watermark(op.input_watermarks.get(i, MIN_WATERMARK)),
                          "output-watermark": _watermark(op.output_watermarks.get(i, MIN_WATERMARK))}
                         for i in sorted(set(op.records_in) | set(op.records_out))],
        } for op in v.operators]
        head, tail = (v.operators[0], v.operators[-1]) if v.operators else (None, None)
        counts: dict[str, int] = {}
        for state in v.subtask_states.values():
            counts[state] = counts.get(state, 0) + 1
        vertices.append({
            "id": v.id, "name": v.name, "parallelism": v.parallelism, "status": _vertex_status(v.subtask_states),
            "tasks": counts, "inputs": list(v.inputs),
            # the chain reads what its head reads and writes what its last operator writes
            "metrics": {"read-records": head.total_in if head else 0, "write-records": tail.total_out if tail else 0,
                        "read-bytes": sum(v.bytes_in.values()), "write-bytes": sum(v.bytes_out.values()),
                        "read-records-per-second": head.records_in_per_second if head else 0.0,
                        "write-records-per-second": tail.records_out_per_second if tail else 0.0},
            "backpressure": _backpressure_summary(v),
            "watermark": _vertex_watermark(v, sample.ended_at or sample.now),
            "operators": operators,
        })
    return {
        "jid": sample.job_id, "name": sample.name, "state": sample.status,
        "start-time": _ms(sample.start_time), "now": _ms(sample.now), "duration": _ms(sample.uptime),
        "restarts": sample.restarts, "checkpointing": sample.checkpointing, "read-only": sample.read_only,
        "status-detail": sample.detail, "end-time": _ms(sample.ended_at),
        "exceptions": [{"timestamp": _ms(f["failed_at"]), "exception": f["cause"]} for f in sample.failures],
        "vertices": vertices,
        "plan": job_plan(sample),
    }


def job_plan(sample: JobSample) -> dict:
    """Where the UI draws each task and each edge with its partitioning (`web.graph_layout`)."""
    edges = [(source, v.id, partitioning) for v in sample.vertices for source, partitioning in v.input_edges]
    linked = {(source, target) for source, target, _ in edges}
    # An archive of an older version recorded inputs without their partitioning.
    edges += [(source, v.id, "") for v in sample.vertices for source in v.inputs if (source, v.id) not in linked]
    return graph_layout.to_json(graph_layout.layout([v.id for v in sample.vertices], edges))


def _vertex_watermark(v: VertexSample, now: float) -> dict:
    """The task's output watermark (its last operator's, the minimum over subtasks) and how far
    it is behind the wall clock (`lag`, ms): what the graph shows per task."""
    tail = v.operators[-1] if v.operators else None
    head = v.operators[0] if v.operators else None
    output = min(tail.output_watermarks.values(), default=MIN_WATERMARK) if tail else MIN_WATERMARK
    given = min(head.input_watermarks.values(), default=MIN_WATERMARK) if head else MIN_WATERMARK
    value = _watermark(output)
    return {"input": _watermark(given), "output": value,
            "lag": None if value is None else max(0, _ms(now) - value)}


def exception_history(sample: JobSample) -> dict:
    """Flink's /jobs/:id/exceptions: the root cause of each failed attempt, newest first, with the
    failures of other subtasks that followed from it (`concurrentExceptions`)."""
    entries = [{
        "exceptionName": e.exception.split(":", 1)[0], "exception": e.exception, "stacktrace": e.root_cause,
        "timestamp": _ms(e.timestamp), "taskName": e.task, "attempt": e.attempt, "reason": e.reason,
        "failureLabels": {"reason": e.reason},
        "concurrentExceptions": [{"exceptionName": c.exception.split(":", 1)[0], "exception": c.exception,
                                  "taskName": c.task} for c in e.concurrent],
        "followOn": e.follow_on_line(),
    } for e in reversed(sample.exceptions)]
    latest = entries[0] if entries else None
    return {"root-exception": latest["stacktrace"] if latest else None,
            "timestamp": latest["timestamp"] if latest else None,
            "exceptionHistory": {"entries": entries, "truncated": False}}


def _watermark(value: int) -> int | None:
    """Epoch milliseconds, or None while there is no watermark yet."""
    return None if value == MIN_WATERMARK else value


def _subtask_time(index: int, shares: dict[str, float]) -> dict:
    ratio = shares["backpressured"] / 1000
    return {"subtask": index, "backpressure-level": backpressure_level(ratio), "ratio": round(ratio, 3),
            "idleRatio": round(shares["idle"] / 1000, 3), "busyRatio": round(shares["busy"] / 1000, 3),
            "backPressuredTimeMsPerSecond": round(shares["backpressured"]),
            "idleTimeMsPerSecond": round(shares["idle"]), "busyTimeMsPerSecond": round(shares["busy"])}


def _backpressure_summary(v: VertexSample) -> dict:
    """The vertex's worst subtask decides its level, as in Flink's job graph."""
    subtasks = [_subtask_time(i, s) for i, s in sorted(v.time_shares.items())]
    ratio = max((s["ratio"] for s in subtasks), default=0.0)
    return {"level": backpressure_level(ratio) if subtasks else "unknown", "ratio": ratio,
            "busyRatio": max((s["busyRatio"] for s in subtasks), default=0.0)}


def find_vertex(sample: JobSample, vertex_id: str) -> VertexSample | None:
    return next((v for v in sample.vertices if v.id == vertex_id), None)


def vertex_backpressure(sample: JobSample, v: VertexSample) -> dict:
    """Flink's /jobs/:id/vertices/:vid/backpressure: per subtask the share of the last poll
    interval spent backpressured (ratio), idle and busy, measured in the task, not sampled."""
    subtasks = [_subtask_time(i, s) for i, s in sorted(v.time_shares.items())]
    level = backpressure_level(max(s["ratio"] for s in subtasks)) if subtasks else "unknown"
    return {"status": "ok" if subtasks else "deprecated", "backpressure-level": level,
            "end-timestamp": _ms(sample.now), "subtasks": subtasks}


def vertex_watermarks(v: VertexSample) -> list[dict]:
    """Flink's /jobs/:id/vertices/:vid/watermarks: "<subtask>.currentInputWatermark" of the
    chain's head, plus each operator's input and output watermark as
    "<subtask>.<operator uid>.current{Input,Output}Watermark"; values are epoch ms as strings,
    Long.MIN_VALUE while there is none (as Flink)."""
    out = []
    head = v.operators[0] if v.operators else None
    for index in range(v.parallelism):
        if head is not None and index in head.input_watermarks:
            out.append({"id": f"{index}.currentInputWatermark", "value": str(head.input_watermarks[index])})
        for op in v.operators:
            if index in op.input_watermarks:
                out.append({"id": f"{index}.{op.uid}.currentInputWatermark", "value": str(op.input_watermarks[index])})
                out.append({"id": f"{index}.{op.uid}.currentOutputWatermark",
                            "value": str(op.output_watermarks[index])})
    return out


def _vertex_status(states: dict[int, str]) -> str:
    distinct = set(states.values())
    if not distinct:
        return "CREATED"
    if len(distinct) == 1:
        return distinct.pop()
    for state in ("FAILED", "CANCELED", "DEPLOYING", "INITIALIZING", "RUNNING"):
        if state in distinct:
            return state
    return sorted(distinct)[0]


# ====================================================================== checkpoints
def _processed(stats: CheckpointStats) -> int:
    return sum(s.bytes_processed_during_alignment for s in stats.subtasks)


def _persisted(stats: CheckpointStats) -> int:
    return sum(s.bytes_persisted_of_in_flight_data for s in stats.subtasks)


def checkpoint_entry(stats: CheckpointStats) -> dict:
    latest_ack = stats.latest_ack_timestamp
    return {
        "id": stats.checkpoint_id,
        "status": stats.status.value,
        "is_savepoint": stats.checkpoint_type.is_savepoint,
        "checkpoint_type": stats.checkpoint_type.value,
        "trigger_timestamp": _ms(stats.trigger_timestamp),
        "latest_ack_timestamp": _ms(latest_ack) if latest_ack is not None else -1,
        "end_to_end_duration": _ms(stats.end_to_end_duration),
        # state_size: all the checkpoint references; checkpointed_size: what it wrote itself
        # (less with incremental RocksDB or changelog snapshots, which reuse earlier files).
        "state_size": stats.state_size,
        "checkpointed_size": stats.checkpointed_size,
        "storage_retries": stats.storage_retries,
        "processed_data": _processed(stats),
        "persisted_data": _persisted(stats),
        "unaligned": any(s.unaligned for s in stats.subtasks),
        "num_subtasks": stats.num_subtasks,
        "num_acknowledged_subtasks": stats.num_acknowledged,
        "external_path": stats.external_path,
        "failure_reason": stats.failure_reason.name if stats.failure_reason is not None else None,
        "failure_message": stats.failure_message,
    }


def _restored_entry(restored: RestoredCheckpointStats | None) -> dict | None:
    if restored is None:
        return None
    return {"id": restored.checkpoint_id, "restore_timestamp": _ms(restored.restore_timestamp),
            "is_savepoint": restored.checkpoint_type.is_savepoint, "external_path": restored.external_path}


def checkpoints_overview(snapshot: CheckpointStatsSnapshot) -> dict:
    """Counts, latest checkpoints, summary statistics and the retained history (newest first).

    min/avg/max of duration and state size are over every checkpoint completed since the job
    started (the tracker keeps running sums); p50/p99, and all statistics of the in-flight
    data, are over the completed checkpoints still in the bounded history.
    """
    c = snapshot.counts
    completed = [s for s in snapshot.history if s.status is CheckpointStatus.COMPLETED]
    durations = statistic(_ms(s.end_to_end_duration) for s in completed)
    sizes = statistic(s.state_size for s in completed)
    written = statistic(s.checkpointed_size for s in completed)
    if c.completed:
        d, z, w = snapshot.summary.end_to_end_duration, snapshot.summary.state_size, snapshot.summary.checkpointed_size
        durations.update(min=_ms(d.minimum), avg=_ms(d.average), max=_ms(d.maximum))
        sizes.update(min=z.minimum, avg=z.average, max=z.maximum)
        written.update(min=w.minimum, avg=w.average, max=w.maximum)
    return {
        "counts": {"total": c.triggered, "triggered": c.triggered, "in_progress": c.in_progress,
                   "completed": c.completed, "failed": c.failed, "restored": c.restored,
                   "storage_retries": snapshot.storage_retries},
        "summary": {
            "end_to_end_duration": durations,
            "state_size": sizes,
            "checkpointed_size": written,
            "processed_data": statistic(_processed(s) for s in completed),
            "persisted_data": statistic(_persisted(s) for s in completed),
        },
        "latest": {
            "completed": checkpoint_entry(snapshot.latest_completed) if snapshot.latest_completed else None,
            "savepoint": checkpoint_entry(snapshot.latest_savepoint) if snapshot.latest_savepoint else None,
            "failed": checkpoint_entry(snapshot.latest_failed) if snapshot.latest_failed else None,
            "restored": _restored_entry(snapshot.latest_restored),
        },
        "failures_by_reason": {reason.name: n for reason, n in snapshot.failures_by_reason.items()},
        "history": [checkpoint_entry(s) for s in snapshot.history],
    }


def checkpoint_config(config, state_backend) -> dict:
    """`CheckpointConfig` as Flink's checkpoint-config document (durations in ms)."""
    return {
        "mode": config.mode,
        "interval": _ms(config.interval) if config.interval is not None else -1,
        "timeout": _ms(config.timeout),
        "min_pause": _ms(config.min_pause),
        "max_concurrent": config.max_concurrent,
        "tolerable_failed_checkpoints": config.tolerable_failures,
        "num_retained": config.num_retained,
        "externalization": {"enabled": config.retention != "delete_on_cancellation",
                            "delete_on_cancellation": config.retention == "delete_on_cancellation"},
        "unaligned_checkpoints": config.unaligned,
        "aligned_checkpoint_timeout": _ms(config.aligned_timeout) if config.aligned_timeout is not None else 0,
        "checkpoints_after_tasks_finish": config.final_checkpoint,
        "state_backend": state_backend if isinstance(state_backend, str) else "rocksdb",
        "checkpoint_storage": config.directory,
        # Only the names: the values are credentials.
        "storage_options": sorted(config.storage_options or ()),
        "resume": config.resume,
    }


def _subtask_entry(s: SubtaskCheckpointStats) -> dict:
    return {
        "index": s.index, "attempt": s.attempt, "status": "completed",
        "ack_timestamp": _ms(s.ack_timestamp), "end_to_end_duration": _ms(s.end_to_end_duration),
        "state_size": s.state_size, "checkpointed_size": s.checkpointed_size,
        "checkpoint": {"sync": _ms(s.sync_duration), "async": _ms(s.async_duration)},
        "alignment": {"duration": _ms(s.alignment_duration), "processed": s.bytes_processed_during_alignment,
                      "persisted": s.bytes_persisted_of_in_flight_data},
        "start_delay": _ms(s.start_delay),
        "unaligned_checkpoint": s.unaligned,
    }


def checkpoint_details(stats: CheckpointStats, vertices: Iterable[tuple[str, str, int]]) -> dict:
    """One checkpoint with, per job vertex (operator chain), its subtasks' figures.

    vertices: (id, name, parallelism) of every job vertex; subtasks that have not acknowledged
    (still pending, or the checkpoint failed before they did) are listed as such.
    """
    by_vertex: dict[str, list[SubtaskCheckpointStats]] = {}
    for s in stats.subtasks:
        by_vertex.setdefault(s.vertex_id, []).append(s)
    tasks = {}
    for vertex_id, name, parallelism in vertices:
        acked = sorted(by_vertex.get(vertex_id, []), key=lambda s: s.index)
        seen = {s.index for s in acked}
        subtasks = [_subtask_entry(s) for s in acked]
        subtasks += [{"index": i, "status": "pending_or_failed"} for i in range(parallelism) if i not in seen]
        subtasks.sort(key=lambda e: e["index"])
        tasks[vertex_id] = {
            "id": vertex_id, "name": name, "status": stats.status.value,
            "num_subtasks": parallelism, "num_acknowledged_subtasks": len(acked),
            "latest_ack_timestamp": _ms(max(s.ack_timestamp for s in acked)) if acked else -1,
            "end_to_end_duration": _ms(max(s.end_to_end_duration for s in acked)) if acked else None,
            "state_size": sum(s.state_size for s in acked),
            "checkpointed_size": sum(s.checkpointed_size for s in acked),
            "alignment_buffered": sum(s.bytes_processed_during_alignment for s in acked),
            "processed_data": sum(s.bytes_processed_during_alignment for s in acked),
            "persisted_data": sum(s.bytes_persisted_of_in_flight_data for s in acked),
            "summary": {
                "end_to_end_duration": statistic(_ms(s.end_to_end_duration) for s in acked),
                "checkpoint_duration": {"sync": statistic(_ms(s.sync_duration) for s in acked),
                                        "async": statistic(_ms(s.async_duration) for s in acked)},
                "alignment": {"duration": statistic(_ms(s.alignment_duration) for s in acked)},
                "start_delay": statistic(_ms(s.start_delay) for s in acked),
                "state_size": statistic(s.state_size for s in acked),
                "checkpointed_size": statistic(s.checkpointed_size for s in acked),
            },
            "subtasks": subtasks,
        }
    return {**checkpoint_entry(stats), "tasks": tasks}
