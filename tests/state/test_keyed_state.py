import datetime

import numpy as np
import pytest

from streamsnap.errors import ConfigurationError
from streamsnap.graph.keys import BatchKeys
from streamsnap.state import (KeyGroupRange, ListStateDescriptor,
                              MapStateDescriptor, PickleSerializer, ReducingStateDescriptor,
                              StateDescriptor, StateError, StateSerializationError,
                              ValueStateDescriptor, assign_to_key_group)

from .conftest import BACKEND_KINDS, make_backend

MAX_P = 128


@pytest.fixture
def backend(new_backend):
    """One backend of each kind (see conftest.backend_kind)."""
    return new_backend(KeyGroupRange(0, MAX_P - 1))


def use_key(backend, key):
    backend.set_current_key(key, assign_to_key_group(key, MAX_P))


def test_value_state_default_update_clear(backend):
    state = backend.get_state(ValueStateDescriptor("count", default=0))
    use_key(backend, "a")
    assert state.value() == 0
    state.update(5)
    assert state.value() == 5
    use_key(backend, "b")
    assert state.value() == 0          # per key
    state.update("x")
    use_key(backend, "a")
    assert state.value() == 5
    state.clear()
    assert state.value() == 0
    use_key(backend, "b")
    state.update(None)                 # None clears
    assert state.value() == 0
    assert backend.num_keys() == 0


def test_value_state_default_none_and_mutable_default_is_copied(backend):
    plain = backend.get_state(ValueStateDescriptor("plain"))
    listy = backend.get_state(ValueStateDescriptor("listy", default=[]))
    use_key(backend, 1)
    assert plain.value() is None
    listy.value().append("leak")
    assert listy.value() == []


def test_value_state_container_values(backend, backend_kind):
    state = backend.get_state(ValueStateDescriptor("d"))
    use_key(backend, 1)
    state.update({"n": [1, 2]})
    state.value()["n"].append(3)
    if backend_kind == "hashmap":      # in-place mutation is visible like any heap state
        assert state.value() == {"n": [1, 2, 3]}
    else:                              # RocksDB hands out copies (as in Flink): write back
        assert state.value() == {"n": [1, 2]}
        value = state.value()
        value["n"].append(3)
        state.update(value)
        assert state.value() == {"n": [1, 2, 3]}


def test_list_state(backend):
    state = backend.get_state(ListStateDescriptor("items"))
    use_key(backend, "k")
    assert state.get() == []
    state.add(1)
    state.add_all([2, 3])
    state.add_all([])
    assert state.get() == [1, 2, 3]
    state.get().append(99)             # get() returns a copy
    assert state.get() == [1, 2, 3]
    state.update(["x"])
    assert state.get() == ["x"]
    state.update([])
    assert state.get() == [] and backend.num_keys() == 0
    state.add(None)
    assert state.get() == [None]
    state.clear()
    assert state.get() == []


def test_map_state_of_many_keys_in_one_call(backend):
    """get_all_many/put_all_many: a batch's lookups and writes in many keys' maps at once —
    the same as key by key, the current key untouched."""
    state = backend.get_state(MapStateDescriptor("m"))
    names = ["a", ("comp", 2), 7]
    keys = BatchKeys(names, np.zeros(0, dtype=np.int64), [assign_to_key_group(k, MAX_P) for k in names])
    use_key(backend, "mine")
    state.put("x", "mine")
    state.put_all_many(keys, [{"x": 1, "y": 2}, {}, {("t", 1): 3}])
    assert state.get_all_many(keys, [["y", "x", "z"], ["x"], [("t", 1), object()]], 0) == [[2, 1, 0], [0], [3, 0]]
    assert backend.current_key == "mine" and state.items() == [("x", "mine")]
    for name, expected in zip(names, [{"x": 1, "y": 2}, {}, {("t", 1): 3}]):
        use_key(backend, name)
        assert dict(state.items()) == expected
    assert state.get_all_many(BatchKeys([], keys.index, []), []) == []
    with pytest.raises(ValueError, match="put_all_many got 1 mappings for 3 keys"):
        state.put_all_many(keys, [{}])
    with pytest.raises(StateSerializationError, match="map key"):
        state.put_all_many(keys, [{object(): 1}, {}, {}])


def test_map_state(backend):
    state = backend.get_state(MapStateDescriptor("m"))
    use_key(backend, ("comp", 1))
    assert state.is_empty() and state.get("a") is None and state.get("a", 7) == 7
    state.put("a", 1)
    state.put_all({"b": 2, ("t", 1): 3})
    assert state.get("a") == 1 and state.contains("b") and not state.contains("z")
    assert sorted(map(str, state.keys())) == sorted(map(str, ["a", "b", ("t", 1)]))
    assert sorted(state.values()) == [1, 2, 3]
    assert dict(state.items()) == {"a": 1, "b": 2, ("t", 1): 3}
    assert state.get_all(["b", "z", ("t", 1), "a", object()], 0) == [2, 0, 3, 1, 0]   # in order, default if absent
    assert state.get_all([]) == []
    use_key(backend, "other")
    assert state.get_all(["a", "b"]) == [None, None]
    use_key(backend, ("comp", 1))
    state.remove("a")
    state.remove("missing")
    assert not state.contains("a")
    state.remove("b")
    state.remove(("t", 1))
    assert state.is_empty() and backend.num_keys() == 0
    state.put("x", 1)
    state.clear()
    assert state.is_empty()


def test_reducing_state(backend):
    state = backend.get_state(ReducingStateDescriptor("sum", lambda a, b: a + b))
    use_key(backend, 1)
    assert state.get() is None
    state.add(3)
    state.add(4)
    assert state.get() == 7
    use_key(backend, 2)
    state.add([1])
    state.add([2])
    assert state.get() == [1, 2]
    state.clear()
    assert state.get() is None
    use_key(backend, 1)
    assert state.get() == 7


def test_same_name_returns_same_state_and_kind_conflict_fails(backend):
    first = backend.get_state(ValueStateDescriptor("s"))
    assert backend.get_state(ValueStateDescriptor("s")) is first
    with pytest.raises(StateError, match="is a value state.*list"):
        backend.get_state(ListStateDescriptor("s"))
    with pytest.raises(StateError, match="serializer"):
        backend.get_state(ValueStateDescriptor("s", serializer=PickleSerializer()))


def test_unknown_state_kind_is_rejected(backend):
    class Weird(StateDescriptor):
        kind = "weird"

    with pytest.raises(ConfigurationError, match="unknown state kind"):
        backend.get_state(Weird("w"))
    with pytest.raises(ConfigurationError, match="unknown state kind"):
        backend.get_state("not a descriptor")


@pytest.mark.parametrize("make", [
    lambda: ValueStateDescriptor(123),
    lambda: ValueStateDescriptor(""),
    lambda: ListStateDescriptor(None),
    lambda: MapStateDescriptor("   "),
    lambda: ReducingStateDescriptor("r", "not callable"),
    lambda: ValueStateDescriptor("v", serializer="pickle"),
])
def test_descriptor_validation(make):
    with pytest.raises(ConfigurationError):
        make()


def test_descriptor_messages_are_clear():
    with pytest.raises(ConfigurationError, match="must be a str, got int"):
        ValueStateDescriptor(123)
    with pytest.raises(ConfigurationError, match="reduce_function must be callable"):
        ReducingStateDescriptor("r", None)


def test_access_without_current_key_fails_clearly(backend):
    state = backend.get_state(ValueStateDescriptor("v"))
    listing = backend.get_state(ListStateDescriptor("l"))
    with pytest.raises(StateError, match="without a current key"):
        state.value()
    with pytest.raises(StateError, match="without a current key"):
        state.update(1)
    with pytest.raises(StateError, match="without a current key"):
        listing.add(1)


def test_key_group_outside_range_fails_clearly(new_backend):
    backend = new_backend(KeyGroupRange(0, 63))
    state = backend.get_state(ValueStateDescriptor("v"))
    backend.set_current_key("k", 100)
    with pytest.raises(StateError, match=r"key group 100, outside .*\[0, 63\]"):
        state.update(1)
    backend.set_current_key("k", -1)   # would silently wrap with a list index
    with pytest.raises(StateError, match="outside"):
        state.value()


def test_current_key_accessors(backend):
    backend.set_current_key("k", 3)
    assert backend.current_key == "k" and backend.current_key_group == 3


class Opaque:
    """A class without a faithful encoding."""


class Moment(datetime.datetime):
    """A datetime subclass (as pandas.Timestamp is): it would come back a plain datetime."""


class Plus2(datetime.tzinfo):
    """A time zone that is neither datetime.timezone nor zoneinfo (as pytz's are)."""

    def utcoffset(self, moment):
        return datetime.timedelta(hours=2)


def local_dataclass():
    from dataclasses import dataclass

    @dataclass
    class Point:
        x: int

    return Point(1)


def test_unencodable_value_fails_at_write_naming_state_type_and_pickle(backend):
    values = backend.get_state(ValueStateDescriptor("seen"))
    lists = backend.get_state(ListStateDescriptor("events"))
    maps = backend.get_state(MapStateDescriptor("by_day"))
    use_key(backend, 1)
    with pytest.raises(StateSerializationError, match=r"state 'seen'.*'.*Opaque'.*@dataclass.*PickleSerializer\(\)"):
        values.update(Opaque())
    with pytest.raises(StateSerializationError, match=r"'events'.*Moment \(a subclass of datetime.*convert it"):
        lists.add(Moment(2024, 1, 1))
    with pytest.raises(StateSerializationError, match=r"'by_day'.*time zone.*zoneinfo\.ZoneInfo"):
        maps.put("d", [datetime.datetime(2024, 1, 1, tzinfo=Plus2())])
    with pytest.raises(StateSerializationError, match="'events'.*defined in a function.*top level of a module"):
        lists.add_all([1, {2: local_dataclass()}])
    with pytest.raises(StateSerializationError, match=r"'by_day'.*map key of type 'frozenset'"):
        maps.put(frozenset({1}), 1)
    with pytest.raises(StateSerializationError, match="map key"):
        maps.put_all({("ok", object()): 1})
    assert backend.num_keys() == 0


def test_pickle_serializer_accepts_any_value(backend):
    state = backend.get_state(ValueStateDescriptor("seen", serializer=PickleSerializer()))
    use_key(backend, 1)
    state.update({1, 2})
    assert state.value() == {1, 2}


def test_dispose_makes_states_unusable(backend):
    state = backend.get_state(ValueStateDescriptor("v"))
    use_key(backend, 1)
    state.update(1)
    backend.dispose()
    with pytest.raises(StateError, match="disposed"):
        state.value()
    with pytest.raises(StateError):
        backend.get_state(ValueStateDescriptor("v"))


@pytest.mark.parametrize("kind", BACKEND_KINDS)
def test_backend_rejects_bad_key_group_range(kind):
    with pytest.raises(ConfigurationError, match="key_group_range"):
        make_backend(kind, 128, KeyGroupRange(0, 128))
    with pytest.raises(ConfigurationError, match="key_group_range"):
        make_backend(kind, 128, KeyGroupRange.EMPTY)
    with pytest.raises(ConfigurationError, match="max_parallelism"):
        make_backend(kind, 0, KeyGroupRange(0, 0))


class _Keys:
    """The `keys` argument of get_many/put_many: distinct keys and their key groups."""

    def __init__(self, unique):
        self.unique = list(unique)
        self.key_groups = [assign_to_key_group(k, MAX_P) for k in self.unique]


def test_value_state_get_many_put_many(backend):
    import numpy as np
    state = backend.get_state(ValueStateDescriptor("v", default=0))
    boxes = backend.get_state(ValueStateDescriptor("boxes", default=[]))
    keys = _Keys(["a", 1, ("t", 2), None, b"raw"])
    assert state.get_many(keys) == [0, 0, 0, 0, 0]
    state.put_many(keys, np.array([1, 2, 3, 4, 5]))
    use_key(backend, ("t", 2))
    assert state.value() == 3 and type(state.value()) is int
    state.put_many(_Keys(["a", 1]), [None, 20])          # None clears a key
    assert state.get_many(keys) == [0, 20, 3, 4, 5]
    assert sorted(map(str, backend.get_keys("v"))) == sorted(map(str, [1, ("t", 2), None, b"raw"]))
    first = boxes.get_many(_Keys(["x", "y"]))
    first[0].append("leak")                               # defaults are private copies
    assert boxes.get_many(_Keys(["x", "y"])) == [[], []]
    boxes.put_many(_Keys(["x"]), [[1, (2, 3)]])
    use_key(backend, "x")
    assert boxes.value() == [1, (2, 3)]
    assert state.get_many(_Keys([])) == []
    with pytest.raises(ValueError, match="2 values for 1 keys"):
        state.put_many(_Keys(["a"]), [1, 2])
    with pytest.raises(StateSerializationError, match="'boxes'.*'.*Opaque'"):
        boxes.put_many(_Keys(["z"]), [Opaque()])


def test_get_many_outside_key_groups_fails_clearly(new_backend):
    backend = new_backend(KeyGroupRange(0, 63))
    state = backend.get_state(ValueStateDescriptor("v"))
    keys = _Keys(["k"])
    keys.key_groups = [100]
    with pytest.raises(StateError, match=r"key group 100, outside .*\[0, 63\]"):
        state.get_many(keys)
    with pytest.raises(StateError, match="outside"):
        state.put_many(keys, [1])


def test_dispose_drops_all_state(backend):
    state = backend.get_state(MapStateDescriptor("m"))
    use_key(backend, 1)
    state.put("a", 1)
    assert backend.num_keys() == 1 and backend.state_names() == ["m"]
    backend.dispose()
    assert backend.num_keys() == 0 and backend.state_names() == [] and backend.get_keys("m") == []
    with pytest.raises(StateError, match="disposed"):
        state.items()
