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
`get_many`/`put_many` (MapState: `get_all_many`/`put_all_many`) read cache hits and multi-get
the rest, and write one batch straight to RocksDB (refreshing cached entries of its keys),
without filling the cache.
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
strategy, in `rocksdb.incremental`: a native RocksDB checkpoint (hard links) whose new SST files
are uploaded to the job's `shared/` directory and reference-counted by the coordinator's
SharedStateRegistry; savepoints stay full and canonical (this format). With
`RocksDBConfig(changelog=...)` checkpoints upload a log of the writes instead and RocksDB is
materialized in the background (`changelog`: hooks in `__init__`, `snapshot`, `restore`, the
notifications and `dispose`; writes are logged by wrapping `_db` and `_rocksdict`).

TTL states (`streamsnap.state.ttl`, classes in `rocksdb.ttl`) store each entry — value,
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

The modules: `backend.py` (RocksDBKeyedStateBackend: the database's life, registering,
restoring, snapshot strategies), `config.py` (RocksDBConfig, opening a database), `states.py`
(the state kinds), `encoding.py` (keys, values, TTL stamps as bytes), `snapshot.py` (full
snapshots), `incremental.py` (incremental checkpoints), `ttl.py` (TTL state kinds),
`write_cache.py` (the write-back cache).
"""
