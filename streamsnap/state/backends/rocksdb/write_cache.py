"""A bounded write-back cache of RocksDB entries, in front of the RocksDB keyed state backend.

Why: per-row keyed state on RocksDB paid one native `get` and one native `put` through rocksdict
per state access (2-5 µs each from Python), several times the heap backend's whole cost of a
row. Per-row jobs touch a hot set of keys over and over; holding those entries here turns a
read into a dict lookup, a write into a dict store, and many puts into one write batch.

What it holds: RocksDB key -> the bytes the database would hold for it (None: no entry), plus,
when the state kind allows it, the decoded value (so a hit costs no msgpack decode either).
An entry is *dirty* when the database does not have it yet. The invariant every user of the
backend relies on: the cache's entry, when present, is the truth for its key; otherwise the
database is.

* `write_through(writes)` writes a batch to the database at once (a batch of map entries,
  already batched and mostly over cold keys) and refreshes the cached entries of its keys.
* `put_many(writes)` (a batch of values) writes the keys already cached in the cache, dirty,
  and the others to the database at once, uncached; `load_many` caches what a batch read from
  the database, for batches whose keys recur (`ValueState.get_many(hot=True)`): so only keys
  read or written before are held, and a batch of new keys does not evict the hot ones.
* `flush()` writes every dirty entry (puts and deletes) in one write batch and leaves them
  cached, clean. Whatever reads the database directly — prefix scans, snapshots, key listings —
  flushes first; whatever writes it directly (restores) flushes, then `clear()`s the cache.
* Memory: the cache counts its entries' bytes (key + stored bytes + `ENTRY_OVERHEAD` for the
  Python objects around them). When a write or load takes it above `bound`, it flushes and then
  drops the oldest entries (by first insertion) until it is at half the bound. `bound=0` keeps
  nothing: every write reaches the database at once.
* Change tracking (for a changelog, off by default): with `track_changes()` every key written
  to the database since the last `take_changes()` is remembered with its stored bytes,
  including writes done by eviction flushes; `take_changes()` flushes and returns them.

The cache does no I/O itself: `flush` hands the dirty entries to the `write` callable given at
construction (the backend turns them into one RocksDB write batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from streamsnap.state.errors import StateError


class _Marker:
    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __repr__(self) -> str:
        return self._name


ABSENT: Any = _Marker("ABSENT")          # decoded slot of an entry that does not exist
UNDECODED: Any = _Marker("UNDECODED")    # decoded slot when only the stored bytes are held

# Bytes of Python objects per cached entry beyond its key and stored bytes: the dict slot, the
# (value, raw) tuple, two bytes objects' headers, a small decoded value, a dirty-set slot.
ENTRY_OVERHEAD = 240

Writes = Sequence[tuple[bytes, "bytes | None"]]


class WriteCache:
    """RocksDB key -> (decoded value | UNDECODED | ABSENT, stored bytes | None), write-back.

    `entries` and `dirty` are public so that the state classes' hot paths can read them
    without a method call; every mutation goes through the methods, which keep the size
    accounting and the bound.
    """

    __slots__ = ("entries", "dirty", "size", "bound", "_write", "_changes", "flushes",
                 "evictions")

    def __init__(self, bound: int, write: Callable[[Writes], None]):
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
            raise StateError(f"the write cache bound must be an integer >= 0 (bytes), got "
                             f"{bound!r}")
        self.entries: dict[bytes, tuple[Any, bytes | None]] = {}
        self.dirty: set[bytes] = set()
        self.size = 0
        self.bound = bound
        self._write = write
        self._changes: dict[bytes, bytes | None] | None = None
        self.flushes = 0            # write batches written (explicit or by eviction)
        self.evictions = 0          # entries dropped to stay within the bound

    # -- reads -----------------------------------------------------------------------------

    def get(self, rkey: bytes) -> tuple[Any, bytes | None] | None:
        """The cached (decoded, stored bytes) of `rkey`, None when not cached."""
        return self.entries.get(rkey)

    def load(self, rkey: bytes, raw: bytes | None, value: Any = UNDECODED) -> None:
        """Cache what the database holds for `rkey` (clean); `value` is its decoded form when
        the caller may hand it out as is (immutable), else UNDECODED."""
        entries = self.entries
        old = entries.get(rkey)
        if old is not None:           # a read through a stale lookup must not undo a write
            return
        entries[rkey] = (ABSENT if raw is None else value, raw)
        self.size += ENTRY_OVERHEAD + len(rkey) + (0 if raw is None else len(raw))
        if self.size > self.bound:
            self._shrink()

    # -- writes ----------------------------------------------------------------------------

    def put(self, rkey: bytes, raw: bytes, value: Any = UNDECODED) -> None:
        """Store `raw` under `rkey` (dirty); `value` as in `load`."""
        entries = self.entries
        old = entries.get(rkey)
        if old is None:
            self.size += ENTRY_OVERHEAD + len(rkey) + len(raw)
        else:
            old_raw = old[1]
            self.size += len(raw) - (0 if old_raw is None else len(old_raw))
        entries[rkey] = (value, raw)
        self.dirty.add(rkey)
        if self.size > self.bound:
            self._shrink()

    def delete(self, rkey: bytes) -> None:
        """Remove `rkey`'s entry (a dirty tombstone until flushed)."""
        entries = self.entries
        old = entries.get(rkey)
        if old is None:
            self.size += ENTRY_OVERHEAD + len(rkey)
        elif old[1] is not None:
            self.size -= len(old[1])
        entries[rkey] = (ABSENT, None)
        self.dirty.add(rkey)
        if self.size > self.bound:
            self._shrink()

    def put_many(self, writes: Writes) -> None:
        """A batch's writes: those of cached keys stay in the cache (dirty), the others go to
        the database now, in one write batch."""
        entries = self.entries
        dirty = self.dirty
        size = self.size
        through = []
        for rkey, raw in writes:
            old = entries.get(rkey)
            if old is None:
                through.append((rkey, raw))
                continue
            size += (0 if raw is None else len(raw)) - (0 if old[1] is None else len(old[1]))
            entries[rkey] = (UNDECODED if raw is not None else ABSENT, raw)
            dirty.add(rkey)
        self.size = size
        if through:
            self._write(through)
            if self._changes is not None:
                self._changes.update(through)
        if size > self.bound:
            self._shrink()

    def load_many(self, loads) -> None:
        """Cache these (key, stored bytes) pairs read from the database, clean; a key already
        cached keeps its entry (it may hold a newer write), as in `load`."""
        entries = self.entries
        size = self.size
        for rkey, raw in loads:
            if rkey in entries:
                continue
            entries[rkey] = (UNDECODED, raw)
            size += ENTRY_OVERHEAD + len(rkey) + len(raw)
        self.size = size
        if size > self.bound:
            self._shrink()

    def write_through(self, writes: Writes) -> None:
        """Write `writes` (RocksDB key, stored bytes | None) to the database now, in one
        batch — for vectorized writes, already batched, whose keys are mostly not hot: cached
        entries of those keys are replaced by what was written (clean), others are not cached."""
        self._write(writes)
        entries = self.entries
        dirty = self.dirty
        for rkey, raw in writes:
            old = entries.get(rkey)
            if old is None:
                continue
            self.size += (0 if raw is None else len(raw)) - (0 if old[1] is None else len(old[1]))
            entries[rkey] = (UNDECODED if raw is not None else ABSENT, raw)
            dirty.discard(rkey)
        if self._changes is not None:
            self._changes.update(writes)
        if self.size > self.bound:
            self._shrink()

    def flush(self) -> dict[bytes, bytes | None]:
        """Write every dirty entry to the database in one batch; returns them (RocksDB key ->
        stored bytes, None for a deletion). They stay cached, clean. If the write fails they
        stay dirty."""
        dirty = self.dirty
        if not dirty:
            return {}
        entries = self.entries
        writes = {rkey: entries[rkey][1] for rkey in dirty}
        self._write(list(writes.items()))
        dirty.clear()
        self.flushes += 1
        if self._changes is not None:
            self._changes.update(writes)
        return writes

    def _shrink(self) -> None:
        """Flush, then drop the oldest entries until the cache is at half its bound."""
        self.flush()
        target = self.bound // 2
        size = self.size
        drop = []
        for rkey, (_, raw) in self.entries.items():
            if size <= target:
                break
            drop.append(rkey)
            size -= ENTRY_OVERHEAD + len(rkey) + (0 if raw is None else len(raw))
        entries = self.entries
        for rkey in drop:
            del entries[rkey]
        self.size = size
        self.evictions += len(drop)

    def forget(self, rkeys) -> None:
        """Drop these keys' entries, which must be clean (after `flush`): the database entries
        behind them were deleted directly (a range deletion)."""
        entries = self.entries
        for rkey in rkeys:
            old = entries.pop(rkey, None)
            if old is not None:
                self.size -= ENTRY_OVERHEAD + len(rkey) + (0 if old[1] is None else len(old[1]))

    def clear(self) -> None:
        """Forget every entry (after the database was changed directly). Dirty entries are
        lost: flush first unless the database is being thrown away."""
        self.entries.clear()
        self.dirty.clear()
        self.size = 0

    # -- change tracking (changelog) -------------------------------------------------------

    def track_changes(self) -> None:
        """From now on remember every key written to the database (see `take_changes`)."""
        if self._changes is None:
            self._changes = {}

    @property
    def tracking_changes(self) -> bool:
        return self._changes is not None

    def take_changes(self) -> dict[bytes, bytes | None]:
        """Flush; then every key written to the database since the previous call (or since
        `track_changes`), with its stored bytes now (None: deleted), and forget them."""
        if self._changes is None:
            raise StateError("take_changes needs change tracking: call track_changes() first "
                             "(before the writes whose keys it should report)")
        self.flush()
        changes, self._changes = self._changes, {}
        return changes

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return (f"WriteCache({len(self.entries)} entries, {len(self.dirty)} dirty, "
                f"{self.size}/{self.bound} bytes)")


__all__ = ["ABSENT", "ENTRY_OVERHEAD", "UNDECODED", "WriteCache"]
