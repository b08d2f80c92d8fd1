"""Mapping a checkpoint onto a job: uid matching, orphaned state, rescaling, empty state."""

import pytest

import streamsnap as ss
from streamsnap.checkpoint.handles import FileHandle, KeyGroupsStateHandle, OperatorStateHandle, OperatorSubtaskState
from streamsnap.checkpoint.metadata import CheckpointMetadata, OperatorState
from streamsnap.checkpoint.restore import plan_restore
from streamsnap.graph.job_graph import build_job_graph
from streamsnap.runtime.events import CheckpointType


class Sum(ss.KeyedProcessFunction):
    def process_element(self, row, ctx):
        return row


def job(parallelism=2, max_parallelism=16, sum_uid="sum"):
    env = ss.StreamEnvironment(parallelism=parallelism, max_parallelism=max_parallelism)
    (env.from_source(ss.sources.Generator(lambda i: {"k": i}, count=5), uid="src")
        .key_by("k").process(Sum(), uid=sum_uid).sink_to(ss.sinks.Collect(), uid="out"))
    return build_job_graph(env._graph)


def metadata(max_parallelism=16):
    keyed = {i: OperatorSubtaskState(keyed=(KeyGroupsStateHandle(FileHandle(f"k{i}", 10), i * 8, i * 8 + 7,
                                                                 {i * 8: (0, 10)}),))
             for i in range(2)}
    splits = {i: OperatorSubtaskState(operator=(OperatorStateHandle(
        FileHandle(f"o{i}", 5), {"source-splits": ("split", ((0, 5),))}),)) for i in range(2)}
    return CheckpointMetadata("old-job", 7, CheckpointType.CHECKPOINT, 1.0, 2.0, {
        "src": OperatorState("src", 2, max_parallelism, splits),
        "sum": OperatorState("sum", 2, max_parallelism, keyed),
        "out": OperatorState("out", 2, max_parallelism, {}),  # in the checkpoint, no state
    })


def test_state_is_matched_by_uid_and_rescaled():
    plan = plan_restore(metadata(), "file:///ckpt/chk-7", job(parallelism=3))
    assert plan.checkpoint_id == 7 and plan.restored_operators == {"src", "sum", "out"}
    keyed = [plan.states[("sum", i)].keyed for i in range(3)]
    assert all(len(k) >= 1 for k in keyed)
    assert sum(len(plan.states[("src", i)].operator[0].elements) if plan.states[("src", i)].operator else 0
               for i in range(3)) == 2  # two split elements dealt over three subtasks
    assert plan.states[("out", 0)].is_restored and not plan.states[("out", 0)].keyed


def test_state_of_a_missing_operator_is_refused_unless_allowed():
    with pytest.raises(ss.RestoreError, match=r"operator\(s\) sum that the job no longer has"):
        plan_restore(metadata(), "file:///c", job(sum_uid="renamed"))
    plan = plan_restore(metadata(), "file:///c", job(sum_uid="renamed"), allow_non_restored_state=True)
    assert "renamed" not in plan.restored_operators and "src" in plan.restored_operators
    assert not plan.states[("renamed", 0)].keyed


def test_keyed_state_cannot_move_to_another_max_parallelism():
    with pytest.raises(ss.RestoreError, match="max_parallelism 16, but the job uses max_parallelism 32"):
        plan_restore(metadata(), "file:///c", job(max_parallelism=32))


def _unaligned_metadata():
    """The checkpoint of `metadata()` taken unaligned: the keyed task kept in-flight data."""
    base = metadata()
    sum_state = base.operators["sum"]
    states = {i: OperatorSubtaskState(s.keyed, s.operator, (FileHandle(f"sum-channels-{i}", 40),))
              for i, s in sum_state.subtask_states.items()}
    operators = dict(base.operators)
    operators["sum"] = OperatorState("sum", 2, sum_state.max_parallelism, states)
    return CheckpointMetadata("old-job", 7, CheckpointType.CHECKPOINT, 1.0, 2.0, operators)


def test_in_flight_data_of_an_unaligned_checkpoint_goes_back_to_the_same_subtask():
    plan = plan_restore(_unaligned_metadata(), "file:///c", job(parallelism=2))
    assert [plan.states[("sum", i)].channel for i in range(2)] == [
        (FileHandle("sum-channels-0", 40),), (FileHandle("sum-channels-1", 40),)]
    assert plan.states[("src", 0)].channel == ()
    wire = plan.states[("sum", 1)].to_wire()
    assert type(plan.states[("sum", 1)]).from_wire(wire) == plan.states[("sum", 1)]


def test_an_unaligned_checkpoint_refuses_another_parallelism_and_names_the_way_out():
    with pytest.raises(ss.RestoreError, match=r"checkpoint 7 is an unaligned checkpoint.*sum \(2 -> 3\)"
                                              r".*take a savepoint"):
        plan_restore(_unaligned_metadata(), "file:///c", job(parallelism=3))
