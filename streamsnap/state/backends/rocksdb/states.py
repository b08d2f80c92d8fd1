"""The keyed state kinds (value, list, map, reducing) over the database and its write cache."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from copy import deepcopy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from streamsnap.state.backends.rocksdb.encoding import _array_count, _array_header, encode_key, encode_value
from streamsnap.state.backends.rocksdb.write_cache import ABSENT, UNDECODED
from streamsnap.state.descriptors import LIST, MAP, REDUCING, StateDescriptor, VALUE
from streamsnap.state.errors import StateSerializationError
from streamsnap.state.keyed_state import (PLAIN_TYPES, check_map_key, put_all_many_mappings, put_many_values,
                                         take_each)
from streamsnap.state.serialization import Serializer, key_error, unpack_value, value_error

if TYPE_CHECKING:
    from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend


# ---------------------------------------------------------------------------------------------
# state objects


class RocksDBState:
    """Common plumbing of the RocksDB keyed state kinds (same API as the heap states).

    Every read and write of an entry goes through the backend's write cache
    (`write_cache.WriteCache`): a cached entry is the truth for its key, the database is for
    the others; scans flush the cache first."""

    __slots__ = ("name", "descriptor", "kind", "_backend", "_sid", "_serializer", "_native",
                 "_dumps", "_loads", "_pack")

    def __init__(self, backend: "RocksDBKeyedStateBackend", descriptor: StateDescriptor,
                 sid: bytes):
        self.name = descriptor.name
        self.descriptor = descriptor
        self.kind = descriptor.kind
        self._backend = backend
        self._sid = sid
        self._serializer: Serializer = descriptor.get_serializer()
        self._native = self._serializer.native
        self._dumps = self._serializer.dumps
        self._loads = self._serializer.loads
        self._pack = backend._pack_value

    # -- encoding of one value/element (the wire element) ---------------------------------

    def _encode(self, value: Any) -> bytes:
        if self._native:
            try:
                return self._pack(value)
            except (TypeError, ValueError, OverflowError) as e:
                raise value_error(self.name, value, self._serializer) from e
        try:
            data = self._dumps(value)
        except Exception as e:
            raise StateSerializationError(
                f"state '{self.name}': {type(self._serializer).__name__} failed to serialize a "
                f"value of type '{type(value).__qualname__}': {type(e).__name__}: {e}") from e
        return msgpack.packb(data, use_bin_type=True)

    def _decode(self, raw: bytes) -> Any:
        value = unpack_value(raw)
        return value if self._native else self._loads(value)

    def _decode_list(self, raw: bytes) -> list:
        items = unpack_value(raw)
        return items if self._native else [self._loads(x) for x in items]

    def _rkey(self) -> bytes:
        """The RocksDB key of the current key's entry of this state."""
        backend = self._backend
        kg, key = backend._kg, backend._key
        if kg is None or key is None:
            kg, key = backend._current_prefix(self.name)
        return kg + self._sid + key

    def clear(self) -> None:
        """Remove the current key's entry."""
        self._backend._cache.delete(self._rkey())

    def _batch_keys(self, keys) -> list[bytes]:
        """The RocksDB keys of a batch's distinct keys' entries of this state (`BatchKeys`)."""
        backend = self._backend
        prefixes = backend._kg_prefixes
        sid = self._sid
        out = []
        append = out.append
        for key, kg in zip(keys.unique, keys.key_groups):
            try:
                prefix = prefixes[kg]
            except (KeyError, TypeError):
                backend.set_current_key(key, kg)
                raise backend._key_group_error(self.name) from None
            try:
                append(prefix + sid + encode_key(key))
            except (TypeError, ValueError, OverflowError) as e:
                raise key_error(self.name, key) from e
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class RocksDBValueState(RocksDBState):
    """One value per key. Values of the plain immutable types (`PLAIN_TYPES`) are held decoded
    in the write cache, so a cached read is a dict lookup."""

    __slots__ = ("_default", "_default_plain", "_plain_pack")

    def __init__(self, backend, descriptor, sid):
        super().__init__(backend, descriptor, sid)
        self._default = descriptor.default
        self._default_plain = self._default is None or type(self._default) in PLAIN_TYPES
        # `update` packs msgpack values itself (no `_encode` call) unless a subclass encodes
        # differently (TTL stamps).
        plain = self._native and type(self)._encode is RocksDBState._encode
        self._plain_pack = self._pack if plain else None

    def _default_value(self) -> Any:
        return self._default if self._default_plain else deepcopy(self._default)

    def value(self) -> Any:
        """The current key's value, or the descriptor's default when none is set."""
        backend = self._backend
        kg, key = backend._kg, backend._key
        if kg is None or key is None:
            kg, key = backend._current_prefix(self.name)
        rkey = kg + self._sid + key
        entry = backend._entries.get(rkey)
        if entry is None:
            raw = backend._db.get(rkey)
            if raw is None:
                backend._cache.load(rkey, None)
                return self._default_value()
            value = self._decode(raw)
            backend._cache.load(rkey, raw, value if value.__class__ in PLAIN_TYPES else UNDECODED)
            return value
        value = entry[0]
        if value is UNDECODED:
            return self._decode(entry[1])
        if value is ABSENT:
            return self._default_value()
        return value

    def update(self, value: Any) -> None:
        """Set the current key's value; None clears it."""
        if value is None:
            self.clear()
            return
        backend = self._backend
        kg, key = backend._kg, backend._key
        if kg is None or key is None:
            kg, key = backend._current_prefix(self.name)
        rkey = kg + self._sid + key
        pack = self._plain_pack
        if pack is None:
            raw = self._encode(value)
        else:
            try:
                raw = pack(value)
            except (TypeError, ValueError, OverflowError) as e:
                raise value_error(self.name, value, self._serializer) from e
        held = value if value.__class__ in PLAIN_TYPES else UNDECODED
        # Hot path: a cached entry of the same stored size is replaced in place (the cache's
        # size does not change, so no accounting and no bound check); else `put`.
        entries = backend._entries
        old = entries.get(rkey)
        if old is not None and old[1] is not None and len(old[1]) == len(raw):
            entries[rkey] = (held, raw)
            backend._cache.dirty.add(rkey)
        else:
            backend._cache.put(rkey, raw, held)

    # -- vectorized access: cache hits, one multi-get / one write batch for the rest ---------

    def get_many(self, keys, *, hot: bool = False) -> list:
        """Values of the batch's distinct keys (`BatchKeys.unique`), defaults where unset:
        cache hits, one multi-get for the misses; with `hot` the entries read are cached."""
        backend = self._backend
        backend._check_open(self.name)
        rkeys = self._batch_keys(keys)
        if not rkeys:
            return []
        decode = self._decode
        return [self._default_value() if raw is None else decode(raw)
                for raw in backend._read_many(rkeys, load=hot)]

    def take_all(self, keys) -> list:
        """`ValueState.take_all`: when `keys` are exactly what this state holds, one scan in
        key order reads them and a range tombstone per key group drops them (a 100 K-entry
        state: ~35 ms instead of a 120 ms multi-get and a tombstone per key); otherwise (or
        while a changelog needs each deletion) key by key. The write cache is flushed first,
        so a state whose keys are read `hot` (cached, dirty) is better taken key by key."""
        backend = self._backend
        backend._check_open(self.name)
        rkeys = self._batch_keys(keys)
        raws = backend._take_whole(self._sid, rkeys) if rkeys else None
        if raws is None:
            return take_each(self, keys)
        decode = self._decode
        return [self._default_value() if raw is None else decode(raw) for raw in raws]

    def put_many(self, keys, values) -> None:
        """Set the values of the batch's distinct keys (aligned with `keys.unique`); None
        clears a key. Cached keys are written in the cache (a hot key's entry), the others
        to the database in one write batch."""
        values = put_many_values(self.name, keys, values)
        backend = self._backend
        backend._check_open(self.name)
        rkeys = self._batch_keys(keys)
        encode = self._encode
        backend._cache.put_many(
            [(rkey, None if value is None else encode(value)) for rkey, value in zip(rkeys, values)])


class RocksDBListState(RocksDBState):
    """A list of elements per key, stored as one msgpack array."""

    __slots__ = ()

    def get(self) -> list:
        """The current key's elements ([] when there are none)."""
        raw = self._backend._read(self._rkey())
        return [] if raw is None else self._decode_list(raw)

    def _append(self, encoded: list[bytes]) -> None:
        backend = self._backend
        rkey = self._rkey()
        raw = backend._read(rkey)
        if raw is None:
            backend._cache.put(rkey, _array_header(len(encoded)) + b"".join(encoded))
            return
        n, header = _array_count(raw)
        backend._cache.put(rkey, _array_header(n + len(encoded)) + raw[header:] + b"".join(encoded))

    def add(self, value: Any) -> None:
        """Append one element."""
        self._append([self._encode(value)])

    def add_all(self, values: Iterable[Any]) -> None:
        """Append several elements (nothing happens for an empty iterable)."""
        encoded = [self._encode(v) for v in values]
        if encoded:
            self._append(encoded)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the elements; an empty iterable clears the state."""
        encoded = [self._encode(v) for v in values]
        if not encoded:
            self.clear()
            return
        self._backend._cache.put(self._rkey(), _array_header(len(encoded)) + b"".join(encoded))


class RocksDBMapState(RocksDBState):
    """A dict per key: one RocksDB entry per (key, user key)."""

    __slots__ = ()

    def _user_key(self, key: Any) -> bytes:
        try:
            return encode_value(key)
        except (TypeError, ValueError, OverflowError):
            check_map_key(self.name, key)
            raise

    def _scan(self) -> Iterator[tuple[bytes, bytes]]:
        prefix = self._rkey()
        return self._backend._scan(prefix, len(prefix))

    def get(self, key: Any, default: Any = None) -> Any:
        rkey = self._rkey()
        try:
            user_key = encode_value(key)
        except (TypeError, ValueError, OverflowError):
            return default
        raw = self._backend._read(rkey + user_key)
        return default if raw is None else self._decode(raw)

    def get_all(self, keys: Iterable[Any], default: Any = None) -> list:
        """The values of several user keys (`default` where absent): write-cache hits, then one
        multi-get for the rest, in key order."""
        rkey = self._rkey()
        rkeys, positions = [], []
        keys = list(keys)
        for i, key in enumerate(keys):
            try:
                rkeys.append(rkey + encode_value(key))
            except (TypeError, ValueError, OverflowError):
                continue        # a key a map cannot hold is absent, as in get()
            positions.append(i)
        out = [default] * len(keys)
        decode = self._decode
        for i, raw in zip(positions, self._backend._read_many(rkeys)):
            if raw is not None:
                out[i] = decode(raw)
        return out

    def get_all_many(self, keys, user_keys: list, default: Any = None) -> list[list]:
        """Per distinct key of a batch, the values of its list of user keys: write-cache hits,
        then one multi-get for the rest of all the keys' lookups."""
        backend = self._backend
        backend._check_open(self.name)
        rkeys, slots = [], []
        out = []
        for p, (prefix, wanted) in enumerate(zip(self._batch_keys(keys), user_keys)):
            wanted = list(wanted)
            out.append([default] * len(wanted))
            for j, key in enumerate(wanted):
                try:
                    rkeys.append(prefix + encode_value(key))
                except (TypeError, ValueError, OverflowError):
                    continue        # a key a map cannot hold is absent, as in get()
                slots.append((p, j))
        decode = self._decode
        for (p, j), raw in zip(slots, backend._read_many(rkeys) if rkeys else ()):
            if raw is not None:
                out[p][j] = decode(raw)
        return out

    def put_all_many(self, keys, mappings: list) -> None:
        """Per distinct key of a batch, its dict of entries put into its map: one RocksDB
        write batch (cached entries of these keys follow it), not the write cache — a batch's
        entries are mostly new ones (a distinct set's first sight of a value), which would only
        push the hot entries out of the cache."""
        mappings = put_all_many_mappings(self.name, keys, mappings)
        self._backend._check_open(self.name)
        self._backend._cache.write_through(self._encoded_entries(zip(self._batch_keys(keys), mappings)))

    def _encoded_entries(self, maps) -> list[tuple[bytes, bytes]]:
        """(RocksDB key, stored bytes) of (RocksDB key prefix of a key's map, its dict of
        entries) pairs, every map key checked and every value encoded before any is written."""
        encoded = []
        for prefix, mapping in maps:
            for k, v in mapping.items():
                check_map_key(self.name, k)
                encoded.append((prefix + self._user_key(k), self._encode(v)))
        return encoded

    def _put_entries(self, maps) -> None:
        """Put (RocksDB key prefix of a key's map, its dict of entries) pairs into the write
        cache (see `_encoded_entries`)."""
        put = self._backend._cache.put
        for k, v in self._encoded_entries(maps):
            put(k, v)

    def put(self, key: Any, value: Any) -> None:
        check_map_key(self.name, key)
        rkey = self._rkey()
        self._backend._cache.put(rkey + self._user_key(key), self._encode(value))

    def put_all(self, mapping: Mapping[Any, Any]) -> None:
        items = dict(mapping)
        if items:
            self._put_entries([(self._rkey(), items)])

    def remove(self, key: Any) -> None:
        rkey = self._rkey()
        try:
            user_key = encode_value(key)
        except (TypeError, ValueError, OverflowError):
            return
        self._backend._cache.delete(rkey + user_key)

    def contains(self, key: Any) -> bool:
        rkey = self._rkey()
        try:
            user_key = encode_value(key)
        except (TypeError, ValueError, OverflowError):
            return False
        return self._backend._read(rkey + user_key) is not None

    def keys(self) -> list:
        return [unpack_value(k) for k, _ in self._scan()]

    def values(self) -> list:
        return [self._decode(v) for _, v in self._scan()]

    def items(self) -> list[tuple[Any, Any]]:
        return [(unpack_value(k), self._decode(v)) for k, v in self._scan()]

    def is_empty(self) -> bool:
        return next(iter(self._scan()), None) is None

    def clear(self) -> None:
        self._backend._delete_prefix(self._rkey())


class RocksDBReducingState(RocksDBState):
    """One value per key, folded with every added value by the descriptor's reduce function."""

    __slots__ = ("_reduce",)

    def __init__(self, backend, descriptor, sid):
        super().__init__(backend, descriptor, sid)
        self._reduce = descriptor.reduce_function

    def get(self) -> Any:
        """The reduced value, or None when nothing was added."""
        raw = self._backend._read(self._rkey())
        return None if raw is None else self._decode(raw)

    def add(self, value: Any) -> None:
        backend = self._backend
        rkey = self._rkey()
        raw = backend._read(rkey)
        result = value if raw is None else self._reduce(self._decode(raw), value)
        if result is None:
            backend._cache.delete(rkey)
        else:
            backend._cache.put(rkey, self._encode(result))


STATE_CLASSES: dict[str, type[RocksDBState]] = {
    VALUE: RocksDBValueState, LIST: RocksDBListState, MAP: RocksDBMapState,
    REDUCING: RocksDBReducingState,
}


@dataclass
class _StateMeta:
    """A state name of this database: its id, kind and serializer tag, and its state object
    once the job registered it (None: restored, not asked for yet)."""

    name: str
    kind: str
    tag: str
    sid: bytes
    state: RocksDBState | None = None


__all__ = ["RocksDBState", "RocksDBValueState", "RocksDBListState", "RocksDBMapState",
           "RocksDBReducingState"]
