"""Keyed state objects (Value, List, Map, Reducing) over copy-on-write per-key-group tables.

Each state reads and writes the entry of the backend's *current key*: the task sets the key
once per record, and the state objects a user function obtained in `open` stay valid for every
record. Storage is a `StateTable`: per key group one dict ``key -> stored value``.

Why copy-on-write: a checkpoint's synchronous part must be quick and must not serialize,
while the asynchronous part serializes on another thread as the mailbox thread keeps changing
state. So a snapshot only captures references, and writers preserve whatever a snapshot may
still be reading, at two levels:

* a key group a running snapshot captured is *frozen* (its value column copied, keys only
  where the last encoding cannot stand in) before its first write, or by the snapshot's
  thread, whichever comes first; the dict itself is never copied
  (`streamsnap.state.copy_on_write`, `StateTable.own`);
* mutable stored values carry the epoch they were created in (the backend's epoch increases
  at each snapshot; ``backend._required_epoch`` is the epoch of the newest snapshot still
  running, -1 when none is), too (`_ListEntry`, `_MapEntry`, `_Cell` for a
  Value/Reducing state holding a container): an in-place `add`/`put` — or handing a mutable
  value to user code, which may mutate it — first copies the value if a snapshot may hold it.

Plain immutable values (int, float, str, bytes, bool) are stored bare, so the common
`value()` / `update()` path is a dict lookup and a dict store. Elements inside List/Map
states are shared with running snapshots: replace them with `add`/`put`, never mutate them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from copy import deepcopy
from typing import TYPE_CHECKING, Any

from streamsnap.state.copy_on_write import FrozenGroup, GroupCapture, freeze
from streamsnap.state.descriptors import (LIST, MAP, REDUCING, VALUE, ListStateDescriptor,
                                          MapStateDescriptor, ReducingStateDescriptor,
                                          StateDescriptor, ValueStateDescriptor)
from streamsnap.state.key_groups import KeyGroupRange
from streamsnap.state.errors import StateSerializationError
from streamsnap.state.serialization import (Serializer, describe, find_unencodable,
                                            value_default)
from streamsnap.state.ttl import state_tag

if TYPE_CHECKING:
    from streamsnap.state.backends.hashmap import HashMapKeyedStateBackend

# Types stored without a wrapper: immutable, so sharing them with a snapshot is harmless.
PLAIN_TYPES = frozenset({int, float, str, bytes, bool})

_MISSING: Any = object()


class _Cell:
    """A mutable Value/Reducing state value with the epoch it was stored in."""

    __slots__ = ("epoch", "value")

    def __init__(self, epoch: int, value: Any):
        self.epoch = epoch
        self.value = value


class _Stamped:
    """An entry of a TTL state (`keyed_state_ttl`): a value, a List element or a Map value with
    the processing time (epoch ms) of its last write. Never changed in place — replaced — so
    snapshots may share it; `epoch` serves Value/Reducing values that are mutable (as `_Cell`)."""

    __slots__ = ("epoch", "ts", "value")

    def __init__(self, epoch: int, ts: int, value: Any):
        self.epoch = epoch
        self.ts = ts
        self.value = value


class _ListEntry:
    """The elements of one key's list state, with the epoch the list object was created in."""

    __slots__ = ("epoch", "items")

    def __init__(self, epoch: int, items: list):
        self.epoch = epoch
        self.items = items


class _MapEntry:
    """The dict of one key's map state, with the epoch the dict object was created in."""

    __slots__ = ("epoch", "data")

    def __init__(self, epoch: int, data: dict):
        self.epoch = epoch
        self.data = data


class StateTable:
    """Storage of one named keyed state: key group -> {key: stored value}, and the key groups
    that running snapshots captured but nobody froze yet (`streamsnap.state.copy_on_write`)."""

    __slots__ = ("name", "kind", "descriptor", "serializer", "tag", "maps", "pending", "backend",
                 "removals", "key_cache")

    def __init__(self, backend: "HashMapKeyedStateBackend", descriptor: StateDescriptor,
                 key_groups: KeyGroupRange):
        self.backend = backend
        self.descriptor = descriptor
        self.name = descriptor.name
        self.kind = descriptor.kind
        self.serializer: Serializer = descriptor.get_serializer()
        # The serializer tag, marked "+ttl" when entries are `_Stamped` (see state.ttl).
        self.tag = state_tag(self.serializer.tag, descriptor.ttl)
        self.maps: dict[int, dict] = {kg: {} for kg in key_groups}
        # Key group -> capture of running snapshots, until frozen. A write to a key group
        # listed here freezes it first (`freeze_pending`).
        self.pending: dict[int, GroupCapture] = {}
        # Keys removed per key group, ever: while it stays put, a key group's dict only gained
        # keys at its end (an update keeps a key's place), which lets a snapshot reuse the keys
        # the previous one encoded (`key_cache`, owned by the heap backend's snapshots).
        self.removals: dict[int, int] = dict.fromkeys(key_groups, 0)
        self.key_cache: dict[int, Any] = {}

    def remove(self, key_group: int, key: Any) -> None:
        """Drop `key` from `key_group`, counted in `removals`. Every removal of a key from a
        key group's dict must come through here."""
        m = self.own(key_group)
        if m.pop(key, _MISSING) is not _MISSING:
            self.removals[key_group] += 1

    def own(self, key_group: int) -> dict:
        """The dict of `key_group`, ready to be written: frozen first for the snapshots that
        captured it (KeyError: not a key group of this table)."""
        if key_group in self.pending:
            self.freeze_pending(key_group)
        return self.maps[key_group]

    def freeze_pending(self, key_group: int) -> None:
        """Freeze the pending capture of `key_group`, if there still is one (any thread)."""
        with self.backend._freeze_lock:
            capture = self.pending.get(key_group)
            if capture is not None:
                self._freeze(key_group, capture)

    def frozen(self, key_group: int, capture: GroupCapture) -> FrozenGroup:
        """`capture` frozen, now if nobody did yet (the snapshot's thread)."""
        frozen = capture.frozen
        if frozen is None:
            with self.backend._freeze_lock:
                frozen = capture.frozen or self._freeze(key_group, capture)
        return frozen

    def _freeze(self, key_group: int, capture: GroupCapture) -> FrozenGroup:
        # Under the lock. The capture leaves `pending` only once frozen: a writer that does not
        # find it there may write at once.
        cache = self.key_cache if self.descriptor.ttl is None else None
        frozen = capture.frozen = freeze(capture.entries, cache, key_group,
                                         self.removals[key_group])
        if self.pending.get(key_group) is capture:
            del self.pending[key_group]
        return frozen

    def capture(self) -> list[tuple[int, GroupCapture]]:
        """The synchronous part of a snapshot: a capture of each non-empty key group, joined
        with a pending one where there is one (nothing was written there since)."""
        captured = []
        pending = self.pending
        with self.backend._freeze_lock:
            for kg, m in self.maps.items():
                if m:
                    capture = pending.get(kg)
                    if capture is None:
                        capture = pending[kg] = GroupCapture(m)
                    capture.holders += 1
                    captured.append((kg, capture))
        return captured

    def release(self, captured: list[tuple[int, GroupCapture]]) -> None:
        """A snapshot no longer needs `captured`: captures nobody else holds and nobody froze
        leave `pending`, so writes there stop freezing."""
        pending = self.pending
        with self.backend._freeze_lock:
            for kg, capture in captured:
                capture.holders -= 1
                if capture.holders <= 0 and pending.get(kg) is capture:
                    del pending[kg]

    def num_entries(self) -> int:
        return sum(len(m) for m in self.maps.values())


def put_many_values(state_name: str, keys, values) -> list:
    """`values` of a put_many as a list (numpy numbers as Python numbers), one per distinct key."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    if len(values) != len(keys.unique):
        raise ValueError(f"state '{state_name}': put_many got {len(values)} values for "
                         f"{len(keys.unique)} keys")
    return values


def take_each(state, keys) -> list:
    """`ValueState.take_all` key by key: the values read in bulk, then each key cleared."""
    values = state.get_many(keys)
    state.put_many(keys, [None] * len(values))
    return values


def check_map_key(state_name: str, key: Any) -> None:
    """Map keys are always msgpack (whatever the value serializer): reject others at once."""
    if key.__class__ not in PLAIN_TYPES and key is not None:
        culprit = find_unencodable(key, keys=True)
        if culprit is not None:
            raise StateSerializationError(
                f"state '{state_name}': cannot use {describe(culprit, 'map key')}; map keys must "
                f"be None, bool, int (64-bit), float, str, bytes or tuples of those")


def get_all_per_key(state, keys, user_keys: list, default: Any = None) -> list[list]:
    """`MapState.get_all` of several keys in one call: per distinct key of `keys` (a
    BatchKeys: `unique`, `key_groups`) the values of its list in `user_keys`. Key by key here
    (each state's own get_all, TTL included); RocksDB reads them all in one multi-get. The
    current key is left as it was."""
    backend = state._backend
    current, group = backend.current_key, backend.current_key_group
    try:
        out = []
        for key, kg, wanted in zip(keys.unique, keys.key_groups, user_keys):
            backend.set_current_key(key, kg)
            out.append(state.get_all(wanted, default))
        return out
    finally:
        backend.set_current_key(current, group)


def put_all_many_mappings(state_name: str, keys, mappings) -> list:
    """`mappings` of a put_all_many as a list, one dict per distinct key of `keys`."""
    mappings = list(mappings)
    if len(mappings) != len(keys.unique):
        raise ValueError(f"state '{state_name}': put_all_many got {len(mappings)} mappings for "
                         f"{len(keys.unique)} keys")
    return mappings


def put_all_per_key(state, keys, mappings: list) -> None:
    """`MapState.put_all` of several keys in one call: the dict `mappings[i]` into the map of
    the i-th distinct key of `keys`; the current key is left as it was."""
    mappings = put_all_many_mappings(state.name, keys, mappings)
    backend = state._backend
    current, group = backend.current_key, backend.current_key_group
    try:
        for key, kg, mapping in zip(keys.unique, keys.key_groups, mappings):
            backend.set_current_key(key, kg)
            state.put_all(mapping)
    finally:
        backend.set_current_key(current, group)


class KeyedState:
    """Common plumbing of the keyed state kinds."""

    __slots__ = ("name", "_backend", "_table", "_maps", "_pending", "_serializer", "_checks")

    def __init__(self, backend: "HashMapKeyedStateBackend", table: StateTable):
        self.name = table.name
        self._backend = backend
        self._table = table
        self._maps = table.maps
        self._pending = table.pending
        self._serializer = table.serializer
        # Whether writes of containers are checked for encodability (fail at the write, not
        # at the next checkpoint); serializers without a check skip the call.
        self._checks = type(table.serializer).check is not Serializer.check

    @property
    def descriptor(self) -> StateDescriptor:
        """The descriptor the state was declared with (name, kind, serializer, TTL)."""
        return self._table.descriptor

    def _read_map(self) -> dict:
        try:
            return self._maps[self._backend._current_key_group]
        except KeyError:
            raise self._backend._key_group_error(self.name) from None

    def _write_map(self) -> dict:
        backend = self._backend
        kg = backend._current_key_group
        if kg in self._pending:
            self._table.freeze_pending(kg)
        try:
            return self._maps[kg]
        except KeyError:
            raise backend._key_group_error(self.name) from None

    def _check(self, value: Any) -> None:
        if self._checks and value.__class__ not in PLAIN_TYPES:
            self._serializer.check(value, self.name)

    def _live_cell_value(self, cell: _Cell) -> Any:
        """The value of `cell`, first given a private copy if a running snapshot may hold it."""
        backend = self._backend
        if cell.epoch > backend._required_epoch:
            return cell.value
        fresh = _Cell(backend._epoch, deepcopy(cell.value))
        self._table.own(backend._current_key_group)[backend._current_key] = fresh
        return fresh.value

    def clear(self) -> None:
        """Remove the current key's entry."""
        key = self._backend._current_key
        if key in self._read_map():
            self._table.remove(self._backend._current_key_group, key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class ValueState(KeyedState):
    """One value per key."""

    __slots__ = ("_default", "_default_plain")

    def __init__(self, backend: "HashMapKeyedStateBackend", table: StateTable):
        super().__init__(backend, table)
        descriptor: ValueStateDescriptor = table.descriptor  # type: ignore[assignment]
        self._default = descriptor.default
        self._default_plain = self._default is None or type(self._default) in PLAIN_TYPES

    def value(self) -> Any:
        """The current key's value, or the descriptor's default when none is set."""
        backend = self._backend
        try:
            v = self._maps[backend._current_key_group].get(backend._current_key, _MISSING)
        except KeyError:
            raise backend._key_group_error(self.name) from None
        if v.__class__ is _Cell:
            return self._live_cell_value(v)
        if v is _MISSING:
            return self._default if self._default_plain else deepcopy(self._default)
        return v

    def update(self, value: Any) -> None:
        """Set the current key's value; None clears it."""
        backend = self._backend
        kg = backend._current_key_group
        if kg in self._pending:
            self._table.freeze_pending(kg)
        try:
            m = self._maps[kg]
        except KeyError:
            raise backend._key_group_error(self.name) from None
        if value.__class__ in PLAIN_TYPES:
            m[backend._current_key] = value
        elif value is None:
            self._table.remove(kg, backend._current_key)
        else:
            self._check(value)
            m[backend._current_key] = _Cell(backend._epoch, value)

    # -- vectorized access (KeyedBatchFunction): one call per batch, one entry per distinct key

    def get_many(self, keys, *, hot: bool = False) -> list:
        """Values of the batch's distinct keys (`BatchKeys.unique`), defaults where unset.
        `hot`: these keys recur batch after batch (a session's key, a user's running total):
        a backend with a cache in front of its store (RocksDB's write cache) keeps what it
        reads, so the write that follows and the next batch's read stay in memory. Here
        everything is in memory anyway."""
        backend = self._backend
        maps = self._maps
        default, plain = self._default, self._default_plain
        out = []
        append = out.append
        for key, kg in zip(keys.unique, keys.key_groups):
            try:
                v = maps[kg].get(key, _MISSING)
            except KeyError:
                backend._current_key_group = kg
                raise backend._key_group_error(self.name) from None
            if v is _MISSING:
                v = default if plain else deepcopy(default)
            elif v.__class__ is _Cell:
                backend.set_current_key(key, kg)
                v = self._live_cell_value(v)
            append(v)
        return out

    def take_all(self, keys) -> list:
        """`get_many(keys)`, then every one of `keys` cleared: for an operator that drops its
        whole state at once, `keys` being every key it holds (the final firing of all windows
        at the end of the input). RocksDB reads and drops such a state whole (by range);
        here it is `take_each`."""
        return take_each(self, keys)

    def put_many(self, keys, values) -> None:
        """Set the values of the batch's distinct keys; None clears a key.

        `values` is aligned with `keys.unique` (a list or a numpy array; numpy numbers are
        stored as Python numbers).
        """
        values = put_many_values(self.name, keys, values)
        backend = self._backend
        table, maps, pending = self._table, self._maps, self._pending
        epoch = backend._epoch
        for key, kg, value in zip(keys.unique, keys.key_groups, values):
            if kg in pending:
                table.freeze_pending(kg)
            try:
                m = maps[kg]
            except KeyError:
                backend._current_key_group = kg
                raise backend._key_group_error(self.name) from None
            if value.__class__ in PLAIN_TYPES:
                m[key] = value
            elif value is None:
                table.remove(kg, key)
            else:
                self._check(value)
                m[key] = _Cell(epoch, value)


class ListState(KeyedState):
    """A list of elements per key."""

    __slots__ = ()

    def get(self) -> list:
        """A copy of the current key's elements ([] when there are none)."""
        entry = self._read_map().get(self._backend._current_key)
        return [] if entry is None else list(entry.items)

    def add(self, value: Any) -> None:
        """Append one element."""
        self._check(value)
        backend = self._backend
        m = self._write_map()
        key = backend._current_key
        entry = m.get(key)
        if entry is None:
            m[key] = _ListEntry(backend._epoch, [value])
        elif entry.epoch <= backend._required_epoch:
            m[key] = _ListEntry(backend._epoch, entry.items + [value])
        else:
            entry.items.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        """Append several elements (nothing happens for an empty iterable)."""
        items = list(values)
        if not items:
            return
        for v in items:
            self._check(v)
        self._extend(items)

    def _extend(self, items: list) -> None:
        """Append checked `items` to the current key's list, copying it if a snapshot holds it."""
        backend = self._backend
        m = self._write_map()
        key = backend._current_key
        entry = m.get(key)
        if entry is None:
            m[key] = _ListEntry(backend._epoch, items)
        elif entry.epoch <= backend._required_epoch:
            m[key] = _ListEntry(backend._epoch, entry.items + items)
        else:
            entry.items.extend(items)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the elements; an empty iterable clears the state."""
        items = list(values)
        if not items:
            self.clear()
            return
        for v in items:
            self._check(v)
        self._write_map()[self._backend._current_key] = _ListEntry(self._backend._epoch, items)


class MapState(KeyedState):
    """A dict per key."""

    __slots__ = ()

    def _entry(self) -> _MapEntry | None:
        return self._read_map().get(self._backend._current_key)

    def _writable_data(self) -> dict:
        """The current key's dict, created or copied so it can be changed in place."""
        backend = self._backend
        m = self._write_map()
        key = backend._current_key
        entry = m.get(key)
        if entry is None:
            entry = m[key] = _MapEntry(backend._epoch, {})
        elif entry.epoch <= backend._required_epoch:
            entry = m[key] = _MapEntry(backend._epoch, entry.data.copy())
        return entry.data

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of `key` in the current key's map, or `default`."""
        entry = self._entry()
        return default if entry is None else entry.data.get(key, default)

    def get_all(self, keys: Iterable[Any], default: Any = None) -> list:
        """The values of several `keys` in the current key's map (`default` where absent), in
        their order: one call for a batch's lookups (RocksDB: cache hits, then one multi-get)."""
        entry = self._entry()
        if entry is None:
            return [default for _ in keys]
        get = entry.data.get
        return [get(k, default) for k in keys]

    def get_all_many(self, keys, user_keys: list, default: Any = None) -> list[list]:
        """Per distinct key of a batch (`BatchKeys`), the values of its own list of user keys:
        a vectorized function's lookups in many keys' maps in one call (RocksDB: one multi-get)."""
        maps = self._maps
        out = []
        for key, kg, wanted in zip(keys.unique, keys.key_groups, user_keys):
            try:
                entry = maps[kg].get(key)
            except KeyError:
                self._backend._current_key_group = kg
                raise self._backend._key_group_error(self.name) from None
            if entry is None:
                out.append([default for _ in wanted])
            else:
                get = entry.data.get
                out.append([get(k, default) for k in wanted])
        return out

    def put_all_many(self, keys, mappings: list) -> None:
        """Per distinct key of a batch (`BatchKeys`), its dict of entries put into its map."""
        put_all_per_key(self, keys, mappings)

    def put(self, key: Any, value: Any) -> None:
        """Set `key` to `value` in the current key's map."""
        check_map_key(self.name, key)
        self._check(value)
        self._writable_data()[key] = value

    def put_all(self, mapping: Mapping[Any, Any]) -> None:
        """Set every key of `mapping` in the current key's map."""
        items = dict(mapping)
        if not items:
            return
        for k, v in items.items():
            check_map_key(self.name, k)
            self._check(v)
        self._writable_data().update(items)

    def remove(self, key: Any) -> None:
        """Remove `key` from the current key's map (nothing happens when it is absent)."""
        entry = self._entry()
        if entry is None or key not in entry.data:
            return
        data = self._writable_data()
        del data[key]
        if not data:
            self.clear()

    def contains(self, key: Any) -> bool:
        """Whether the current key's map holds `key`."""
        entry = self._entry()
        return entry is not None and key in entry.data

    def keys(self) -> list:
        """The keys of the current key's map (a list)."""
        entry = self._entry()
        return [] if entry is None else list(entry.data.keys())

    def values(self) -> list:
        """The values of the current key's map (a list)."""
        entry = self._entry()
        return [] if entry is None else list(entry.data.values())

    def items(self) -> list[tuple[Any, Any]]:
        """The (key, value) pairs of the current key's map (a list)."""
        entry = self._entry()
        return [] if entry is None else list(entry.data.items())

    def is_empty(self) -> bool:
        """Whether the current key's map is empty."""
        return self._entry() is None


class ReducingState(KeyedState):
    """One value per key, folded with every added value by the descriptor's reduce function."""

    __slots__ = ("_reduce",)

    def __init__(self, backend: "HashMapKeyedStateBackend", table: StateTable):
        super().__init__(backend, table)
        descriptor: ReducingStateDescriptor = table.descriptor  # type: ignore[assignment]
        self._reduce = descriptor.reduce_function

    def get(self) -> Any:
        """The reduced value, or None when nothing was added."""
        v = self._read_map().get(self._backend._current_key, _MISSING)
        if v.__class__ is _Cell:
            return self._live_cell_value(v)
        return None if v is _MISSING else v

    def add(self, value: Any) -> None:
        """Fold `value` into the current key's value with the descriptor's reduce function."""
        current = self.get() if self._backend._current_key in self._read_map() else _MISSING
        result = value if current is _MISSING else self._reduce(current, value)
        backend = self._backend
        m = self._write_map()
        if result.__class__ in PLAIN_TYPES:
            m[backend._current_key] = result
        elif result is None:
            self._table.remove(backend._current_key_group, backend._current_key)
        else:
            self._check(result)
            m[backend._current_key] = _Cell(backend._epoch, result)


STATE_CLASSES: dict[str, type[KeyedState]] = {
    VALUE: ValueState, LIST: ListState, MAP: MapState, REDUCING: ReducingState,
}
DESCRIPTOR_CLASSES: dict[str, type[StateDescriptor]] = {
    VALUE: ValueStateDescriptor, LIST: ListStateDescriptor, MAP: MapStateDescriptor,
    REDUCING: ReducingStateDescriptor,
}


# ---------------------------------------------------------------------------------------------
# stored values <-> wire form (what goes into the checkpoint file, before msgpack)
#
# Wire form of one key's state: Value/Reducing -> the value; List -> list of elements; Map ->
# dict. With a non-native serializer each value/element/map value is replaced by its bytes.
# Backends pack keys and wire values as two parallel msgpack arrays (see backends.hashmap).


def native_default(obj: Any) -> Any:
    """msgpack `default` hook: unwraps stored entries, so tables pack without a Python loop."""
    cls = obj.__class__
    if cls is _Cell:
        # msgpack applies `default` once per object: convert the value here if it needs it.
        value = obj.value
        return value if value.__class__ in _MSGPACK_EXACT else value_default(value)
    if cls is _ListEntry:
        return obj.items
    if cls is _MapEntry:
        return obj.data
    if cls is _Stamped:
        return [obj.ts, obj.value]     # the canonical TTL wire element
    return value_default(obj)


_MSGPACK_EXACT = frozenset({type(None), bool, int, float, str, bytes, bytearray, list, dict})


def unwrap(stored: Any) -> Any:
    """The user-visible value of a stored entry (for diagnostics and iteration)."""
    cls = stored.__class__
    if cls is _Cell:
        return stored.value
    if cls is _Stamped:
        return stored.value
    if cls is _ListEntry:
        return [x.value if x.__class__ is _Stamped else x for x in stored.items]
    if cls is _MapEntry:
        return {k: v.value if v.__class__ is _Stamped else v for k, v in stored.data.items()}
    return stored


def entries_to_wire(kind: str, stored: Iterable, serializer: Serializer) -> list:
    """Wire values of `stored` values (in order) with a non-native serializer: values become
    bytes."""
    plain_dumps = serializer.dumps

    def dumps(v: Any) -> Any:
        if v.__class__ is _Stamped:
            return [v.ts, plain_dumps(v.value)]
        return plain_dumps(v.value if v.__class__ is _Cell else v)

    if kind == LIST:
        return [[dumps(x) for x in e.items] for e in stored]
    if kind == MAP:
        return [{uk: dumps(uv) for uk, uv in e.data.items()} for e in stored]
    return [dumps(v) for v in stored]


def entries_from_wire(kind: str, wire: dict, serializer: Serializer, epoch: int,
                      ttl: bool = False) -> dict:
    """Stored entries from their decoded wire form (keys are already frozen).

    Entries are stamped with `epoch`; the result may be `wire` itself, and lists/dicts inside
    it are reused, so pass an epoch that forces copy-on-write (-1) if a snapshot may hold them.
    `ttl`: the wire elements are ``[timestamp, element]`` (a "+ttl" tag) and become `_Stamped`.
    """
    if ttl:
        loads = None if serializer.native else serializer.loads

        def stamped(pair: Any) -> _Stamped:
            ts, v = pair
            return _Stamped(epoch, int(ts), v if loads is None else loads(v))

        if kind == LIST:
            return {k: _ListEntry(epoch, [stamped(x) for x in items]) for k, items in wire.items()}
        if kind == MAP:
            return {k: _MapEntry(epoch, {uk: stamped(p) for uk, p in data.items()})
                    for k, data in wire.items()}
        return {k: stamped(p) for k, p in wire.items()}
    if serializer.native:
        if kind == LIST:
            return {k: _ListEntry(epoch, items) for k, items in wire.items()}
        if kind == MAP:
            return {k: _MapEntry(epoch, data) for k, data in wire.items()}
        if PLAIN_TYPES.issuperset(map(type, wire.values())):   # a C loop: no per-entry bytecode
            return wire
        return {k: (v if v.__class__ in PLAIN_TYPES else _Cell(epoch, v)) for k, v in wire.items()}
    loads = serializer.loads
    if kind == LIST:
        return {k: _ListEntry(epoch, [loads(x) for x in items]) for k, items in wire.items()}
    if kind == MAP:
        return {k: _MapEntry(epoch, {uk: loads(b) for uk, b in data.items()})
                for k, data in wire.items()}
    out = {}
    for k, b in wire.items():
        v = loads(b)
        out[k] = v if v.__class__ in PLAIN_TYPES else _Cell(epoch, v)
    return out
