"""Full snapshots: a pinned view of the database written in the canonical (heap backend) format."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgpack

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.handles import FileHandle, KeyGroupsStateHandle
from streamsnap.state import local_recovery
from streamsnap.state.backends.hashmap import FORMAT_VERSION, MAGIC, _CHECKSUM_BYTES, _checksum
from streamsnap.state.backends.rocksdb.encoding import _array_header, _map_header, _skip, live_ttl_list, stamp_time
from streamsnap.state.descriptors import LIST, MAP
from streamsnap.state.errors import StateError
from streamsnap.state.serialization import array_length, unpack_keys, unpack_value
from streamsnap.state.snapshot import StateSnapshot, safe_file_prefix

if TYPE_CHECKING:
    from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend


# ---------------------------------------------------------------------------------------------
# snapshots


class RocksDBKeyedStateSnapshot(StateSnapshot[KeyGroupsStateHandle]):
    """Full snapshot over a pinned view of the database; `run()` writes the canonical file."""

    def __init__(self, backend: "RocksDBKeyedStateBackend", token: int | None,
                 checkpoint_id: int, location: str, iterator: Any,
                 states: dict[bytes, tuple[str, str, str]],
                 ttl_cutoffs: dict[bytes, int] | None = None):
        super().__init__(checkpoint_id, location,
                         f"keyed snapshot of operator '{backend.operator_uid}'")
        self._backend = backend
        self._token = token
        self._iterator = iterator
        self._states = states
        self._local_store = backend.local_store
        # state id -> the snapshot time minus the state's ttl: entries stamped at or before it
        # are expired and left out.
        self._ttl_cutoffs = ttl_cutoffs or {}

    def _release(self) -> None:
        self._iterator = None
        if self._token is not None:
            self._backend._release_snapshot(self._token)
            self._token = None

    def _blocks(self) -> Iterator[tuple[int, list]]:
        """(key group, [[name, kind, tag, keys bytes, values bytes], ...]) in key group order."""
        it = self._iterator
        states = self._states
        cutoffs = self._ttl_cutoffs
        kg_prefix = None
        out: list = []
        sid = None
        keys: list[bytes] = []
        values: list = []
        is_map = False
        last_key = None
        cutoff = None

        def finish_state():
            if not keys:             # every entry of the state expired in this key group
                return
            name, kind, tag = states[sid]
            if is_map:
                vals = [_map_header(len(g)) + b"".join(g) for g in values]
            else:
                vals = values
            out.append([name, kind, tag, _array_header(len(keys)) + b"".join(keys),
                        _array_header(len(vals)) + b"".join(vals)])

        while it.valid():
            rkey = it.key()
            value = it.value()
            if rkey[:2] != kg_prefix:
                if kg_prefix is not None:
                    finish_state()
                    if out:
                        yield int.from_bytes(kg_prefix, "big"), out
                kg_prefix, out, sid = rkey[:2], [], None
            if rkey[2:4] != sid:
                if sid is not None:
                    finish_state()
                sid = rkey[2:4]
                if sid not in states:
                    raise StateError(f"operator '{self._backend.operator_uid}': the RocksDB "
                                     f"database holds entries of unknown state id {sid.hex()}")
                is_map = states[sid][1] == MAP
                is_list = states[sid][1] == LIST
                cutoff = cutoffs.get(sid)
                keys, values, last_key = [], [], None
            if cutoff is not None:
                if is_list:
                    value = live_ttl_list(value, cutoff)
                if value is None or (not is_list and stamp_time(value) <= cutoff):
                    it.next()
                    continue
            if is_map:
                end = _skip(rkey, 4)
                key = rkey[4:end]
                if key != last_key:
                    keys.append(key)
                    values.append([])
                    last_key = key
                values[-1].append(rkey[end:] + value)
            else:
                keys.append(rkey[4:])
                values.append(value)
            it.next()
        if kg_prefix is not None:
            finish_state()
            if out:
                yield int.from_bytes(kg_prefix, "big"), out

    def _write(self) -> KeyGroupsStateHandle | None:
        if self._iterator is None:
            return None
        backend = self._backend
        name = filesystem.unique_name(f"{safe_file_prefix(backend.operator_uid)}-keyed")
        self._url = filesystem.join(self.location, name)
        offsets: dict[int, tuple[int, int]] = {}
        keys = dict.fromkeys(sorted(name for name, _, _ in self._states.values()), 0)
        with local_recovery.open_write(self._url, backend.local_store) as out:
            out.write(MAGIC)
            position = len(MAGIC)
            for kg, states in self._blocks():
                self._check_not_discarded()
                for state in states:
                    keys[state[0]] += array_length(state[3])
                payload = msgpack.packb([FORMAT_VERSION, kg, states], use_bin_type=True)
                out.write(payload)
                out.write(_checksum(payload))
                length = len(payload) + _CHECKSUM_BYTES
                offsets[kg] = (position, length)
                position += length
        kg_range = backend.key_group_range
        return KeyGroupsStateHandle(FileHandle(name, position), kg_range.start, kg_range.end,
                                    offsets, states=tuple(sorted(self._states.values())), keys=tuple(keys.items()))


def canonical_entries(backend: "RocksDBKeyedStateBackend"
                      ) -> Iterator[tuple[int, list[tuple[str, str, str, dict]]]]:
    """(key group, [(state name, kind, serializer tag, wire entries)]) of everything in the
    database, decoded as a restore decodes a canonical block — expired TTL entries included.
    The offline state reader's hook (`streamsnap.state_processor`), over a pinned view."""
    iterator = backend._db.iter()
    iterator.seek_to_first()
    if not iterator.valid():
        return
    states = {m.sid: (m.name, m.kind, m.tag) for m in backend._meta.values()}
    view = RocksDBKeyedStateSnapshot(backend, None, 0, backend.directory, iterator, states)
    for kg, blocks in view._blocks():
        yield kg, [(name, kind, tag, dict(zip(unpack_keys(keys), unpack_value(values))))
                   for name, kind, tag, keys, values in blocks]


__all__ = ["RocksDBKeyedStateSnapshot", "canonical_entries"]
