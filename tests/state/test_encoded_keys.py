"""The heap snapshot's reuse of the previous snapshot's encoded keys: the same bytes as a full
encode, whatever happened to the state in between."""

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.properties import examples

from streamsnap.state import HashMapKeyedStateBackend, KeyGroupRange, assign_to_key_group
from streamsnap.state.serialization import array_header, pack_array_body, pack_keys, pack_value

from .test_hashmap_backend import FULL, MAX_P, Model, fill, use_key

KEYS = st.one_of(st.integers(-3, 40), st.sampled_from(["a", "b", "ü", b"x", None, 2.5, ("t", 1), True]))
INTS = st.integers(-(1 << 63), (1 << 63) - 1)
VALUES = st.one_of(INTS, st.floats(allow_nan=False), st.text(max_size=3),
                   st.binary(max_size=3), st.booleans(), st.lists(INTS, max_size=2),
                   st.tuples(INTS))
OPS = st.one_of(
    st.tuples(st.just("value"), KEYS, st.one_of(st.none(), VALUES)),
    st.tuples(st.just("clear"), KEYS, st.sampled_from(["value", "list", "map", "reduce"])),
    st.tuples(st.just("list_add"), KEYS, VALUES),
    st.tuples(st.just("list_update"), KEYS, st.lists(INTS, max_size=2)),
    st.tuples(st.just("map_put"), KEYS, st.sampled_from(["u", "v"]), VALUES),
    st.tuples(st.just("map_remove"), KEYS, st.sampled_from(["u", "v"])),
    st.tuples(st.just("reduce"), KEYS, st.one_of(st.none(), st.integers(-5, 5))),
    st.tuples(st.just("snapshot")),
)


def apply(model: Model, op) -> None:
    kind, key, *args = op
    use_key(model.backend, key)
    if kind == "value":
        model.value.update(args[0])
    elif kind == "clear":
        getattr(model, args[0]).clear()
    elif kind == "list_add":
        model.list.add(args[0])
    elif kind == "list_update":
        model.list.update(args[0])
    elif kind == "map_put":
        model.map.put(*args)
    elif kind == "map_remove":
        model.map.remove(args[0])
    else:
        model.reduce.add(args[0]) if args[0] is not None else model.reduce.clear()


def file_bytes(location: str, handle) -> bytes:
    return (Path(location.removeprefix("file://")) / handle.file.path).read_bytes()


def snapshot_both_ways(backend, location: str, checkpoint_id: int):
    """(handle reusing keys, handle of a full encode) of the same captured state."""
    tables = backend._tables.values()
    saved = [dict(t.key_cache) for t in tables]
    for t in tables:
        t.key_cache.clear()
    full = backend.snapshot(checkpoint_id, location)
    full_handle = full.run()
    for t, s in zip(tables, saved):
        t.key_cache.clear()
        t.key_cache.update(s)
    reused = backend.snapshot(checkpoint_id, location).run()
    return reused, full_handle


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(OPS, max_size=60))
def test_reused_keys_give_the_bytes_of_a_full_encode(ops):
    location = "file://" + tempfile.mkdtemp(prefix="ss-keys-")
    model = Model(HashMapKeyedStateBackend("op", MAX_P, FULL))
    ops = ops + [("snapshot",)]
    for i, op in enumerate(ops):
        if op[0] != "snapshot":
            apply(model, op)
            continue
        reused, full = snapshot_both_ways(model.backend, location, i)
        if full is None:
            assert reused is None
            continue
        assert reused.offsets == full.offsets
        assert file_bytes(location, reused) == file_bytes(location, full)
        back = HashMapKeyedStateBackend("op", MAX_P, FULL)
        back.restore([reused], location)
        assert Model(back).dump() == model.dump()


def test_values_only_changes_reuse_the_encoded_keys(location):
    model = Model(HashMapKeyedStateBackend("op", MAX_P, FULL))
    fill(model, range(300))
    model.backend.snapshot(1, location).run()
    table = model.backend._tables["value"]
    before = dict(table.key_cache)
    assert sum(e.count for e in before.values()) == 300
    for k in range(0, 300, 3):
        use_key(model.backend, k)
        model.value.update(-k)
    use_key(model.backend, 1000)
    model.value.update(7)             # one new key: appended to its key group's encoding
    handle = model.backend.snapshot(2, location).run()
    after = table.key_cache
    grown = [kg for kg in after if after[kg].count != before[kg].count]
    assert len(grown) == 1 and after[grown[0]].body.startswith(before[grown[0]].body)
    assert all(after[kg].body is before[kg].body for kg in after if kg not in grown)
    back = HashMapKeyedStateBackend("op", MAX_P, FULL)
    back.restore([handle], location)
    assert Model(back).dump() == model.dump()


def test_a_removal_the_table_did_not_count_is_still_caught(location):
    """A key dropped from a key group's dict behind the table's back (a code path that forgot
    `StateTable.remove`) and another added: the guard on the last known key re-encodes."""
    backend = HashMapKeyedStateBackend("op", MAX_P, KeyGroupRange(0, MAX_P - 1))
    model = Model(backend)
    same_group = [k for k in range(2000) if assign_to_key_group(k, MAX_P) == 5]
    for k in same_group[:3]:
        use_key(backend, k)
        model.value.update(k)
    backend.snapshot(1, location).run()
    table = backend._tables["value"]
    del table.own(5)[same_group[0]]   # not counted in table.removals
    use_key(backend, same_group[3])
    model.value.update(1)
    handle = backend.snapshot(2, location).run()
    back = HashMapKeyedStateBackend("op", MAX_P, FULL)
    back.restore([handle], location)
    assert Model(back).dump() == model.dump()


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(VALUES, max_size=1300), st.lists(KEYS, max_size=1300))
def test_packing_in_chunks_gives_the_bytes_of_one_pack(values, keys):
    assert pack_array_body(iter(values), pack_value, array_header(len(values))) == pack_value(values)
    assert pack_array_body(keys, header=array_header(len(keys))) == pack_keys(keys)
    assert array_header(len(keys)) + pack_array_body(keys) == pack_keys(keys)
