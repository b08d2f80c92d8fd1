"""What the monitoring endpoint knows about a running job, sampled from its JobMaster.

The JobMaster owns its state on its own thread; this module only reads it through the
JobMaster's public accessors (status, subtasks, restarts, the last per-subtask counters) and
asks running subtasks for fresh counters every poll interval. Each poll turns two successive
counter readings into records-per-second rates and freezes everything into a `JobSample`,
an immutable value that HTTP threads and the Prometheus collector read without locks.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from streamsnap.runtime.task_time import time_shares
from streamsnap.time.watermarks import MIN_WATERMARK

DEFAULT_POLL_INTERVAL = 1.0


@dataclass(frozen=True)
class OperatorSample:
    uid: str
    name: str
    vertex_id: str
    parallelism: int
    records_in: dict[int, int]      # by subtask index, since the current attempt started
    records_out: dict[int, int]
    records_in_per_second: float = 0.0
    records_out_per_second: float = 0.0
    # Event time by subtask index: what the operator was last told, and last emitted
    # (MIN_WATERMARK: none yet, as Flink reports Long.MIN_VALUE).
    input_watermarks: dict[int, int] = field(default_factory=dict)
    output_watermarks: dict[int, int] = field(default_factory=dict)
    # RocksDB native metrics by subtask index (keyed state on RocksDB only): compactions
    # running/pending, flushes, live SST bytes, memory (state/backends/rocksdb/backend.py NATIVE_METRICS).
    rocksdb: dict[int, dict[str, int]] = field(default_factory=dict)

    @property
    def total_in(self) -> int:
        return sum(self.records_in.values())

    @property
    def total_out(self) -> int:
        return sum(self.records_out.values())


@dataclass(frozen=True)
class VertexSample:
    id: str
    name: str
    parallelism: int
    subtask_states: dict[int, str]  # by subtask index
    operators: tuple[OperatorSample, ...]
    inputs: tuple[str, ...] = ()    # upstream vertex ids
    bytes_in: dict[int, int] = field(default_factory=dict)    # network bytes received, by subtask index
    bytes_out: dict[int, int] = field(default_factory=dict)   # network bytes sent
    # By subtask index: milliseconds per second idle / backpressured / busy over the last poll
    # interval (runtime/task_time.py); absent until two readings of the subtask arrived.
    time_shares: dict[int, dict[str, float]] = field(default_factory=dict)
    # (upstream vertex id, partitioning: forward/hash/rebalance/broadcast) per input edge
    input_edges: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class JobSample:
    job_id: str
    name: str
    status: str
    start_time: float               # wall-clock seconds
    now: float
    restarts: int
    failures: tuple[dict, ...]      # failed_at (wall-clock seconds), cause; oldest first
    vertices: tuple[VertexSample, ...]
    checkpointing: bool = True
    read_only: bool = False         # a checkpoint directory after the fact (web/archive.py)
    detail: str = ""                # what the status waits for ("starting Spark")
    exceptions: tuple = ()          # cluster.exception_history.ExceptionHistoryEntry, oldest first
    ended_at: float | None = None   # wall-clock seconds the job ended (archived jobs)

    @property
    def uptime(self) -> float:
        return max(0.0, self.now - self.start_time)


def _counters(metrics_by_subtask: dict) -> dict[str, dict[int, tuple[int, int]]]:
    """{(vertex, index): task metrics} → {operator uid: {index: (records in, records out)}}."""
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for (_vertex, index), metrics in metrics_by_subtask.items():
        for uid, m in (metrics.get("operators") or {}).items():
            out.setdefault(uid, {})[index] = (int(m["records_in"]), int(m["records_out"]))
    return out


def _watermarks(metrics_by_subtask: dict, vertex_id: str, uid: str) -> dict[int, tuple[int, int]]:
    """{index: (input watermark, output watermark)} of one operator from its subtasks' metrics."""
    out = {}
    for (vertex, index), metrics in sorted(metrics_by_subtask.items()):
        m = (metrics.get("operators") or {}).get(uid) if vertex == vertex_id else None
        if m is not None:
            out[index] = (int(m.get("input_watermark", MIN_WATERMARK)), int(m.get("output_watermark", MIN_WATERMARK)))
    return out


def _rocksdb(metrics_by_subtask: dict, vertex_id: str, uid: str) -> dict[int, dict[str, int]]:
    """{index: RocksDB native metrics} of one operator (empty: its state is not on RocksDB)."""
    out = {}
    for (vertex, index), metrics in sorted(metrics_by_subtask.items()):
        m = (metrics.get("operators") or {}).get(uid) if vertex == vertex_id else None
        if m is not None and m.get("rocksdb"):
            out[index] = dict(m["rocksdb"])
    return out


def rates(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
          seconds: float) -> dict[str, tuple[float, float]]:
    """Records in/out per second of each operator between two readings of its totals. A total
    that went down (a restart: counts start again from the restored checkpoint) gives 0, not a
    negative rate; an operator not in `before` counts from 0."""
    return {uid: tuple(max(0.0, (value - before.get(uid, (0, 0))[k]) / seconds) for k, value in enumerate(totals))
            for uid, totals in after.items()}


class JobProgress:
    """Samples one JobMaster; `poll()` runs on the web server's poller thread."""

    def __init__(self, master, clock=time.time):
        self._master = master
        self._clock = clock
        self._start = clock()
        self._lock = threading.Lock()
        self._previous: tuple[float, dict[str, tuple[int, int]]] | None = None
        self._rates: dict[str, tuple[float, float]] = {}
        self._time_readings: dict[tuple[str, int], dict] = {}
        self._time_shares: dict[tuple[str, int], dict[str, float]] = {}

    def poll(self) -> None:
        """Turn the counters that arrived since the last poll into rates, then ask for fresh ones."""
        now = self._clock()
        metrics = self._master.operator_metrics()
        totals = {uid: (sum(i for i, _ in by.values()), sum(o for _, o in by.values()))
                  for uid, by in _counters(metrics).items()}
        with self._lock:
            if self._previous is not None and now > self._previous[0]:
                then, before = self._previous
                self._rates = rates(before, totals, now - then)
            self._previous = (now, totals)
            for subtask, m in metrics.items():
                reading = m.get("time")
                if reading is None:
                    continue
                shares = time_shares(self._time_readings.get(subtask), reading)
                if shares is not None:   # None: no fresh reading since the last poll
                    self._time_shares[subtask] = shares
                    self._time_readings[subtask] = reading
        self._master.request_metrics()

    def sample(self) -> JobSample:
        master = self._master
        states: dict[str, dict[int, str]] = {}
        for s in master.subtasks():
            states.setdefault(s.vertex, {})[s.index] = s.state
        with self._lock:
            rates = dict(self._rates)
            shares = dict(self._time_shares)
        vertices = vertex_samples(master.execution_graph.job_graph, master.operator_metrics(), states, rates, shares)
        failures = tuple({"failed_at": r["failed_at"], "cause": r.get("cause", "")} for r in list(master.recovery_log))
        return JobSample(master.job_id, master.settings.job_name, master.status.value, self._start, self._clock(),
                         master.restarts, failures, vertices, master.settings.checkpoint is not None,
                         exceptions=master.exceptions.entries())


def vertex_samples(graph, metrics: dict | None = None, states: dict | None = None, rates: dict | None = None,
                   shares: dict | None = None) -> tuple[VertexSample, ...]:
    """The job graph's vertices with what is known of them (nothing yet for a job still starting)."""
    metrics, states, rates, shares = metrics or {}, states or {}, rates or {}, shares or {}
    counters = _counters(metrics)
    vertices = []
    for vertex in graph.vertices.values():
        operators = []
        for node_id in vertex.nodes:
            node = graph.node(node_id)
            by_index = counters.get(node.uid, {})
            rate_in, rate_out = rates.get(node.uid, (0.0, 0.0))
            watermarks = _watermarks(metrics, vertex.id, node.uid)
            operators.append(OperatorSample(
                node.uid, node.name, vertex.id, node.parallelism,
                {i: c[0] for i, c in sorted(by_index.items())}, {i: c[1] for i, c in sorted(by_index.items())},
                rate_in, rate_out, {i: w[0] for i, w in watermarks.items()},
                {i: w[1] for i, w in watermarks.items()}, _rocksdb(metrics, vertex.id, node.uid)))
        network = {index: m for (vertex_id, index), m in metrics.items() if vertex_id == vertex.id}
        vertices.append(VertexSample(
            vertex.id, vertex.name, vertex.parallelism, states.get(vertex.id, {}), tuple(operators),
            tuple(dict.fromkeys(e.source_vertex for e in vertex.inputs)),
            {i: int(m.get("bytes_received", 0)) for i, m in sorted(network.items())},
            {i: int(m.get("bytes_sent", 0)) for i, m in sorted(network.items())},
            {index: share for (vertex_id, index), share in sorted(shares.items()) if vertex_id == vertex.id},
            tuple(dict.fromkeys((e.source_vertex, e.partitioner.name) for e in vertex.inputs))))
    return tuple(vertices)
