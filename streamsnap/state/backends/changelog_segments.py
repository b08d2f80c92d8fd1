"""The file format of a changelog segment (`changelog`): the writes of one RocksDB keyed
backend between two cuts, last write per entry, grouped by key group.

Why a format of its own: a segment is replayed onto a database restored from a
materialization, possibly by a subtask with another key-group range (rescaling) and another
state-id table, so each block is self-describing — its key group, the names behind the state
ids it uses — and checksummed, and a reader skips the key groups it does not own.

    file  := MAGIC block*
    block := length (4 bytes, big-endian) payload xxh64(payload) (8 bytes)
    payload := msgpack([VERSION, key group, [[state id, name, kind, tag], ...],
                        [entry key, ...], [value or nil, ...]])

An entry key is the RocksDB key without its key-group prefix (state id, key, user key); a nil
value deletes the entry. Values are the stored bytes, exactly as in the database.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterator, Mapping

import msgpack
import xxhash

from streamsnap.errors import RestoreError
from streamsnap.state.backends.hashmap import _CHECKSUM_BYTES, _checksum
from streamsnap.state.key_groups import KeyGroupRange

MAGIC = b"SSCHGSEG"
VERSION = 1
_LENGTH_BYTES = 4
_STATE_ID = operator.itemgetter(slice(2, 4))


def encode_segment(content: Mapping[bytes, bytes | None],
                   states: Mapping[bytes, tuple[str, str, str]]) -> bytes:
    """The segment file of `content` (RocksDB key -> stored value, None: deleted);
    `states` maps the state ids in use to (name, kind, tag)."""
    out = [MAGIC]
    keys = sorted(content)
    start = 0
    while start < len(keys):
        prefix = keys[start][:2]
        kg = int.from_bytes(prefix, "big")
        # The block ends at the first key of the next key group (found by bisection: no
        # per-entry Python in the grouping).
        end = (len(keys) if kg == 0xFFFF
               else bisect.bisect_left(keys, (kg + 1).to_bytes(2, "big"), start))
        block = keys[start:end]
        sids = sorted(set(map(_STATE_ID, block)))
        table = [[int.from_bytes(sid, "big"), *states[sid]] for sid in sids]
        payload = msgpack.packb([VERSION, kg, table,
                                 [k[2:] for k in block], [content[k] for k in block]],
                                use_bin_type=True)
        out += [len(payload).to_bytes(_LENGTH_BYTES, "big"), payload, _checksum(payload)]
        start = end
    return b"".join(out)


def checksum_of(data: bytes) -> str:
    return xxhash.xxh64(data).hexdigest()


def iter_blocks(data: bytes, where: str, key_groups: KeyGroupRange | None = None
                ) -> Iterator[tuple[int, list, list, list]]:
    """(key group, state table, entry keys, values) of each block of a segment file whose key
    group is in `key_groups` (all when None). A damaged file raises RestoreError naming
    `where` (the checkpoint and the file)."""
    if not data.startswith(MAGIC):
        raise RestoreError(f"{where} is not a changelog segment (bad header)")
    pos, size = len(MAGIC), len(data)
    while pos < size:
        if pos + _LENGTH_BYTES > size:
            raise RestoreError(f"{where} is truncated (a block header is cut off)")
        length = int.from_bytes(data[pos:pos + _LENGTH_BYTES], "big")
        pos += _LENGTH_BYTES
        end = pos + length
        if end + _CHECKSUM_BYTES > size:
            raise RestoreError(f"{where} is truncated (a block of {length} bytes is cut off)")
        payload = data[pos:end]
        if _checksum(payload) != data[end:end + _CHECKSUM_BYTES]:
            raise RestoreError(f"{where} is corrupt (checksum mismatch in the block at byte {pos})")
        pos = end + _CHECKSUM_BYTES
        try:
            version, kg, table, keys, values = msgpack.unpackb(payload, raw=False)
        except (ValueError, TypeError) as e:
            raise RestoreError(f"{where} is malformed: {e}") from e
        if version != VERSION:
            raise RestoreError(f"{where} has changelog segment format v{version}; this streamsnap "
                               f"reads v{VERSION}")
        if key_groups is not None and kg not in key_groups:
            continue
        yield kg, table, keys, values


__all__ = ["MAGIC", "VERSION", "checksum_of", "encode_segment", "iter_blocks"]
