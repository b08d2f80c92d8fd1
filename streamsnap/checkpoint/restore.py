"""Mapping a checkpoint's state onto a job: which subtask restores what.

Operators are matched by uid (that is what the uid is for). Each matched operator's state is
redistributed to the job's parallelism (`state.assignment`), so restoring with another
parallelism rescales. State of an operator the job no longer has is an error — it would be
lost silently — unless the user allows it; keyed state cannot move to another number of key
groups, so a changed max_parallelism is refused too. Runs on the driver, before deployment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from streamsnap.checkpoint.metadata import CheckpointMetadata
from streamsnap.errors import RestoreError
from streamsnap.graph.job_graph import JobGraph
from streamsnap.state.assignment import SubtaskRestoreState, assign_operator_state
from streamsnap.state.key_groups import key_group_range_for_subtask

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestorePlan:
    checkpoint_id: int
    base_location: str  # handle paths in the metadata are relative to this directory
    states: dict[tuple[str, int], SubtaskRestoreState] = field(default_factory=dict)
    # Operators the checkpoint knew, with or without state: an operator whose state happened
    # to be empty (a source with no splits left, a sink with nothing pending) must restore
    # that emptiness, not start over as if it were new.
    restored_operators: frozenset[str] = frozenset()


def _has_state(operator) -> bool:
    return any(s.keyed or s.operator or s.channel for s in operator.subtask_states.values())


def _check_in_flight_data(metadata: CheckpointMetadata, nodes: dict) -> None:
    """In-flight data belongs to channels between subtasks: at another parallelism of any
    operator those channels no longer exist, so an unaligned checkpoint restores only as is."""
    if not any(s.channel for op in metadata.operators.values() for s in op.subtask_states.values()):
        return
    changed = sorted(f"{uid} ({op.parallelism} -> {nodes[uid].parallelism})"
                     for uid, op in metadata.operators.items()
                     if uid in nodes and op.parallelism != nodes[uid].parallelism)
    if changed:
        raise RestoreError(
            f"checkpoint {metadata.checkpoint_id} is an unaligned checkpoint: it holds in-flight data "
            f"between subtasks, which cannot be redistributed when the parallelism changes "
            f"({', '.join(changed)}). Restore it at the same parallelism, or take a savepoint "
            f"(always aligned) and rescale from that.")


def plan_restore(metadata: CheckpointMetadata, base_location: str, job_graph: JobGraph,
                 allow_non_restored_state: bool = False) -> RestorePlan:
    nodes = {node.uid: node for node in job_graph.operators()}
    orphans = sorted(uid for uid, op in metadata.operators.items() if uid not in nodes and _has_state(op))
    if orphans:
        if not allow_non_restored_state:
            raise RestoreError(
                f"checkpoint {metadata.checkpoint_id} has state for operator(s) {', '.join(orphans)} that the "
                f"job no longer has (operators are matched by uid). Give the operators their old uid=..., or "
                f"pass allow_non_restored_state=True to drop that state.")
        log.warning("dropping state of operator(s) %s: not in the job (allow_non_restored_state=True)",
                    ", ".join(orphans))
    _check_in_flight_data(metadata, nodes)
    states: dict[tuple[str, int], SubtaskRestoreState] = {}
    for uid, node in nodes.items():
        operator = metadata.operators.get(uid)
        if operator is None or not _has_state(operator):
            for i in range(node.parallelism):
                states[(uid, i)] = SubtaskRestoreState(
                    i, node.parallelism, node.max_parallelism,
                    key_group_range_for_subtask(node.max_parallelism, node.parallelism, i), is_restored=True)
            continue
        has_keyed = any(s.keyed for s in operator.subtask_states.values())
        if has_keyed and operator.max_parallelism != node.max_parallelism:
            raise RestoreError(
                f"operator {uid!r} has keyed state for max_parallelism {operator.max_parallelism}, but the job "
                f"uses max_parallelism {node.max_parallelism}; keyed state is split into max_parallelism key "
                f"groups and cannot be re-split. Use StreamEnvironment(max_parallelism={operator.max_parallelism}).")
        if node.parallelism > operator.max_parallelism:
            raise RestoreError(
                f"operator {uid!r} cannot run with parallelism {node.parallelism}: its state has "
                f"{operator.max_parallelism} key groups (max_parallelism)")
        for i, state in enumerate(assign_operator_state(operator.subtask_states, node.max_parallelism,
                                                        node.parallelism)):
            states[(uid, i)] = state
    return RestorePlan(metadata.checkpoint_id, base_location, states,
                       frozenset(uid for uid in nodes if uid in metadata.operators))
