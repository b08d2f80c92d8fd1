import copy
import threading
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.properties import examples

from streamsnap.checkpoint.handles import KeyGroupsStateHandle
from streamsnap.errors import RestoreError
from streamsnap.state import (HashMapKeyedStateBackend, KeyGroupRange, ListStateDescriptor,
                              MapStateDescriptor, PickleSerializer, ReducingStateDescriptor,
                              SnapshotDiscardedError, StateError, StateSerializationError,
                              ValueStateDescriptor, assign_to_key_group)
from streamsnap.state.backends.hashmap import MAGIC

from .conftest import BACKEND_KINDS, files_in, make_backend

MAX_P = 128
FULL = KeyGroupRange(0, MAX_P - 1)

VALUE = ValueStateDescriptor("value", default=0)
LIST = ListStateDescriptor("list")
MAP = MapStateDescriptor("map")
REDUCE = ReducingStateDescriptor("reduce", lambda a, b: a + b)


def use_key(backend, key):
    backend.set_current_key(key, assign_to_key_group(key, MAX_P))


class Model:
    """The four states of a backend, with helpers to read everything back."""

    def __init__(self, backend):
        self.backend = backend
        self.value = backend.get_state(VALUE)
        self.list = backend.get_state(LIST)
        self.map = backend.get_state(MAP)
        self.reduce = backend.get_state(REDUCE)

    def dump(self) -> dict:
        out = {}
        for name in ("value", "list", "map", "reduce"):
            for key in self.backend.get_keys(name):
                use_key(self.backend, key)
                if name == "value":
                    out[(name, key)] = self.value.value()
                elif name == "map":
                    out[(name, key)] = dict(self.map.items())
                else:
                    out[(name, key)] = getattr(self, name).get()
        return out


def fill(model, keys):
    for k in keys:
        use_key(model.backend, k)
        model.value.update(k if isinstance(k, int) else len(str(k)))
        model.list.add_all([k, "x"])
        model.map.put("a", k)
        model.map.put(("t", 1), [k])
        model.reduce.add(1)
        model.reduce.add(2)


def restored(new_backend, handles, location, kg_range=FULL):
    backend = new_backend(kg_range)
    backend.restore(handles, location)
    return Model(backend)


def no_running_snapshots(backend) -> bool:
    """The backend holds nothing for a snapshot any more (heap: writes stop copying)."""
    if isinstance(backend, HashMapKeyedStateBackend):
        return backend._required_epoch == -1
    return not backend._live_snapshots


KEYS = list(range(200)) + [f"s{i}" for i in range(50)] + [("comp", i) for i in range(20)] + [None, b"raw"]


def test_round_trip_all_state_kinds(location, new_backend):
    model = Model(new_backend(FULL))
    fill(model, KEYS)
    use_key(model.backend, 7)
    model.value.update({"nested": {(1, 2): [1, 2]}, "t": [3]})
    expected = model.dump()
    handle = model.backend.snapshot(1, location).run()
    assert isinstance(handle, KeyGroupsStateHandle)
    assert (handle.key_group_start, handle.key_group_end) == (0, MAX_P - 1)
    assert files_in(location) == [handle.file.path]             # relative path, one file
    assert handle.file.size == Path(location[7:], handle.file.path).stat().st_size
    assert Path(location[7:], handle.file.path).read_bytes().startswith(MAGIC)
    groups = {assign_to_key_group(k, MAX_P) for k in KEYS}
    assert set(handle.offsets) == groups                         # only key groups with data
    again = restored(new_backend, [handle], location)
    assert again.backend.num_keys() == model.backend.num_keys() == 4 * len(KEYS)
    assert again.dump() == expected
    # composite keys come back as hashable tuples
    assert ("comp", 3) in again.backend.get_keys("value")
    assert again.backend.is_restored


def test_handle_survives_wire_round_trip(location, new_backend):
    model = Model(new_backend(FULL))
    fill(model, KEYS[:30])
    handle = model.backend.snapshot(1, location).run()
    wire = msgpack.unpackb(msgpack.packb(handle.to_wire()), raw=False)
    assert restored(new_backend, [KeyGroupsStateHandle.from_wire(wire)], location).dump() == model.dump()


def test_empty_backend_writes_nothing(location, new_backend):
    backend = new_backend(FULL)
    backend.get_state(VALUE)
    snapshot = backend.snapshot(1, location)
    assert snapshot.run() is None
    assert files_in(location) == []


def test_restore_only_reads_own_key_groups(location, monkeypatch, new_backend):
    model = Model(new_backend(FULL))
    fill(model, KEYS)
    handle = model.backend.snapshot(1, location).run()
    from streamsnap.checkpoint import filesystem
    reads = []
    real = filesystem.read_range
    monkeypatch.setattr(filesystem, "read_range",
                        lambda url, off, n: reads.append((off, n)) or real(url, off, n))
    part = restored(new_backend, [handle], location, KeyGroupRange(10, 20))
    assert all(10 <= assign_to_key_group(k, MAX_P) <= 20 for k in part.backend.get_keys("value"))
    wanted = [handle.offsets[kg] for kg in handle.offsets if 10 <= kg <= 20]
    assert reads == [(min(o for o, _ in wanted), sum(n for _, n in wanted))]
    assert part.backend.num_keys() == 4 * sum(10 <= assign_to_key_group(k, MAX_P) <= 20 for k in KEYS)


def test_mutations_after_snapshot_are_not_in_it(location, new_backend):
    model = Model(new_backend(FULL))
    fill(model, KEYS)
    use_key(model.backend, 1)
    model.value.update({"counts": [1]})
    before = model.dump()
    snapshot = model.backend.snapshot(1, location)
    # mutate every kind of state in every way after the synchronous part
    for k in KEYS:
        use_key(model.backend, k)
        model.list.add("after")
        model.map.put("a", "after")
        model.map.remove(("t", 1))
        model.reduce.add(100)
        if isinstance(k, int) and k % 2:
            model.value.clear()
            model.list.clear()
        else:
            model.value.update(-1)
    use_key(model.backend, 1)
    model.value.update({"counts": [1]})
    model.value.value()["counts"].append("in place")     # in-place on a snapshotted value
    use_key(model.backend, "new key")
    model.value.update(5)
    model.list.add(1)
    after = model.dump()
    handle = snapshot.run()
    assert restored(new_backend, [handle], location).dump() == before
    assert model.dump() == after                           # the live state kept its changes
    use_key(model.backend, 1)
    if isinstance(model.backend, HashMapKeyedStateBackend):
        assert model.value.value() == {"counts": [1, "in place"]}
    else:                       # RocksDB hands out copies: the in-place change is not stored
        assert model.value.value() == {"counts": [1]}


def test_in_place_mutation_of_value_read_before_snapshot(location, new_backend):
    model = Model(new_backend(FULL))
    use_key(model.backend, "k")
    model.value.update({"n": 1})
    snapshot = model.backend.snapshot(1, location)
    held = model.value.value()        # first read after the snapshot: a private copy
    held["n"] = 2
    model.value.update(held)
    handle = snapshot.run()
    use_key(model.backend, "k")
    again = restored(new_backend, [handle], location)
    use_key(again.backend, "k")
    assert again.value.value() == {"n": 1}
    assert model.value.value() == {"n": 2}


def test_overlapping_snapshots_are_each_consistent(location, tmp_path, new_backend):
    model = Model(new_backend(FULL))
    fill(model, KEYS[:50])
    state1 = model.dump()
    snap1 = model.backend.snapshot(1, location)
    fill(model, KEYS[:80])
    state2 = model.dump()
    loc2 = "file://" + str(tmp_path)
    snap2 = model.backend.snapshot(2, loc2)
    fill(model, KEYS)
    handle2 = snap2.run()
    fill(model, KEYS)
    handle1 = snap1.run()
    assert restored(new_backend, [handle1], location).dump() == state1
    assert restored(new_backend, [handle2], loc2).dump() == state2
    # no snapshot running any more: writes stop copying
    assert no_running_snapshots(model.backend)


def test_snapshot_sync_part_is_independent_of_state_size(location):
    """Heap only: the synchronous part captures the live dicts by reference."""
    model = Model(HashMapKeyedStateBackend("op", MAX_P, FULL))
    fill(model, range(20000))
    snapshot = model.backend.snapshot(1, location)
    # the synchronous part captured references only: the live dicts, nothing frozen yet
    part = snapshot._parts[0]
    table = model.backend._tables[part.name]
    assert all(table.maps[kg] is capture.entries and capture.frozen is None
               for kg, capture in part.key_groups)
    assert set(table.pending) == {kg for kg, _ in part.key_groups}
    snapshot.discard()
    # a discarded snapshot leaves nothing pending: writes no longer freeze
    assert all(not t.pending for t in model.backend._tables.values())


def test_concurrent_run_while_mailbox_thread_mutates(location, new_backend):
    model = Model(new_backend(FULL))
    keys = list(range(30000))
    fill(model, keys)
    expected = copy.deepcopy(model.dump())
    snapshot = model.backend.snapshot(1, location)
    result = {}
    started = threading.Event()

    def run():
        started.set()
        result["handle"] = snapshot.run()

    thread = threading.Thread(target=run)
    thread.start()
    started.wait()
    rounds = 0
    while thread.is_alive() or rounds < 2:
        for k in keys[rounds % 7::7]:
            use_key(model.backend, k)
            model.value.update(model.value.value() + 1)
            model.list.add(rounds)
            model.map.put("a", rounds)
            model.map.put(("new", rounds), 1)
            model.reduce.add(1)
            if k % 5 == 0:
                model.list.clear()
                model.map.remove(("t", 1))
        rounds += 1
    thread.join()
    assert restored(new_backend, [result["handle"]], location).dump() == expected


def test_discard_deletes_written_file(location, new_backend):
    model = Model(new_backend(FULL))
    fill(model, KEYS)
    snapshot = model.backend.snapshot(1, location)
    snapshot.run()
    assert len(files_in(location)) == 1
    snapshot.discard()
    assert files_in(location) == [] and snapshot.status == "discarded"
    assert no_running_snapshots(model.backend)


def test_discard_before_run(location, new_backend):
    model = Model(new_backend(FULL))
    fill(model, KEYS)
    snapshot = model.backend.snapshot(1, location)
    snapshot.discard()
    assert no_running_snapshots(model.backend)
    with pytest.raises(SnapshotDiscardedError, match="discarded"):
        snapshot.run()
    assert files_in(location) == []


def test_discard_during_run_leaves_nothing(location, new_backend):
    model = Model(new_backend(FULL))
    fill(model, range(50000))
    snapshot = model.backend.snapshot(1, location)
    outcome = {}

    def run():
        try:
            outcome["handle"] = snapshot.run()
        except SnapshotDiscardedError as e:
            outcome["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    snapshot.discard()
    thread.join()
    assert files_in(location) == []
    assert snapshot.status == "discarded"
    assert "handle" in outcome or "error" in outcome


def test_run_twice_fails(location, new_backend):
    model = Model(new_backend(FULL))
    fill(model, KEYS[:3])
    snapshot = model.backend.snapshot(1, location)
    snapshot.run()
    with pytest.raises(StateError, match="twice"):
        snapshot.run()


def test_unencodable_key_fails_snapshot_clearly_and_cleans_up(location, backend_kind, new_backend):
    model = Model(new_backend(FULL))
    fill(model, KEYS[:3])
    model.backend.set_current_key(frozenset({1}), 5)
    snapshots = []
    with pytest.raises(StateSerializationError, match="state 'value'.*key of type 'frozenset'"):
        model.value.update(1)           # RocksDB encodes keys at the write: fails here
        snapshots.append(model.backend.snapshot(1, location))
        snapshots[0].run()              # the heap backend fails at the snapshot
    assert len(snapshots) == (1 if backend_kind == "hashmap" else 0)
    assert files_in(location) == []
    assert all(s.status == "failed" for s in snapshots)
    assert no_running_snapshots(model.backend)
    if backend_kind == "rocksdb":
        assert model.backend.num_keys() == 4 * 3     # the failed write stored nothing


def test_big_int_value_fails_snapshot_naming_state(location, new_backend):
    model = Model(new_backend(FULL))
    use_key(model.backend, "k")
    with pytest.raises(StateSerializationError,
                       match=r"state 'value'.*int outside the 64-bit range.*PickleSerializer"):
        model.value.update(2 ** 80)        # heap: plain ints are not checked on the hot path
        model.backend.snapshot(1, location).run()


def test_pickle_serializer_round_trip(location, new_backend):
    backend = new_backend(FULL)
    pickled = PickleSerializer()
    value = backend.get_state(ValueStateDescriptor("v", serializer=pickled))
    listing = backend.get_state(ListStateDescriptor("l", serializer=pickled))
    mapping = backend.get_state(MapStateDescriptor("m", serializer=pickled))
    use_key(backend, ("k", 1))
    value.update({1, 2})
    listing.add(frozenset({3}))
    mapping.put("when", (1, 2))
    handle = backend.snapshot(1, location).run()
    again = new_backend(FULL)
    again.restore([handle], location)
    value2 = again.get_state(ValueStateDescriptor("v", serializer=pickled))
    listing2 = again.get_state(ListStateDescriptor("l", serializer=pickled))
    mapping2 = again.get_state(MapStateDescriptor("m", serializer=pickled))
    use_key(again, ("k", 1))
    assert value2.value() == {1, 2} and listing2.get() == [frozenset({3})]
    assert mapping2.get("when") == (1, 2)            # pickle keeps tuples


def test_restore_with_other_serializer_or_kind_fails(location, new_backend):
    backend = new_backend(FULL)
    state = backend.get_state(ValueStateDescriptor("v", serializer=PickleSerializer()))
    use_key(backend, 1)
    state.update(1)
    handle = backend.snapshot(1, location).run()
    again = new_backend(FULL)
    again.restore([handle], location)
    with pytest.raises(RestoreError, match="'pickle' serializer.*'msgpack'"):
        again.get_state(ValueStateDescriptor("v"))
    with pytest.raises(RestoreError, match="checkpointed as a value state.*list"):
        again.get_state(ListStateDescriptor("v"))
    # registered before restore: checked at restore time
    third = new_backend(FULL)
    third.get_state(ValueStateDescriptor("v"))
    with pytest.raises(RestoreError, match="serializer"):
        third.restore([handle], location)


def test_restore_into_registered_state(location, new_backend):
    model = Model(new_backend(FULL))
    fill(model, KEYS)
    expected = model.dump()
    handle = model.backend.snapshot(1, location).run()
    backend = new_backend(FULL)
    again = Model(backend)                 # states registered first
    backend.restore([handle], location)
    assert again.dump() == expected


def test_unregistered_restored_state_is_carried_into_next_snapshot(location, tmp_path, new_backend):
    model = Model(new_backend(FULL))
    fill(model, KEYS)
    expected = model.dump()
    handle = model.backend.snapshot(1, location).run()
    middle = new_backend(FULL)
    middle.restore([handle], location)
    assert middle.num_keys() == 4 * len(KEYS)
    loc2 = "file://" + str(tmp_path / "chk-2")
    snapshot = middle.snapshot(2, loc2)
    # registering and mutating while that snapshot runs must not leak into it
    late = Model(middle)
    for k in KEYS:
        use_key(middle, k)
        late.list.add("late")
        late.map.put("a", "late")
        late.value.update(-5)
    handle2 = snapshot.run()
    assert restored(new_backend, [handle2], loc2).dump() == expected


def corrupt(location, handle, position_in_block=5):
    path = Path(location[7:], handle.file.path)
    data = bytearray(path.read_bytes())
    offset, _ = handle.offsets[min(handle.offsets)]
    data[offset + position_in_block] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_file_fails_restore_clearly(location, new_backend):
    model = Model(new_backend(FULL))
    fill(model, KEYS)
    handle = model.backend.snapshot(1, location).run()
    corrupt(location, handle)
    with pytest.raises(RestoreError, match="corrupt: checksum mismatch.*key group"):
        restored(new_backend, [handle], location)


def test_truncated_and_missing_files_fail_restore_clearly(location, new_backend):
    model = Model(new_backend(FULL))
    fill(model, KEYS)
    handle = model.backend.snapshot(1, location).run()
    path = Path(location[7:], handle.file.path)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(RestoreError, match="truncated"):
        restored(new_backend, [handle], location)
    path.unlink()
    with pytest.raises(RestoreError, match="missing"):
        restored(new_backend, [handle], location)


def test_block_with_valid_checksum_but_garbage_fails_clearly(location, new_backend):
    import xxhash
    backend = new_backend(FULL)
    state = backend.get_state(VALUE)
    use_key(backend, 1)
    state.update(1)
    handle = backend.snapshot(1, location).run()
    path = Path(location[7:], handle.file.path)
    payload = msgpack.packb(["not", "a block"])
    path.write_bytes(MAGIC + payload + xxhash.xxh64_digest(payload))
    kg = next(iter(handle.offsets))
    bad = KeyGroupsStateHandle(handle.file, 0, MAX_P - 1, {kg: (len(MAGIC), len(payload) + 8)})
    with pytest.raises(RestoreError, match="corrupt: cannot decode"):
        restored(new_backend, [bad], location)


def test_restore_rejects_foreign_handles_and_wrong_max_parallelism(location, new_backend):
    backend = new_backend(FULL)
    with pytest.raises(RestoreError, match="expected KeyGroupsStateHandle"):
        backend.restore(["nope"], location)
    from streamsnap.checkpoint.handles import FileHandle
    wide = KeyGroupsStateHandle(FileHandle("x", 1), 0, 255, {200: (8, 10)})
    with pytest.raises(RestoreError, match="max parallelism"):
        backend.restore([wide], location)


def test_notify_checkpoint_complete(location, new_backend):
    backend = new_backend(FULL)
    backend.notify_checkpoint_complete(3)
    backend.notify_checkpoint_complete(2)
    assert backend.last_completed_checkpoint_id == 3


def test_value_types_survive_a_checkpoint(location, new_backend):
    import collections
    import enum

    import numpy as np

    class Color(enum.IntEnum):
        RED = 1

    Point = collections.namedtuple("Point", "x y")
    backend = new_backend(FULL)
    value = backend.get_state(ValueStateDescriptor("v"))
    listing = backend.get_state(ListStateDescriptor("l"))
    samples = {
        "tuple": (1, ("nested", 2.5), None),
        "dict_with_tuple_keys": {(1, "a"): [1, (2,)], "s": {"t": ()}},
        "namedtuple": Point(1, 2),
        "intenum": Color.RED,
        "numpy": np.int64(7),
        "ordered": collections.OrderedDict(a=1),
    }
    expected = {
        "tuple": (1, ("nested", 2.5), None),
        "dict_with_tuple_keys": {(1, "a"): [1, (2,)], "s": {"t": ()}},
        "namedtuple": (1, 2),
        "intenum": 1,
        "numpy": 7,
        "ordered": {"a": 1},
    }
    for key, sample in samples.items():
        use_key(backend, key)
        value.update(sample)
        listing.add(sample)
    np_key = np.int64(12345)
    backend.set_current_key(np_key, assign_to_key_group(np_key, MAX_P))
    value.update("numpy key")
    handle = backend.snapshot(1, location).run()
    again = new_backend(FULL)
    again.restore([handle], location)
    value2 = again.get_state(ValueStateDescriptor("v"))
    listing2 = again.get_state(ListStateDescriptor("l"))
    for key, want in expected.items():
        use_key(again, key)
        assert value2.value() == want and type(value2.value()) is type(want)
        assert listing2.get() == [want]
    use_key(again, 12345)
    assert value2.value() == "numpy key"


def test_restore_assignment_for_other_max_parallelism_fails(location, new_backend):
    from streamsnap.state import SubtaskRestoreState
    backend = new_backend(FULL)
    with pytest.raises(RestoreError, match="max parallelism 256"):
        backend.restore(SubtaskRestoreState.fresh(0, 1, 256), location)


_keys = st.sampled_from([0, 1, "a", ("c", 1), None])
_ints = st.integers(-(2 ** 63), 2 ** 63 - 1)
_values = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.lists(_ints, max_size=3),
                    st.tuples(_ints, st.text(max_size=2)))
_ops = st.lists(st.tuples(st.sampled_from(["set", "clear_value", "add", "clear_list", "put",
                                           "remove", "mutate"]), _keys, _values), max_size=60)


def apply_op(model, op: str, key, value, reference: dict) -> None:
    """One random operation on `model` and on `reference` (the expected dump)."""
    use_key(model.backend, key)
    if op == "set":
        model.value.update(value)
        reference[("value", key)] = value
    elif op == "clear_value":
        model.value.clear()
        reference.pop(("value", key), None)
    elif op == "add":
        model.list.add(value)
        reference.setdefault(("list", key), []).append(value)
    elif op == "clear_list":
        model.list.clear()
        reference.pop(("list", key), None)
    elif op == "put":
        model.map.put(str(value), value)
        reference.setdefault(("map", key), {})[str(value)] = value
    elif op == "remove":
        model.map.remove(str(value))
        entry = reference.get(("map", key), {})
        entry.pop(str(value), None)
        if not entry:
            reference.pop(("map", key), None)
    elif op == "mutate":
        current = model.value.value()
        if isinstance(current, list):          # in-place change of a stored list
            current.append(value)
            reference[("value", key)] = current
            model.value.update(current)


@pytest.mark.parametrize("kind", BACKEND_KINDS)
@settings(max_examples=examples(100), deadline=None)
@given(before=_ops, after=_ops)
def test_snapshot_equals_model_at_snapshot_time(kind, before, after):
    """Random operations, a snapshot, more operations: the snapshot holds the first model."""
    import tempfile

    def new_backend(kg_range):
        backend = make_backend(kind, MAX_P, kg_range)
        created.append(backend)
        return backend

    created: list = []
    try:
        model = Model(new_backend(FULL))
        reference: dict = {}
        for op in before:
            apply_op(model, *op, reference)
        expected = copy.deepcopy(reference)
        with tempfile.TemporaryDirectory() as directory:
            location = "file://" + directory
            snapshot = model.backend.snapshot(1, location)
            for op in after:
                apply_op(model, *op, reference)
            handle = snapshot.run()
            got = {} if handle is None else {
                k: v for k, v in restored(new_backend, [handle], location).dump().items()}
        assert got == expected
        assert model.dump() == reference
    finally:
        for backend in created:
            backend.dispose()


def test_snapshot_writes_are_coalesced_into_few_large_ones(monkeypatch):
    """Each write of the async snapshot thread gives up the GIL (a convoy beside a busy task
    thread), so blocks are joined up to a limit; the bytes are exactly those written one by one."""
    import io

    from streamsnap.state.backends.hashmap import _CoalescedWriter

    class Recording(io.BytesIO):
        def __init__(self):
            super().__init__()
            self.writes = 0

        def write(self, data):
            self.writes += 1
            return super().write(data)

    monkeypatch.setattr(_CoalescedWriter, "LIMIT", 100)
    parts = [bytes([i]) * (7 + i) for i in range(40)]
    out = Recording()
    writer = _CoalescedWriter(out)
    for part in parts:
        writer.write(part)
    writer.flush()
    assert out.getvalue() == b"".join(parts)
    assert out.writes <= sum(map(len, parts)) // 100 + 1 < len(parts)
