"""The JobResult of a finished job, from the JobMaster's subtask records (cluster/jobmaster.py).

Record counts per operator, the network's peaks, the restarts and recovery log, and what
task-local recovery wrote and read (also recorded per recovery: `_restore_sources`). Gathered
here so the JobMaster's event loop only decides when the job ended.
"""

from __future__ import annotations

import time

from streamsnap.api.result import JobResult, OperatorMetrics
from streamsnap.cluster.status import JobStatus


class ResultReport:
    """Mixin of the JobMaster: its result and the local-recovery figures of its recoveries."""

    def _restore_sources(self) -> dict:
        """Where this attempt's subtasks restored their keyed state from: files and bytes read
        from task-local copies and from checkpoint storage, in total and per subtask."""
        from streamsnap.state.local_recovery import summarize_restores

        return summarize_restores({f"{s.attempt_id.vertex_id}#{s.attempt_id.index}": counts
                                   for s in self._subtasks.values()
                                   if (counts := (s.local_recovery or {}).get("restored")) is not None})

    def _build_result(self, stats) -> JobResult:
        operators: dict[str, OperatorMetrics] = {}
        network = {"peak_input_buffered_bytes": 0, "peak_output_queued_bytes": 0, "bytes_sent": 0,
                   "max_frame_bytes": 0, "refused_connections": self._server.refused}
        for vertex in self.job_graph.vertices.values():
            for node_id in vertex.nodes:
                node = self.job_graph.node(node_id)
                records_in = records_out = 0
                for subtask in self._subtasks.values():
                    m = (subtask.metrics or {}).get("operators", {}).get(node.uid)
                    if m:
                        records_in += m["records_in"]
                        records_out += m["records_out"]
                operators[node.uid] = OperatorMetrics(node.name, node.uid, node.parallelism, records_in, records_out)
        for subtask in self._subtasks.values():
            m = subtask.metrics or {}
            network["peak_input_buffered_bytes"] = max(network["peak_input_buffered_bytes"],
                                                       m.get("peak_input_buffered_bytes", 0))
            network["peak_output_queued_bytes"] = max(network["peak_output_queued_bytes"],
                                                      m.get("peak_output_queued_bytes", 0))
            network["bytes_sent"] += m.get("bytes_sent", 0)
            network["max_frame_bytes"] = max(network["max_frame_bytes"], m.get("max_frame_bytes", 0))
            network["refused_connections"] += m.get("refused_connections", 0)
        collected = {self._sink_names[uid]: c.rows() for uid, c in self._sinks.items() if hasattr(c, "rows")}
        return JobResult(self.job_id, self.settings.job_name, JobStatus.FINISHED.value,
                         time.monotonic() - self.started_at, operators, collected, stats,
                         self._backoff.restarts, network, tuple(dict(r) for r in self.recovery_log),
                         attempt=self._attempt, restored_checkpoint=self._restored_checkpoint_id,
                         local_recovery=self._local_recovery_totals(), exceptions=self.exceptions.entries())

    def _local_recovery_totals(self) -> dict | None:
        """The finished subtasks' local stores summed: copies written, and the restore's reads."""
        from streamsnap.state.local_recovery import summarize_stores

        if not self.settings.local_recovery:
            return None
        return summarize_stores([(s.metrics or {}).get("local_recovery") or {} for s in self._subtasks.values()],
                                self._restore_sources())


__all__ = ["ResultReport"]
