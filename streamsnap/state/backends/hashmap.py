"""The heap keyed state backend (Flink's HashMapStateBackend) with asynchronous snapshots.

State lives in Python dicts: per state name, per key group, ``key -> value`` (see
`streamsnap.state.keyed_state`). A checkpoint has two parts, as in Flink:

* `snapshot()` — the synchronous part, on the mailbox thread while no record is processed:
  it only registers a capture of each non-empty key group and advances the backend's epoch.
  Cost: O(states × key groups), no entry touched, no serialization, no I/O.
* `Snapshot.run()` — the asynchronous part, on any thread, while the mailbox thread keeps
  processing records: freezes the captured key groups no write froze yet (their value
  columns: `streamsnap.state.copy_on_write`), serializes them and writes one file. The keys of
  a key group that only gained keys since the previous snapshot are not read or encoded
  again: that snapshot's encoding is reused and extended (`streamsnap.state.encoded_keys`),
  the bytes being the same.

File format (one file per snapshot, in the checkpoint directory)::

    file   := MAGIC block*                      MAGIC = b"SSKEYED\\x01"
    block  := payload xxh64(payload)            one block per key group with data, in key
                                                group order; checksum: 8 bytes, big-endian
    payload := msgpack [1, key_group, [[state name, kind, serializer tag, keys, values], ...]]
    keys    := bytes: msgpack array of the keys (composite keys as arrays → tuples on restore)
    values  := bytes: msgpack array of the wire values, parallel to `keys` (tuples inside
               values as an extension type, see `streamsnap.state.serialization`)

The handle records (offset, length) of every block, so a restoring subtask reads only the
key groups it now owns, whatever the old parallelism was. Wire values: Value/Reducing → the
value, List → list of elements, Map → dict; with a non-native serializer (pickle) every
value/element/map value is replaced by its bytes. Keys and values are separate arrays so
keys decode in bulk with arrays as tuples (hashable) while values keep lists as lists; both
pack without a per-entry Python loop for plain values. The checksum turns a corrupt or
truncated file into a clear `RestoreError` instead of garbage state.

State restored for a name that the job never asks for again is kept in its wire form and
written into later snapshots unchanged, so it is not lost.

With task-local recovery (`streamsnap.state.local_recovery`) the file is written to checkpoint
storage and to a local copy in one pass, and a restore reads the local copy first.

TTL states (`streamsnap.state.ttl`) are written under the serializer tag plus "+ttl", each wire
element as ``[timestamp, element]``; entries expired at the snapshot's time (taken in the
synchronous part) are left out. Restored TTL state nobody asked for yet is written back as it
is, expired entries included: its time-to-live is only known once a descriptor asks for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import xxhash

from streamsnap.checkpoint import filesystem
from streamsnap.clock import Clock, SystemClock
from streamsnap.checkpoint.handles import FileHandle, KeyGroupsStateHandle
from streamsnap.errors import ConfigurationError, RestoreError
from streamsnap.state.assignment import SubtaskRestoreState
from streamsnap.state.copy_on_write import FrozenGroup, GroupCapture
from streamsnap.state.encoded_keys import EncodedKeys
from streamsnap.state.descriptors import STATE_KINDS, StateDescriptor
from streamsnap.state.errors import StateError, StateSerializationError
from streamsnap.state.key_groups import KeyGroupRange, check_max_parallelism
from streamsnap.state.keyed_state import (STATE_CLASSES, KeyedState, StateTable,
                                          entries_from_wire, entries_to_wire, native_default,
                                          unwrap)
from streamsnap.state.keyed_state_ttl import TTL_STATE_CLASSES, drop_expired
from streamsnap.state import local_recovery
from streamsnap.state.local_recovery import LocalRecoveryStore
from streamsnap.state.ttl import check_same_ttl, clock_millis, is_ttl_tag, tag_mismatch
from streamsnap.state.serialization import (Serializer, array_length, find_unencodable,
                                            key_error, pack_value, unpack_keys,
                                            unpack_value, value_error)
from streamsnap.state.snapshot import StateSnapshot, safe_file_prefix

log = logging.getLogger(__name__)

MAGIC = b"SSKEYED\x01"
FORMAT_VERSION = 1
_CHECKSUM_BYTES = 8


def _checksum(data: bytes | memoryview) -> bytes:
    return xxhash.xxh64_digest(data)


def _pack_native(values: list) -> bytes:
    """msgpack of stored values of a native-serializer state (wrappers unwrapped)."""
    return pack_value(values, default=native_default)


@dataclass
class _RestoredState:
    """State restored for a name nobody has asked for yet, kept in wire form."""

    name: str
    kind: str
    tag: str
    maps: dict[int, dict]


@dataclass
class _CapturedState:
    """One state's captured key groups, as the synchronous snapshot part took them: captures
    of a live table (frozen later, `streamsnap.state.copy_on_write`) or dicts nobody writes."""

    name: str
    kind: str
    tag: str
    serializer: Serializer | None   # None: the dicts already hold wire values
    key_groups: list[tuple[int, GroupCapture | dict]]
    ttl_cutoff: int | None = None   # TTL states: entries stamped at or before it are expired
    table: StateTable | None = None     # the live table the captures belong to
    key_cache: dict[int, EncodedKeys] | None = None   # live non-TTL states: its encoded keys

    def frozen(self) -> list[tuple[int, FrozenGroup]]:
        """Every captured key group frozen (now, where no write froze it yet), expired TTL
        entries left out, empty ones dropped."""
        out = []
        for kg, captured in self.key_groups:
            if isinstance(captured, dict):
                group = FrozenGroup(captured)
            else:
                group = self.table.frozen(kg, captured)
            if self.ttl_cutoff is not None:
                group = FrozenGroup(drop_expired(self.kind, group.as_dict(), self.ttl_cutoff))
            if len(group):
                out.append((kg, group))
        return out

    def release(self) -> None:
        """The snapshot is done with its captures (writes there stop freezing)."""
        if self.table is not None:
            self.table.release(self.key_groups)

    def encode(self, key_group: int, group: FrozenGroup) -> tuple[bytes, bytes]:
        """(keys, values): two parallel msgpack arrays of one key group's entries."""
        try:
            keys = group.encode_keys(self.key_cache, key_group)
        except (TypeError, ValueError, OverflowError) as e:
            raise self._diagnose(group, None) from e
        serializer = self.serializer
        try:
            if serializer is None:
                return keys, group.pack_values(pack_value)
            if serializer.native:
                return keys, group.pack_values(_pack_native)
        except (TypeError, ValueError, OverflowError) as e:
            raise self._diagnose(group, serializer) from e
        try:
            wire = entries_to_wire(self.kind, group.stored_values(), serializer)
        except Exception as e:
            raise StateSerializationError(
                f"state '{self.name}': {type(serializer).__name__} failed to serialize a value: "
                f"{type(e).__name__}: {e}") from e
        try:
            return keys, pack_value(wire)
        except (TypeError, ValueError, OverflowError) as e:
            raise self._diagnose(group, None) from e

    def _diagnose(self, group: FrozenGroup, serializer: Serializer | None) -> StateSerializationError:
        # Keys reused from an earlier encoding were encodable: only the others are checked.
        for key in group.new_keys():
            if find_unencodable(key, keys=True) is not None:
                return key_error(self.name, key)
        if serializer is not None:
            for stored in group.stored_values():
                value = unwrap(stored)
                if find_unencodable(value) is not None:
                    return value_error(self.name, value, serializer)
        return StateSerializationError(f"state '{self.name}': its entries cannot be encoded")


class _CoalescedWriter:
    """Joins small writes into large ones. The asynchronous snapshot thread gives up the GIL on
    every write, and while the task's thread keeps releasing and retaking it (numpy, Arrow,
    sockets) each retake can wait many switch intervals (CPython's GIL convoy): beside a thread
    busy with small numpy calls, writing 2 M keys took 27-60 s with one write per key group and
    1.5 s coalesced (0.3 s alone)."""

    LIMIT = 32 << 20

    def __init__(self, out):
        self._out = out
        self._parts: list[bytes] = []
        self._size = 0

    def write(self, data: bytes) -> None:
        self._parts.append(data)
        self._size += len(data)
        if self._size >= self.LIMIT:
            self.flush()

    def flush(self) -> None:
        if self._parts:
            self._out.write(b"".join(self._parts))
            self._parts, self._size = [], 0


class KeyedStateSnapshot(StateSnapshot[KeyGroupsStateHandle]):
    """A keyed snapshot whose synchronous part is taken; `run()` writes it, `discard()` drops it."""

    def __init__(self, backend: "HashMapKeyedStateBackend", token: int | None, checkpoint_id: int,
                 location: str, parts: list[_CapturedState]):
        super().__init__(checkpoint_id, location, f"keyed snapshot of operator '{backend.operator_uid}'")
        self._backend = backend
        self._token = token
        self._parts: list[_CapturedState] | None = parts
        self._local_store = backend.local_store

    def _release(self) -> None:
        parts, self._parts = self._parts, None
        for part in parts or ():
            part.release()
        if self._token is not None:
            self._backend._release_snapshot(self._token)
            self._token = None

    def _write(self) -> KeyGroupsStateHandle | None:
        parts = self._parts
        if not parts:
            return None
        backend = self._backend
        # Freeze what no write froze yet, all first: writes from now on do not wait for it.
        by_key_group: dict[int, list[tuple[_CapturedState, FrozenGroup]]] = {}
        for part in parts:
            for kg, group in part.frozen():
                by_key_group.setdefault(kg, []).append((part, group))
        name = filesystem.unique_name(f"{safe_file_prefix(backend.operator_uid)}-keyed")
        self._url = filesystem.join(self.location, name)
        offsets: dict[int, tuple[int, int]] = {}
        keys = dict.fromkeys(sorted({p.name for p in parts}), 0)
        with local_recovery.open_write(self._url, backend.local_store) as out:
            pending = _CoalescedWriter(out)
            pending.write(MAGIC)
            position = len(MAGIC)
            for kg in sorted(by_key_group):
                self._check_not_discarded()
                states = [[part.name, part.kind, part.tag, *part.encode(kg, group)]
                          for part, group in by_key_group.pop(kg)]
                for state in states:
                    keys[state[0]] += array_length(state[3])
                payload = msgpack.packb([FORMAT_VERSION, kg, states], use_bin_type=True)
                pending.write(payload)
                pending.write(_checksum(payload))
                length = len(payload) + _CHECKSUM_BYTES
                offsets[kg] = (position, length)
                position += length
            pending.flush()
        kg_range = backend.key_group_range
        return KeyGroupsStateHandle(FileHandle(name, position), kg_range.start, kg_range.end,
                                    offsets, states=tuple(sorted({(p.name, p.kind, p.tag) for p in parts})),
                                    keys=tuple(keys.items()))


def read_key_group_blocks(handle: KeyGroupsStateHandle, base_location: str, key_group_range: KeyGroupRange,
                          max_parallelism: int, operator_uid: str,
                          local: LocalRecoveryStore | None = None):
    """(key group, decoded states) of each key group of `handle` in `key_group_range`, read with
    one ranged read — the canonical format's restore, for every backend.

    With task-local recovery (`local`), the range is read from the file's local copy when there
    is one of the recorded size. Every block is checksummed, so a block that decodes is the
    block that was written; from the first one that does not, the remaining blocks are read
    from checkpoint storage instead (the blocks already yielded stay valid)."""
    if handle.key_group_end >= max_parallelism:
        raise RestoreError(
            f"operator '{operator_uid}': keyed state handle covers key groups up to "
            f"{handle.key_group_end} but max parallelism is {max_parallelism}; the max "
            f"parallelism of a job's state cannot change")
    wanted = sorted(kg for kg in handle.offsets if kg in key_group_range)
    if not wanted:
        return
    url = filesystem.join(base_location, handle.file.path)
    path = local.find(url, handle.file.size) if local is not None else None
    if path is not None:
        done = 0
        try:
            low, data = _read_blocks(filesystem.normalize(path), handle, wanted, operator_uid)
            view = memoryview(data)
            for kg in wanted:
                offset, length = handle.offsets[kg]
                decoded = decode_block(view[offset - low: offset - low + length], kg, path)
                yield kg, decoded
                done += 1
        except (RestoreError, OSError) as e:
            log.warning("operator '%s': the local copy %s is unusable (%s); reading the rest "
                        "from %s", operator_uid, path, e, url)
            local.reject(path)
            wanted = wanted[done:]
        else:
            local.count_local(len(data))
            return
    low, data = _read_blocks(url, handle, wanted, operator_uid)
    if local is not None:
        local.count_remote(len(data))
    view = memoryview(data)
    for kg in wanted:
        offset, length = handle.offsets[kg]
        yield kg, decode_block(view[offset - low: offset - low + length], kg, url)


def _read_blocks(url: str, handle: KeyGroupsStateHandle, key_groups: list[int],
                 operator_uid: str) -> tuple[int, bytes]:
    """(offset, bytes) of the one range of `url` that holds the blocks of `key_groups`."""
    low = min(handle.offsets[kg][0] for kg in key_groups)
    high = max(handle.offsets[kg][0] + handle.offsets[kg][1] for kg in key_groups)
    try:
        data = filesystem.read_range(url, low, high - low)
    except FileNotFoundError as e:
        raise RestoreError(f"operator '{operator_uid}': keyed state file {url} is "
                           f"missing") from e
    if len(data) != high - low:
        raise RestoreError(f"keyed state file {url} is truncated: expected {high - low} "
                           f"bytes at offset {low}, read {len(data)}")
    return low, data


def decode_block(block: bytes | memoryview, key_group: int, where: str
                 ) -> list[tuple[str, str, str, dict]]:
    """(state name, kind, serializer tag, wire entries) of one key group's block."""
    if len(block) <= _CHECKSUM_BYTES:
        raise RestoreError(f"keyed state file {where} is corrupt: the block of key group "
                           f"{key_group} is truncated ({len(block)} bytes)")
    payload, checksum = block[:-_CHECKSUM_BYTES], block[-_CHECKSUM_BYTES:]
    if _checksum(payload) != bytes(checksum):
        raise RestoreError(f"keyed state file {where} is corrupt: checksum mismatch in the "
                           f"block of key group {key_group}; restore from an older checkpoint")
    try:
        version, stored_kg, states = msgpack.unpackb(payload, raw=False)
        if version != FORMAT_VERSION:
            raise RestoreError(f"keyed state file {where} has format version {version}, this "
                               f"streamsnap reads version {FORMAT_VERSION}")
        if stored_kg != key_group:
            raise RestoreError(f"keyed state file {where}: the block at the offsets of key "
                               f"group {key_group} holds key group {stored_kg}")
        decoded = []
        for name, kind, tag, keys_bin, values_bin in states:
            keys, values = unpack_keys(keys_bin), unpack_value(values_bin)
            if len(keys) != len(values):
                raise RestoreError(f"keyed state file {where} is corrupt: state '{name}' has "
                                   f"{len(keys)} keys but {len(values)} values in key group "
                                   f"{key_group}")
            decoded.append((str(name), str(kind), str(tag), dict(zip(keys, values))))
        return decoded
    except (ValueError, TypeError) as e:
        raise RestoreError(f"keyed state file {where} is corrupt: cannot decode the block of "
                           f"key group {key_group}: {e}") from e


class HashMapKeyedStateBackend:
    """Keyed state of one operator subtask on the heap, for the key groups it owns."""

    # A lookup is a dict access: skipping one (e.g. with a filter of values seen) saves nothing.
    LOOKUPS_ARE_CHEAP = True

    def __init__(self, operator_uid: str, max_parallelism: int, key_group_range: KeyGroupRange,
                 *, clock: Clock | None = None, local_store: LocalRecoveryStore | None = None):
        check_max_parallelism(max_parallelism)
        if not isinstance(key_group_range, KeyGroupRange) or key_group_range.is_empty \
                or key_group_range.end >= max_parallelism:
            raise ConfigurationError(
                f"operator '{operator_uid}': key_group_range must be a non-empty KeyGroupRange "
                f"within [0, {max_parallelism}), got {key_group_range!r}")
        self.operator_uid = operator_uid
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        # Hot-path attributes, read directly by the state objects.
        self._current_key: Any = None
        self._current_key_group: int | None = None
        self._epoch = 0
        self._required_epoch = -1
        self._tables: dict[str, StateTable] = {}
        self._states: dict[str, KeyedState] = {}
        self._restored: dict[str, _RestoredState] = {}
        self._live_snapshots: dict[int, int] = {}   # token -> epoch it captured
        self._next_token = 0
        self._lock = threading.Lock()
        # Orders freezing a captured key group (either thread) against the mailbox thread's
        # writes there (`streamsnap.state.copy_on_write`).
        self._freeze_lock = threading.Lock()
        self._disposed = False
        self.is_restored = False
        self.last_completed_checkpoint_id: int | None = None
        # Processing time of state TTL (wall clock); injectable for deterministic tests.
        self.ttl_clock: Clock = clock if clock is not None else SystemClock()
        # Task-local recovery: snapshots keep a local copy, restores read it first.
        self.local_store = local_store

    def _ttl_now(self) -> int:
        return clock_millis(self.ttl_clock)

    # -- keys ------------------------------------------------------------------------------

    def set_current_key(self, key: Any, key_group: int) -> None:
        """Make `key` (in `key_group`, from `assign_to_key_group`) the key states refer to."""
        self._current_key = key
        self._current_key_group = key_group

    @property
    def current_key(self) -> Any:
        return self._current_key

    @property
    def current_key_group(self) -> int | None:
        return self._current_key_group

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

    # -- states ----------------------------------------------------------------------------

    def get_state(self, descriptor: StateDescriptor) -> KeyedState:
        """The state for `descriptor`; the same name returns the same state object."""
        if not isinstance(descriptor, StateDescriptor) or descriptor.kind not in STATE_KINDS:
            raise ConfigurationError(
                f"unknown state kind: get_state expects a ValueStateDescriptor, "
                f"ListStateDescriptor, MapStateDescriptor or ReducingStateDescriptor, got "
                f"{type(descriptor).__name__}")
        if self._disposed:
            raise StateError(f"operator '{self.operator_uid}': get_state after dispose")
        name = descriptor.name
        existing = self._states.get(name)
        if existing is not None:
            table = self._tables[name]
            if table.kind != descriptor.kind:
                raise StateError(
                    f"state '{name}' of operator '{self.operator_uid}' is a {table.kind} state; "
                    f"it cannot also be used as a {descriptor.kind} state (use another name)")
            if table.serializer != descriptor.get_serializer():
                raise StateError(
                    f"state '{name}' of operator '{self.operator_uid}' is registered with "
                    f"serializer {table.serializer!r}, not {descriptor.get_serializer()!r}")
            check_same_ttl(name, self.operator_uid, table.descriptor, descriptor)
            return existing
        table = StateTable(self, descriptor, self.key_group_range)
        restored = self._restored.get(name)
        if restored is not None:
            self._check_compatible(restored.name, restored.kind, restored.tag, table)
            # A running snapshot may hold the wire dicts: the table writes its dicts in place,
            # so it gets copies then; and entries are stamped with epoch -1, so the first
            # in-place change of a list, map or mutable value copies it.
            held = bool(self._live_snapshots)
            for kg, wire in restored.maps.items():
                table.maps[kg] = entries_from_wire(table.kind, dict(wire) if held else wire,
                                                   table.serializer, -1,
                                                   ttl=descriptor.ttl is not None)
            del self._restored[name]
        classes = STATE_CLASSES if descriptor.ttl is None else TTL_STATE_CLASSES
        state = classes[descriptor.kind](self, table)
        descriptor._mark_registered()
        self._tables[name] = table
        self._states[name] = state
        return state

    def _check_compatible(self, name: str, kind: str, tag: str, table: StateTable) -> None:
        if kind != table.kind:
            raise RestoreError(
                f"state '{name}' of operator '{self.operator_uid}' was checkpointed as a {kind} "
                f"state but is now requested as a {table.kind} state; keep the kind or rename "
                f"the state")
        if tag != table.tag:
            raise RestoreError(tag_mismatch(name, self.operator_uid, tag, table.tag))

    def state_names(self) -> list[str]:
        return sorted(set(self._tables) | set(self._restored))

    def get_keys(self, state_name: str) -> list:
        """All keys that have an entry in `state_name` (any key group)."""
        table = self._tables.get(state_name)
        maps = table.maps if table is not None else (
            self._restored[state_name].maps if state_name in self._restored else {})
        return [key for m in maps.values() for key in m]

    def num_keys(self) -> int:
        """Entries over all states (a key with two states counts twice)."""
        return sum(t.num_entries() for t in self._tables.values()) + sum(
            len(m) for r in self._restored.values() for m in r.maps.values())

    # -- snapshots -------------------------------------------------------------------------

    def snapshot(self, checkpoint_id: int, location: str) -> KeyedStateSnapshot:
        """Synchronous part of a checkpoint: register captures, no serialization, no I/O."""
        if self._disposed:
            raise StateError(f"operator '{self.operator_uid}': snapshot after dispose")
        parts = []
        now = self._ttl_now()
        for table in self._tables.values():
            captured = table.capture()
            if captured:
                if table.descriptor.ttl is None:
                    parts.append(_CapturedState(table.name, table.kind, table.tag,
                                                table.serializer, captured, table=table,
                                                key_cache=table.key_cache))
                else:
                    parts.append(_CapturedState(table.name, table.kind, table.tag,
                                                table.serializer, captured,
                                                now - table.descriptor.ttl.ttl_ms, table=table))
        for restored in self._restored.values():
            captured = [(kg, m) for kg, m in restored.maps.items() if m]
            if captured:
                parts.append(_CapturedState(restored.name, restored.kind, restored.tag, None,
                                            captured))
        token = None
        if parts:
            with self._lock:
                token = self._next_token
                self._next_token += 1
                self._live_snapshots[token] = self._epoch
                self._required_epoch = max(self._live_snapshots.values())
                self._epoch += 1
        return KeyedStateSnapshot(self, token, checkpoint_id, location, parts)

    def _release_snapshot(self, token: int) -> None:
        with self._lock:
            self._live_snapshots.pop(token, None)
            self._required_epoch = max(self._live_snapshots.values(), default=-1)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Remembered for metrics; local copies of older checkpoints are deleted."""
        if self.last_completed_checkpoint_id is None or checkpoint_id > self.last_completed_checkpoint_id:
            self.last_completed_checkpoint_id = checkpoint_id
        if self.local_store is not None:
            self.local_store.checkpoint_complete(checkpoint_id)

    # -- restore ---------------------------------------------------------------------------

    def restore(self, state: SubtaskRestoreState | Sequence[KeyGroupsStateHandle],
                base_location: str) -> None:
        """Load the key groups of this backend's range from `state` (paths relative to
        `base_location`, the checkpoint directory). Handles may come from any parallelism."""
        if self._disposed:
            raise StateError(f"operator '{self.operator_uid}': restore after dispose")
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
        for handle in handles:
            if handle is None:
                continue
            if not isinstance(handle, KeyGroupsStateHandle):
                raise RestoreError(f"operator '{self.operator_uid}': cannot restore keyed state "
                                   f"from a {type(handle).__name__}; expected KeyGroupsStateHandle")
            self._restore_handle(handle, base_location)

    def _restore_handle(self, handle: KeyGroupsStateHandle, base_location: str) -> None:
        for kg, states in read_key_group_blocks(handle, base_location, self.key_group_range,
                                                self.max_parallelism, self.operator_uid,
                                                self.local_store):
            for name, kind, tag, wire in states:
                self._merge(kg, name, kind, tag, wire)

    def _merge(self, kg: int, name: str, kind: str, tag: str, wire: dict) -> None:
        if kind not in STATE_KINDS:
            raise RestoreError(f"state '{name}' of operator '{self.operator_uid}' has unknown "
                               f"kind {kind!r} in the checkpoint")
        table = self._tables.get(name)
        if table is not None:
            self._check_compatible(name, kind, tag, table)
            entries = entries_from_wire(kind, wire, table.serializer, self._epoch,
                                        ttl=is_ttl_tag(tag))
            live = table.own(kg)
            if live:
                live.update(entries)
            else:
                table.maps[kg] = entries    # a dict of its own (decoded): no copy
            return
        restored = self._restored.get(name)
        if restored is None:
            restored = self._restored[name] = _RestoredState(name, kind, tag, {})
        elif (restored.kind, restored.tag) != (kind, tag):
            raise RestoreError(
                f"state '{name}' of operator '{self.operator_uid}' appears in the checkpoint as "
                f"{restored.kind}/{restored.tag} and as {kind}/{tag}")
        previous = restored.maps.get(kg)
        # A new dict: a running snapshot may hold the previous one.
        restored.maps[kg] = {**previous, **wire} if previous else wire

    # -- lifecycle -------------------------------------------------------------------------

    def dispose(self) -> None:
        """Drop all state; running snapshots keep what they captured and can still finish."""
        self._disposed = True
        for table in self._tables.values():
            table.maps.clear()
            table.pending.clear()
        self._tables.clear()
        self._states.clear()
        self._restored.clear()
        self._current_key = None
        self._current_key_group = None

    def iter_entries(self, state_name: str) -> Iterator[tuple[int, Any, Any]]:
        """(key group, key, value) of every entry of a live state (tests, debugging)."""
        table = self._tables[state_name]
        for kg, m in list(table.maps.items()):
            for key, stored in list(m.items()):
                yield kg, key, unwrap(stored)
