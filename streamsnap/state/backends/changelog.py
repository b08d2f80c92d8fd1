"""Changelog checkpoints of the RocksDB keyed backend (Flink's changelog state backend,
FLIP-158): checkpoint time and size follow the state's *changes*, not RocksDB's files.

Why: an incremental RocksDB checkpoint uploads the SST files written since the last one, and
every memtable flush and compaction writes new ones — with 1 % of 10 M keys changed per
interval a checkpoint still wrote ~19 % of the state and took 1.5 s (flush + hard links + the
upload). Here every keyed-state write is also appended to a per-subtask log, and:

* a checkpoint's synchronous part only *cuts* the log (swaps the dict of writes since the last
  cut: last write per entry); its asynchronous part uploads the new segment(s) to the job's
  `shared/` directory (`changelog_segments` format) and a small private manifest;
* a *materialization* — a normal incremental RocksDB snapshot (`rocksdb.incremental`), its
  bundle in `shared/` too — is taken at a checkpoint's cut every `materialization_interval`
  seconds or once the log since the last one holds `max_log_bytes`, and uploaded in the
  background; later checkpoints reference it instead of the segments it covers, which are
  then forgotten;
* the completed checkpoint references (`ChangelogStateHandle`) the materialization and the
  segments after it; the coordinator's SharedStateRegistry counts references to all of these
  files, so subsuming a checkpoint never deletes what a retained one needs;
* restore = restore the materialization(s) (rescaling as `rocksdb.incremental` does), then
  replay the segments — merged in order first, so each entry is written once with its last
  write — only the key groups the subtask owns. A subtask restoring
  exactly one handle of its own key-group range continues that log; otherwise its next
  checkpoint materializes inline.

Savepoints, and any location outside the checkpoint storage layout, stay full and canonical.
Which segment and which materialization each checkpoint needs, what may be reused and what
forgotten is decided by the sans-I/O `changelog_bookkeeping`; this module is its I/O shell.

Writes are logged where they reach the database: the backend's database handle and its
`WriteBatch` factory are wrapped (`_LoggingDatabase`, `_LoggingModule`), so every state kind,
TTL states and batched writes are covered without a change to the state classes; reads go to
RocksDB directly. Restores write unlogged (the handle is unwrapped meanwhile).

Task-local recovery (`local_recovery=True`, `streamsnap.state.local_recovery`): segments and
manifests are written to the task's local store beside their upload, the materialization's
files by `rocksdb.incremental` (its bundle and SST files, in the local `shared/`). Each
checkpoint references the local copies of every file its handle names, and the changelog pins
those of the materializations it may still build on, so retention deletes exactly the copies
no longer needed: segments a confirmed materialization subsumed, older materializations, older
manifests. A restore reads each file from its local copy when that one has the recorded size and
checksum (the manifest: its own checksum and the handle's content), otherwise from checkpoint
storage — file by file, counted in the store's restore counters. A subtask that continues the
restored log references the restored files again (copies of the segments it had to download
are made then), so a second failure before the next checkpoint restores locally too.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

import msgpack

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.handles import (ChangelogSegmentHandle, ChangelogStateHandle, FileHandle,
                                           IncrementalKeyGroupsStateHandle, KeyGroupsStateHandle)
from streamsnap.checkpoint.storage import SHARED_DIR
from streamsnap.errors import ConfigurationError, RestoreError
from streamsnap.state.backends import changelog_segments
from streamsnap.state.backends.rocksdb import incremental as rocksdb_incremental
from streamsnap.state.backends.changelog_bookkeeping import (EMPTY, ChangelogBookkeeping, CheckpointPlan,
                                                             Materialization)
from streamsnap.state.backends.hashmap import _CHECKSUM_BYTES, _checksum
from streamsnap.state.errors import StateError
from streamsnap.state import local_recovery
from streamsnap.state.key_groups import KeyGroupRange
from streamsnap.state.local_recovery import LocalRecoveryStore
from streamsnap.state.snapshot import StateSnapshot, safe_file_prefix

if TYPE_CHECKING:
    from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend

log = logging.getLogger(__name__)

MIB = 1 << 20
MANIFEST_MAGIC = b"SSCHGMAN"
MANIFEST_VERSION = 1
_BATCH_ENTRIES = 20_000


@dataclass(frozen=True)
class ChangelogConfig:
    """The changelog mode of the RocksDB backend (`RocksDBConfig(changelog=...)`).

    materialization_interval: seconds between materializations (taken at the first
      checkpoint after the interval passed); longer: less uploaded, more log to replay on
      restore.
    max_log_bytes: materialize sooner once the log segments since the last materialization
      hold this many bytes (bounds restore time and the log kept in storage).
    """

    materialization_interval: float = 60.0
    max_log_bytes: int = 64 * MIB

    def __post_init__(self):
        value = self.materialization_interval
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigurationError(f"ChangelogConfig.materialization_interval must be a number of "
                                     f"seconds > 0, got {value!r}")
        value = self.max_log_bytes
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"ChangelogConfig.max_log_bytes must be an integer >= 1, got {value!r}")


def check_config(value) -> "ChangelogConfig | None":
    """`RocksDBConfig.changelog`: False/None (off), True (defaults) or a ChangelogConfig."""
    if value is None or value is False:
        return None
    if value is True:
        return ChangelogConfig()
    if isinstance(value, ChangelogConfig):
        return value
    raise ConfigurationError(f"RocksDBConfig.changelog must be True, False or a ChangelogConfig, got {value!r}")


# ---------------------------------------------------------------------------------------------
# logging the writes


class _RecordsWrites:
    """`put`/`delete` applied to `raw` (a database or a write batch) and recorded in `writes`
    (last write per key; None: deleted)."""

    __slots__ = ()
    raw: Any
    writes: dict[bytes, bytes | None]

    def put(self, key: bytes, value: bytes) -> None:
        self.raw.put(key, value)
        self.writes[key] = value

    def delete(self, key: bytes) -> None:
        self.raw.delete(key)
        self.writes[key] = None


class _LoggingBatch(_RecordsWrites):
    """A rocksdict WriteBatch that also records its writes."""

    __slots__ = ("raw", "writes")

    def __init__(self, batch):
        self.raw = batch
        self.writes: dict[bytes, bytes | None] = {}

    def __len__(self) -> int:
        return len(self.raw)

    def __getattr__(self, name: str):
        raise StateError(f"WriteBatch.{name} cannot be logged by the changelog; use put/delete")


class _LoggingDatabase(_RecordsWrites):
    """The backend's database: writes go to RocksDB and into `writes` (the current segment)."""

    __slots__ = ("raw", "writes", "get", "iter")

    def __init__(self, db):
        self.raw = db
        self.writes: dict[bytes, bytes | None] = {}
        self.get = db.get            # reads: straight to RocksDB
        self.iter = db.iter

    def write(self, batch) -> None:
        if not isinstance(batch, _LoggingBatch):
            raise StateError("a write batch that the changelog did not create was written to the "
                             "database; create it with backend._rocksdict.WriteBatch")
        self.raw.write(batch.raw)
        self.writes.update(batch.writes)

    def delete_range(self, *args):
        raise StateError("delete_range cannot be logged by the changelog")

    def __getattr__(self, name: str):
        return getattr(self.raw, name)


class _LoggingModule:
    """The `rocksdict` module as the backend sees it: write batches that log, checkpoints of
    the real database."""

    def __init__(self, module):
        self.raw = module

    def WriteBatch(self, *args, **kwargs) -> _LoggingBatch:  # noqa: N802 (rocksdict's name)
        return _LoggingBatch(self.raw.WriteBatch(*args, **kwargs))

    def Checkpoint(self, db):  # noqa: N802
        return self.raw.Checkpoint(db.raw if isinstance(db, _LoggingDatabase) else db)

    def __getattr__(self, name: str):
        return getattr(self.raw, name)


# ---------------------------------------------------------------------------------------------
# the manifest (the checkpoint's private file)


def _manifest(handle: ChangelogStateHandle) -> bytes:
    payload = msgpack.packb([MANIFEST_VERSION, handle.checkpoint_id,
                             [handle.key_group_start, handle.key_group_end],
                             handle.materialization_id, handle.materialized_upto,
                             [[s.seq, s.checksum] for s in handle.segments]], use_bin_type=True)
    return MANIFEST_MAGIC + payload + _checksum(payload)


def _read(handle: ChangelogStateHandle, file: FileHandle, base_location: str, operator_uid: str,
          what: str, local: LocalRecoveryStore | None = None,
          verify: Callable[[bytes], bool] = lambda data: True) -> tuple[bytes, str, bool]:
    """(bytes, a description naming the checkpoint and the file for errors, whether they are a
    verified local copy) of a file of `handle`, or RestoreError when it is missing or not of its
    recorded size. With task-local recovery (`local`) its local copy when `verify` accepts it,
    else the remote file (counted; the caller verifies it)."""
    url = filesystem.join(base_location, file.path)
    where = f"operator '{operator_uid}': checkpoint {handle.checkpoint_id}: the changelog {what} {url}"
    if local is not None:
        data = local.read(url, file.size, verify)
        if data is not None:
            return data, where, True
    data = filesystem.read_checked_file(url, file.size, where)
    if local is not None:
        local.count_remote(len(data))
    return data, where, False


def _check_manifest(handle: ChangelogStateHandle, base_location: str, operator_uid: str,
                    local: LocalRecoveryStore | None = None) -> None:
    """The manifest exists, is intact and names the handle's materialization and segments."""
    expected = _manifest(handle)
    data, where, _ = _read(handle, handle.file, base_location, operator_uid, "manifest", local,
                           lambda data: data == expected)
    payload = data[len(MANIFEST_MAGIC):-_CHECKSUM_BYTES]
    if not data.startswith(MANIFEST_MAGIC) or _checksum(payload) != data[-_CHECKSUM_BYTES:]:
        raise RestoreError(f"{where} is corrupt (bad header or checksum)")
    if data != expected:
        raise RestoreError(f"{where} does not match the checkpoint's metadata (another checkpoint's file?)")


def local_paths(local: LocalRecoveryStore, base_location: str, files: Sequence[FileHandle]) -> list[str]:
    """Where the local copies of a handle's `files` are (those with a local place)."""
    paths = (local.local_path(filesystem.join(base_location, f.path)) for f in files)
    return [p for p in paths if p is not None]


# ---------------------------------------------------------------------------------------------
# the changelog of one backend


class KeyedChangelog:
    """The changelog of one RocksDB keyed backend: logs its writes, snapshots, restores."""

    def __init__(self, backend: "RocksDBKeyedStateBackend", config: ChangelogConfig, *,
                 clock: Callable[[], float] = time.monotonic,
                 run_in_background: Callable[[Callable[[], None], str], Any] | None = None):
        self._backend = backend
        self.config = config
        self._clock = clock
        self._run_in_background = run_in_background or _start_thread
        self._lock = threading.Lock()
        self.book = ChangelogBookkeeping(config.materialization_interval, config.max_log_bytes, clock())
        self._materializations: dict[int, StateSnapshot] = {}   # running in the background
        self._prefix = safe_file_prefix(backend.operator_uid)
        self._pinned: set[int] = set()       # materializations whose local copies are pinned
        self._last_cut_at: float | None = None
        self._db: _LoggingDatabase | None = None
        self._attach()

    # -- the write hook ------------------------------------------------------------------

    def _attach(self) -> None:
        backend = self._backend
        self._db = _LoggingDatabase(backend._db)
        backend._db = self._db
        backend._rocksdict = _LoggingModule(backend._rocksdict)

    def _detach(self) -> None:
        backend = self._backend
        if isinstance(backend._db, _LoggingDatabase):
            backend._db = backend._db.raw
        if isinstance(backend._rocksdict, _LoggingModule):
            backend._rocksdict = backend._rocksdict.raw
        self._db = None

    # -- snapshots -----------------------------------------------------------------------

    def snapshot(self, checkpoint_id: int, location: str) -> "ChangelogSnapshot | None":
        """Synchronous part: cut the log (and take a materialization's RocksDB snapshot when
        one is due). None for locations outside the checkpoint storage layout (savepoints):
        the backend writes a full snapshot there."""
        shared = rocksdb_incremental.shared_directory_of(location)
        if shared is None:
            return None
        backend = self._backend
        content, self._db.writes = self._db.writes, {}
        states = {m.sid: (m.name, m.kind, m.tag) for m in backend._meta.values()}
        now = self._clock()
        with self._lock:
            plan = self.book.cut(checkpoint_id, content, now)
            reusable = self._reusable_uploads(shared)
            # A materialization due by the next cut (assumed as far off as the last one was):
            # flush the memtables now in RocksDB's background threads, so that cut's snapshot
            # flushes only one interval of writes (a full 2 x 16 MiB of memtables took ~0.5 s
            # inside the synchronous part).
            flush_ahead = (plan.start is None and self._last_cut_at is not None
                           and self.book.due_within(now, now - self._last_cut_at))
            self._unpin_unused_materializations()
        self._last_cut_at = now
        if flush_ahead:
            self._db.raw.flush(wait=False)
        inline = None
        if plan.start is not None:
            inline = self._start_materialization(plan, shared, reusable)
        return ChangelogSnapshot(self, plan, states, location, shared, inline)

    def _pin_name(self, materialization_id: int) -> str:
        return f"changelog of {self._backend.operator_uid}: materialization {materialization_id}"

    def _unpin_unused_materializations(self) -> None:
        """Task-local recovery: release the local copies of the materializations no later
        checkpoint will build on (called under `_lock` after the book changed)."""
        local = self._backend.local_store
        if local is None:
            return
        live = set(self.book.live_materializations())
        local.release([self._pin_name(i) for i in self._pinned - live])
        self._pinned = live

    def _reusable_uploads(self, shared: str) -> dict[str, rocksdb_incremental.Upload]:
        """The SST uploads of the base materialization (a completed checkpoint holds them)."""
        base = self.book.base
        handle = None if base is None else base.handle
        if handle is None:
            return {}
        return {name: rocksdb_incremental.Upload(filesystem.join(shared, f.path.rsplit("/", 1)[-1]),
                                                 f.size, checksum)
                for name, f, checksum in zip(handle.sst_names, handle.shared_files, handle.checksums)}

    def _start_materialization(self, plan: CheckpointPlan, shared: str, reusable: dict
                               ) -> "StateSnapshot | None":
        """Take the RocksDB snapshot of `plan.start` now; upload it in the background, or
        return it for the checkpoint's asynchronous part when it is inline."""
        m = plan.start
        try:
            snapshot = rocksdb_incremental.take_snapshot(self._backend, m.id, shared, shared, reusable,
                                                         pin=self._pin_name(m.id))
        except Exception as e:
            with self._lock:
                self.book.materialization_failed(m.id)
                self._unpin_unused_materializations()
            if plan.inline:
                raise
            log.warning("operator '%s': the RocksDB snapshot of a materialization at checkpoint %d "
                        "failed: %r; the next one starts when due", self._backend.operator_uid, m.id, e)
            return None
        if snapshot is None:          # an empty database: the empty state
            with self._lock:
                self.book.materialization_finished(m.id, None)
            return None
        if plan.inline:
            return snapshot
        with self._lock:
            self._materializations[m.id] = snapshot
        self._run_in_background(lambda: self._materialize(m, snapshot),
                                f"materialize {self._backend.operator_uid} at checkpoint {m.id}")
        return None

    def _materialize(self, m: Materialization, snapshot) -> None:
        """Background: upload a materialization, hand it to the bookkeeping."""
        try:
            handle = shared_materialization(snapshot.run())
        except BaseException as e:
            log.warning("operator '%s': materialization at checkpoint %d failed: %r; the log keeps "
                        "growing until the next one", self._backend.operator_uid, m.id, e)
            with self._lock:
                self._materializations.pop(m.id, None)
                self.book.materialization_failed(m.id)
                self._unpin_unused_materializations()
            return
        with self._lock:
            self._materializations.pop(m.id, None)
            accepted = self.book.materialization_finished(m.id, handle)
        if not accepted:
            snapshot.discard()

    def wait_for_materializations(self, timeout: float = 60.0) -> None:
        """Block until no materialization runs in the background (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._materializations:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"materializations still running after {timeout} s")
            time.sleep(0.01)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Before the local store's retention runs (the backend calls this first)."""
        with self._lock:
            self.book.checkpoint_complete(checkpoint_id)
            self._unpin_unused_materializations()

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        with self._lock:
            self.book.checkpoint_aborted(checkpoint_id)
            self._unpin_unused_materializations()

    # -- restore -------------------------------------------------------------------------

    def restore(self, handles: Sequence[Any], base_location: str) -> None:
        """Restore the backend's key groups from any keyed handles (changelog, incremental,
        full); continue the restored log when that is possible (see the module docstring)."""
        backend = self._backend
        mine = backend.key_group_range
        changelog, incremental, full = [], [], []
        for h in handles:
            if h is None:
                continue
            if isinstance(h, ChangelogStateHandle):
                changelog.append(h)
            elif isinstance(h, IncrementalKeyGroupsStateHandle):
                incremental.append(h)
            elif isinstance(h, KeyGroupsStateHandle):
                full.append(h)
            else:
                raise RestoreError(f"operator '{backend.operator_uid}': cannot restore keyed state from a "
                                   f"{type(h).__name__}")
        changelog = [h for h in changelog
                     if mine.overlaps(KeyGroupRange(h.key_group_start, h.key_group_end))]
        local = backend.local_store
        # The restored log continues: exactly one changelog handle, of exactly this range.
        continues = (len(changelog) == 1 and not incremental and not full and
                     (changelog[0].key_group_start, changelog[0].key_group_end) == (mine.start, mine.end))
        self._detach()
        try:
            for h in changelog:
                _check_manifest(h, base_location, backend.operator_uid, local)
            materialized = [h.materialization for h in changelog if h.materialization is not None]
            if materialized or incremental:
                rocksdb_incremental.restore(backend, [*materialized, *incremental], base_location)
            for h in full:
                backend._restore_handle(h, base_location)
            for h in sorted(changelog, key=lambda h: h.key_group_start):
                self._replay(h, base_location, keep_copies=continues)
        finally:
            self._attach()
        with self._lock:
            if continues:
                h = changelog[0]
                base = None if h.materialization_id == EMPTY else Materialization(
                    h.materialization_id, h.materialized_upto, h.materialization, finished=True)
                self.book.restored(base, [(s.seq, s, s.file.size) for s in h.segments])
                if local is not None:
                    self._keep_restored(h, base_location, local)
            elif changelog or incremental or full:
                self.book.restored_without_log()
            self._unpin_unused_materializations()

    def _keep_restored(self, handle: ChangelogStateHandle, base_location: str,
                       local: LocalRecoveryStore) -> None:
        """The restored log continues: its next checkpoints reference the restored files, so
        retention keeps their local copies (the materialization's pinned while it is the base)."""
        if handle.materialization is not None:
            m = handle.materialization
            local.pin(self._pin_name(handle.materialization_id),
                      local_paths(local, base_location, (m.file, *m.shared_files)))
        local.reference(handle.checkpoint_id, local_paths(local, base_location, handle.shared_files))

    def _replay(self, handle: ChangelogStateHandle, base_location: str, keep_copies: bool = False) -> None:
        """Apply a handle's segments in order, merged first: an entry written in several
        segments reaches RocksDB once, with its last write, and the writes go in key order."""
        backend = self._backend
        merged: dict[bytes, bytes | None] = {}
        for segment in handle.segments:
            data, where = read_segment(handle, segment, base_location, backend.operator_uid,
                                       backend.local_store, keep_copies)
            for kg, table, keys, values in changelog_segments.iter_blocks(data, where, backend.key_group_range):
                sids = {int(sid).to_bytes(2, "big"): backend._state_id(name, kind, tag)
                        for sid, name, kind, tag in table}
                prefix = kg.to_bytes(2, "big")
                for key, value in zip(keys, values):
                    try:
                        merged[prefix + sids[key[:2]] + key[2:]] = value
                    except KeyError:
                        raise RestoreError(f"{where} holds an entry of state id {key[:2].hex()} that its "
                                           f"block does not name") from None
        db, module = backend._db, backend._rocksdict
        batch = module.WriteBatch(raw_mode=True)
        for rkey in sorted(merged):
            value = merged[rkey]
            if value is None:
                batch.delete(rkey)
            else:
                batch.put(rkey, value)
            if len(batch) >= _BATCH_ENTRIES:
                db.write(batch)
                batch = module.WriteBatch(raw_mode=True)
        if len(batch):
            db.write(batch)

    # -- lifecycle -----------------------------------------------------------------------

    def dispose(self) -> None:
        """Abandon background materializations (their files are deleted)."""
        with self._lock:
            running = list(self._materializations.values())
            self._materializations.clear()
        for snapshot in running:
            snapshot.discard()


def _start_thread(fn: Callable[[], None], name: str) -> threading.Thread:
    thread = threading.Thread(target=fn, name=name, daemon=True)
    thread.start()
    return thread


def shared_materialization(handle: IncrementalKeyGroupsStateHandle | None
                           ) -> IncrementalKeyGroupsStateHandle | None:
    """A materialization's handle with its bundle named from a checkpoint directory (it was
    written into `shared/`, like its SST files)."""
    if handle is None:
        return None
    return replace(handle, file=FileHandle(f"../{SHARED_DIR}/{handle.file.path}", handle.file.size))


def read_segment(handle: ChangelogStateHandle, segment: ChangelogSegmentHandle, base_location: str,
                 operator_uid: str, local: LocalRecoveryStore | None = None,
                 keep_copy: bool = False) -> tuple[bytes, str]:
    """(bytes, description for errors) of a segment file, checked against its recorded size
    and checksum; RestoreError naming the checkpoint and the file otherwise. With task-local
    recovery (`local`) from its local copy when that one verifies; `keep_copy`: a segment read
    from storage gets a local copy (the restored log continues, so later checkpoints reuse it)."""
    def intact(data: bytes) -> bool:
        return changelog_segments.checksum_of(data) == segment.checksum

    data, where, from_local = _read(handle, segment.file, base_location, operator_uid, "segment",
                                    local, intact)
    if not from_local:
        if not intact(data):
            raise RestoreError(f"{where} is corrupt: its checksum does not match the one recorded when "
                               f"it was uploaded")
        if local is not None and keep_copy:
            local.keep_bytes(data, filesystem.join(base_location, segment.file.path))
    return data, where


class ChangelogSnapshot(StateSnapshot[ChangelogStateHandle]):
    """Asynchronous part of a changelog checkpoint: upload the new segments (and an inline
    materialization), write the manifest."""

    def __init__(self, changelog: KeyedChangelog, plan: CheckpointPlan, states: dict, location: str,
                 shared: str, inline: StateSnapshot | None):
        super().__init__(plan.checkpoint_id, location,
                         f"changelog snapshot of operator '{changelog._backend.operator_uid}'")
        self._changelog = changelog
        self._plan: CheckpointPlan | None = plan
        self._states = states
        self._shared = filesystem.normalize(shared).rstrip("/")
        self._inline = inline
        self._new_urls: list[str] = []
        self._local_store = changelog._backend.local_store
        self.uploaded_bytes = 0          # new segments + inline materialization + manifest
        self.reused_bytes = 0

    def _written_urls(self) -> list[str]:
        return [*self._new_urls, *super()._written_urls()]

    def _release(self) -> None:
        self._plan = None
        self._states = {}

    def run(self) -> ChangelogStateHandle | None:
        try:
            return super().run()
        except BaseException:
            if self._inline is not None:    # its files (or its pinned RocksDB snapshot) go too
                self._inline.discard()
            raise

    def discard(self) -> None:
        super().discard()
        if self._inline is not None:
            self._inline.discard()

    def _write(self) -> ChangelogStateHandle:
        changelog, plan = self._changelog, self._plan
        backend = changelog._backend
        segments, new_flags = [], []
        for s in plan.segments:
            self._check_not_discarded()
            if not s.new:
                segments.append(s.upload)
                new_flags.append(False)
                self.reused_bytes += s.upload.file.size
                continue
            data = changelog_segments.encode_segment(s.content, self._states)
            name = filesystem.unique_name(f"{changelog._prefix}-changelog-{s.seq}")
            url = filesystem.join(self._shared, name)
            self._new_urls.append(url)
            with local_recovery.open_write(url, self._local_store) as out:
                out.write(data)
            upload = ChangelogSegmentHandle(s.seq, FileHandle(f"../{SHARED_DIR}/{name}", len(data)),
                                            changelog_segments.checksum_of(data))
            with changelog._lock:
                changelog.book.segment_uploaded(self.checkpoint_id, s.seq, upload, len(data))
            segments.append(upload)
            new_flags.append(True)
            self.uploaded_bytes += len(data)
        m = plan.materialization
        handle = None if m is None else m.handle
        if plan.inline and self._inline is not None:
            self._check_not_discarded()
            handle = shared_materialization(self._inline.run())
            with changelog._lock:
                accepted = changelog.book.materialization_finished(m.id, handle)
            if not accepted:
                raise StateError(f"{self._what} of checkpoint {self.checkpoint_id}: its materialization "
                                 f"was abandoned while it was uploaded")
            self.uploaded_bytes += handle.incremental_size
        elif m is not None and plan.materialization_new and handle is not None:
            self.uploaded_bytes += handle.incremental_size
        kg_range = backend.key_group_range
        result = ChangelogStateHandle(
            FileHandle("", 0), kg_range.start, kg_range.end, self.checkpoint_id,
            EMPTY if m is None else m.id, EMPTY if m is None else m.upto, handle,
            plan.materialization_new, tuple(segments), tuple(new_flags))
        data = _manifest(result)
        name = filesystem.unique_name(f"{changelog._prefix}-changelog-manifest")
        self._url = filesystem.join(self.location, name)
        with local_recovery.open_write(self._url, self._local_store) as out:
            out.write(data)
        self.uploaded_bytes += len(data)
        if self._local_store is not None:
            # Retention keeps every local file this checkpoint's restore needs while it is the
            # latest (the manifest goes with its chk-<n> directory).
            self._local_store.reference(self.checkpoint_id,
                                        local_paths(self._local_store, self.location, result.shared_files))
        return replace(result, file=FileHandle(name, len(data)))


__all__ = ["ChangelogConfig", "ChangelogSnapshot", "KeyedChangelog", "check_config", "read_segment",
           "shared_materialization"]
