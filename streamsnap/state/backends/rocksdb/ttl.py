"""RocksDB keyed states with a time-to-live (see `streamsnap.state.ttl` for the semantics).

Separate classes, chosen at `get_state` when the descriptor has a `StateTtlConfig`, so the
plain states' hot path has no TTL check. Every stored entry (value, list element, map value)
is ``stamp(timestamp, element)`` (layout in `rocksdb`): `_encode` stamps with the time now,
so the inherited write paths (update, add, put, put_all, write batches) store TTL entries as
they are; reads check the timestamp, delete what expired, and with ON_READ_AND_WRITE write
the entry back with a new timestamp. Reads and writes go through the backend's write cache like
the plain states'; these states only ever read an entry's stored bytes (stamp included), never
a decoded value the cache may hold beside them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from streamsnap.state.backends.rocksdb.encoding import TTL_PREFIX_LEN, _array_header, encode_value, split_ttl_list, stamp, stamp_time
from streamsnap.state.backends.rocksdb.states import RocksDBListState, RocksDBMapState, RocksDBReducingState, RocksDBState, RocksDBValueState
from streamsnap.state.descriptors import LIST, MAP, REDUCING, VALUE
from streamsnap.state.keyed_state import get_all_per_key, put_all_per_key, take_each
from streamsnap.state.serialization import unpack_value

_MISSING: Any = object()


class _Ttl:
    """TTL plumbing shared by the RocksDB TTL states (no slots of its own)."""

    __slots__ = ()

    def _init_ttl(self) -> None:
        config = self.descriptor.ttl
        self._ttl_ms = config.ttl_ms
        self._on_read = config.update_on_read
        self._return_expired = config.return_expired

    def _encode(self, value: Any) -> bytes:
        return stamp(self._backend._ttl_now(), super()._encode(value))

    def _decode(self, raw: bytes) -> Any:
        return super()._decode(raw[TTL_PREFIX_LEN:])

    def _decode_list(self, raw: bytes) -> list:
        return [self._decode(e) for e in split_ttl_list(raw)]

    def _read_entry(self, rkey: bytes, raw: bytes | None) -> Any:
        """The value of the stored entry `raw` under `rkey` (_MISSING when absent or expired
        and not returned); deletes it when expired, re-stamps it when reads refresh."""
        if raw is None:
            return _MISSING
        now = self._backend._ttl_now()
        cache = self._backend._cache
        if stamp_time(raw) + self._ttl_ms <= now:
            cache.delete(rkey)
            return self._decode(raw) if self._return_expired else _MISSING
        if self._on_read:
            cache.put(rkey, stamp(now, raw[TTL_PREFIX_LEN:]))
        return self._decode(raw)


class RocksDBTtlValueState(_Ttl, RocksDBValueState):
    """A ValueState whose value expires `ttl` after its last write (or read)."""

    __slots__ = ("_ttl_ms", "_on_read", "_return_expired")

    def __init__(self, backend, descriptor, sid):
        super().__init__(backend, descriptor, sid)
        self._init_ttl()

    def value(self) -> Any:
        rkey = self._rkey()
        v = self._read_entry(rkey, self._backend._read(rkey))
        return self._default_value() if v is _MISSING else v

    def get_many(self, keys, *, hot: bool = False) -> list:
        """Values of the batch's distinct keys (cache hits, one multi-get for the misses; with
        `hot` the entries read are cached), expired entries deleted and refreshed ones
        re-stamped."""
        backend = self._backend
        backend._check_open(self.name)
        rkeys = self._batch_keys(keys)
        if not rkeys:
            return []
        out = []
        for rkey, raw in zip(rkeys, backend._read_many(rkeys, load=hot)):
            v = self._read_entry(rkey, raw)
            out.append(self._default_value() if v is _MISSING else v)
        return out


    def take_all(self, keys) -> list:
        """Key by key (`take_each`): a stored value carries its timestamp, checked as read."""
        return take_each(self, keys)


class RocksDBTtlReducingState(_Ttl, RocksDBReducingState):
    """A ReducingState whose value expires `ttl` after its last add (or read); an expired
    value is not folded into the next add."""

    __slots__ = ("_ttl_ms", "_on_read", "_return_expired")

    def __init__(self, backend, descriptor, sid):
        super().__init__(backend, descriptor, sid)
        self._init_ttl()

    def get(self) -> Any:
        rkey = self._rkey()
        v = self._read_entry(rkey, self._backend._read(rkey))
        return None if v is _MISSING else v

    def add(self, value: Any) -> None:
        backend = self._backend
        rkey = self._rkey()
        raw = backend._read(rkey)
        if raw is None or stamp_time(raw) + self._ttl_ms <= backend._ttl_now():
            result = value
        else:
            result = self._reduce(self._decode(raw), value)
        if result is None:
            backend._cache.delete(rkey)
        else:
            backend._cache.put(rkey, self._encode(result))


class RocksDBTtlListState(_Ttl, RocksDBListState):
    """A ListState whose elements expire one by one, `ttl` after each was added."""

    __slots__ = ("_ttl_ms", "_on_read", "_return_expired")

    def __init__(self, backend, descriptor, sid):
        super().__init__(backend, descriptor, sid)
        self._init_ttl()

    def get(self) -> list:
        backend = self._backend
        rkey = self._rkey()
        raw = backend._read(rkey)
        if raw is None:
            return []
        now = self._backend._ttl_now()
        cutoff = now - self._ttl_ms
        elements = split_ttl_list(raw)
        live = [e for e in elements if stamp_time(e) > cutoff]
        returned = elements if self._return_expired else live
        values = [self._decode(e) for e in returned]
        if self._on_read and live:
            live = [stamp(now, e[TTL_PREFIX_LEN:]) for e in live]
        elif len(live) == len(elements):
            return values
        if live:
            backend._cache.put(rkey, _array_header(len(live)) + b"".join(live))
        else:
            backend._cache.delete(rkey)
        return values


class RocksDBTtlMapState(_Ttl, RocksDBMapState):
    """A MapState whose user keys expire one by one, `ttl` after each was put."""

    __slots__ = ("_ttl_ms", "_on_read", "_return_expired")

    def __init__(self, backend, descriptor, sid):
        super().__init__(backend, descriptor, sid)
        self._init_ttl()

    def _lookup(self, key: Any) -> Any:
        try:
            user_key = encode_value(key)
        except (TypeError, ValueError, OverflowError):
            return _MISSING
        rkey = self._rkey() + user_key
        return self._read_entry(rkey, self._backend._read(rkey))

    def get(self, key: Any, default: Any = None) -> Any:
        v = self._lookup(key)
        return default if v is _MISSING else v

    def get_all(self, keys: Iterable[Any], default: Any = None) -> list:
        return [self.get(k, default) for k in keys]      # each one expires (or is re-stamped) alone

    def get_all_many(self, keys, user_keys: list, default: Any = None) -> list[list]:
        return get_all_per_key(self, keys, user_keys, default)     # key by key: each entry's TTL

    def put_all_many(self, keys, mappings: list) -> None:
        put_all_per_key(self, keys, mappings)

    def contains(self, key: Any) -> bool:
        return self._lookup(key) is not _MISSING

    def _live(self) -> list[tuple[bytes, Any]]:
        """(user key bytes, value) of the current key's entries, expired ones deleted (and
        returned with RETURN_EXPIRED_IF_NOT_CLEANED_UP), the rest re-stamped on read."""
        prefix = self._rkey()
        out = []
        for user_key, raw in list(self._scan()):
            v = self._read_entry(prefix + user_key, raw)
            if v is not _MISSING:
                out.append((user_key, v))
        return out

    def keys(self) -> list:
        return [unpack_value(k) for k, _ in self._live()]

    def values(self) -> list:
        return [v for _, v in self._live()]

    def items(self) -> list[tuple[Any, Any]]:
        return [(unpack_value(k), v) for k, v in self._live()]

    def is_empty(self) -> bool:
        return not self._live()


TTL_STATE_CLASSES: dict[str, type[RocksDBState]] = {
    VALUE: RocksDBTtlValueState, LIST: RocksDBTtlListState, MAP: RocksDBTtlMapState,
    REDUCING: RocksDBTtlReducingState,
}

__all__ = ["RocksDBTtlListState", "RocksDBTtlMapState", "RocksDBTtlReducingState",
           "RocksDBTtlValueState", "TTL_STATE_CLASSES"]
