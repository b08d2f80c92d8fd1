import msgpack
import pytest

from streamsnap.checkpoint.handles import (BROADCAST, SPLIT_DISTRIBUTE, UNION, FileHandle,
                                           KeyGroupsStateHandle, OperatorStateHandle,
                                           OperatorSubtaskState)
from streamsnap.errors import ConfigurationError, RestoreError
from streamsnap.state import (HashMapKeyedStateBackend, KeyGroupRange, OperatorStateBackend,
                              SubtaskRestoreState, ValueStateDescriptor, ListStateDescriptor,
                              assign_operator_state, assign_to_key_group,
                              key_group_range_for_subtask)

MAX_P = 128
COUNT = ValueStateDescriptor("count", default=0)
SEEN = ListStateDescriptor("seen")
KEYS = list(range(500)) + [f"user-{i}" for i in range(300)] + [("t", i) for i in range(100)]


def value_of(key):
    return {"k": str(key), "n": len(str(key))}


@pytest.fixture
def two_subtask_checkpoint(location):
    """A checkpoint of an operator with parallelism 2: keyed state and three operator states."""
    states = {}
    for index in range(2):
        kg_range = key_group_range_for_subtask(MAX_P, 2, index)
        keyed = HashMapKeyedStateBackend("op", MAX_P, kg_range)
        count, seen = keyed.get_state(COUNT), keyed.get_state(SEEN)
        for key in KEYS:
            kg = assign_to_key_group(key, MAX_P)
            if kg in kg_range:
                keyed.set_current_key(key, kg)
                count.update(value_of(key))
                seen.add_all([key, index])
        operator = OperatorStateBackend("op")
        # uneven element counts: 5 on subtask 0, 2 on subtask 1
        operator.get_list_state("offsets").add_all(
            [f"s{index}-e{i}" for i in range(5 if index == 0 else 2)])
        operator.get_union_list_state("watermarks").add(f"wm{index}")
        operator.get_broadcast_state("rules").put("copy", index)
        keyed_handle = keyed.snapshot(1, location).run()
        operator_handle = operator.snapshot(1, location).run()
        states[index] = OperatorSubtaskState((keyed_handle,), (operator_handle,))
    # the checkpoint metadata travels as msgpack: restore from the wire form
    wire = msgpack.unpackb(msgpack.packb({i: s.to_wire() for i, s in states.items()}),
                           raw=False, strict_map_key=False)
    return {int(i): OperatorSubtaskState.from_wire(s) for i, s in wire.items()}


@pytest.mark.parametrize("new_parallelism", [1, 2, 3])
def test_keyed_state_rescales(two_subtask_checkpoint, location, new_parallelism):
    assignments = assign_operator_state(two_subtask_checkpoint, MAX_P, new_parallelism)
    assert [a.subtask_index for a in assignments] == list(range(new_parallelism))
    owner = {}
    for assignment in assignments:
        assert assignment.key_group_range == key_group_range_for_subtask(
            MAX_P, new_parallelism, assignment.subtask_index)
        backend = HashMapKeyedStateBackend("op", MAX_P, assignment.key_group_range)
        backend.restore(assignment, location)
        assert backend.is_restored
        count, seen = backend.get_state(COUNT), backend.get_state(SEEN)
        for key in backend.get_keys("count"):
            assert key not in owner, f"{key!r} restored into two subtasks"
            owner[key] = assignment.subtask_index
            kg = assign_to_key_group(key, MAX_P)
            assert kg in assignment.key_group_range
            backend.set_current_key(key, kg)
            assert count.value() == value_of(key)
            old_index = 0 if kg < 64 else 1
            assert seen.get() == [key, old_index]
    assert sorted(map(repr, owner)) == sorted(map(repr, KEYS))
    assert isinstance(next(k for k in owner if isinstance(k, tuple)), tuple)


def test_keyed_handles_are_assigned_by_range_intersection(two_subtask_checkpoint):
    assignments = assign_operator_state(two_subtask_checkpoint, MAX_P, 3)
    # new ranges [0,42] [43,85] [86,127]; old ranges [0,63] [64,127]
    assert [len(a.keyed) for a in assignments] == [1, 2, 1]


@pytest.mark.parametrize("new_parallelism,sizes", [(1, [7]), (2, [4, 3]), (3, [3, 2, 2])])
def test_operator_state_split_union_broadcast(two_subtask_checkpoint, location, new_parallelism, sizes):
    assignments = assign_operator_state(two_subtask_checkpoint, MAX_P, new_parallelism)
    split, unions = [], []
    for assignment in assignments:
        assert {s.name: s.mode for s in assignment.operator} == {
            "offsets": SPLIT_DISTRIBUTE, "watermarks": UNION, "rules": BROADCAST}
        backend = OperatorStateBackend("op")
        backend.restore(assignment, location)
        split.append(backend.get_list_state("offsets").get())
        unions.append(backend.get_union_list_state("watermarks").get())
        assert dict(backend.get_broadcast_state("rules").items()) == {"copy": 0}
    assert [len(part) for part in split] == sizes
    everything = [f"s0-e{i}" for i in range(5)] + [f"s1-e{i}" for i in range(2)]
    assert [e for part in split for e in part] == everything        # contiguous, in order
    assert unions == [["wm0", "wm1"]] * new_parallelism


def test_assignment_is_deterministic(two_subtask_checkpoint):
    assert assign_operator_state(two_subtask_checkpoint, MAX_P, 3) == \
        assign_operator_state(two_subtask_checkpoint, MAX_P, 3)


def test_restore_state_wire_round_trip(two_subtask_checkpoint):
    for assignment in assign_operator_state(two_subtask_checkpoint, MAX_P, 3):
        wire = msgpack.unpackb(msgpack.packb(assignment.to_wire()), raw=False)
        assert SubtaskRestoreState.from_wire(wire) == assignment
    fresh = SubtaskRestoreState.fresh(1, 2, MAX_P)
    assert SubtaskRestoreState.from_wire(fresh.to_wire()) == fresh and not fresh.is_restored


def test_no_state_in_checkpoint():
    assignments = assign_operator_state({}, MAX_P, 2)
    assert all(a.is_restored and not a.keyed and not a.operator for a in assignments)
    assert assign_operator_state({0: OperatorSubtaskState()}, MAX_P, 2)[1].key_group_range == \
        KeyGroupRange(64, 127)


def test_validation():
    with pytest.raises(ConfigurationError, match="parallelism"):
        assign_operator_state({0: OperatorSubtaskState()}, MAX_P, MAX_P + 1)
    with pytest.raises(ConfigurationError, match="parallelism"):
        assign_operator_state({0: OperatorSubtaskState()}, MAX_P, 0)
    with pytest.raises(RestoreError, match="indices"):
        assign_operator_state({0: OperatorSubtaskState(), 2: OperatorSubtaskState()}, MAX_P, 2)
    wide = KeyGroupsStateHandle(FileHandle("f", 10), 0, 255)
    with pytest.raises(RestoreError, match="another max parallelism"):
        assign_operator_state({0: OperatorSubtaskState(keyed=(wide,))}, MAX_P, 2)
    bad_mode = OperatorStateHandle(FileHandle("f", 10), {"s": ("scatter", ((0, 1),))})
    with pytest.raises(RestoreError, match="unknown distribution mode"):
        assign_operator_state({0: OperatorSubtaskState(operator=(bad_mode,))}, MAX_P, 1)
    a = OperatorStateHandle(FileHandle("a", 10), {"s": (SPLIT_DISTRIBUTE, ((0, 1),))})
    b = OperatorStateHandle(FileHandle("b", 10), {"s": (UNION, ((0, 1),))})
    with pytest.raises(RestoreError, match="written as 'split'.*'union'"):
        assign_operator_state({0: OperatorSubtaskState(operator=(a,)),
                               1: OperatorSubtaskState(operator=(b,))}, MAX_P, 1)
