"""Heap keyed states with a time-to-live (see `streamsnap.state.ttl` for the semantics).

Separate classes, chosen by the backend at `get_state` when the descriptor has a
`StateTtlConfig`, so the plain states' hot path has no TTL check. Entries are `_Stamped`
(value + timestamp of the last write): the whole value for Value/Reducing, each element of a
List, each value of a Map. A `_Stamped` is never changed in place; refreshing a timestamp or
dropping expired elements stores a new object, so the copy-on-write rules of `keyed_state`
hold unchanged. Expired entries found by an access are removed at once; `drop_expired` leaves
the others out of snapshots.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from copy import deepcopy
from typing import TYPE_CHECKING, Any

from streamsnap.state.descriptors import LIST, MAP, REDUCING, VALUE
from streamsnap.state.keyed_state import (_MISSING, PLAIN_TYPES, KeyedState, ListState,
                                          MapState, ReducingState, StateTable, ValueState,
                                          _ListEntry, _MapEntry, _Stamped, check_map_key,
                                          get_all_per_key, put_many_values)

if TYPE_CHECKING:
    from streamsnap.state.backends.hashmap import HashMapKeyedStateBackend


class _Ttl:
    """TTL plumbing shared by the heap TTL states (no slots of its own: see the subclasses)."""

    __slots__ = ()

    def _init_ttl(self, table: StateTable) -> None:
        config = table.descriptor.ttl
        self._ttl_ms = config.ttl_ms
        self._on_read = config.update_on_read
        self._return_expired = config.return_expired

    def _stamp(self, value: Any, now: int) -> _Stamped:
        return _Stamped(self._backend._epoch, now, value)

    def _fresh(self, entry: _Stamped) -> _Stamped:
        """`entry`, or a copy owning its value when a snapshot may hold a mutable one that the
        caller is about to hand out."""
        if entry.value.__class__ in PLAIN_TYPES or entry.epoch > self._backend._required_epoch:
            return entry
        return _Stamped(self._backend._epoch, entry.ts, deepcopy(entry.value))

    def _read_single(self, default: Any) -> Any:
        """Value/Reducing read of the current key: expiry, cleanup and refresh-on-read."""
        backend = self._backend
        key = backend._current_key
        entry = self._read_map().get(key)
        if entry is None:
            return default
        now = backend._ttl_now()
        if entry.ts + self._ttl_ms <= now:
            self.clear()
            return entry.value if self._return_expired else default
        fresh = self._fresh(entry)
        if self._on_read:
            fresh = _Stamped(backend._epoch, now, fresh.value)
        if fresh is not entry:
            self._write_map()[key] = fresh
        return fresh.value

    def _live_items(self, items: list, now: int) -> tuple[list, list]:
        """(unexpired, expired) of a list of `_Stamped`."""
        cutoff = now - self._ttl_ms
        live = [x for x in items if x.ts > cutoff]
        if len(live) == len(items):
            return items, []
        return live, [x for x in items if x.ts <= cutoff]


class TtlValueState(_Ttl, ValueState):
    """A ValueState whose value expires `ttl` after its last write (or read)."""

    __slots__ = ("_ttl_ms", "_on_read", "_return_expired")

    def __init__(self, backend: "HashMapKeyedStateBackend", table: StateTable):
        super().__init__(backend, table)
        self._init_ttl(table)

    def _default_value(self) -> Any:
        return self._default if self._default_plain else deepcopy(self._default)

    def value(self) -> Any:
        v = self._read_single(_MISSING)
        return self._default_value() if v is _MISSING else v

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        self._check(value)
        self._write_map()[self._backend._current_key] = self._stamp(value,
                                                                    self._backend._ttl_now())

    def get_many(self, keys, *, hot: bool = False) -> list:
        """Per distinct key as `value()` (expiry checked and cleaned up key by key); `hot` as
        in ValueState.get_many (all in memory here)."""
        backend = self._backend
        saved = backend._current_key, backend._current_key_group
        try:
            out = []
            for key, kg in zip(keys.unique, keys.key_groups):
                backend.set_current_key(key, kg)
                out.append(self.value())
            return out
        finally:
            backend.set_current_key(*saved)

    def put_many(self, keys, values) -> None:
        """Per distinct key as `update()`; all entries get the same timestamp."""
        values = put_many_values(self.name, keys, values)
        backend = self._backend
        saved = backend._current_key, backend._current_key_group
        now = backend._ttl_now()
        try:
            for key, kg, value in zip(keys.unique, keys.key_groups, values):
                backend.set_current_key(key, kg)
                if value is None:
                    self.clear()
                else:
                    self._check(value)
                    self._write_map()[key] = self._stamp(value, now)
        finally:
            backend.set_current_key(*saved)


class TtlReducingState(_Ttl, ReducingState):
    """A ReducingState whose reduced value expires `ttl` after its last add (or read); an
    expired value is not folded into the next add."""

    __slots__ = ("_ttl_ms", "_on_read", "_return_expired")

    def __init__(self, backend: "HashMapKeyedStateBackend", table: StateTable):
        super().__init__(backend, table)
        self._init_ttl(table)

    def get(self) -> Any:
        return self._read_single(None)

    def add(self, value: Any) -> None:
        backend = self._backend
        key = backend._current_key
        now = backend._ttl_now()
        entry = self._read_map().get(key)
        if entry is None or entry.ts + self._ttl_ms <= now:
            result = value
        else:
            result = self._reduce(self._fresh(entry).value, value)
        if result is None:
            if entry is not None:
                self.clear()
            return
        self._check(result)
        self._write_map()[key] = self._stamp(result, now)


class TtlListState(_Ttl, ListState):
    """A ListState whose elements expire one by one, `ttl` after each was added."""

    __slots__ = ("_ttl_ms", "_on_read", "_return_expired")

    def __init__(self, backend: "HashMapKeyedStateBackend", table: StateTable):
        super().__init__(backend, table)
        self._init_ttl(table)

    def get(self) -> list:
        backend = self._backend
        key = backend._current_key
        entry = self._read_map().get(key)
        if entry is None:
            return []
        now = backend._ttl_now()
        live, expired = self._live_items(entry.items, now)
        returned = entry.items if (expired and self._return_expired) else live
        values = [x.value for x in returned]
        if self._on_read and live:
            live = [_Stamped(backend._epoch, now, x.value) for x in live]
        elif not expired:
            return values
        if live:
            self._write_map()[key] = _ListEntry(backend._epoch, live)
        else:
            self.clear()
        return values

    def _stamped(self, values: Iterable[Any]) -> list[_Stamped]:
        now = self._backend._ttl_now()
        items = []
        for v in values:
            self._check(v)
            items.append(self._stamp(v, now))
        return items

    def add(self, value: Any) -> None:
        self._extend(self._stamped((value,)))

    def add_all(self, values: Iterable[Any]) -> None:
        items = self._stamped(values)
        if items:
            self._extend(items)

    def update(self, values: Iterable[Any]) -> None:
        items = self._stamped(values)
        if not items:
            self.clear()
            return
        self._write_map()[self._backend._current_key] = _ListEntry(self._backend._epoch, items)


class TtlMapState(_Ttl, MapState):
    """A MapState whose user keys expire one by one, `ttl` after each was put."""

    __slots__ = ("_ttl_ms", "_on_read", "_return_expired")

    def __init__(self, backend: "HashMapKeyedStateBackend", table: StateTable):
        super().__init__(backend, table)
        self._init_ttl(table)

    def _lookup(self, key: Any) -> Any:
        """The live value of user key `key` (refreshed on read), or _MISSING; removes it if
        expired (returning it once with RETURN_EXPIRED_IF_NOT_CLEANED_UP)."""
        entry = self._entry()
        if entry is None:
            return _MISSING
        stamped = entry.data.get(key)
        if stamped is None:
            return _MISSING
        now = self._backend._ttl_now()
        if stamped.ts + self._ttl_ms <= now:
            self.remove(key)
            return stamped.value if self._return_expired else _MISSING
        if self._on_read:
            self._writable_data()[key] = _Stamped(self._backend._epoch, now, stamped.value)
        return stamped.value

    def _live(self) -> list[tuple[Any, Any]]:
        """(user key, value) of the current key, after removing expired entries (returned too
        with RETURN_EXPIRED_IF_NOT_CLEANED_UP) and refreshing the rest on read."""
        entry = self._entry()
        if entry is None:
            return []
        now = self._backend._ttl_now()
        cutoff = now - self._ttl_ms
        data = entry.data
        expired = [k for k, s in data.items() if s.ts <= cutoff]
        returned = [(k, s.value) for k, s in data.items()
                    if self._return_expired or s.ts > cutoff]
        if expired or self._on_read:
            writable = self._writable_data()
            for k in expired:
                del writable[k]
            if self._on_read:
                epoch = self._backend._epoch
                for k, s in writable.items():
                    writable[k] = _Stamped(epoch, now, s.value)
            if not writable:
                self.clear()
        return returned

    def get(self, key: Any, default: Any = None) -> Any:
        v = self._lookup(key)
        return default if v is _MISSING else v

    def get_all_many(self, keys, user_keys: list, default: Any = None) -> list[list]:
        return get_all_per_key(self, keys, user_keys, default)     # key by key: each entry's TTL

    def get_all(self, keys: Iterable[Any], default: Any = None) -> list:
        return [self.get(k, default) for k in keys]      # each one expires (or is re-stamped) alone

    def put(self, key: Any, value: Any) -> None:
        check_map_key(self.name, key)
        self._check(value)
        self._writable_data()[key] = self._stamp(value, self._backend._ttl_now())

    def put_all(self, mapping: Mapping[Any, Any]) -> None:
        items = dict(mapping)
        if not items:
            return
        now = self._backend._ttl_now()
        for k, v in items.items():
            check_map_key(self.name, k)
            self._check(v)
            items[k] = self._stamp(v, now)
        self._writable_data().update(items)

    def contains(self, key: Any) -> bool:
        return self._lookup(key) is not _MISSING

    def keys(self) -> list:
        return [k for k, _ in self._live()]

    def values(self) -> list:
        return [v for _, v in self._live()]

    def items(self) -> list[tuple[Any, Any]]:
        return self._live()

    def is_empty(self) -> bool:
        return not self._live()


TTL_STATE_CLASSES: dict[str, type[KeyedState]] = {
    VALUE: TtlValueState, LIST: TtlListState, MAP: TtlMapState, REDUCING: TtlReducingState,
}


def drop_expired(kind: str, entries: dict, cutoff: int) -> dict:
    """`entries` (one key group of a TTL state) without what expired at or before `cutoff`
    (now - ttl): for snapshots. Returns `entries` itself when nothing expired; never changes
    the captured objects, which the live state may still share."""
    out = {}
    changed = False
    for key, stored in entries.items():
        if kind == LIST:
            items = stored.items
            live = [x for x in items if x.ts > cutoff]
            if len(live) != len(items):
                changed = True
                if live:
                    out[key] = _ListEntry(stored.epoch, live)
                continue
        elif kind == MAP:
            data = stored.data
            live_data = {k: s for k, s in data.items() if s.ts > cutoff}
            if len(live_data) != len(data):
                changed = True
                if live_data:
                    out[key] = _MapEntry(stored.epoch, live_data)
                continue
        elif stored.ts <= cutoff:
            changed = True
            continue
        out[key] = stored
    return out if changed else entries


__all__ = ["TTL_STATE_CLASSES", "TtlListState", "TtlMapState", "TtlReducingState",
           "TtlValueState", "drop_expired"]
