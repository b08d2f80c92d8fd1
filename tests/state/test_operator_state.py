import datetime
from pathlib import Path

import pytest

from streamsnap.checkpoint.handles import SPLIT_DISTRIBUTE, UNION, OperatorSubtaskState
from streamsnap.errors import ConfigurationError, RestoreError
from streamsnap.state import (OperatorStateBackend, PickleSerializer, SnapshotDiscardedError,
                              StateError, StateSerializationError, SubtaskRestoreState,
                              assign_operator_state)
from streamsnap.state.operator_state import MAGIC

from .conftest import files_in


def restore_same(handle, location, parallelism=1, index=0) -> OperatorStateBackend:
    assignment = assign_operator_state({0: OperatorSubtaskState(operator=(handle,))}, 128, parallelism)
    backend = OperatorStateBackend("src")
    backend.restore(assignment[index], location)
    return backend


def test_list_state_api():
    backend = OperatorStateBackend("src")
    state = backend.get_list_state("offsets")
    assert state.get() == []
    state.add(1)
    state.add_all([2, 3])
    state.get().append(99)
    assert state.get() == [1, 2, 3]
    state.update(["a"])
    assert state.get() == ["a"]
    state.clear()
    assert state.get() == []
    assert backend.get_list_state("offsets") is state
    assert state.mode == SPLIT_DISTRIBUTE
    assert backend.get_union_list_state("u").mode == UNION


def test_broadcast_state_api():
    backend = OperatorStateBackend("op")
    rules = backend.get_broadcast_state("rules")
    assert rules.is_empty() and rules.get("x") is None
    rules.put("x", 1)
    rules.put_all({("t", 1): [2]})
    assert rules.contains("x") and rules.get(("t", 1)) == [2]
    assert sorted(map(str, rules.keys())) == sorted(map(str, ["x", ("t", 1)]))
    assert len(rules.values()) == 2 and len(rules.items()) == 2
    rules.remove("x")
    rules.remove("missing")
    assert not rules.contains("x")
    rules.clear()
    assert rules.is_empty()


def test_mode_conflicts_and_bad_names():
    backend = OperatorStateBackend("src")
    backend.get_list_state("s")
    with pytest.raises(StateError, match="split state; it cannot also be used as union"):
        backend.get_union_list_state("s")
    with pytest.raises(StateError, match="broadcast"):
        backend.get_broadcast_state("s")
    with pytest.raises(StateError, match="serializer"):
        backend.get_list_state("s", serializer=PickleSerializer())
    with pytest.raises(ConfigurationError, match="non-empty str"):
        backend.get_list_state(42)
    with pytest.raises(ConfigurationError, match="non-empty str"):
        backend.get_list_state("")
    with pytest.raises(ConfigurationError, match="serializer"):
        backend.get_list_state("x", serializer=object())


def test_round_trip_all_modes(location):
    backend = OperatorStateBackend("src")
    backend.get_list_state("split").add_all([1, ("p", 2), {"k": [3]}])
    backend.get_union_list_state("union").add_all(["u1", "u2"])
    backend.get_list_state("empty")
    backend.get_broadcast_state("rules").put_all({"a": 1, ("t", 2): (3, 4)})
    handle = backend.snapshot(1, location).run()
    assert files_in(location) == [handle.file.path]
    assert Path(location[7:], handle.file.path).read_bytes().startswith(MAGIC)
    assert handle.states["split"][0] == SPLIT_DISTRIBUTE and len(handle.states["split"][1]) == 3
    assert handle.states["empty"] == (SPLIT_DISTRIBUTE, ())
    again = restore_same(handle, location)
    assert again.is_restored
    assert again.get_list_state("split").get() == [1, ("p", 2), {"k": [3]}]
    assert again.get_union_list_state("union").get() == ["u1", "u2"]
    assert again.get_list_state("empty").get() == []
    assert dict(again.get_broadcast_state("rules").items()) == {"a": 1, ("t", 2): (3, 4)}


def test_no_elements_means_no_file(location):
    backend = OperatorStateBackend("src")
    backend.get_list_state("s")
    assert backend.snapshot(1, location).run() is None
    assert files_in(location) == []


def test_changes_after_snapshot_are_not_in_it(location):
    backend = OperatorStateBackend("src")
    offsets = backend.get_list_state("offsets")
    rules = backend.get_broadcast_state("rules")
    offsets.add_all([1, 2])
    rules.put("r", 1)
    snapshot = backend.snapshot(1, location)
    offsets.add(3)
    offsets.update([9])
    rules.put("r", 2)
    rules.put("new", 3)
    handle = snapshot.run()
    again = restore_same(handle, location)
    assert again.get_list_state("offsets").get() == [1, 2]
    assert dict(again.get_broadcast_state("rules").items()) == {"r": 1}


def test_serialization_errors_and_pickle(location):
    backend = OperatorStateBackend("src")
    with pytest.raises(StateSerializationError, match=r"'offsets'.*'object'.*PickleSerializer"):
        backend.get_list_state("offsets").add([datetime.datetime(2024, 1, 1), object()])
    pickled = backend.get_list_state("pickled", serializer=PickleSerializer())
    pickled.add({1, 2})
    handle = backend.snapshot(1, location).run()
    again = restore_same(handle, location)
    assert again.get_list_state("pickled", serializer=PickleSerializer()).get() == [{1, 2}]
    with pytest.raises(RestoreError, match="'pickle' serializer"):
        restore_same(handle, location).get_list_state("pickled")


def test_restored_mode_must_match(location):
    backend = OperatorStateBackend("src")
    backend.get_union_list_state("s").add(1)
    handle = backend.snapshot(1, location).run()
    with pytest.raises(RestoreError, match="checkpointed as union"):
        restore_same(handle, location).get_list_state("s")


def test_unregistered_restored_state_is_carried_forward(location, tmp_path):
    backend = OperatorStateBackend("src")
    backend.get_list_state("s").add_all([1, 2, 3])
    handle = backend.snapshot(1, location).run()
    middle = restore_same(handle, location)
    loc2 = "file://" + str(tmp_path)
    handle2 = middle.snapshot(2, loc2).run()
    assert restore_same(handle2, loc2).get_list_state("s").get() == [1, 2, 3]


def test_corrupt_and_missing_files(location):
    backend = OperatorStateBackend("src")
    backend.get_list_state("s").add_all(["a", "b"])
    handle = backend.snapshot(1, location).run()
    path = Path(location[7:], handle.file.path)
    data = bytearray(path.read_bytes())
    data[handle.states["s"][1][1][0] + 2] ^= 0x55
    path.write_bytes(bytes(data))
    with pytest.raises(RestoreError, match="corrupt: checksum mismatch"):
        restore_same(handle, location)
    path.unlink()
    with pytest.raises(RestoreError, match="missing"):
        restore_same(handle, location)


def test_restore_requires_an_assignment(location):
    with pytest.raises(RestoreError, match="SubtaskRestoreState"):
        OperatorStateBackend("src").restore([], location)


def test_fresh_start_is_not_restored(location):
    backend = OperatorStateBackend("src")
    backend.restore(SubtaskRestoreState.fresh(0, 2, 128), location)
    assert not backend.is_restored


def test_discard(location):
    backend = OperatorStateBackend("src")
    backend.get_list_state("s").add(1)
    snapshot = backend.snapshot(1, location)
    snapshot.run()
    snapshot.discard()
    assert files_in(location) == []
    other = backend.snapshot(2, location)
    other.discard()
    with pytest.raises(SnapshotDiscardedError):
        other.run()
    assert files_in(location) == []


def test_dispose():
    backend = OperatorStateBackend("src")
    backend.get_list_state("s")
    backend.dispose()
    with pytest.raises(StateError, match="dispose"):
        backend.get_list_state("s")


def test_broadcast_keys_must_be_msgpack():
    rules = OperatorStateBackend("op").get_broadcast_state("rules")
    with pytest.raises(StateSerializationError, match="'rules'.*map key of type 'set'"):
        rules.put({1}, 1)
