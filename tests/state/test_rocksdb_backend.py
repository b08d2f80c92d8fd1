"""The RocksDB keyed state backend: canonical snapshots shared with the heap backend,
rescaling, memory bounds, lifecycle and configuration errors. (The generic keyed state and
snapshot tests run on both backends: see conftest.backend_kind.)"""

import os
import random
import sys
import threading
from pathlib import Path

import pytest

import streamsnap as ss
from streamsnap.errors import ConfigurationError
from streamsnap.state import (HashMapKeyedStateBackend, KeyGroupRange, ListStateDescriptor,
                              MapStateDescriptor, PickleSerializer, ReducingStateDescriptor,
                              StateError, ValueStateDescriptor, assign_to_key_group,
                              key_group_range_for_subtask)
from streamsnap.state.backends.hashmap import decode_block
from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamsnap.state.backends.rocksdb.config import RocksDBConfig
from streamsnap.time.timers import InternalTimerService

from .conftest import make_backend

MAX_P = 128
FULL = KeyGroupRange(0, MAX_P - 1)
PICKLED = PickleSerializer()
DESCRIPTORS = (
    ValueStateDescriptor("value", default=0),
    ListStateDescriptor("list"),
    MapStateDescriptor("map"),
    ReducingStateDescriptor("reduce", lambda a, b: a + b),
    ValueStateDescriptor("pickled", serializer=PICKLED),
    MapStateDescriptor("pickled_map", serializer=PICKLED),
)
KEYS = list(range(300)) + [f"s{i}" for i in range(40)] + [("comp", i) for i in range(20)] + \
    [None, b"raw", 2.5]
INDEX = {k: i for i, k in enumerate(KEYS)}


def use_key(backend, key):
    backend.set_current_key(key, assign_to_key_group(key, MAX_P))


def fill(backend, keys, timers=True):
    value, listing, mapping, reduce, pickled, pickled_map = (backend.get_state(d) for d in DESCRIPTORS)
    service = InternalTimerService(backend) if timers else None
    for k in keys:
        i = INDEX[k]                       # values depend on the key only
        use_key(backend, k)
        value.update(i)
        listing.add_all([k, (i, "tuple"), {"nested": [i]}])
        mapping.put("a", i)
        mapping.put(("t", i % 3), [k, None])
        reduce.add(i)
        reduce.add(1)
        pickled.update({i, "set"})
        pickled_map.put(i % 5, frozenset({i}))
        if service is not None and i % 4 == 0:
            service.register_event_time_timer(1000 + i % 50)
            service.register_processing_time_timer(5000 + i, namespace=("w", i % 2))


def dump(backend) -> dict:
    """Every entry of every state, read through the state API."""
    states = [backend.get_state(d) for d in DESCRIPTORS]
    out = {}
    for d, state in zip(DESCRIPTORS, states):
        for key in backend.get_keys(d.name):
            use_key(backend, key)
            if d.kind == "value":
                out[(d.name, key)] = state.value()
            elif d.kind == "map":
                out[(d.name, key)] = dict(state.items())
            else:
                out[(d.name, key)] = state.get()
    for name in backend.state_names():
        if name.startswith("_timers."):
            timers = backend.get_state(MapStateDescriptor(name))
            for kg, key, entries in backend.iter_entries(name):
                use_key(backend, key)
                assert kg == assign_to_key_group(key, MAX_P)
                out[(name, key)] = dict(timers.items())
                assert out[(name, key)] == entries
    return out


def decoded_file(handle, location) -> dict:
    """key group -> {state name: (kind, tag, wire entries)} of a canonical keyed state file."""
    data = Path(location.removeprefix("file://"), handle.file.path).read_bytes()
    out = {}
    for kg, (offset, length) in handle.offsets.items():
        out[kg] = {name: (kind, tag, wire) for name, kind, tag, wire
                   in decode_block(data[offset:offset + length], kg, handle.file.path)}
    return out


@pytest.fixture
def rocks_config(tmp_path):
    return RocksDBConfig(local_dir=str(tmp_path / "rocksdb"))


@pytest.fixture
def backends():
    created = []
    yield created
    for backend in created:
        backend.dispose()


@pytest.mark.parametrize("source, target", [("hashmap", "rocksdb"), ("rocksdb", "hashmap")])
def test_snapshot_restores_into_the_other_backend(source, target, location, tmp_path,
                                                   rocks_config, backends):
    def new(kind, kg_range=FULL):
        backend = make_backend(kind, MAX_P, kg_range, config=rocks_config)
        backends.append(backend)
        return backend

    original = new(source)
    fill(original, KEYS)
    expected = dump(original)
    handle = original.snapshot(1, location).run()
    # The same state in the other backend writes the same canonical content.
    twin = new(target)
    fill(twin, KEYS)
    twin_location = "file://" + str(tmp_path / "twin")
    os.makedirs(twin_location[7:])
    twin_handle = twin.snapshot(1, twin_location).run()
    assert decoded_file(handle, location) == decoded_file(twin_handle, twin_location)
    assert set(handle.offsets) == set(twin_handle.offsets)

    restored = new(target)
    restored.restore([handle], location)
    assert restored.is_restored
    assert dump(restored) == expected
    assert restored.num_keys() == original.num_keys()
    # ...its timers fire after the switch, in order, with their keys current
    service = InternalTimerService(restored)
    fired = [(t.timestamp, t.key) for t in service.advance_watermark(1010)]
    assert [ts for ts, _ in fired] == sorted(ts for ts, _ in fired) and fired
    assert {k for _, k in fired} == {k for i, k in enumerate(KEYS) if i % 4 == 0 and i % 50 <= 10}
    # ...and back again, through a second snapshot of the restored backend.
    back_location = "file://" + str(tmp_path / "back")
    os.makedirs(back_location[7:])
    back = new(source)
    back.restore([new_handle := restored.snapshot(2, back_location).run()], back_location)
    assert new_handle is not None
    after_fire = dump(restored)
    assert dump(back) == after_fire


@pytest.mark.parametrize("old_kind, new_kind", [("rocksdb", "rocksdb"), ("hashmap", "rocksdb"),
                                                ("rocksdb", "hashmap")])
def test_rescale_from_two_subtasks_to_three(old_kind, new_kind, location, rocks_config,
                                            backends):
    def new(kind, kg_range):
        backend = make_backend(kind, MAX_P, kg_range, config=rocks_config)
        backends.append(backend)
        return backend

    reference = new("hashmap", FULL)
    fill(reference, KEYS, timers=False)
    expected = dump(reference)
    handles = []
    for index in range(2):
        kg_range = key_group_range_for_subtask(MAX_P, 2, index)
        old = new(old_kind, kg_range)
        fill(old, [k for k in KEYS if assign_to_key_group(k, MAX_P) in kg_range], timers=False)
        handles.append(old.snapshot(1, location).run())
    merged = {}
    for index in range(3):
        kg_range = key_group_range_for_subtask(MAX_P, 3, index)
        part = new(new_kind, kg_range)
        part.restore(handles, location)        # every handle: each keeps only its key groups
        got = dump(part)
        assert all(assign_to_key_group(key, MAX_P) in kg_range for _, key in got)
        assert not set(got) & set(merged)
        merged.update(got)
    assert merged == expected


def test_state_larger_than_block_cache_and_write_buffers(tmp_path, location):
    config = RocksDBConfig(block_cache_size=64 * 1024, write_buffer_size=64 * 1024,
                           max_write_buffers=2, write_cache_size=64 * 1024,
                           local_dir=str(tmp_path / "rocksdb"))
    backend = RocksDBKeyedStateBackend("op", MAX_P, FULL, config)
    try:
        value = backend.get_state(ValueStateDescriptor("blob"))
        listing = backend.get_state(ListStateDescriptor("events"))
        n = 6000
        blob = [random.Random(i).randbytes(256) for i in range(n)]     # incompressible
        for i in range(n):
            use_key(backend, i)
            value.update(blob[i])
            listing.add(i)
            listing.add(-i)
        sst_bytes = sum(p.stat().st_size for p in Path(backend.directory).rglob("*.sst"))
        assert sst_bytes > 4 * config.memory_bound        # the state lives on disk
        usage = backend.memory_usage()
        assert usage["memtables"] <= config.write_buffer_size * config.max_write_buffers
        assert usage["write_cache"] <= config.write_cache_size
        native = backend.native_metrics()
        assert set(native) == set(backend.NATIVE_METRICS) | {"block_cache_bytes", "memtables_bytes",
                                                             "write_cache_bytes"}
        assert native["live_sst_bytes"] > 4 * config.memory_bound
        assert native["estimate_keys"] > 0 and native["compactions_running"] >= 0
        for i in range(0, n, 7):
            use_key(backend, i)
            assert value.value() == blob[i] and listing.get() == [i, -i]
        handle = backend.snapshot(1, location).run()
        heap = HashMapKeyedStateBackend("op", MAX_P, FULL)
        heap.restore([handle], location)
        assert heap.num_keys() == 2 * n
        heap_value = heap.get_state(ValueStateDescriptor("blob"))
        use_key(heap, n - 1)
        assert heap_value.value() == blob[n - 1]
    finally:
        backend.dispose()
    assert backend.native_metrics() == {}       # a monitor asking after dispose gets nothing, not a crash


def test_database_directory_is_deleted_on_dispose(rocks_config, location):
    backend = RocksDBKeyedStateBackend("op/with:odd chars", MAX_P, FULL, rocks_config)
    directory = Path(backend.directory)
    assert directory.parent == Path(rocks_config.local_dir) and directory.is_dir()
    other = RocksDBKeyedStateBackend("op/with:odd chars", MAX_P, FULL, rocks_config)
    assert other.directory != backend.directory         # one database per subtask instance
    other.dispose()
    state = backend.get_state(ValueStateDescriptor("v"))
    use_key(backend, 1)
    state.update(1)
    backend.dispose()
    assert not directory.exists()
    backend.dispose()                                   # idempotent
    with pytest.raises(StateError, match="disposed"):
        state.value()
    with pytest.raises(StateError, match="after dispose"):
        backend.snapshot(2, location)


def test_dispose_while_a_snapshot_runs_lets_it_finish(rocks_config, location, backends):
    backend = RocksDBKeyedStateBackend("op", MAX_P, FULL, rocks_config)
    fill(backend, KEYS, timers=False)
    expected = dump(backend)
    snapshot = backend.snapshot(1, location)
    directory = Path(backend.directory)
    backend.dispose()
    assert directory.exists()                           # the pinned view is still needed
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("handle", snapshot.run()))
    thread.start()
    thread.join()
    assert not directory.exists()
    heap = HashMapKeyedStateBackend("op", MAX_P, FULL)
    heap.restore([result["handle"]], location)
    assert dump(heap) == expected


def test_keys_are_laid_out_by_key_group(rocks_config, backends):
    backend = RocksDBKeyedStateBackend("op", MAX_P, KeyGroupRange(10, 40), rocks_config)
    backends.append(backend)
    state = backend.get_state(ValueStateDescriptor("v"))
    keys = [k for k in range(2000) if 10 <= assign_to_key_group(k, MAX_P) <= 40]
    for k in keys:
        use_key(backend, k)
        state.update(k)
    backend.flush_write_cache()
    raw = list(backend._db.keys())
    assert raw == sorted(raw)
    groups = [int.from_bytes(r[:2], "big") for r in raw]
    assert groups == sorted(groups) and set(groups) <= set(range(10, 41))
    import msgpack
    assert sorted(msgpack.unpackb(r[4:]) for r in raw) == sorted(keys)
    assert all(g == assign_to_key_group(msgpack.unpackb(r[4:]), MAX_P) for g, r in zip(groups, raw))


@pytest.mark.parametrize("field, value", [
    ("block_cache_size", 0), ("block_cache_size", "64MB"), ("write_buffer_size", 1024),
    ("max_write_buffers", 1), ("max_write_buffers", True), ("level0_compaction_trigger", 1), ("local_dir", ""), ("local_dir", 3),
    ("compaction", "fifo"), ("compaction", None),
])
def test_rocksdb_config_validation(field, value):
    with pytest.raises(ConfigurationError, match=f"RocksDBConfig.{field} must be"):
        RocksDBConfig(**{field: value})


def test_state_backend_option():
    assert ss.StreamEnvironment(state_backend="hashmap").state_backend == "hashmap"
    assert ss.StreamEnvironment(state_backend="rocksdb").state_backend == RocksDBConfig()
    config = RocksDBConfig(block_cache_size=8 << 20)
    assert ss.StreamEnvironment(state_backend=config).state_backend is config
    for bad in ("mongo", "RocksDB", None, 1):
        with pytest.raises(ConfigurationError,
                           match="state_backend must be one of 'hashmap', 'rocksdb', got"):
            ss.StreamEnvironment(state_backend=bad)


def test_missing_rocksdict_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "rocksdict", None)     # makes `import rocksdict` fail
    with pytest.raises(ConfigurationError, match=r"needs the rocksdict package.*pip install"):
        ss.StreamEnvironment(state_backend="rocksdb")
    local = tmp_path / "rocksdb"
    with pytest.raises(ConfigurationError, match="rocksdict"):
        RocksDBKeyedStateBackend("op", MAX_P, FULL, RocksDBConfig(local_dir=str(local)))
    assert list(local.iterdir()) == []                    # nothing left behind
    assert ss.StreamEnvironment(state_backend="hashmap").state_backend == "hashmap"


def test_unusable_local_dir_fails_clearly(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigurationError, match="cannot create the RocksDB working directory"):
        RocksDBKeyedStateBackend("op", MAX_P, FULL, RocksDBConfig(local_dir=str(blocker / "x")))


def test_directories_of_dead_processes_are_removed(rocks_config):
    import subprocess
    from streamsnap.state.backends.rocksdb.config import DIRECTORY_PREFIX
    base = Path(rocks_config.local_dir)
    base.mkdir(parents=True)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()                                          # its pid now names no process
    dead = base / f"{DIRECTORY_PREFIX}{child.pid}-op-kg0-abc"
    alive = base / f"{DIRECTORY_PREFIX}{os.getppid()}-op-kg0-def"
    unrelated = base / "something-else"
    for d in (dead, alive, unrelated):
        (d / "db").mkdir(parents=True)
    backend = RocksDBKeyedStateBackend("op", MAX_P, FULL, rocks_config)
    try:
        assert not dead.exists() and alive.exists() and unrelated.exists()
        assert Path(backend.directory).name.startswith(f"{DIRECTORY_PREFIX}{os.getpid()}-op-kg0-")
    finally:
        backend.dispose()


def test_large_state_options_reach_the_database(tmp_path):
    """Index/filter blocks partitioned inside the block cache (whole ones thrashed a cache shard)
    and flushes piling up before universal compactions (an incremental upload is the flush):
    read back from the OPTIONS file RocksDB writes for the open database."""
    config = RocksDBConfig(local_dir=str(tmp_path / "rocksdb"))
    backend = RocksDBKeyedStateBackend("op", MAX_P, FULL, config)
    try:
        [options_file] = sorted(Path(backend.directory).rglob("OPTIONS-*"))[-1:]
        settings = {line.strip() for line in options_file.read_text().splitlines()}
    finally:
        backend.dispose()
    assert {"index_type=kTwoLevelIndexSearch", "partition_filters=true",
            "cache_index_and_filter_blocks=true", "pin_top_level_index_and_filter=true",
            f"max_bytes_for_level_base={64 << 20}", f"target_file_size_base={8 << 20}",
            f"level0_file_num_compaction_trigger={config.level0_compaction_trigger}",
            "compaction_style=kCompactionStyleUniversal"} <= settings
    [universal] = [line for line in settings if line.startswith("compaction_options_universal=")]
    assert "max_size_amplification_percent=200;" in universal and "min_merge_width=4;" in universal


def test_leveled_compaction_on_request(tmp_path):
    backend = RocksDBKeyedStateBackend("op", MAX_P, FULL, RocksDBConfig(local_dir=str(tmp_path), compaction="level"))
    try:
        [options_file] = sorted(Path(backend.directory).rglob("OPTIONS-*"))[-1:]
        settings = {line.strip() for line in options_file.read_text().splitlines()}
        assert {"compaction_style=kCompactionStyleLevel", "level_compaction_dynamic_level_bytes=true"} <= settings
    finally:
        backend.dispose()
