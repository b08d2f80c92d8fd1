"""Operator (non-keyed) state: lists of elements per subtask, redistributed by element.

Sources keep their read offsets here, sinks their pending transactions. Unlike keyed state
there is no key to route by, so on rescaling the elements themselves are dealt out
(`streamsnap.state.assignment`): a *split* list state's elements are divided among the new
subtasks, a *union* list state gives every subtask all elements (each picks what it needs),
and a *broadcast* state (a dict every subtask holds identically) is restored from one copy.

Operator state is small, so the synchronous snapshot part simply copies each list (elements
are shared: replace them rather than mutating them in place) and the asynchronous part
writes one file::

    file    := MAGIC record*                    MAGIC = b"SSOPSTA\\x01"
    record  := payload xxh64(payload)           8-byte big-endian checksum
    payload := msgpack [serializer tag, element]  element: the value (msgpack) or its bytes
                                                  (other serializers); broadcast: [key, value]

The handle lists (offset, length) per element and state name, so any element can be read
alone and handed to whichever subtask it is assigned to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import xxhash

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.handles import (BROADCAST, SPLIT_DISTRIBUTE, UNION, FileHandle,
                                           OperatorStateHandle)
from streamsnap.errors import ConfigurationError, RestoreError
from streamsnap.state.assignment import StateElementRef, SubtaskRestoreState
from streamsnap.state.errors import StateError, StateSerializationError
from streamsnap.state.keyed_state import PLAIN_TYPES, check_map_key
from streamsnap.state.serialization import (DEFAULT_SERIALIZER, Serializer, pack_value,
                                            unpack_value, value_error)
from streamsnap.state.snapshot import StateSnapshot, safe_file_prefix

MAGIC = b"SSOPSTA\x01"
_CHECKSUM_BYTES = 8


def _checksum(data: bytes | memoryview) -> bytes:
    return xxhash.xxh64_digest(data)


class _OperatorState:
    __slots__ = ("name", "mode", "serializer", "_checks")

    def __init__(self, name: str, mode: str, serializer: Serializer):
        self.name = name
        self.mode = mode
        self.serializer = serializer
        self._checks = type(serializer).check is not Serializer.check

    def _check(self, value: Any) -> None:
        if self._checks and value.__class__ not in PLAIN_TYPES:
            self.serializer.check(value, self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, mode={self.mode!r})"


class OperatorListState(_OperatorState):
    """A list of elements of one subtask; split or union redistributed on restore."""

    __slots__ = ("_items",)

    def __init__(self, name: str, mode: str, serializer: Serializer):
        super().__init__(name, mode, serializer)
        self._items: list = []

    def get(self) -> list:
        """A copy of the elements."""
        return list(self._items)

    def add(self, value: Any) -> None:
        """Append one element."""
        self._check(value)
        self._items.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        """Append several elements."""
        items = list(values)
        for v in items:
            self._check(v)
        self._items.extend(items)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the elements by `values`."""
        items = list(values)
        for v in items:
            self._check(v)
        self._items = items

    def clear(self) -> None:
        """Remove every element."""
        self._items = []

    def _elements(self) -> list:
        return list(self._items)

    def _load(self, values: list) -> None:
        self._items.extend(values)


class BroadcastState(_OperatorState):
    """A dict every subtask holds identically (e.g. rules from a broadcast stream)."""

    __slots__ = ("_data",)

    def __init__(self, name: str, serializer: Serializer):
        super().__init__(name, BROADCAST, serializer)
        self._data: dict = {}

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of `key`, or `default`."""
        return self._data.get(key, default)

    def put(self, key: Any, value: Any) -> None:
        """Set `key` to `value` (in `process_broadcast_element` only, identically on every subtask)."""
        check_map_key(self.name, key)
        self._check(value)
        self._data[key] = value

    def put_all(self, mapping: Mapping[Any, Any]) -> None:
        """Set every key of `mapping` (as `put`)."""
        items = dict(mapping)
        for k, v in items.items():
            check_map_key(self.name, k)
            self._check(v)
        self._data.update(items)

    def remove(self, key: Any) -> None:
        """Remove `key` (nothing happens when it is absent)."""
        self._data.pop(key, None)

    def contains(self, key: Any) -> bool:
        """Whether `key` is present."""
        return key in self._data

    def keys(self) -> list:
        """The keys (a list)."""
        return list(self._data.keys())

    def values(self) -> list:
        """The values (a list)."""
        return list(self._data.values())

    def items(self) -> list[tuple[Any, Any]]:
        """The (key, value) pairs (a list)."""
        return list(self._data.items())

    def is_empty(self) -> bool:
        """Whether there are no entries."""
        return not self._data

    def clear(self) -> None:
        """Remove every entry."""
        self._data = {}

    def _elements(self) -> list:
        return [[k, v] for k, v in self._data.items()]

    def _load(self, values: list) -> None:
        for k, v in values:
            self._data[k] = v


@dataclass
class _RestoredOperatorState:
    """Elements restored for a name nobody has asked for yet, in wire form (tag, element)."""

    name: str
    mode: str
    records: list[tuple[str, Any]] = field(default_factory=list)


@dataclass
class _CapturedOperatorState:
    name: str
    mode: str
    serializer: Serializer | None          # None: `elements` are (tag, wire element) records
    elements: list


class OperatorStateSnapshot(StateSnapshot[OperatorStateHandle]):
    """Operator state captured by `OperatorStateBackend.snapshot`; `run()` writes it."""

    def __init__(self, backend: "OperatorStateBackend", checkpoint_id: int, location: str,
                 parts: list[_CapturedOperatorState]):
        super().__init__(checkpoint_id, location,
                         f"operator state snapshot of operator '{backend.operator_uid}'")
        self._operator_uid = backend.operator_uid
        self._parts: list[_CapturedOperatorState] | None = parts

    def _release(self) -> None:
        self._parts = None

    def _write(self) -> OperatorStateHandle | None:
        parts = self._parts or []
        if not any(part.elements for part in parts):
            return None
        name = filesystem.unique_name(f"{safe_file_prefix(self._operator_uid)}-operator")
        self._url = filesystem.join(self.location, name)
        states: dict[str, tuple[str, tuple[tuple[int, int], ...]]] = {}
        with filesystem.open_write(self._url) as out:
            out.write(MAGIC)
            position = len(MAGIC)
            for part in parts:
                self._check_not_discarded()
                offsets = []
                for record in self._records(part):
                    out.write(record)
                    offsets.append((position, len(record)))
                    position += len(record)
                states[part.name] = (part.mode, tuple(offsets))
        return OperatorStateHandle(FileHandle(name, position), states)

    @staticmethod
    def _records(part: _CapturedOperatorState) -> Iterable[bytes]:
        serializer = part.serializer
        for element in part.elements:
            if serializer is None:
                tag, wire = element
            else:
                tag = serializer.tag
                wire = _element_to_wire(part, serializer, element)
            try:
                payload = pack_value([tag, wire])
            except (TypeError, ValueError, OverflowError) as e:
                if part.mode == BROADCAST:
                    check_map_key(part.name, element[0])     # raises if the key is the culprit
                    element = element[1]
                raise value_error(part.name, element, serializer or DEFAULT_SERIALIZER) from e
            yield payload + _checksum(payload)


def _element_to_wire(part: _CapturedOperatorState, serializer: Serializer, element: Any) -> Any:
    if serializer.native:
        return element
    try:
        if part.mode == BROADCAST:
            return [element[0], serializer.dumps(element[1])]
        return serializer.dumps(element)
    except Exception as e:
        raise StateSerializationError(
            f"operator state '{part.name}': {type(serializer).__name__} failed to serialize a "
            f"value: {type(e).__name__}: {e}") from e


def _element_from_wire(name: str, mode: str, tag: str, wire: Any, serializer: Serializer) -> Any:
    if tag != serializer.tag:
        raise RestoreError(f"operator state '{name}' was checkpointed with the {tag!r} serializer "
                           f"but is now requested with {serializer.tag!r}")
    if serializer.native:
        return wire
    if mode == BROADCAST:
        return [wire[0], serializer.loads(wire[1])]
    return serializer.loads(wire)


def decode_record(record: bytes | memoryview, where: str) -> tuple[str, Any]:
    """(serializer tag, wire element) of one element record."""
    if len(record) <= _CHECKSUM_BYTES:
        raise RestoreError(f"operator state file {where} is corrupt: an element record is "
                           f"truncated ({len(record)} bytes)")
    payload, checksum = record[:-_CHECKSUM_BYTES], record[-_CHECKSUM_BYTES:]
    if _checksum(payload) != bytes(checksum):
        raise RestoreError(f"operator state file {where} is corrupt: checksum mismatch of an "
                           f"element record; restore from an older checkpoint")
    try:
        tag, wire = unpack_value(payload)
        return str(tag), wire
    except (ValueError, TypeError) as e:
        raise RestoreError(f"operator state file {where} is corrupt: cannot decode an element "
                           f"record: {e}") from e


def read_elements(refs: Iterable[StateElementRef], base_location: str) -> list[tuple[str, Any]]:
    """Read and decode element records, one ranged read per file, keeping their order."""
    refs = list(refs)
    by_file: dict[str, list[int]] = {}
    for i, ref in enumerate(refs):
        by_file.setdefault(ref.file.path, []).append(i)
    out: list[tuple[str, Any] | None] = [None] * len(refs)
    for path, indices in by_file.items():
        url = filesystem.join(base_location, path)
        low = min(refs[i].offset for i in indices)
        high = max(refs[i].offset + refs[i].length for i in indices)
        try:
            data = filesystem.read_range(url, low, high - low)
        except FileNotFoundError as e:
            raise RestoreError(f"operator state file {url} is missing") from e
        if len(data) != high - low:
            raise RestoreError(f"operator state file {url} is truncated: expected {high - low} "
                               f"bytes at offset {low}, read {len(data)}")
        view = memoryview(data)
        for i in indices:
            ref = refs[i]
            out[i] = decode_record(view[ref.offset - low: ref.offset - low + ref.length], url)
    return out  # type: ignore[return-value]


class OperatorStateBackend:
    """Operator state of one subtask: named list, union-list and broadcast states."""

    def __init__(self, operator_uid: str):
        self.operator_uid = operator_uid
        self._states: dict[str, OperatorListState | BroadcastState] = {}
        self._restored: dict[str, _RestoredOperatorState] = {}
        self._disposed = False
        self.is_restored = False

    def get_list_state(self, name: str, serializer: Serializer | None = None) -> OperatorListState:
        """A list state whose elements are split among the subtasks on restore."""
        return self._get(name, SPLIT_DISTRIBUTE, serializer)  # type: ignore[return-value]

    def get_union_list_state(self, name: str, serializer: Serializer | None = None
                             ) -> OperatorListState:
        """A list state of which every subtask gets all elements on restore."""
        return self._get(name, UNION, serializer)  # type: ignore[return-value]

    def get_broadcast_state(self, name: str, serializer: Serializer | None = None) -> BroadcastState:
        """A dict state held identically by every subtask; restored from one copy."""
        return self._get(name, BROADCAST, serializer)  # type: ignore[return-value]

    def _get(self, name: str, mode: str, serializer: Serializer | None
             ) -> OperatorListState | BroadcastState:
        if not isinstance(name, str) or not name.strip():
            raise ConfigurationError(f"operator state name must be a non-empty str, got {name!r}")
        if serializer is not None and not isinstance(serializer, Serializer):
            raise ConfigurationError(f"operator state '{name}': serializer must be a "
                                     f"streamsnap.state.Serializer, got {type(serializer).__name__}")
        if self._disposed:
            raise StateError(f"operator '{self.operator_uid}': operator state used after dispose")
        serializer = serializer if serializer is not None else DEFAULT_SERIALIZER
        existing = self._states.get(name)
        if existing is not None:
            if existing.mode != mode:
                raise StateError(f"operator state '{name}' of operator '{self.operator_uid}' is a "
                                 f"{existing.mode} state; it cannot also be used as {mode}")
            if existing.serializer != serializer:
                raise StateError(f"operator state '{name}' is registered with serializer "
                                 f"{existing.serializer!r}, not {serializer!r}")
            return existing
        state: OperatorListState | BroadcastState = (
            BroadcastState(name, serializer) if mode == BROADCAST
            else OperatorListState(name, mode, serializer))
        restored = self._restored.get(name)
        if restored is not None:
            if restored.mode != mode:
                raise RestoreError(
                    f"operator state '{name}' of operator '{self.operator_uid}' was checkpointed "
                    f"as {restored.mode} but is now requested as {mode}")
            state._load([_element_from_wire(name, mode, tag, wire, serializer)
                         for tag, wire in restored.records])
            del self._restored[name]
        self._states[name] = state
        return state

    def state_names(self) -> list[str]:
        return sorted(set(self._states) | set(self._restored))

    def snapshot(self, checkpoint_id: int, location: str) -> OperatorStateSnapshot:
        """Synchronous part: copies the (small) element lists; nothing is serialized."""
        if self._disposed:
            raise StateError(f"operator '{self.operator_uid}': snapshot after dispose")
        parts = [_CapturedOperatorState(s.name, s.mode, s.serializer, s._elements())
                 for s in self._states.values()]
        parts += [_CapturedOperatorState(r.name, r.mode, None, list(r.records))
                  for r in self._restored.values()]
        return OperatorStateSnapshot(self, checkpoint_id, location, parts)

    def restore(self, state: SubtaskRestoreState, base_location: str) -> None:
        """Load this subtask's share of the operator state (from `assign_operator_state`)."""
        if not isinstance(state, SubtaskRestoreState):
            raise RestoreError(f"operator '{self.operator_uid}': restore expects a "
                               f"SubtaskRestoreState, got {type(state).__name__}")
        if self._disposed:
            raise StateError(f"operator '{self.operator_uid}': restore after dispose")
        if state.is_restored:
            self.is_restored = True
        for restore in state.operator:
            records = read_elements(restore.elements, base_location)
            live = self._states.get(restore.name)
            if live is not None:
                if live.mode != restore.mode:
                    raise RestoreError(
                        f"operator state '{restore.name}' of operator '{self.operator_uid}' was "
                        f"checkpointed as {restore.mode} but is registered as {live.mode}")
                live._load([_element_from_wire(restore.name, restore.mode, tag, wire,
                                               live.serializer) for tag, wire in records])
                continue
            pending = self._restored.get(restore.name)
            if pending is None:
                pending = self._restored[restore.name] = _RestoredOperatorState(
                    restore.name, restore.mode)
            elif pending.mode != restore.mode:
                raise RestoreError(f"operator state '{restore.name}' is restored as both "
                                   f"{pending.mode} and {restore.mode}")
            pending.records.extend(records)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Operator state keeps nothing per checkpoint."""

    def dispose(self) -> None:
        self._disposed = True
        self._states.clear()
        self._restored.clear()
