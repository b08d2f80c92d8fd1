"""The RocksDB keyed state backend (Flink's EmbeddedRocksDBStateBackend), on `rocksdict`.

Keyed state lives in an embedded RocksDB database, one per operator subtask, in a directory
under a local working directory (`RocksDBConfig.local_dir`, the system temp directory by
default), closed and deleted when the backend is disposed (directories of killed processes are
deleted by the next backend created under the same directory). State is off the Python heap, so it
can be larger than memory; RocksDB's own memory is bounded by `RocksDBConfig`: an LRU block
cache (which also holds index and filter blocks) and the memtables (write buffer size × number
of write buffers). The database is a working copy only: it has no write-ahead log, recovery
always comes from a checkpoint.

Layout (every key and value is bytes)::

    key   := key_group (2 bytes, big-endian) state_id (2 bytes, big-endian) msgpack(key) [user key]
    value := the entry's *wire element*, exactly as it appears in a checkpoint file

So a subtask's key groups are one contiguous, ordered range, one key group's entries are
contiguous and grouped by state, and a snapshot is a single ordered scan. `state_id` numbers
the state names of this database (assigned when a state is registered or restored; the
mapping lives in memory, like the database itself). Keys are msgpack-encoded as in the
checkpoint format (tuples as arrays); two keys are the same key when their encodings are equal
(as in Flink, which compares serialized keys), so ``1``, ``1.0`` and ``True`` — one key on the
heap — are three keys here. Per kind:

* Value / Reducing: one entry per key; value = msgpack of the value (tuples as an extension
  type) or, with a non-native serializer (pickle), msgpack bin of `serializer.dumps(value)`.
* List: one entry per key; value = msgpack array of the elements, so `add` appends bytes
  (rewrites the array header) without decoding the list — but it reads and rewrites the
  key's whole entry (rocksdict exposes no merge operator), so very long per-key lists are
  better kept in a MapState.
* Map: one entry per (key, user key): the RocksDB key ends with msgpack of the user key after
  the key, the value is the map value's wire element. `get`/`put`/`contains`/`remove` are
  point operations; `items`/`keys`/`is_empty`/`clear` scan the key's prefix (msgpack is
  self-delimiting, so one key's prefix never covers another key's entries).

Values are encoded at write time, so an unencodable value or key fails at the write that
stores it, not at the next checkpoint. Unlike the heap backend, a value read from state is a
fresh copy: changing it in place does not change the state; write it back with `update`/`put`
(the same contract as Flink's RocksDB backend).

Every state read and write goes through a bounded write-back cache of entries
(`write_cache.WriteCache`, `RocksDBConfig.write_cache_size`): a cached entry (or deletion) is
the truth for its key, RocksDB for the others. Per-row access to hot keys is then a dict lookup
and a dict store (values of `PLAIN_TYPES` held decoded, so `ValueState.value()` of a cached key
decodes nothing); dirty entries reach RocksDB in one write batch when the cache overflows, and
before anything reads the database directly — snapshots (synchronous part), prefix scans
(MapState iteration, key listings) — while restores flush and then empty it. Vectorized
`get_many`/`put_many` read cache hits and multi-get the rest, and write one batch straight to
RocksDB (refreshing cached entries of its keys), without filling the cache.
`flush_write_cache()` / `take_changes()` expose the flush (the latter with the RocksDB keys
changed since its previous call, for a changelog). The encodings of recent int and str keys
are remembered, so a row of a hot key does not re-encode it.

Full snapshots (savepoints always; checkpoints with `RocksDBConfig(incremental=False)`) are
written in the heap backend's canonical format
(`streamsnap.state.backends.hashmap`: one block per key group, checksummed, keys and values as
two parallel msgpack arrays), so checkpoints and savepoints restore into either backend and
rescale the same way (a restoring subtask reads only its key groups of each handle):

* `snapshot()` — synchronous part: creates a RocksDB iterator, which pins a consistent view
  of the database (memtables and SST files as they are now), and copies the state-id table.
  No serialization, no I/O. (The pinned memtables stay in memory until the snapshot ends,
  beyond the write-buffer bound.) (rocksdict's `Snapshot.iter` does not bind the snapshot to its
  iterators in 0.3.29, so the backend pins the view with an iterator created at once.)
* `Snapshot.run()` — asynchronous part, on any thread while the mailbox thread keeps writing:
  scans the pinned view and writes the blocks. Entries are already wire elements, so a block
  is built by concatenating bytes under msgpack array/map headers — no per-entry decode.

Incremental checkpoints (`RocksDBConfig.incremental`, the default) are the other snapshot
strategy, in `rocksdb_incremental`: a native RocksDB checkpoint (hard links) whose new SST files
are uploaded to the job's `shared/` directory and reference-counted by the coordinator's
SharedStateRegistry; savepoints stay full and canonical (this format). With
`RocksDBConfig(changelog=...)` checkpoints upload a log of the writes instead and RocksDB is
materialized in the background (`changelog`: hooks in `__init__`, `snapshot`, `restore`, the
notifications and `dispose`; writes are logged by wrapping `_db` and `_rocksdict`).

TTL states (`streamsnap.state.ttl`, classes in `rocksdb_ttl`) store each entry — value,
list element, map value — as the canonical TTL wire element ``[timestamp, element]`` with a
fixed layout: ``0x92 0xcf <timestamp: 8 bytes big-endian> <element>`` (a msgpack array of a
uint64 and the element), so the timestamp is read without decoding and a snapshot still
concatenates bytes. Full snapshots leave out entries expired at the snapshot's time (taken in
the synchronous part). rocksdict exposes no compaction filter, so RocksDB compactions keep
expired entries, and incremental checkpoints carry them until an access or a full snapshot
drops them; they are never returned, since a restored entry keeps its timestamp.

Task-local recovery (`streamsnap.state.local_recovery`): with a store, full snapshots and
incremental bundles are written to a local copy as well, new SST files are hard-linked into it,
and restores take each file from its verified local copy before checkpoint storage (in changelog
mode also the segments and manifests, see `changelog`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from copy import deepcopy
from dataclasses import dataclass
from typing import Any

import msgpack

from streamsnap.checkpoint import filesystem
from streamsnap.clock import Clock, SystemClock
from streamsnap.checkpoint.handles import (FileHandle, IncrementalKeyGroupsStateHandle,
                                           KeyGroupsStateHandle)
from streamsnap.errors import ConfigurationError, RestoreError
from streamsnap.state.assignment import SubtaskRestoreState
from streamsnap.state.backends.hashmap import (FORMAT_VERSION, MAGIC, _checksum, _CHECKSUM_BYTES,
                                               read_key_group_blocks)
from streamsnap.state.descriptors import (LIST, MAP, REDUCING, STATE_KINDS, VALUE,
                                          StateDescriptor)
from streamsnap.state.errors import StateError, StateSerializationError
from streamsnap.state.key_groups import KeyGroupRange, check_max_parallelism
from streamsnap.state.keyed_state import PLAIN_TYPES, check_map_key, put_many_values
from streamsnap.state.serialization import (Serializer, array_length, key_error, unpack_keys, unpack_value,
                                            value_default, value_error)
from streamsnap.state.backends import rocksdb_incremental
from streamsnap.state.backends.write_cache import ABSENT, UNDECODED, WriteCache
from streamsnap.state.backends.changelog import ChangelogConfig, KeyedChangelog, check_config
from streamsnap.state import local_recovery
from streamsnap.state.local_recovery import LocalRecoveryStore
from streamsnap.state.snapshot import StateSnapshot, safe_file_prefix
from streamsnap.state.ttl import (check_same_ttl, clock_millis, is_ttl_tag, state_tag,
                                 tag_mismatch)

log = logging.getLogger(__name__)

MIB = 1 << 20
LEVEL_BASE = 64 * MIB           # see _open_db
TARGET_FILE_SIZE = 8 * MIB
_MAX_STATES = 1 << 16
# int/str keys whose encoding a backend remembers (~1.6 MB), then forgets all at once
_ENCODED_KEYS = 1 << 14
COMPACTION_STYLES = ("universal", "level")
# Universal compaction: rewrite the bottom run once the newer runs add up to this share of it
# (RocksDB's default; with 100 the bottom run was rewritten within 80 checkpoints of 1 % of
# the keys, not with 200: 3.8 % of the live state uploaded per checkpoint on average instead of
# 3.0 %, at about the same full size — benchmarks/rocksdb_compaction.py);
# merge at least this many runs at a time (fewer, larger rewrites of the recent flushes).
_MAX_SPACE_AMPLIFICATION_PERCENT = 200
_MIN_MERGE_WIDTH = 4
DIRECTORY_PREFIX = "streamsnap-rocksdb-p"     # + "<pid>-<operator>-kg<first key group>-<random>"


# ---------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class RocksDBConfig:
    """Memory and disk of the RocksDB state backend, per operator subtask.

    block_cache_size: bytes of the LRU block cache (data, index and filter blocks) — the
      bound on RocksDB's read memory.
    write_buffer_size: bytes of one memtable; with `max_write_buffers` the bound on write memory
      (write_buffer_size × max_write_buffers).
    max_write_buffers: memtables kept before writes wait for a flush (>= 2 so one can flush
      while the other fills).
    local_dir: directory under which each subtask's database directory is created (it must be
      on a local disk); None: the system temp directory.
    incremental: checkpoints upload only the SST files not uploaded before (native RocksDB
      checkpoints, shared files reference-counted by the coordinator); False: every checkpoint
      is a full canonical snapshot. Savepoints are always full.
    write_cache_size: bytes of the write-back cache of entries in front of RocksDB (Python
      objects, counted approximately: see `write_cache`); hot keys' reads and writes stay in it
      and reach RocksDB in one write batch when it overflows and at every snapshot. 0: no
      cache, every write goes to RocksDB at once.
    changelog: True or a `ChangelogConfig`: every state write is also logged, a checkpoint
      uploads only the log since the last one, RocksDB is materialized in the background
      (`streamsnap.state.backends.changelog`); needs incremental=True.
    compaction: "universal" (the default) or "level", RocksDB's compaction style.
      Incremental checkpoints upload each checkpoint's flush (about what changed) plus the
      files compactions rewrote since the last one. Under updates spread over the key space
      every compaction into the large bottom run rewrites all of it; leveled compaction does
      so every `level0_compaction_trigger` flushes, universal compaction merges the flushes
      among themselves (runs of similar size) and rewrites the bottom run only once the
      newer runs add up to twice its size (space amplification bounded at 3x; in practice the
      merges of the newer runs keep it far lower). 1 % of 5 M keys (50.6 MB) updated per
      checkpoint, 80 checkpoints: universal 1.51 MB per checkpoint (3.0 % of the live state;
      full size 60 MB on average, 79 at most), leveled 2.94 MB (5.8 %), at the same CPU for
      the reads and writes (`benchmarks/rocksdb_compaction.py`).
    level0_compaction_trigger: flushes (level-0 files; sorted runs with universal
      compaction) that pile up before a compaction merges them. Larger: fewer rewrites, so
      smaller uploads on average; the price is disk space and a bloom-filter check per
      level-0 file on every read. RocksDB's default is 4; with leveled compaction 16 uploaded
      a third of what 4 did for 1 % of the keys changed per checkpoint, 32 halved 16's
      uploads again but made reads ~10 % (at worst ~1.8x) slower.
    """

    block_cache_size: int = 64 * MIB
    write_buffer_size: int = 16 * MIB
    max_write_buffers: int = 2
    local_dir: str | None = None
    incremental: bool = True
    write_cache_size: int = 16 * MIB
    changelog: ChangelogConfig | bool | None = None
    level0_compaction_trigger: int = 16
    compaction: str = "universal"

    def __post_init__(self):
        if not isinstance(self.incremental, bool):
            raise ConfigurationError(f"RocksDBConfig.incremental must be True or False, got "
                                     f"{self.incremental!r}")
        object.__setattr__(self, "changelog", check_config(self.changelog))
        if self.changelog is not None and not self.incremental:
            raise ConfigurationError("RocksDBConfig.changelog needs incremental=True: its "
                                     "materializations are incremental RocksDB snapshots")
        for name, minimum in (("block_cache_size", 64 * 1024), ("write_buffer_size", 64 * 1024),
                              ("max_write_buffers", 2), ("level0_compaction_trigger", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigurationError(
                    f"RocksDBConfig.{name} must be an integer >= {minimum}, got {value!r}")
        if self.compaction not in COMPACTION_STYLES:
            raise ConfigurationError(f"RocksDBConfig.compaction must be one of "
                                     f"{', '.join(map(repr, COMPACTION_STYLES))}, got {self.compaction!r}")
        size = self.write_cache_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ConfigurationError(f"RocksDBConfig.write_cache_size must be an integer >= 0 "
                                     f"(bytes; 0 turns the write cache off), got {size!r}")
        if self.local_dir is not None and (not isinstance(self.local_dir, (str, os.PathLike))
                                           or not str(self.local_dir).strip()):
            raise ConfigurationError(
                f"RocksDBConfig.local_dir must be a local directory path or None, got "
                f"{self.local_dir!r}")

    @property
    def memory_bound(self) -> int:
        """Bytes the backend may hold in memory for one subtask (block cache + memtables +
        write cache)."""
        return (self.block_cache_size + self.write_buffer_size * self.max_write_buffers
                + self.write_cache_size)


def import_rocksdict():
    """The `rocksdict` module, or a ConfigurationError saying how to install it."""
    try:
        import rocksdict
    except ImportError as e:
        raise ConfigurationError(
            f"state_backend='rocksdb' needs the rocksdict package (RocksDB for Python), which "
            f"cannot be imported here ({e}); install it with pip install 'rocksdict>=0.3.29' on "
            f"the driver and every Spark executor, or use state_backend='hashmap'") from e
    return rocksdict


def _open_db(path: str, config: RocksDBConfig):
    rocksdict = import_rocksdict()
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_write_buffer_size(config.write_buffer_size)
    options.set_max_write_buffer_number(config.max_write_buffers)
    # Incremental checkpoints upload the SST files written since the last one: each checkpoint
    # flushes its changes into one new level-0 file, and compactions rewrite older files. With
    # leveled compaction (`compaction="level"`; universal below, the default), under
    # updates spread over the key space every level-0 file overlaps every file below it, so each
    # compaction into a level rewrites all of it. Letting `level0_compaction_trigger` flushes
    # pile up in level 0 and merging them into the level below in one compaction makes most
    # uploads the flush alone, with one rewrite of the state every trigger flushes. 1 % of 5 M
    # keys changed per checkpoint, mean upload per checkpoint / 50 K sorted random multi-get
    # (one run, machine loaded): trigger 4: 22.9 % / 519 ms, 8: 10.8 % / 710 ms, 16: 7.5 % /
    # 571 ms, 32: ~3 % / 940 ms (median 1.1-1.8 % for all): reads check every level-0 file's
    # bloom filter, so the trigger trades uploads for reads. Level 0 also compacts once it
    # holds more than the 64 MiB first level (a bulk load's full memtables do not pile up),
    # and levels are sized from the bottom up, so a subtask's state up to ~640 MiB sits in one
    # level below level 0 (target file size 8 MiB).
    trigger = config.level0_compaction_trigger
    options.set_level_zero_file_num_compaction_trigger(trigger)
    options.set_level_zero_slowdown_writes_trigger(max(20, trigger + trigger // 2))
    options.set_level_zero_stop_writes_trigger(max(36, 2 * trigger))
    options.set_level_compaction_dynamic_level_bytes(True)
    options.set_max_bytes_for_level_base(LEVEL_BASE)
    options.set_target_file_size_base(TARGET_FILE_SIZE)
    if config.compaction == "universal":
        # See RocksDBConfig.compaction. `python -m benchmarks.rocksdb_compaction` (5 M keys,
        # 50.6 MB loaded, 1 % changed per checkpoint, 80 checkpoints, trigger 16): mean upload
        # per checkpoint 1.51 MB universal (0.54 flush + 0.96 compaction output; 1.92 MB with a
        # space-amplification bound of 100 %) against 2.94 MB leveled (0.54 + 2.39); full size
        # 60 MB on average (max 79) against 43.7 MB (max 54). A leveled trigger of 32 uploaded
        # 2.0 MB at ~10 % more CPU per interval (another run).
        universal = rocksdict.UniversalCompactOptions()
        universal.max_size_amplification_percent = _MAX_SPACE_AMPLIFICATION_PERCENT
        universal.min_merge_width = _MIN_MERGE_WIDTH
        options.set_compaction_style(rocksdict.DBCompactionStyle.universal())
        options.set_universal_compaction_options(universal)
    table = rocksdict.BlockBasedOptions()
    cache = rocksdict.Cache(config.block_cache_size)
    table.set_block_cache(cache)
    # Index and filter blocks live in the block cache, so memory stays bounded by it; they are
    # partitioned (two-level) because whole ones grow with the file (a 5 M-key file's bloom
    # filter is ~6 MiB) beyond a cache shard's share (the LRU cache has 64 shards), so each
    # lookup re-read them: random reads of 5 M keys went from 54 K to 198 K keys/s this way.
    # The small top levels stay pinned.
    table.set_cache_index_and_filter_blocks(True)
    table.set_bloom_filter(10, False)
    table.set_index_type(rocksdict.BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_metadata_block_size(4096)
    table.set_pin_top_level_index_and_filter(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    options.set_block_based_table_factory(table)
    db = rocksdict.Rdict(path, options)
    write_options = rocksdict.WriteOptions()
    write_options.disable_wal = True       # a working copy: recovery is from checkpoints
    db.set_write_options(write_options)
    return rocksdict, db, cache


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
# msgpack byte helpers


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x80 | n,))
    if n < 0x10000:
        return b"\xde" + n.to_bytes(2, "big")
    return b"\xdf" + n.to_bytes(4, "big")


def _array_count(raw: bytes) -> tuple[int, int]:
    """(element count, header length) of a msgpack array."""
    b = raw[0]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F, 1
    if b == 0xDC:
        return int.from_bytes(raw[1:3], "big"), 3
    if b == 0xDD:
        return int.from_bytes(raw[1:5], "big"), 5
    raise StateError(f"corrupt list state entry (first byte 0x{b:02x} is not a msgpack array)")


_FIXED = {0xC0: 1, 0xC2: 1, 0xC3: 1, 0xCC: 2, 0xD0: 2, 0xCD: 3, 0xD1: 3, 0xCE: 5, 0xD2: 5,
          0xCA: 5, 0xCF: 9, 0xD3: 9, 0xCB: 9, 0xD4: 3, 0xD5: 4, 0xD6: 6, 0xD7: 10, 0xD8: 18}


def _skip(buf: bytes, pos: int) -> int:
    """Position just after the msgpack object starting at `pos`."""
    b = buf[pos]
    if b <= 0x7F or b >= 0xE0:
        return pos + 1
    if 0xA0 <= b <= 0xBF:
        return pos + 1 + (b & 0x1F)
    if 0x90 <= b <= 0x9F:
        pos += 1
        for _ in range(b & 0x0F):
            pos = _skip(buf, pos)
        return pos
    if 0x80 <= b <= 0x8F:
        pos += 1
        for _ in range(2 * (b & 0x0F)):
            pos = _skip(buf, pos)
        return pos
    fixed = _FIXED.get(b)
    if fixed is not None:
        return pos + fixed
    if b in (0xD9, 0xC4):
        return pos + 2 + buf[pos + 1]
    if b in (0xDA, 0xC5):
        return pos + 3 + int.from_bytes(buf[pos + 1:pos + 3], "big")
    if b in (0xDB, 0xC6):
        return pos + 5 + int.from_bytes(buf[pos + 1:pos + 5], "big")
    if b == 0xC7:
        return pos + 3 + buf[pos + 1]
    if b == 0xC8:
        return pos + 4 + int.from_bytes(buf[pos + 1:pos + 3], "big")
    if b == 0xC9:
        return pos + 6 + int.from_bytes(buf[pos + 1:pos + 5], "big")
    if b in (0xDC, 0xDD, 0xDE, 0xDF):
        width = 2 if b in (0xDC, 0xDE) else 4
        n = int.from_bytes(buf[pos + 1:pos + 1 + width], "big") * (2 if b >= 0xDE else 1)
        pos += 1 + width
        for _ in range(n):
            pos = _skip(buf, pos)
        return pos
    raise StateError(f"corrupt state key (byte 0x{b:02x} does not start a msgpack object)")


def _successor(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with `prefix`."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes((stripped[-1] + 1,))


def _key_default(obj: Any) -> Any:
    import numpy as np
    if isinstance(obj, np.generic) and obj.dtype.kind in "biuf":
        return obj.item()
    raise TypeError(f"can not serialize {type(obj).__qualname__!r} object")


_local = threading.local()


def new_packers() -> tuple:
    """A (key packer, value packer) pair, for one thread at a time: reusing a Packer is ~5x
    faster than packb."""
    return (msgpack.Packer(use_bin_type=True, default=_key_default).pack,
            msgpack.Packer(use_bin_type=True, strict_types=True, default=value_default).pack)


def _packers() -> tuple:
    """This thread's `new_packers()`."""
    try:
        return _local.packers
    except AttributeError:
        _local.packers = new_packers()
        return _local.packers


def encode_key(key: Any) -> bytes:
    """msgpack of a key as the checkpoint format writes it (tuples as arrays)."""
    return _packers()[0](key)


def encode_value(value: Any) -> bytes:
    """`serialization.pack_value` (tuples as an extension type), with this thread's packer."""
    return _packers()[1](value)


def _decode_key(data: bytes) -> Any:
    return unpack_keys(b"\x91" + data)[0]


def _kg_bytes(key_group: int) -> bytes:
    return key_group.to_bytes(2, "big")


# TTL entries: msgpack [uint64 timestamp, element] with the timestamp always 8 bytes wide.
TTL_HEADER = b"\x92\xcf"
TTL_PREFIX_LEN = 10


def stamp(ts: int, element: bytes) -> bytes:
    """The stored form of a TTL entry written at `ts` (epoch ms)."""
    return TTL_HEADER + ts.to_bytes(8, "big") + element


def stamp_time(raw: bytes) -> int:
    """The timestamp of a stored TTL entry."""
    return int.from_bytes(raw[2:TTL_PREFIX_LEN], "big")


def split_ttl_list(raw: bytes) -> list[bytes]:
    """The stored TTL elements of a list entry (a msgpack array of them)."""
    n, pos = _array_count(raw)
    out = []
    for _ in range(n):
        end = _skip(raw, pos + TTL_PREFIX_LEN)
        out.append(raw[pos:end])
        pos = end
    return out


def live_ttl_list(raw: bytes, cutoff: int) -> bytes | None:
    """A stored TTL list without the elements stamped at or before `cutoff`; None if none is
    left (`raw` itself when none expired)."""
    elements = split_ttl_list(raw)
    live = [e for e in elements if stamp_time(e) > cutoff]
    if len(live) == len(elements):
        return raw
    return _array_header(len(live)) + b"".join(live) if live else None


def _ttl_wire_to_stored(kind: str, value: Any) -> Any:
    """Stored bytes of a decoded canonical TTL wire value (re-stamped in the fixed layout)."""
    if kind == LIST:
        return _array_header(len(value)) + b"".join(stamp(int(ts), encode_value(x))
                                                    for ts, x in value)
    if kind == MAP:
        return {uk: stamp(int(ts), encode_value(v)) for uk, (ts, v) in value.items()}
    ts, v = value
    return stamp(int(ts), encode_value(v))


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

    def _batch_keys(self, keys) -> list[bytes]:
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

    def get_many(self, keys) -> list:
        """Values of the batch's distinct keys (`BatchKeys.unique`), defaults where unset."""
        backend = self._backend
        backend._check_open(self.name)
        rkeys = self._batch_keys(keys)
        if not rkeys:
            return []
        decode = self._decode
        return [self._default_value() if raw is None else decode(raw)
                for raw in backend._read_many(rkeys)]

    def put_many(self, keys, values) -> None:
        """Set the values of the batch's distinct keys (aligned with `keys.unique`); None
        clears a key. One RocksDB write batch (cached entries of these keys follow it)."""
        values = put_many_values(self.name, keys, values)
        backend = self._backend
        backend._check_open(self.name)
        rkeys = self._batch_keys(keys)
        encode = self._encode
        backend._cache.write_through(
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

    def put(self, key: Any, value: Any) -> None:
        check_map_key(self.name, key)
        rkey = self._rkey()
        self._backend._cache.put(rkey + self._user_key(key), self._encode(value))

    def put_all(self, mapping: Mapping[Any, Any]) -> None:
        items = dict(mapping)
        if not items:
            return
        rkey = self._rkey()
        encoded = []
        for k, v in items.items():
            check_map_key(self.name, k)
            encoded.append((rkey + self._user_key(k), self._encode(v)))
        put = self._backend._cache.put
        for k, v in encoded:
            put(k, v)

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
        prefix = self._rkey()
        delete = self._backend._cache.delete
        for user_key, _ in list(self._backend._scan(prefix, len(prefix))):
            delete(prefix + user_key)


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


# ---------------------------------------------------------------------------------------------
# the backend


class RocksDBKeyedStateBackend:
    """Keyed state of one operator subtask in an embedded RocksDB, for the key groups it owns."""

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

    def _read_many(self, rkeys: list[bytes]) -> list[bytes | None]:
        """The stored bytes of several keys: cache hits, one multi-get for the misses (not
        cached: vectorized access would only churn the cache)."""
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
            for i, raw in zip(missing, self._db.get([rkeys[i] for i in missing])):
                out[i] = raw
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
            from streamsnap.state.backends.rocksdb_ttl import TTL_STATE_CLASSES as classes
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
        checkpoint, see `rocksdb_incremental`. Otherwise — savepoints, `full=True`, or
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


__all__ = ["RocksDBConfig", "RocksDBKeyedStateBackend", "RocksDBKeyedStateSnapshot",
           "RocksDBListState", "RocksDBMapState", "RocksDBReducingState", "RocksDBState",
           "RocksDBValueState", "canonical_entries", "encode_key", "import_rocksdict"]
