"""Which subtasks share a Spark task slot (Flink's slot sharing).

Without sharing, every subtask is its own Spark barrier task, so a job holds one slot per
subtask of every unchained vertex (source at parallelism 4 + keyed operator at 4 = 8 slots).
With sharing, slot i hosts subtask i of every vertex — one slice of the whole pipeline — so
a job needs as many slots as its widest vertex. Each shared subtask still runs in its own
process (runtime/slot.py forks it), so sharing a slot costs no parallelism, only Spark's
count of cores reserved for the job.
"""

from __future__ import annotations

from streamsnap.graph.execution_graph import ExecutionGraph


def plan_slots(graph: ExecutionGraph, shared: bool) -> tuple[tuple[int, ...], ...]:
    """Slot s -> the task indices it runs; the first one runs in the slot's own process.

    Vertices keep their graph order (sources first), so slot s is the same on every attempt.
    """
    if not shared:
        return tuple((v.task_index,) for v in graph.vertices)
    slots: dict[int, list[int]] = {}
    for vertex in graph.vertices:
        slots.setdefault(vertex.index, []).append(vertex.task_index)
    return tuple(tuple(slots[i]) for i in sorted(slots))
