"""The RocksDB backend's write-back cache (state/backends/rocksdb/write_cache.py): it never loses nor
resurrects an entry across flushes, evictions, snapshots (full and incremental), restores,
rescaling (cut and merge), TTL expiry and clear — checked against the heap backend as the model
over random operation sequences on real RocksDB databases — and it stays within its bound."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from streamsnap.clock import ManualScheduler
from streamsnap.errors import ConfigurationError
from streamsnap.graph.keys import BatchKeys
from streamsnap.state import (HashMapKeyedStateBackend, KeyGroupRange, ListStateDescriptor,
                              MapStateDescriptor, ReducingStateDescriptor, StateError,
                              StateTtlConfig, ValueStateDescriptor, assign_to_key_group,
                              key_group_range_for_subtask)
from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamsnap.state.backends.rocksdb.config import RocksDBConfig
from streamsnap.state.backends.rocksdb.write_cache import ENTRY_OVERHEAD, WriteCache

MAX_P = 128
FULL = KeyGroupRange(0, MAX_P - 1)
TTL = StateTtlConfig(10)
DESCRIPTORS = (
    ValueStateDescriptor("value", default=0),
    ListStateDescriptor("list"),
    MapStateDescriptor("map"),
    ReducingStateDescriptor("sum", lambda a, b: a + b),
    ValueStateDescriptor("ttl_value"),
    ListStateDescriptor("ttl_list"),
    MapStateDescriptor("ttl_map"),
)
TTL_NAMES = {"ttl_value", "ttl_list", "ttl_map"}
KIND = {d.name: d.kind for d in DESCRIPTORS}
KEYS = list(range(40)) + [f"k{i}" for i in range(10)] + [("t", i) for i in range(5)]


def descriptors():
    """Fresh descriptors (a descriptor is marked registered by the first backend using it)."""
    out = []
    for d in DESCRIPTORS:
        if d.kind == "value":
            new = ValueStateDescriptor(d.name, default=d.default)
        elif d.kind == "list":
            new = ListStateDescriptor(d.name)
        elif d.kind == "map":
            new = MapStateDescriptor(d.name)
        else:
            new = ReducingStateDescriptor(d.name, lambda a, b: a + b)
        if d.name in TTL_NAMES:
            new.enable_time_to_live(TTL)
        out.append(new)
    return out


def use(backend, key):
    backend.set_current_key(key, assign_to_key_group(key, MAX_P))


def read(backend, states: dict, name: str):
    state = states[name]
    kind = KIND[name]
    if kind == "value":
        return state.value()
    if kind == "map":
        return sorted(state.items(), key=repr)
    return state.get()


def snapshot_of(backend) -> dict:
    """Every (state, key) with an entry -> what the state API reads for it."""
    states = {d.name: backend.get_state(d) for d in descriptors()}
    out = {}
    for name in states:
        for key in backend.get_keys(name):
            use(backend, key)
            got = read(backend, states, name)
            if got not in (None, [], 0):      # expired TTL entries read as absent
                out[(name, key)] = got
    return out


class Harness:
    """A RocksDB backend (tiny write cache: evictions all the time) and the heap model, on one
    manual TTL clock; checkpoints go through real files, in the checkpoint storage layout so
    that incremental snapshots are taken."""

    def __init__(self, tmp_path: Path, seed: int, cache_size: int):
        self.tmp = tmp_path
        self.rng = random.Random(seed)
        self.clock = ManualScheduler()
        self.cache_size = cache_size
        self.created: list = []
        self.job = tmp_path / "job"
        (self.job / "shared").mkdir(parents=True)
        self.next_checkpoint = 1
        self.model = HashMapKeyedStateBackend("op", MAX_P, FULL)
        self.model.ttl_clock = self.clock
        self.model_states = {d.name: self.model.get_state(d) for d in descriptors()}
        self.rocks = self.new_rocks(FULL)

    def new_rocks(self, kg_range: KeyGroupRange, incremental: bool = True):
        config = RocksDBConfig(local_dir=str(self.tmp / "rocksdb"), incremental=incremental,
                               write_cache_size=self.cache_size)
        backend = RocksDBKeyedStateBackend("op", MAX_P, kg_range, config, clock=self.clock)
        self.created.append(backend)
        return backend

    def states(self, backend) -> dict:
        return {d.name: backend.get_state(d) for d in descriptors()}

    def location(self) -> str:
        path = self.job / f"chk-{self.next_checkpoint}"
        path.mkdir()
        self.next_checkpoint += 1
        return "file://" + str(path)

    def checkpoint(self, backend, full: bool):
        location = self.location()
        checkpoint_id = self.next_checkpoint - 1
        handle = backend.snapshot(checkpoint_id, location, full=full).run()
        backend.notify_checkpoint_complete(checkpoint_id)
        return handle, location

    # -- operations, applied to both backends ----------------------------------------------

    def apply(self, op: str, name: str, key, arg) -> None:
        results = []
        for backend, states in ((self.rocks, self.rocks_states), (self.model, self.model_states)):
            use(backend, key)
            state = states[name]
            kind = KIND[name]
            if op == "write":
                if kind == "value":
                    state.update(arg)
                elif kind == "list":
                    state.add_all(arg) if arg else state.add(key)
                elif kind == "map":
                    state.put(arg[0], arg[1])
                else:
                    state.add(arg)
            elif op == "replace" and kind == "list":
                state.update(arg)
            elif op == "remove" and kind == "map":
                state.remove(arg[0])
            elif op == "clear":
                state.clear()
            results.append(read(backend, states, name))
        assert results[0] == results[1], (op, name, key, arg)

    def apply_many(self, name: str, keys: list, values: list, hot: bool) -> None:
        """Vectorized access (get_many, then put_many) to the distinct `keys` on both."""
        batch = BatchKeys(keys, np.arange(len(keys)), [assign_to_key_group(k, MAX_P) for k in keys])
        got = [states[name].get_many(batch, hot=hot) for states in (self.rocks_states, self.model_states)]
        assert got[0] == got[1], (name, keys)
        for states in (self.rocks_states, self.model_states):
            states[name].put_many(batch, values)

    def take_all(self, name: str, extra: list) -> None:
        """`take_all` on both with every key RocksDB holds in state `name` (its fast path:
        a scan and range deletions), plus `extra` keys (then key by key)."""
        keys = list(dict.fromkeys(self.rocks.get_keys(name) + extra))
        if not keys:
            return
        batch = BatchKeys(keys, np.arange(len(keys)), [assign_to_key_group(k, MAX_P) for k in keys])
        got = [states[name].take_all(batch) for states in (self.rocks_states, self.model_states)]
        assert got[0] == got[1], (name, keys)

    def random_step(self) -> None:
        rng = self.rng
        if rng.random() < 0.02:
            self.take_all(rng.choice(["value", "ttl_value"]), rng.sample(KEYS, rng.choice([0, 0, 1])))
            return
        if rng.random() < 0.05:
            keys = rng.sample(KEYS, rng.randrange(1, 12))
            self.apply_many(rng.choice(["value", "ttl_value"]), keys,
                            [rng.choice([None, rng.randrange(1000), "s"]) for _ in keys], rng.random() < 0.5)
            return
        name = rng.choice(list(self.model_states))
        key = rng.choice(KEYS)
        kind = KIND[name]
        op = rng.choice(["write", "write", "write", "clear", "replace", "remove"])
        if kind == "value":
            arg = rng.choice([rng.randrange(1000), f"s{rng.randrange(50)}", [1, [2, "x"]], None])
        elif kind == "list":
            arg = [rng.randrange(100) for _ in range(rng.randrange(3))]
        elif kind == "map":
            arg = (rng.choice(["a", "b", 3, ("u", 1)]), rng.randrange(100))
        else:
            arg = rng.randrange(10)
        self.apply(op, name, key, arg)

    def check(self) -> None:
        assert snapshot_of(self.rocks) == snapshot_of(self.model)
        assert self.rocks.memory_usage()["write_cache"] <= self.cache_size

    def restore_same(self, full: bool) -> None:
        handle, location = self.checkpoint(self.rocks, full)
        restored = self.new_rocks(FULL)
        restored.restore([handle] if handle is not None else [], location)
        self.rocks = restored

    def rescale_cut_and_merge(self, full: bool) -> None:
        """Restore the state into two subtasks (cut), work on them, then back into one
        (merge)."""
        handle, location = self.checkpoint(self.rocks, full)
        parts = []
        for index in range(2):
            part = self.new_rocks(key_group_range_for_subtask(MAX_P, 2, index))
            part.restore([handle] if handle is not None else [], location)
            parts.append(part)
        # Work on each part with the keys it owns, then checkpoint both.
        for part in parts:
            self.rocks, self.rocks_states = part, self.states(part)
            owned = [k for k in KEYS if assign_to_key_group(k, MAX_P) in part.key_group_range]
            for _ in range(30):
                self.apply("write", "value", self.rng.choice(owned), self.rng.randrange(1000))
                self.apply("clear", "list", self.rng.choice(owned), None)
        handles = []
        for part in parts:
            h, location = self.checkpoint(part, full)
            handles.append((h, location))
        merged = self.new_rocks(FULL)
        for h, location in handles:
            if h is not None:
                merged.restore([h], location)
        self.rocks = merged


@pytest.fixture
def harnesses(tmp_path):
    made = []

    def new(seed, cache_size):
        harness = Harness(tmp_path / f"h{seed}-{cache_size}", seed, cache_size)
        made.append(harness)
        return harness

    yield new
    for harness in made:
        for backend in harness.created:
            backend.dispose()


@pytest.mark.parametrize("cache_size", [0, 2048, 16 << 20])
@pytest.mark.parametrize("seed", [1, 2])
def test_random_operations_match_the_heap_model(harnesses, seed, cache_size):
    h = harnesses(seed, cache_size)
    h.rocks_states = h.states(h.rocks)
    for step in range(1, 901):
        h.random_step()
        if step % 37 == 0:
            h.clock.advance(h.rng.choice([1, 4, 9]))       # TTL entries expire under the cache
        if step % 50 == 0:
            h.rocks.flush_write_cache()
        if step % 150 == 0:
            h.check()
            action = (step // 150) % 4
            if action == 0:
                h.restore_same(full=False)
            elif action == 1:
                h.restore_same(full=True)
            elif action == 2:
                h.rescale_cut_and_merge(full=False)
            else:
                h.rescale_cut_and_merge(full=True)
            h.rocks_states = h.states(h.rocks)
            h.check()
    h.check()
    if cache_size == 2048:
        assert h.created[0]._cache.evictions > 0 or h.rocks._cache.evictions > 0


# -- targeted cases --------------------------------------------------------------------------

@pytest.fixture
def new_backend(tmp_path):
    created = []

    def new(kg_range=FULL, **config):
        config.setdefault("local_dir", str(tmp_path / "rocksdb"))
        backend = RocksDBKeyedStateBackend("op", MAX_P, kg_range, RocksDBConfig(**config))
        created.append(backend)
        return backend

    yield new
    for backend in created:
        backend.dispose()


def stored(backend, name: str, key):
    """What RocksDB itself holds for `key` in value state `name` (None: nothing)."""
    from streamsnap.state.backends.rocksdb.encoding import encode_key
    sid = backend._meta[name].sid
    kg = assign_to_key_group(key, MAX_P)
    return backend._db.get(kg.to_bytes(2, "big") + sid + encode_key(key))


def test_writes_stay_in_the_cache_until_a_flush_writes_them_in_one_batch(new_backend):
    backend = new_backend()
    state = backend.get_state(ValueStateDescriptor("v", default=0))
    for k in range(100):
        use(backend, k)
        state.update(state.value() + k + 1)
    assert stored(backend, "v", 5) is None                  # not in RocksDB yet
    flushes = backend._cache.flushes
    written = backend.flush_write_cache()
    assert len(written) == 100 and backend._cache.flushes == flushes + 1
    assert stored(backend, "v", 5) is not None
    assert backend.flush_write_cache() == {}               # nothing dirty any more
    use(backend, 5)
    assert state.value() == 6


def test_eviction_flushes_before_it_drops_and_keeps_the_bound(new_backend):
    backend = new_backend(write_cache_size=8 * 1024)
    state = backend.get_state(ValueStateDescriptor("v"))
    for k in range(2000):
        use(backend, k)
        state.update(k * 3)
        assert backend._cache.size <= 8 * 1024
    assert backend._cache.evictions > 1000
    for k in range(2000):
        use(backend, k)
        assert state.value() == k * 3


def test_a_cleared_entry_is_not_resurrected_by_eviction_snapshot_or_restore(new_backend, tmp_path):
    backend = new_backend(write_cache_size=4 * 1024, incremental=False)
    state = backend.get_state(ValueStateDescriptor("v"))
    listing = backend.get_state(ListStateDescriptor("l"))
    use(backend, "gone")
    state.update(1)
    listing.add(1)
    backend.flush_write_cache()
    assert stored(backend, "v", "gone") is not None
    state.clear()                                          # a dirty tombstone in the cache
    listing.update([])
    for k in range(500):                                   # evicts the tombstone (flushed first)
        use(backend, k)
        state.update(k)
    assert stored(backend, "v", "gone") is None
    use(backend, "gone")
    assert state.value() is None and listing.get() == []
    state.update(2)
    state.clear()                                          # dirty again at snapshot time
    directory = tmp_path / "snap"
    directory.mkdir()
    handle = backend.snapshot(1, "file://" + str(directory)).run()
    restored = new_backend()
    restored.restore([handle], "file://" + str(directory))
    use(restored, "gone")
    assert restored.get_state(ValueStateDescriptor("v")).value() is None
    assert "gone" not in restored.get_keys("v") and len(restored.get_keys("v")) == 500


def test_restore_is_not_shadowed_by_cached_entries(new_backend, tmp_path):
    source = new_backend()
    use(source, "k")
    source.get_state(ValueStateDescriptor("v")).update("from checkpoint")
    directory = tmp_path / "snap"
    directory.mkdir()
    handle = source.snapshot(1, "file://" + str(directory)).run()
    target = new_backend()
    state = target.get_state(ValueStateDescriptor("v"))
    use(target, "k")
    assert state.value() is None                           # cached as absent
    target.restore([handle], "file://" + str(directory))
    use(target, "k")
    assert state.value() == "from checkpoint"


def test_values_read_are_copies_and_writes_are_encoded_at_once(new_backend):
    backend = new_backend()
    state = backend.get_state(ValueStateDescriptor("v"))
    use(backend, 1)
    value = [1, {"a": 2}]
    state.update(value)
    value.append(3)                                        # after the write: not in the state
    got = state.value()
    got.append(4)
    assert state.value() == [1, {"a": 2}]
    with pytest.raises(StateError):
        state.update(object())
    assert state.value() == [1, {"a": 2}]


def test_keys_equal_in_python_but_not_encoded_stay_apart(new_backend):
    backend = new_backend()
    state = backend.get_state(ValueStateDescriptor("v"))
    for key, value in ((1, "int"), (1.0, "float"), (True, "bool"), ("1", "str")):
        use(backend, key)
        state.update(value)
    use(backend, np.int64(1))                              # encodes as the int 1: the same key
    assert state.value() == "int"
    for key, value in ((1, "int"), (1.0, "float"), (True, "bool"), ("1", "str")):
        use(backend, key)
        assert state.value() == value
    assert sorted(map(repr, backend.get_keys("v"))) == sorted(["1", "1.0", "True", "'1'"])


def test_take_changes_reports_every_change_since_the_last_call(new_backend):
    backend = new_backend(write_cache_size=4 * 1024)
    state = backend.get_state(ValueStateDescriptor("v"))
    mapping = backend.get_state(MapStateDescriptor("m"))
    with pytest.raises(StateError, match="track_changes"):
        backend.take_changes()
    use(backend, "before")
    state.update(0)
    backend.track_changes()
    for k in range(300):                                   # overflows: eviction flushes
        use(backend, k)
        state.update(k)
    use(backend, "before")
    state.clear()
    mapping.put("x", 1)
    state.put_many(BatchKeys(["many"], np.arange(1), [assign_to_key_group("many", MAX_P)]), [5])
    assert backend._cache.evictions > 0
    changes = backend.take_changes()
    assert len(changes) == 300 + 1 + 1 + 1
    deleted = [rkey for rkey, raw in changes.items() if raw is None]
    value_sid = backend._meta["v"].sid
    assert len(deleted) == 1
    assert deleted == [r for r in changes if r.endswith(b"\xa6before") and r[2:4] == value_sid]
    assert all(backend._db.get(rkey) == raw for rkey, raw in changes.items())
    assert backend.take_changes() == {}
    use(backend, 7)
    state.update(70)
    assert list(backend.take_changes().values()) == [b"\x46"]


def test_write_cache_accounting_and_validation():
    writes = []
    cache = WriteCache(2 * (ENTRY_OVERHEAD + 8), writes.extend)
    cache.put(b"k1", b"v1")
    cache.put(b"k1", b"longer")
    assert cache.size == ENTRY_OVERHEAD + 2 + 6 and not writes
    cache.delete(b"k2")
    assert cache.size == 2 * ENTRY_OVERHEAD + 4 + 6
    cache.put(b"k3", b"v3")                                # over the bound: flush, then evict
    assert sorted(writes) == [(b"k1", b"longer"), (b"k2", None), (b"k3", b"v3")]
    assert cache.size <= cache.bound // 2 and cache.evictions >= 2
    cache.put(b"k4", b"new")
    cache.load(b"k4", b"old from a stale read")            # never undoes a write
    assert cache.get(b"k4") is not None and cache.get(b"k4")[1] == b"new"
    for bad in (-1, True, "1MB"):
        with pytest.raises(StateError, match="write cache bound"):
            WriteCache(bad, writes.extend)
    for bad in (-1, True, "16MB", 1.5):
        with pytest.raises(ConfigurationError, match="RocksDBConfig.write_cache_size"):
            RocksDBConfig(write_cache_size=bad)
    assert RocksDBConfig(write_cache_size=0).memory_bound == RocksDBConfig().memory_bound - (16 << 20)


def test_a_cleared_map_is_one_range_deletion_and_no_cached_entry_outlives_it(new_backend, tmp_path):
    """MapState.clear deletes a key's entries with one range tombstone (no tombstone per entry
    in the cache or a write batch), drops the cached ones, and leaves the other keys' entries;
    a snapshot and restore see the same."""
    backend = new_backend()
    state = backend.get_state(MapStateDescriptor("m"))
    for key in ("a", "b"):
        use(backend, key)
        state.put_all({i: i * 2 for i in range(200)})
    use(backend, "a")
    assert state.get(7) == 14 and state.get(500) is None        # cached: one present, one absent
    writes = []
    original = backend._write_entries
    backend._write_entries = lambda entries: (writes.append(list(entries)), original(entries))
    backend._cache._write = backend._write_entries
    state.clear()
    assert not any(raw is None for batch in writes for _, raw in batch)   # no tombstone per entry
    assert state.get(7) is None and state.get(500) is None and state.is_empty() and not state.contains(1)
    assert not any(k.startswith(state._rkey()) and v[1] is not None for k, v in backend._cache.entries.items())
    state.put(1, "again")
    use(backend, "b")
    assert state.get(7) == 14 and len(state.keys()) == 200
    directory = tmp_path / "snap"
    directory.mkdir()
    handle = backend.snapshot(1, "file://" + str(directory)).run()
    restored = new_backend(local_dir=str(tmp_path / "restored"))
    restored.restore([handle], "file://" + str(directory))
    again = restored.get_state(MapStateDescriptor("m"))
    use(restored, "a")
    assert again.items() == [(1, "again")]
    use(restored, "b")
    assert len(again.keys()) == 200


def test_a_batch_of_map_entries_is_written_through_not_cached(new_backend, tmp_path):
    """MapState.put_all_many writes its entries to RocksDB in one batch without caching them
    (a batch's entries are mostly new: caching them only evicts hot ones), an entry already
    cached follows the write, and a batch with a bad map key writes nothing."""
    backend = new_backend()
    state = backend.get_state(MapStateDescriptor("m"))
    use(backend, "a")
    state.put("x", 1)                                             # cached, dirty
    cached = dict(backend._cache.entries)
    names = ["a", "b"]
    keys = BatchKeys(names, np.zeros(0, dtype=np.int64), [assign_to_key_group(k, MAX_P) for k in names])
    state.put_all_many(keys, [{"x": 2, "y": 3}, {("t", 1): 4}])
    assert set(backend._cache.entries) == set(cached) and backend._cache.evictions == 0
    assert not backend._cache.dirty                              # the cached one was written too
    assert state.get_all_many(keys, [["x", "y"], [("t", 1)]]) == [[2, 3], [4]]
    use(backend, "a")
    assert state.get("x") == 2 and sorted(state.items()) == [("x", 2), ("y", 3)]
    with pytest.raises(StateError, match="map key"):
        state.put_all_many(keys, [{"x": 9}, {object(): 1}])
    assert state.get_all_many(keys, [["x"], [("t", 1)]]) == [[2], [4]]     # nothing written
    directory = tmp_path / "snap"
    directory.mkdir()
    handle = backend.snapshot(1, "file://" + str(directory)).run()
    restored = new_backend(local_dir=str(tmp_path / "restored"))
    restored.restore([handle], "file://" + str(directory))
    assert restored.get_state(MapStateDescriptor("m")).get_all_many(keys, [["x", "y"], [("t", 1)]]) == [[2, 3], [4]]


def test_hot_batch_reads_are_cached_and_their_writes_stay_there_until_a_flush(new_backend, tmp_path):
    """ValueState.get_many(hot=True) caches the entries it reads from RocksDB; put_many then
    writes cached keys in the cache (dirty, one write batch at the next flush) and the others
    straight to RocksDB, uncached; a snapshot has both."""
    backend = new_backend()
    state = backend.get_state(ValueStateDescriptor("v"))
    names = [f"k{i}" for i in range(6)]
    keys = BatchKeys(names, np.zeros(0, dtype=np.int64), [assign_to_key_group(k, MAX_P) for k in names])
    state.put_many(keys, list(range(6)))                       # nothing cached: all written through
    assert not backend._cache.entries and stored(backend, "v", "k0") is not None
    assert state.get_many(keys) == list(range(6)) and not backend._cache.entries
    hot = BatchKeys(names[:3], np.zeros(0, dtype=np.int64), keys.key_groups[:3])
    assert state.get_many(hot, hot=True) == [0, 1, 2]
    assert len(backend._cache.entries) == 3 and not backend._cache.dirty
    state.put_many(keys, [10, None, 12, 13, None, 15])
    assert len(backend._cache.dirty) == 3                       # k0-k2: in the cache only
    assert stored(backend, "v", "k0") == backend._pack_value(0) and stored(backend, "v", "k1") is not None
    assert stored(backend, "v", "k3") == backend._pack_value(13) and stored(backend, "v", "k4") is None
    assert state.get_many(keys) == [10, None, 12, 13, None, 15]
    directory = tmp_path / "snap"
    directory.mkdir()
    handle = backend.snapshot(1, "file://" + str(directory)).run()
    assert stored(backend, "v", "k0") == backend._pack_value(10) and stored(backend, "v", "k1") is None
    restored = new_backend(local_dir=str(tmp_path / "restored"))
    restored.restore([handle], "file://" + str(directory))
    assert restored.get_state(ValueStateDescriptor("v")).get_many(keys) == [10, None, 12, 13, None, 15]


def test_take_all_reads_a_whole_state_by_a_scan_and_drops_it_by_range(new_backend, tmp_path):
    """ValueState.take_all with every key the state holds (dirty cached entries too) returns
    their values and drops them with range deletions — no tombstone per key — leaving the
    other states; an incremental snapshot then restores without them. With keys that are not
    the whole state it reads and clears just those, key by key; under a changelog each
    deletion is reported."""
    backend = new_backend()
    state = backend.get_state(ValueStateDescriptor("v"))
    other = backend.get_state(ValueStateDescriptor("other"))
    names = [f"k{i}" for i in range(300)]
    keys = BatchKeys(names, np.zeros(0, dtype=np.int64), [assign_to_key_group(k, MAX_P) for k in names])
    state.put_many(keys, list(range(300)))
    other.put_many(keys, ["o"] * 300)
    use(backend, "k7")
    state.update(-7)                                             # dirty in the cache only
    directory = tmp_path / "one"
    directory.mkdir()
    backend.snapshot(1, "file://" + str(directory)).run()
    backend.notify_checkpoint_complete(1)
    writes = []
    original = backend._write_entries
    backend._write_entries = lambda entries: (writes.append(list(entries)), original(entries))
    backend._cache._write = backend._write_entries
    shuffled = BatchKeys(names[::-1], np.zeros(0, dtype=np.int64), keys.key_groups[::-1])
    assert state.take_all(shuffled) == [-7 if i == 7 else i for i in range(300)][::-1]
    assert not any(raw is None for batch in writes for _, raw in batch)   # no tombstone per key
    assert backend.get_keys("v") == [] and state.get_many(keys) == [None] * 300
    assert other.get_many(keys) == ["o"] * 300
    directory = tmp_path / "two"
    directory.mkdir()
    handle = backend.snapshot(2, "file://" + str(directory)).run()
    restored = new_backend(local_dir=str(tmp_path / "restored"))
    restored.restore([handle], "file://" + str(directory))
    assert restored.get_keys("v") == [] and len(restored.get_keys("other")) == 300

    part = BatchKeys(names[:10], np.zeros(0, dtype=np.int64), keys.key_groups[:10])
    assert other.take_all(part) == ["o"] * 10                    # not the whole state: key by key
    assert len(backend.get_keys("other")) == 290
    backend.track_changes()
    backend.take_changes()
    rest = BatchKeys(names[10:], np.zeros(0, dtype=np.int64), keys.key_groups[10:])
    assert other.take_all(rest) == ["o"] * 290
    changes = backend.take_changes()
    assert len(changes) == 290 and set(changes.values()) == {None}
