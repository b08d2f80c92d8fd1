"""The RocksDB keyed state backend: one embedded database per operator subtask (see the package
docstring for the layout, the snapshot strategies and TTL)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from streamsnap.checkpoint.handles import IncrementalKeyGroupsStateHandle, KeyGroupsStateHandle
from streamsnap.clock import Clock, SystemClock
from streamsnap.errors import ConfigurationError, RestoreError
from streamsnap.state.assignment import SubtaskRestoreState
from streamsnap.state.backends.changelog import KeyedChangelog
from streamsnap.state.backends.hashmap import read_key_group_blocks
from streamsnap.state.backends.rocksdb import incremental as rocksdb_incremental
from streamsnap.state.backends.rocksdb.config import DIRECTORY_PREFIX, RocksDBConfig, _open_db, import_rocksdict
from streamsnap.state.backends.rocksdb.encoding import (_decode_key, _kg_bytes, _skip, _successor, _ttl_wire_to_stored,
                                                        encode_key, encode_value, new_packers)
from streamsnap.state.backends.rocksdb.snapshot import RocksDBKeyedStateSnapshot
from streamsnap.state.backends.rocksdb.states import STATE_CLASSES, RocksDBState, _StateMeta
from streamsnap.state.backends.rocksdb.write_cache import WriteCache
from streamsnap.state.descriptors import LIST, MAP, STATE_KINDS, StateDescriptor
from streamsnap.state.errors import StateError
from streamsnap.state.key_groups import KeyGroupRange, check_max_parallelism
from streamsnap.state.local_recovery import LocalRecoveryStore
from streamsnap.state.serialization import key_error, unpack_value
from streamsnap.state.snapshot import StateSnapshot, safe_file_prefix
from streamsnap.state.ttl import check_same_ttl, clock_millis, is_ttl_tag, state_tag, tag_mismatch

log = logging.getLogger(__name__)

_MAX_STATES = 1 << 16
# int/str keys whose encoding a backend remembers (~1.6 MB), then forgets all at once
_ENCODED_KEYS = 1 << 14


# ---------------------------------------------------------------------------------------------
# working directories


def remove_stale_directories(base: str) -> list[str]:
    """Delete the database directories under `base` left by processes that no longer run (a
    task killed by a failure cannot delete its own); returns what was deleted."""
    removed = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(DIRECTORY_PREFIX):
            continue
        pid_text = name[len(DIRECTORY_PREFIX):].split("-", 1)[0]
        if not pid_text.isdigit() or _process_exists(int(pid_text)):
            continue
        path = os.path.join(base, name)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _process_exists(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:           # exists, owned by someone else
        return True
    return True


# ---------------------------------------------------------------------------------------------
# the backend


class RocksDBKeyedStateBackend:
    """Keyed state of one operator subtask in an embedded RocksDB, for the key groups it owns."""

    # A lookup the write cache misses probes memtables and files (~1-3 µs from Python).
    LOOKUPS_ARE_CHEAP = False

    def __init__(self, operator_uid: str, max_parallelism: int, key_group_range: KeyGroupRange,
                 config: RocksDBConfig | str | None = None, *, clock: Clock | None = None,
                 local_store: LocalRecoveryStore | None = None):
        check_max_parallelism(max_parallelism)
        if not isinstance(key_group_range, KeyGroupRange) or key_group_range.is_empty \
                or key_group_range.end >= max_parallelism:
            raise ConfigurationError(
                f"operator '{operator_uid}': key_group_range must be a non-empty KeyGroupRange "
                f"within [0, {max_parallelism}), got {key_group_range!r}")
        if config is None or config == "rocksdb":
            config = RocksDBConfig()
        if not isinstance(config, RocksDBConfig):
            raise ConfigurationError(f"operator '{operator_uid}': the RocksDB backend needs a "
                                     f"RocksDBConfig, got {config!r}")
        self.operator_uid = operator_uid
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        self.config = config
        base = str(config.local_dir) if config.local_dir is not None else tempfile.gettempdir()
        try:
            os.makedirs(base, exist_ok=True)
            remove_stale_directories(base)
            self.directory = tempfile.mkdtemp(
                prefix=f"{DIRECTORY_PREFIX}{os.getpid()}-{safe_file_prefix(operator_uid)[:40]}-"
                       f"kg{key_group_range.start}-", dir=base)
        except OSError as e:
            raise ConfigurationError(f"operator '{operator_uid}': cannot create the RocksDB "
                                     f"working directory under {base!r}: {e}; set "
                                     f"RocksDBConfig.local_dir to a writable local "
                                     f"directory") from e
        try:
            self._rocksdict, self._db, self.block_cache = _open_db(os.path.join(self.directory, "db"), config)
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        self._kg_prefixes: dict[int, bytes] = {kg: _kg_bytes(kg) for kg in key_group_range}
        self._encoded_keys: dict[int | str, bytes] = {}     # recent int/str keys' msgpack
        # The states' own packers: a backend is used by one thread at a time (its current key
        # is shared by its states), so they need no thread-local lookup per row.
        self._pack_key, self._pack_value = new_packers()
        # Entries read and written since the last flush (see `write_cache`); `_entries` is its
        # dict, read directly on the hot paths.
        self._cache = WriteCache(config.write_cache_size, self._write_entries)
        self._entries = self._cache.entries
        self._current_key: Any = None
        self._current_key_group: int | None = None
        self._kg: bytes | None = None          # encoded current key group (lazily checked)
        self._key: bytes | None = None         # encoded current key (lazily)
        self._meta: dict[str, _StateMeta] = {}
        self._next_sid = 0
        self._live_snapshots: set[int] = set()
        self._next_token = 0
        self._lock = threading.Lock()
        self._disposed = False
        self._deleted = False
        self.is_restored = False
        self.last_completed_checkpoint_id: int | None = None
        self._uploads = rocksdb_incremental.UploadTracker()
        # Task-local recovery: snapshots keep a local copy, restores read it first.
        self.local_store = local_store
        # Processing time of state TTL (wall clock); injectable for deterministic tests.
        self.ttl_clock: Clock = clock if clock is not None else SystemClock()
        # Changelog mode: logs every write from here on (wraps `_db` and `_rocksdict`).
        self.changelog = (KeyedChangelog(self, config.changelog)
                          if config.changelog is not None else None)

    def _ttl_now(self) -> int:
        return clock_millis(self.ttl_clock)

    # -- keys ------------------------------------------------------------------------------

    def set_current_key(self, key: Any, key_group: int) -> None:
        """Make `key` (in `key_group`, from `assign_to_key_group`) the key states refer to."""
        self._current_key = key
        self._current_key_group = key_group
        self._kg = None
        self._key = None

    @property
    def current_key(self) -> Any:
        return self._current_key

    @property
    def current_key_group(self) -> int | None:
        return self._current_key_group

    def _current_prefix(self, state_name: str) -> tuple[bytes, bytes]:
        """(key group bytes, key bytes) of the current key, checked on first use."""
        kg = self._kg
        if kg is None:
            if self._disposed:
                raise self._key_group_error(state_name)
            try:
                kg = self._kg = self._kg_prefixes[self._current_key_group]
            except (KeyError, TypeError):
                raise self._key_group_error(state_name) from None
        key = self._key
        if key is None:
            current = self._current_key
            # Only exact ints and strs: their equality is their encoding's (1, 1.0 and True are
            # equal in Python, three keys here).
            memo = current.__class__ is int or current.__class__ is str
            if memo:
                key = self._encoded_keys.get(current)
            if key is None:
                try:
                    key = self._pack_key(current)
                except (TypeError, ValueError, OverflowError) as e:
                    raise key_error(state_name, current) from e
                if memo:
                    if len(self._encoded_keys) >= _ENCODED_KEYS:
                        self._encoded_keys.clear()
                    self._encoded_keys[current] = key
            self._key = key
        return kg, key

    def _check_open(self, state_name: str) -> None:
        if self._disposed:
            raise self._key_group_error(state_name)

    def _key_group_error(self, state_name: str) -> StateError:
        if self._disposed:
            return StateError(f"state '{state_name}' of operator '{self.operator_uid}' was used "
                              f"after its backend was disposed")
        if self._current_key_group is None:
            return StateError(
                f"state '{state_name}' of operator '{self.operator_uid}' was accessed without a "
                f"current key: keyed state is only available while processing a record of a "
                f"keyed stream (call set_current_key first)")
        return StateError(
            f"state '{state_name}' of operator '{self.operator_uid}': the current key "
            f"{self._current_key!r} has key group {self._current_key_group!r}, outside this "
            f"subtask's key groups [{self.key_group_range.start}, {self.key_group_range.end}] "
            f"(max parallelism {self.max_parallelism}); the record was routed to the wrong "
            f"subtask")

    def memory_usage(self) -> dict[str, int]:
        """Bytes held in memory now: RocksDB's block cache and memtables, and the write cache
        (its own estimate)."""
        return {"block_cache": self.block_cache.get_usage(),
                "memtables": self._db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0,
                "write_cache": self._cache.size}

    # RocksDB's own figures that tell whether the database keeps up (Flink's RocksDB native
    # metrics): name in streamsnap's metrics -> RocksDB property.
    NATIVE_METRICS = {
        "compactions_running": "rocksdb.num-running-compactions",
        "compaction_pending": "rocksdb.compaction-pending",
        "pending_compaction_bytes": "rocksdb.estimate-pending-compaction-bytes",
        "flushes_running": "rocksdb.num-running-flushes",
        "flush_pending": "rocksdb.mem-table-flush-pending",
        "live_sst_bytes": "rocksdb.live-sst-files-size",
        "estimate_keys": "rocksdb.estimate-num-keys",
    }

    def native_metrics(self) -> dict[str, int]:
        """RocksDB's compaction and flush state and its sizes now, plus `memory_usage()`: what a
        monitor needs to see a backend falling behind (pending compactions grow) or settled
        (nothing pending or running), e.g. before measuring steady-state checkpoints."""
        try:
            # Called from the task's control thread: the database may close meanwhile.
            values = {name: self._db.property_int_value(prop) or 0 for name, prop in self.NATIVE_METRICS.items()}
        except import_rocksdict().DbClosedError:
            return {}
        values.update({f"{part}_bytes": size for part, size in self.memory_usage().items()})
        return values

    # -- entries: through the write cache --------------------------------------------------

    def _read(self, rkey: bytes) -> bytes | None:
        """The stored bytes of `rkey` (None: no entry): the cache's, else the database's
        (then cached)."""
        entry = self._entries.get(rkey)
        if entry is not None:
            return entry[1]
        raw = self._db.get(rkey)
        self._cache.load(rkey, raw)
        return raw

    def _read_many(self, rkeys: list[bytes], load: bool = False) -> list[bytes | None]:
        """The stored bytes of several keys: cache hits, one multi-get for the misses, which
        are cached only with `load` (keys that recur batch after batch: for others caching
        would only churn the cache)."""
        entries = self._entries
        out: list = []
        missing: list[int] = []
        for i, rkey in enumerate(rkeys):
            entry = entries.get(rkey)
            if entry is None:
                missing.append(i)
                out.append(None)
            else:
                out.append(entry[1])
        if missing:
            # In key order: RocksDB's multi-get then walks each file's blocks forward (50 K
            # random keys of a 5 M-key database: 172 ms sorted, ~250 ms unsorted).
            missing.sort(key=rkeys.__getitem__)
            asked = [rkeys[i] for i in missing]
            found = self._db.get(asked)
            for i, raw in zip(missing, found):
                out[i] = raw
            if load:
                self._cache.load_many([(k, raw) for k, raw in zip(asked, found) if raw is not None])
        return out

    def _write_entries(self, writes) -> None:
        """One RocksDB write batch of (key, stored bytes | None for a deletion): the write
        cache's flush."""
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        for rkey, raw in writes:
            if raw is None:
                batch.delete(rkey)
            else:
                batch.put(rkey, raw)
        self._db.write(batch)

    def flush_write_cache(self) -> dict[bytes, bytes | None]:
        """Write the write cache's dirty entries to RocksDB in one write batch (every
        snapshot does this first); returns them: RocksDB key -> stored bytes, None for a
        deletion."""
        if self._disposed:
            raise StateError(f"operator '{self.operator_uid}': flush after dispose")
        return self._cache.flush()

    def track_changes(self) -> None:
        """Remember from now on every RocksDB key whose entry changes (for a changelog):
        see `take_changes`."""
        self._cache.track_changes()

    def take_changes(self) -> dict[bytes, bytes | None]:
        """Flush the write cache, then return every RocksDB key whose entry changed since the
        previous call (or since `track_changes`) with its stored bytes now (None: deleted),
        and start over. Keys are `key group (2 bytes) state id (2 bytes) msgpack(key) [user
        key]` (see the module docstring); restores are not changes."""
        if self._disposed:
            raise StateError(f"operator '{self.operator_uid}': take_changes after dispose")
        return self._cache.take_changes()

    def _delete_prefix(self, prefix: bytes) -> None:
        """Delete every entry starting with `prefix` (a map state's entries of one key): one
        range tombstone instead of a tombstone per entry. A changelog (`track_changes`) needs
        each deleted key, so then each is deleted through the write cache instead."""
        rkeys = [rkey for rkey, _ in self._scan(prefix, 0)]   # _scan flushed: cached entries are clean
        upper = _successor(prefix)
        if upper is None or self._cache.tracking_changes:
            for rkey in rkeys:
                self._cache.delete(rkey)
            return
        self._cache.forget(rkeys)
        self._db.delete_range(prefix, upper)

    def _take_whole(self, sid: bytes, rkeys: list[bytes]) -> list[bytes | None] | None:
        """The stored bytes of `rkeys` (aligned with them) when they are every entry of state
        `sid` here, which are then dropped by a range tombstone per key group; None, with
        nothing changed, when the state holds other entries too (or a changelog needs each
        deletion)."""
        if self._cache.tracking_changes:
            return None
        self._cache.flush()
        found_keys: list = []
        found: list = []
        for kg_bytes in sorted(self._kg_prefixes.values()):   # key groups in key order
            prefix = kg_bytes + sid
            options = self._rocksdict.ReadOptions()
            options.set_iterate_upper_bound(_successor(prefix))
            for rkey, raw in self._db.items(from_key=prefix, read_opt=options):
                found_keys.append(rkey)
                found.append(raw)
        order = sorted(range(len(rkeys)), key=rkeys.__getitem__)
        if len(found_keys) != len(rkeys) or found_keys != [rkeys[i] for i in order]:
            return None
        out: list = [None] * len(rkeys)
        for i, raw in zip(order, found):
            out[i] = raw
        self._cache.forget(found_keys)
        for kg_bytes in self._kg_prefixes.values():
            prefix = kg_bytes + sid
            self._db.delete_range(prefix, _successor(prefix))
        return out

    def _scan(self, prefix: bytes, strip: int) -> Iterator[tuple[bytes, bytes]]:
        """(key without its first `strip` bytes, value) of every entry starting with `prefix`
        (after flushing the write cache, so the database has every entry)."""
        self._cache.flush()
        options = self._rocksdict.ReadOptions()
        upper = _successor(prefix)
        if upper is not None:
            options.set_iterate_upper_bound(upper)
        it = self._db.iter(options)
        it.seek(prefix)
        while it.valid():
            yield it.key()[strip:], it.value()
            it.next()

    # -- states ----------------------------------------------------------------------------

    def _new_sid(self) -> bytes:
        if self._next_sid >= _MAX_STATES:
            raise StateError(f"operator '{self.operator_uid}': more than {_MAX_STATES} keyed "
                             f"states")
        sid = self._next_sid.to_bytes(2, "big")
        self._next_sid += 1
        return sid

    def get_state(self, descriptor: StateDescriptor) -> RocksDBState:
        """The state for `descriptor`; the same name returns the same state object."""
        if not isinstance(descriptor, StateDescriptor) or descriptor.kind not in STATE_KINDS:
            raise ConfigurationError(
                f"unknown state kind: get_state expects a ValueStateDescriptor, "
                f"ListStateDescriptor, MapStateDescriptor or ReducingStateDescriptor, got "
                f"{type(descriptor).__name__}")
        if self._disposed:
            raise StateError(f"operator '{self.operator_uid}': get_state after dispose")
        name = descriptor.name
        meta = self._meta.get(name)
        if meta is not None and meta.state is not None:
            state = meta.state
            if state.kind != descriptor.kind:
                raise StateError(
                    f"state '{name}' of operator '{self.operator_uid}' is a {state.kind} state; "
                    f"it cannot also be used as a {descriptor.kind} state (use another name)")
            if state._serializer != descriptor.get_serializer():
                raise StateError(
                    f"state '{name}' of operator '{self.operator_uid}' is registered with "
                    f"serializer {state._serializer!r}, not {descriptor.get_serializer()!r}")
            check_same_ttl(name, self.operator_uid, state.descriptor, descriptor)
            return state
        tag = state_tag(descriptor.get_serializer().tag, descriptor.ttl)
        if meta is not None:       # restored, now asked for
            self._check_compatible(name, meta.kind, meta.tag, descriptor.kind, tag)
        else:
            meta = self._meta[name] = _StateMeta(name, descriptor.kind, tag, self._new_sid())
        if descriptor.ttl is None:
            classes = STATE_CLASSES
        else:
            from streamsnap.state.backends.rocksdb.ttl import TTL_STATE_CLASSES as classes
        meta.state = classes[descriptor.kind](self, descriptor, meta.sid)
        descriptor._mark_registered()
        return meta.state

    def _check_compatible(self, name: str, kind: str, tag: str, want_kind: str,
                          want_tag: str) -> None:
        if kind != want_kind:
            raise RestoreError(
                f"state '{name}' of operator '{self.operator_uid}' was checkpointed as a {kind} "
                f"state but is now requested as a {want_kind} state; keep the kind or rename "
                f"the state")
        if tag != want_tag:
            raise RestoreError(tag_mismatch(name, self.operator_uid, tag, want_tag))

    def state_names(self) -> list[str]:
        return sorted(self._meta)

    def _state_entries(self, meta: _StateMeta) -> Iterator[tuple[int, bytes, Any]]:
        """(key group, key bytes, raw value or [(user key bytes, raw value)]) of a state."""
        if self._disposed:
            return
        for kg, kg_bytes in self._kg_prefixes.items():
            prefix = kg_bytes + meta.sid
            if meta.kind != MAP:
                for key, raw in self._scan(prefix, 4):
                    yield kg, key, raw
                continue
            last, entries = None, []
            for rest, raw in self._scan(prefix, 4):
                end = _skip(rest, 0)
                key = rest[:end]
                if key != last:
                    if last is not None:
                        yield kg, last, entries
                    last, entries = key, []
                entries.append((rest[end:], raw))
            if last is not None:
                yield kg, last, entries

    def get_keys(self, state_name: str) -> list:
        """All keys that have an entry in `state_name` (any key group)."""
        meta = self._meta.get(state_name)
        if meta is None:
            return []
        return [_decode_key(key) for _, key, _ in self._state_entries(meta)]

    def num_keys(self) -> int:
        """Entries over all states (a key with two states counts twice)."""
        return sum(1 for meta in self._meta.values() for _ in self._state_entries(meta))

    def iter_entries(self, state_name: str) -> Iterator[tuple[int, Any, Any]]:
        """(key group, key, value) of every entry of a registered state."""
        meta = self._meta.get(state_name)
        if meta is None or meta.state is None:
            raise KeyError(state_name)
        state = meta.state
        for kg, key, raw in self._state_entries(meta):
            if meta.kind == MAP:
                value = {unpack_value(uk): state._decode(v) for uk, v in raw}
            elif meta.kind == LIST:
                value = state._decode_list(raw)
            else:
                value = state._decode(raw)
            yield kg, _decode_key(key), value

    # -- snapshots -------------------------------------------------------------------------

    def snapshot(self, checkpoint_id: int, location: str, *,
                 full: bool | None = None) -> StateSnapshot:
        """Synchronous part of a checkpoint.

        Incremental (`RocksDBConfig.incremental`, into a `chk-<n>` location of the checkpoint
        storage, which has the job's `shared/` directory beside it): a native RocksDB
        checkpoint, see `rocksdb.incremental`. Otherwise — savepoints, `full=True`, or
        incremental off — a full canonical snapshot: pin a consistent view (an iterator), no
        I/O. `full=None` decides by the location.
        """
        if self._disposed:
            raise StateError(f"operator '{self.operator_uid}': snapshot after dispose")
        self._cache.flush()
        if not full and self.changelog is not None:
            snapshot = self.changelog.snapshot(checkpoint_id, location)
            if snapshot is not None:
                return snapshot
        if not full and self.config.incremental:
            shared = rocksdb_incremental.shared_directory_of(location)
            if shared is not None:
                snapshot = rocksdb_incremental.take_snapshot(self, checkpoint_id, location, shared)
                if snapshot is not None:
                    return snapshot
        iterator = self._db.iter()
        iterator.seek_to_first()
        if not iterator.valid():
            return RocksDBKeyedStateSnapshot(self, None, checkpoint_id, location, None, {})
        states = {m.sid: (m.name, m.kind, m.tag) for m in self._meta.values()}
        now = self._ttl_now()
        cutoffs = {m.sid: now - m.state.descriptor.ttl.ttl_ms for m in self._meta.values()
                   if m.state is not None and m.state.descriptor.ttl is not None}
        token = self._register_snapshot()
        return RocksDBKeyedStateSnapshot(self, token, checkpoint_id, location, iterator, states,
                                         cutoffs)

    def _register_snapshot(self) -> int:
        """A token that keeps the working directory alive until the snapshot releases it."""
        with self._lock:
            token = self._next_token
            self._next_token += 1
            self._live_snapshots.add(token)
        return token

    def _release_snapshot(self, token: int) -> None:
        with self._lock:
            self._live_snapshots.discard(token)
            delete = self._disposed and not self._live_snapshots
        if delete:
            self._delete_directory()

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """The SST files uploaded for `checkpoint_id` become the ones the next incremental
        snapshot may reuse."""
        if self.last_completed_checkpoint_id is None or checkpoint_id > self.last_completed_checkpoint_id:
            self.last_completed_checkpoint_id = checkpoint_id
        self._uploads.notify_complete(checkpoint_id)
        if self.changelog is not None:       # first: it unpins what retention may delete
            self.changelog.notify_checkpoint_complete(checkpoint_id)
        if self.local_store is not None:
            self.local_store.checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        if self.changelog is not None:
            self.changelog.notify_checkpoint_aborted(checkpoint_id)

    # -- restore ---------------------------------------------------------------------------

    def restore(self, state: SubtaskRestoreState | Sequence[KeyGroupsStateHandle],
                base_location: str) -> None:
        """Load the key groups of this backend's range from `state` (canonical keyed state
        files, from either backend and any parallelism; paths relative to `base_location`)."""
        if self._disposed:
            raise StateError(f"operator '{self.operator_uid}': restore after dispose")
        # The restore writes the database directly: nothing cached may shadow what it writes.
        self._cache.flush()
        self._cache.clear()
        if isinstance(state, SubtaskRestoreState):
            if state.max_parallelism != self.max_parallelism:
                raise RestoreError(
                    f"operator '{self.operator_uid}': the restore assignment is for max "
                    f"parallelism {state.max_parallelism}, this backend has "
                    f"{self.max_parallelism}; the max parallelism of a job's state cannot change")
            handles: Sequence[Any] = state.keyed
            if state.is_restored:
                self.is_restored = True
        else:
            handles = state
            self.is_restored = True
        if self.changelog is not None:
            self.changelog.restore(handles, base_location)
            return
        incremental = [h for h in handles if isinstance(h, IncrementalKeyGroupsStateHandle)]
        if incremental:
            rocksdb_incremental.restore(self, incremental, base_location)
        for handle in handles:
            if handle is None or isinstance(handle, IncrementalKeyGroupsStateHandle):
                continue
            if not isinstance(handle, KeyGroupsStateHandle):
                raise RestoreError(f"operator '{self.operator_uid}': cannot restore keyed state "
                                   f"from a {type(handle).__name__}; expected KeyGroupsStateHandle")
            self._restore_handle(handle, base_location)

    def _is_empty(self) -> bool:
        """No state registered and no entry: a restore may replace the database."""
        if self._meta:
            return False
        it = self._db.iter()
        it.seek_to_first()
        return not it.valid()

    def _replace_database(self, path: str) -> None:
        """Close the (empty) database and open the one in `path` (moved into its place)."""
        target = os.path.join(self.directory, "db")
        self._db.close()
        shutil.rmtree(target, ignore_errors=True)
        os.rename(path, target)
        self._rocksdict, self._db, self.block_cache = _open_db(target, self.config)

    def _adopt_states(self, states: Sequence[Sequence], source: str) -> None:
        """Take over the state-id table of a restored database."""
        for sid, name, kind, tag in states:
            if kind not in STATE_KINDS:
                raise RestoreError(f"state '{name}' of operator '{self.operator_uid}' has "
                                   f"unknown kind {kind!r} in {source}")
            self._meta[name] = _StateMeta(name, kind, tag, int(sid).to_bytes(2, "big"))
        self._next_sid = max((int(s[0]) for s in states), default=-1) + 1

    def _state_id(self, name: str, kind: str, tag: str) -> bytes:
        """The state id of `name` in this database (registered now if new), after checking
        that restored state of that name is of the same kind and serializer."""
        if kind not in STATE_KINDS:
            raise RestoreError(f"state '{name}' of operator '{self.operator_uid}' has unknown "
                               f"kind {kind!r} in the checkpoint")
        meta = self._meta.get(name)
        if meta is None:
            meta = self._meta[name] = _StateMeta(name, kind, tag, self._new_sid())
        elif meta.state is not None:
            self._check_compatible(name, kind, tag, meta.state.kind, meta.tag)
        elif (meta.kind, meta.tag) != (kind, tag):
            raise RestoreError(
                f"state '{name}' of operator '{self.operator_uid}' appears in the checkpoint as "
                f"{meta.kind}/{meta.tag} and as {kind}/{tag}")
        return meta.sid

    def _restore_handle(self, handle: KeyGroupsStateHandle, base_location: str) -> None:
        for kg, states in read_key_group_blocks(handle, base_location, self.key_group_range,
                                                self.max_parallelism, self.operator_uid,
                                                self.local_store):
            batch = self._rocksdict.WriteBatch(raw_mode=True)
            for name, kind, tag, wire in states:
                self._merge(batch, kg, name, kind, tag, wire)
            if len(batch):
                self._db.write(batch)

    def _merge(self, batch: Any, kg: int, name: str, kind: str, tag: str, wire: dict) -> None:
        prefix = self._kg_prefixes[kg] + self._state_id(name, kind, tag)
        try:
            if is_ttl_tag(tag):
                wire = {key: _ttl_wire_to_stored(kind, value) for key, value in wire.items()}
                for key, stored in wire.items():
                    rkey = prefix + encode_key(key)
                    if kind == MAP:
                        for user_key, user_value in stored.items():
                            batch.put(rkey + encode_value(user_key), user_value)
                    else:
                        batch.put(rkey, stored)
                return
            for key, value in wire.items():
                rkey = prefix + encode_key(key)
                if kind == MAP:
                    for user_key, user_value in value.items():
                        batch.put(rkey + encode_value(user_key), encode_value(user_value))
                else:
                    batch.put(rkey, encode_value(value))
        except (TypeError, ValueError, OverflowError) as e:
            raise RestoreError(f"state '{name}' of operator '{self.operator_uid}': an entry of "
                               f"key group {kg} cannot be stored: {e}") from e

    # -- lifecycle -------------------------------------------------------------------------

    def dispose(self) -> None:
        """Close the database and delete its directory (once running snapshots finished;
        they keep their pinned view and can still complete)."""
        if self._disposed:
            return
        self._disposed = True
        if self.changelog is not None:
            self.changelog.dispose()
        self._meta.clear()
        self._cache.clear()          # the database is deleted: nothing to flush
        self._current_key = None
        self._current_key_group = None
        self._kg = None
        self._key = None
        try:
            self._db.close()
        except Exception:  # the directory is deleted next either way; say why it did not close
            log.warning("RocksDB backend of operator '%s': closing the database failed", self.operator_uid,
                        exc_info=True)
        with self._lock:
            delete = not self._live_snapshots
        if delete:
            self._delete_directory()

    def _delete_directory(self) -> None:
        with self._lock:
            if self._deleted:
                return
            self._deleted = True
        shutil.rmtree(self.directory, ignore_errors=True)

    def __del__(self):
        try:
            if not self._disposed:
                self.dispose()
        except Exception:
            pass


__all__ = ["RocksDBKeyedStateBackend", "remove_stale_directories"]
