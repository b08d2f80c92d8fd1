"""State TTL (StateTtlConfig) on both keyed backends, on a manual clock: expiry per state kind,
update types, visibility, snapshots that drop expired entries, restore keeping timestamps (also
across backends through the canonical format), RocksDB incremental checkpoints, vectorized
access, and the errors for bad configurations."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.errors import ConfigurationError, RestoreError
from streamsnap.graph.keys import BatchKeys
from streamsnap.state import (KeyGroupRange, ListStateDescriptor, MapStateDescriptor,
                              PickleSerializer, ReducingStateDescriptor, StateError,
                              StateTtlConfig, TtlStateVisibility, TtlUpdateType,
                              ValueStateDescriptor, assign_to_key_group)
from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamsnap.state.backends.rocksdb.config import RocksDBConfig

from .conftest import BACKEND_KINDS, make_backend

MAX_P = 128
FULL = KeyGroupRange(0, MAX_P - 1)
TTL = StateTtlConfig(10)                                   # 10 s
ON_READ = StateTtlConfig(10, update_type=TtlUpdateType.ON_READ_AND_WRITE)
RETURN_EXPIRED = StateTtlConfig(
    10, state_visibility=TtlStateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP)


@pytest.fixture
def clock():
    return ManualScheduler()


@pytest.fixture
def new(backend_kind, tmp_path, clock):
    """Backends of the test's kind on the manual clock (RocksDB: full checkpoints)."""
    created = []

    def make(kind=None, **config):
        kind = kind or backend_kind
        cfg = RocksDBConfig(local_dir=str(tmp_path / "rocksdb"), **config) \
            if kind == "rocksdb" else None
        backend = make_backend(kind, MAX_P, FULL, "op", cfg)
        backend.ttl_clock = clock
        created.append(backend)
        return backend

    yield make
    for backend in created:
        backend.dispose()


def use(backend, key):
    backend.set_current_key(key, assign_to_key_group(key, MAX_P))


def snapshot_restore(backend, tmp_path: Path, target):
    """Full snapshot of `backend` restored into `target`; returns the snapshot's handle."""
    directory = tmp_path / f"snap-{id(target)}"
    directory.mkdir()
    handle = backend.snapshot(1, "file://" + str(directory), **(
        {"full": True} if isinstance(backend, RocksDBKeyedStateBackend) else {})).run()
    target.restore([handle] if handle is not None else [], "file://" + str(directory))
    return handle


# -- configuration ---------------------------------------------------------------------------

def test_config_accepts_seconds_timedelta_and_flink_spellings():
    assert StateTtlConfig(timedelta(minutes=1)).ttl_ms == 60_000
    assert StateTtlConfig(0.25).ttl_ms == 250
    config = ss.StateTtlConfig(5, update_type="OnReadAndWrite",
                               state_visibility="return_expired_if_not_cleaned_up")
    assert config.update_type is StateTtlConfig.UpdateType.ON_READ_AND_WRITE
    assert config.state_visibility is StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp
    assert StateTtlConfig(5).update_type is TtlUpdateType.OnCreateAndWrite


@pytest.mark.parametrize("ttl", [0, -1, 0.0001, float("inf"), "10s", None, True])
def test_config_rejects_bad_ttl(ttl):
    with pytest.raises(ConfigurationError, match="StateTtlConfig.ttl"):
        StateTtlConfig(ttl)


def test_config_rejects_unknown_update_type_and_visibility():
    with pytest.raises(ConfigurationError, match="update_type.*ON_READ_AND_WRITE"):
        StateTtlConfig(1, update_type="on_access")
    with pytest.raises(ConfigurationError, match="state_visibility"):
        StateTtlConfig(1, state_visibility=3)


def test_descriptor_ttl_must_be_a_config():
    with pytest.raises(ConfigurationError, match="'v': ttl must be a StateTtlConfig"):
        ValueStateDescriptor("v", ttl=10)
    with pytest.raises(ConfigurationError, match="enable_time_to_live needs a StateTtlConfig"):
        ListStateDescriptor("l").enable_time_to_live(None)


def test_enable_time_to_live_before_and_after_registration(new):
    backend = new()
    descriptor = ValueStateDescriptor("v", default=0)
    assert descriptor.enable_time_to_live(TTL) is descriptor and descriptor.ttl == TTL
    backend.get_state(descriptor)
    with pytest.raises(ConfigurationError, match="'v': enable_time_to_live was called after"):
        descriptor.enable_time_to_live(ON_READ)


def test_same_name_with_another_ttl_fails(new):
    backend = new()
    backend.get_state(ValueStateDescriptor("v", ttl=TTL))
    with pytest.raises(StateError, match="state 'v'.*registered with ttl"):
        backend.get_state(ValueStateDescriptor("v"))
    assert backend.get_state(ValueStateDescriptor("v", ttl=StateTtlConfig(10))) is not None


# -- expiry per state kind ---------------------------------------------------------------------

def test_value_state_expires_ttl_after_its_last_write(new, clock):
    backend = new()
    state = backend.get_state(ValueStateDescriptor("v", default=-1, ttl=TTL))
    use(backend, "k")
    state.update(1)
    clock.advance(9.999)
    assert state.value() == 1                  # reads do not refresh (OnCreateAndWrite)
    state.update(2)
    clock.advance(9.999)
    assert state.value() == 2
    clock.advance(0.001)
    assert state.value() == -1                 # ts + ttl <= now: expired, default returned
    assert backend.get_keys("v") == []         # ... and removed by that access
    state.update(3)
    assert state.value() == 3


def test_list_state_elements_expire_one_by_one(new, clock):
    backend = new()
    state = backend.get_state(ListStateDescriptor("l", ttl=TTL))
    use(backend, "k")
    state.add("a")
    clock.advance(4)
    state.add_all(["b", "c"])
    clock.advance(6)
    assert state.get() == ["b", "c"]
    clock.advance(4)
    assert state.get() == []
    assert backend.get_keys("l") == []
    state.update(["x"])
    clock.advance(10)
    assert state.get() == []


def test_map_state_user_keys_expire_one_by_one(new, clock):
    backend = new()
    state = backend.get_state(MapStateDescriptor("m", ttl=TTL))
    use(backend, "k")
    state.put("a", 1)
    clock.advance(5)
    state.put_all({"b": 2, ("t", 1): [3]})
    clock.advance(5)
    assert state.get("a") is None and not state.contains("a")
    assert state.get("b") == 2 and state.contains(("t", 1))
    assert state.get_all(["a", "b", ("t", 1)], "gone") == ["gone", 2, [3]]
    one = BatchKeys(["k"], np.zeros(0, dtype=np.int64), [assign_to_key_group("k", MAX_P)])
    assert state.get_all_many(one, [["a", "b", ("t", 1)]], "gone") == [["gone", 2, [3]]]   # each entry's TTL
    assert sorted(state.keys(), key=str) == [("t", 1), "b"]
    assert not state.is_empty()
    clock.advance(5)
    assert state.items() == [] and state.is_empty() and state.get("b", "gone") == "gone"
    assert backend.get_keys("m") == []


def test_reducing_state_expired_value_is_not_folded(new, clock):
    backend = new()
    state = backend.get_state(ReducingStateDescriptor("r", lambda a, b: a + b, ttl=TTL))
    use(backend, "k")
    state.add(1)
    clock.advance(5)
    state.add(2)                               # a write: refreshes the timestamp
    clock.advance(9)
    assert state.get() == 3
    clock.advance(1)
    assert state.get() is None
    state.add(5)
    clock.advance(10)
    state.add(7)                               # the expired 5 is not folded in
    assert state.get() == 7


def test_ttl_is_per_key(new, clock):
    backend = new()
    state = backend.get_state(ValueStateDescriptor("v", ttl=TTL))
    use(backend, "old")
    state.update("o")
    clock.advance(6)
    use(backend, "new")
    state.update("n")
    clock.advance(6)
    assert state.value() == "n"
    use(backend, "old")
    assert state.value() is None


# -- update type and visibility ----------------------------------------------------------------

@pytest.mark.parametrize("kind", ["value", "list", "map", "reducing"])
def test_on_read_and_write_refreshes_on_reads(new, clock, kind):
    backend = new()
    use(backend, "k")
    if kind == "value":
        state = backend.get_state(ValueStateDescriptor("s", ttl=ON_READ))
        state.update(1)
        read = state.value
    elif kind == "list":
        state = backend.get_state(ListStateDescriptor("s", ttl=ON_READ))
        state.add(1)
        read = state.get
    elif kind == "map":
        state = backend.get_state(MapStateDescriptor("s", ttl=ON_READ))
        state.put("u", 1)
        read = lambda: state.get("u")          # noqa: E731
    else:
        state = backend.get_state(ReducingStateDescriptor("s", lambda a, b: a + b, ttl=ON_READ))
        state.add(1)
        read = state.get
    for _ in range(3):
        clock.advance(8)
        assert read() in (1, [1])              # each read restarts the ttl
    clock.advance(10)
    assert read() in (None, [])


def test_map_items_refresh_on_read(new, clock):
    backend = new()
    state = backend.get_state(MapStateDescriptor("m", ttl=ON_READ))
    use(backend, "k")
    state.put("a", 1)
    clock.advance(8)
    assert state.items() == [("a", 1)]
    clock.advance(8)
    assert state.values() == [1]


@pytest.mark.parametrize("kind", ["value", "list", "map"])
def test_return_expired_if_not_cleaned_up_returns_it_once(new, clock, kind):
    backend = new()
    use(backend, "k")
    if kind == "value":
        state = backend.get_state(ValueStateDescriptor("s", default=0, ttl=RETURN_EXPIRED))
        state.update(1)
        read, empty = state.value, 0
    elif kind == "list":
        state = backend.get_state(ListStateDescriptor("s", ttl=RETURN_EXPIRED))
        state.add(1)
        read, empty = state.get, []
    else:
        state = backend.get_state(MapStateDescriptor("s", ttl=RETURN_EXPIRED))
        state.put("u", 1)
        read, empty = state.items, []
    clock.advance(10)
    assert read() in (1, [1], [("u", 1)])      # expired but not cleaned up yet: returned ...
    assert read() == empty                     # ... and cleaned up by that access


# -- vectorized access -------------------------------------------------------------------------

def test_get_many_and_put_many_respect_ttl(new, clock):
    backend = new()
    state = backend.get_state(ValueStateDescriptor("v", default=0, ttl=TTL))
    unique = [1, 2, 3]
    keys = BatchKeys(unique, np.arange(3), [assign_to_key_group(k, MAX_P) for k in unique])
    state.put_many(keys, np.array([10, 20, 30]))
    clock.advance(5)
    use(backend, 2)
    state.update(21)
    assert state.get_many(keys) == [10, 21, 30]
    clock.advance(5)
    assert state.get_many(keys) == [0, 21, 0]
    assert sorted(backend.get_keys("v")) == [2]
    state.put_many(keys, [None, 22, 33])
    assert state.get_many(keys) == [0, 22, 33]
    assert backend.current_key == 2           # the current key is left as it was


# -- snapshots and restore ---------------------------------------------------------------------

def fill_all_kinds(backend, clock, serializer=None):
    """Per state kind one entry written at t=0 and one at t=6 (ttl 10)."""
    kw = {} if serializer is None else {"serializer": serializer}
    states = (backend.get_state(ValueStateDescriptor("v", ttl=TTL, **kw)),
              backend.get_state(ListStateDescriptor("l", ttl=TTL, **kw)),
              backend.get_state(MapStateDescriptor("m", ttl=TTL, **kw)),
              backend.get_state(ReducingStateDescriptor("r", max, ttl=TTL, **kw)))
    v, lst, m, r = states
    use(backend, "early")
    v.update({"e": 1})
    lst.add("e")
    m.put("e", 1)
    r.add(1)
    clock.advance(6)
    use(backend, "late")
    v.update({"l": 2})
    r.add(2)
    use(backend, "early")                      # one element / user key more, written later
    lst.add("l")
    m.put("l", (2,))
    return states


def read_all_kinds(backend, key, serializer=None):
    kw = {} if serializer is None else {"serializer": serializer}
    v = backend.get_state(ValueStateDescriptor("v", ttl=TTL, **kw))
    lst = backend.get_state(ListStateDescriptor("l", ttl=TTL, **kw))
    m = backend.get_state(MapStateDescriptor("m", ttl=TTL, **kw))
    r = backend.get_state(ReducingStateDescriptor("r", max, ttl=TTL, **kw))
    use(backend, key)
    return v.value(), lst.get(), m.items(), r.get()


def test_snapshot_drops_expired_entries(new, clock, tmp_path):
    backend = new()
    fill_all_kinds(backend, clock)
    clock.advance(5)                           # t=11: the t=0 entries expired, t=6 ones live
    target = new()
    snapshot_restore(backend, tmp_path, target)
    for name in ("v", "l", "m", "r"):          # restored, not asked for yet: what was written
        keys = sorted(target.get_keys(name))
        assert keys == (["late"] if name in ("v", "r") else ["early"]), name
    assert read_all_kinds(target, "early") == (None, ["l"], [("l", (2,))], None)
    assert read_all_kinds(target, "late") == ({"l": 2}, [], [], 2)


@pytest.mark.parametrize("source,target", [(a, b) for a in BACKEND_KINDS for b in BACKEND_KINDS])
@pytest.mark.parametrize("pickled", [False, True], ids=["msgpack", "pickle"])
def test_restore_keeps_timestamps_across_backends(new, clock, tmp_path, source, target,
                                                  pickled):
    serializer = PickleSerializer() if pickled else None
    backend = new(source)
    fill_all_kinds(backend, clock, serializer)
    clock.advance(1)                           # t=7: everything is live
    restored = new(target)
    snapshot_restore(backend, tmp_path, restored)
    assert read_all_kinds(restored, "late", serializer) == ({"l": 2}, [], [], 2)
    clock.advance(3)                           # t=10: the t=0 entries expire after restore too
    assert read_all_kinds(restored, "early", serializer) == (None, ["l"], [("l", (2,))], None)
    clock.advance(6)                           # t=16: all expired
    assert read_all_kinds(restored, "late", serializer) == (None, [], [], None)


def test_restored_entries_expire_without_being_read_again(new, clock, tmp_path):
    """A snapshot of restored TTL state that nobody asked for keeps it, timestamps included;
    once asked for with a TTL, the old timestamps still count."""
    backend = new()
    fill_all_kinds(backend, clock)
    middle = new()
    snapshot_restore(backend, tmp_path, middle)
    clock.advance(20)
    last = new()
    snapshot_restore(middle, tmp_path, last)
    assert read_all_kinds(last, "early") == (None, [], [], None)


def test_ttl_cannot_be_added_or_removed_across_a_restore(new, tmp_path):
    with_ttl = new()
    state = with_ttl.get_state(ValueStateDescriptor("v", ttl=TTL))
    use(with_ttl, "k")
    state.update(1)
    without = new()
    snapshot_restore(with_ttl, tmp_path, without)
    with pytest.raises(RestoreError, match="'v'.*checkpointed with a time-to-live.*enable the TTL"):
        without.get_state(ValueStateDescriptor("v"))

    plain = new()
    p = plain.get_state(ValueStateDescriptor("v"))
    use(plain, "k")
    p.update(1)
    later = new()
    later.get_state(ValueStateDescriptor("v", ttl=TTL))   # registered before the restore
    with pytest.raises(RestoreError, match="'v'.*checkpointed without a time-to-live"):
        snapshot_restore(plain, tmp_path, later)


def test_rocksdb_incremental_checkpoint_keeps_timestamps(tmp_path, clock):
    """Incremental checkpoints ship the database as is (expired entries included, no
    compaction filter); after a restore those are still expired and never returned, and a
    savepoint (full) of the restored backend drops them."""
    job = tmp_path / "job"
    (job / "shared").mkdir(parents=True)
    chk = job / "chk-1"
    chk.mkdir()
    cfg = RocksDBConfig(local_dir=str(tmp_path / "rocksdb"))
    source = RocksDBKeyedStateBackend("op", MAX_P, FULL, cfg, clock=clock)
    restored = RocksDBKeyedStateBackend("op", MAX_P, FULL, cfg, clock=clock)
    try:
        fill_all_kinds(source, clock)
        clock.advance(5)
        handle = source.snapshot(1, "file://" + str(chk)).run()
        assert type(handle).__name__ == "IncrementalKeyGroupsStateHandle"
        restored.restore([handle], "file://" + str(chk))
        assert read_all_kinds(restored, "late") == ({"l": 2}, [], [], 2)
        assert read_all_kinds(restored, "early") == (None, ["l"], [("l", (2,))], None)
        heap = make_backend("hashmap", MAX_P, FULL)
        heap.ttl_clock = clock
        snapshot_restore(restored, tmp_path, heap)
        assert sorted(heap.get_keys("v")) == ["late"]
    finally:
        source.dispose()
        restored.dispose()


def test_ttl_and_plain_states_side_by_side(new, clock, tmp_path):
    backend = new()
    plain = backend.get_state(ValueStateDescriptor("plain", default=0))
    ttl = backend.get_state(ValueStateDescriptor("ttl", default=0, ttl=TTL))
    use(backend, "k")
    plain.update(1)
    ttl.update(1)
    clock.advance(10)
    assert (plain.value(), ttl.value()) == (1, 0)
    assert type(plain).__name__ in ("ValueState", "RocksDBValueState")
