"""Incremental checkpoints of the RocksDB keyed state backend (Flink's
RocksIncrementalSnapshotStrategy and RocksDBIncrementalRestoreOperation).

Snapshot:

* synchronous part (mailbox thread): a native RocksDB checkpoint (`rocksdict.Checkpoint`) into
  a local per-snapshot directory under the backend's working directory. RocksDB flushes the
  memtables and hard-links the immutable SST files, so the cost is bounded by the write buffers,
  not by the state size. The state-id table and the set of SST files already uploaded are
  captured with it.
* asynchronous part (`IncrementalSnapshot.run`, any thread): SST files that the last completed
  checkpoint of this backend already uploaded are referenced again; the others are uploaded
  under unique names into the job's `shared/` directory. The small files (MANIFEST, CURRENT,
  OPTIONS, the empty WAL) and the state-id table go into one private *bundle* file inside the
  checkpoint directory. The handle (`IncrementalKeyGroupsStateHandle`) lists both; the
  coordinator's SharedStateRegistry reference-counts the shared files.

Which uploads may be reused: only those of the checkpoint most recently confirmed complete to
this backend (`notify_checkpoint_complete`), as Flink does, since the files of a checkpoint that
was aborted may already be deleted. A checkpoint completing on the coordinator between the
task's snapshot and its acknowledgement can still subsume the one whose files are reused; the
coordinator detects that (the file is no longer registered when the acknowledgement arrives)
and aborts the checkpoint (`SHARED_STATE_DISCARDED`); the next one uploads afresh.

Incremental snapshots are taken only into a checkpoint location of the checkpoint storage
layout (`<job>/chk-<n>` beside `<job>/shared/`); savepoints, and any other location, get the
backend's full canonical snapshot (self-contained, readable by the heap backend).

Restore: the files are downloaded into a fresh local database directory and opened. A subtask
whose key-group range equals the handle's adopts the database as is (and may reuse its SST
uploads for its next checkpoint). When rescaling, the handle overlapping most becomes the
database, the key groups the subtask does not own are deleted (`delete_range`), and the entries
of the subtask's key groups in the other handles are copied in (state ids remapped by name).

Task-local recovery (`streamsnap.state.local_recovery`): each uploaded SST file is also
hard-linked into the task's local store and the bundle written there too; a restore takes every
SST file whose local copy has the handle's size and xxh64 (as a hard link), and the bundle when
its local copy's checksum holds, and downloads the rest.

Bundle file format: ``b"SSRDBINC" msgpack([version, checkpoint_id, [kg start, kg end],
[[state id, name, kind, tag], ...], {file name: bytes}]) xxh64(msgpack)``.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from typing import TYPE_CHECKING, NamedTuple, Sequence

import msgpack
import xxhash

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.handles import FileHandle, IncrementalKeyGroupsStateHandle
from streamsnap.checkpoint.storage import SHARED_DIR, checkpoint_id_of, is_directory
from streamsnap.errors import RestoreError
from streamsnap.state.backends.hashmap import _checksum, _CHECKSUM_BYTES
from streamsnap.state import local_recovery
from streamsnap.state.local_recovery import LocalRecoveryStore
from streamsnap.state.snapshot import StateSnapshot, safe_file_prefix

if TYPE_CHECKING:
    from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend

log = logging.getLogger(__name__)

BUNDLE_MAGIC = b"SSRDBINC"
BUNDLE_VERSION = 1
SST_SUFFIX = ".sst"
# Large enough that an SST file is copied with one read and one write: the asynchronous
# snapshot thread retakes the GIL after each, which can take many switch intervals beside a busy
# task thread (see hashmap._CoalescedWriter).
_COPY_CHUNK = 64 << 20
_BATCH_ENTRIES = 20_000


def shared_directory_of(location: str) -> str | None:
    """The job's `shared/` directory when `location` is a `chk-<n>` directory of the checkpoint
    storage layout (the shared directory exists beside it — on an object store, which has no
    empty directories, the `chk-<n>` name is enough); None for anything else (savepoints, bare
    directories), which then get full snapshots."""
    url = filesystem.normalize(location).rstrip("/")
    parent, _, name = url.rpartition("/")
    if checkpoint_id_of(name) is None or not parent:
        return None
    shared = filesystem.join(parent, SHARED_DIR)
    try:
        return shared if not filesystem.has_directories(shared) or is_directory(shared) else None
    except OSError:
        return None


class Upload(NamedTuple):
    """An SST file in checkpoint storage: absolute URL, size and xxh64 (hex)."""

    url: str
    size: int
    checksum: str


class UploadTracker:
    """The SST files a backend uploaded, per checkpoint, and those it may reuse: the uploads
    of the last checkpoint confirmed complete (or restored from). Thread-safe: snapshots run
    on other threads than the notifications."""

    def __init__(self):
        self._lock = threading.Lock()
        self._confirmed: dict[str, Upload] = {}      # by the database's SST file name
        self._confirmed_id = -1
        self._pending: dict[int, dict[str, Upload]] = {}

    def reusable(self) -> dict[str, Upload]:
        with self._lock:
            return dict(self._confirmed)

    @property
    def confirmed_checkpoint_id(self) -> int:
        return self._confirmed_id

    def record(self, checkpoint_id: int, files: dict[str, Upload]) -> None:
        with self._lock:
            if checkpoint_id > self._confirmed_id:
                self._pending[checkpoint_id] = dict(files)

    def notify_complete(self, checkpoint_id: int) -> None:
        """Checkpoint `checkpoint_id` completed: its uploads become the reusable set (none, if
        this backend took no incremental snapshot for it), older ones are forgotten."""
        with self._lock:
            if checkpoint_id <= self._confirmed_id:
                return
            self._confirmed = self._pending.get(checkpoint_id, {})
            self._confirmed_id = checkpoint_id
            self._pending = {i: f for i, f in self._pending.items() if i > checkpoint_id}

    def restored(self, checkpoint_id: int, files: dict[str, Upload]) -> None:
        with self._lock:
            self._confirmed = dict(files)
            self._confirmed_id = checkpoint_id
            self._pending.clear()


# ---------------------------------------------------------------------------------------------
# snapshot


def take_snapshot(backend: "RocksDBKeyedStateBackend", checkpoint_id: int, location: str,
                  shared_directory: str, reusable: dict[str, Upload] | None = None,
                  pin: str | None = None) -> "IncrementalSnapshot | None":
    """Synchronous part: a native RocksDB checkpoint into a local directory (flush + hard
    links). None when the database is empty (the caller returns an empty snapshot).
    `reusable`: the uploads it may reference again (default: those of the last checkpoint
    confirmed to the backend; the changelog passes its materialization's). `pin`: task-local
    copies are pinned under this name (a changelog's materialization) instead of being
    referenced by the checkpoint."""
    iterator = backend._db.iter()
    iterator.seek_to_first()
    if not iterator.valid():
        return None
    del iterator
    token = backend._register_snapshot()
    local = os.path.join(backend.directory, f"snapshot-{checkpoint_id}-{token}")
    try:
        backend._rocksdict.Checkpoint(backend._db).create_checkpoint(local)
    except BaseException:
        shutil.rmtree(local, ignore_errors=True)
        backend._release_snapshot(token)
        raise
    states = {m.sid: (m.name, m.kind, m.tag) for m in backend._meta.values()}
    return IncrementalSnapshot(backend, token, checkpoint_id, location, local, shared_directory,
                               states, backend._uploads.reusable() if reusable is None else reusable, pin)


def _upload(path: str, url: str) -> str:
    """Copy a local file to storage as one whole-file transfer (retried on an object store's
    transient errors, filesystem.upload); returns its xxh64 (hex)."""
    digest = xxhash.xxh64()
    with open(path, "rb") as source:
        while chunk := source.read(_COPY_CHUNK):
            digest.update(chunk)
    filesystem.upload(path, url)
    return digest.hexdigest()


class IncrementalSnapshot(StateSnapshot[IncrementalKeyGroupsStateHandle]):
    """Asynchronous part: upload new SST files to `shared/`, bundle the rest privately."""

    def __init__(self, backend: "RocksDBKeyedStateBackend", token: int, checkpoint_id: int,
                 location: str, local_directory: str, shared_directory: str,
                 states: dict[bytes, tuple[str, str, str]], reusable: dict[str, Upload],
                 pin: str | None = None):
        super().__init__(checkpoint_id, location,
                         f"incremental keyed snapshot of operator '{backend.operator_uid}'")
        self._backend = backend
        self._token: int | None = token
        self._local = local_directory
        self._shared = filesystem.normalize(shared_directory).rstrip("/")
        self._states = states
        self._reusable = reusable
        self._new_urls: list[str] = []
        self._local_store = backend.local_store
        self._pin = pin
        self.uploaded_bytes = 0         # new SST bytes + the bundle (for tests and metrics)
        self.reused_bytes = 0

    def _written_urls(self) -> list[str]:
        return [*self._new_urls, *super()._written_urls()]

    def _release(self) -> None:
        shutil.rmtree(self._local, ignore_errors=True)
        if self._token is not None:
            self._backend._release_snapshot(self._token)
            self._token = None

    def _write(self) -> IncrementalKeyGroupsStateHandle:
        backend = self._backend
        prefix = safe_file_prefix(backend.operator_uid)
        names = sorted(os.listdir(self._local))
        shared_prefix = self._shared + "/"
        handles, sst_names, new_flags, checksums = [], [], [], []
        uploads: dict[str, Upload] = {}
        private: dict[str, bytes] = {}
        for name in names:
            path = os.path.join(self._local, name)
            if not name.endswith(SST_SUFFIX):
                with open(path, "rb") as f:
                    private[name] = f.read()
                continue
            self._check_not_discarded()
            size = os.path.getsize(path)
            prior = self._reusable.get(name)
            if prior is not None and prior.size == size and prior.url.startswith(shared_prefix):
                url, new, checksum = prior.url, False, prior.checksum
                self.reused_bytes += size
            else:
                url = filesystem.join(self._shared,
                                      filesystem.unique_name(f"{prefix}-{name[:-len(SST_SUFFIX)]}")
                                      + SST_SUFFIX)
                self._new_urls.append(url)
                checksum = _upload(path, url)
                new = True
                self.uploaded_bytes += size
            uploads[name] = Upload(url, size, checksum)
            if self._local_store is not None:
                # The SST file is immutable: its local copy is a hard link (an existing copy of
                # a reused upload is kept; a missing one, e.g. after a remote restore, is made).
                self._local_store.keep_file(path, url, pinned_by=self._pin,
                                            referenced_by=None if self._pin else self.checkpoint_id)
            handles.append(FileHandle(f"../{SHARED_DIR}/{url.rsplit('/', 1)[-1]}", size))
            sst_names.append(name)
            new_flags.append(new)
            checksums.append(checksum)
        self._check_not_discarded()
        kg_range = backend.key_group_range
        payload = msgpack.packb(
            [BUNDLE_VERSION, self.checkpoint_id, [kg_range.start, kg_range.end],
             [[int.from_bytes(sid, "big"), n, k, t] for sid, (n, k, t) in sorted(self._states.items())],
             private], use_bin_type=True)
        data = BUNDLE_MAGIC + payload + _checksum(payload)
        bundle = filesystem.unique_name(f"{prefix}-keyed-incremental")
        self._url = filesystem.join(self.location, bundle)
        with local_recovery.open_write(self._url, self._local_store) as out:
            out.write(data)
        if self._local_store is not None and self._pin is not None:
            self._local_store.pin(self._pin, [p for p in [self._local_store.local_path(self._url)] if p])
        self.uploaded_bytes += len(data)
        backend._uploads.record(self.checkpoint_id, uploads)
        return IncrementalKeyGroupsStateHandle(
            FileHandle(bundle, len(data)), kg_range.start, kg_range.end, self.checkpoint_id,
            tuple(handles), tuple(sst_names), tuple(new_flags), tuple(checksums))


# ---------------------------------------------------------------------------------------------
# restore


def _read_bundle(handle: IncrementalKeyGroupsStateHandle, url: str, operator_uid: str) -> tuple:
    """(states [[sid, name, kind, tag]], {file name: bytes}) of a handle's private bundle."""
    where = f"operator '{operator_uid}': checkpoint {handle.checkpoint_id}"
    data = filesystem.read_checked_file(url, None, f"{where}: the incremental snapshot file {url}")
    return _parse_bundle(handle, data, url, operator_uid)


def _parse_bundle(handle: IncrementalKeyGroupsStateHandle, data: bytes, url: str, operator_uid: str) -> tuple:
    """`_read_bundle` of the bytes `data` read from `url`."""
    where = f"operator '{operator_uid}': checkpoint {handle.checkpoint_id}"
    if len(data) < len(BUNDLE_MAGIC) + _CHECKSUM_BYTES or not data.startswith(BUNDLE_MAGIC):
        raise RestoreError(f"{where}: {url} is not an incremental RocksDB snapshot file (bad "
                           f"header or truncated)")
    payload = data[len(BUNDLE_MAGIC):-_CHECKSUM_BYTES]
    if _checksum(payload) != data[-_CHECKSUM_BYTES:]:
        raise RestoreError(f"{where}: the incremental snapshot file {url} is corrupt (checksum "
                           f"mismatch)")
    try:
        version, _, _, states, files = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, TypeError) as e:
        raise RestoreError(f"{where}: the incremental snapshot file {url} is malformed: {e}") from e
    if version != BUNDLE_VERSION:
        raise RestoreError(f"{where}: {url} has incremental format v{version}; this streamsnap "
                           f"reads v{BUNDLE_VERSION}")
    return states, files


def bundle_states(handle: IncrementalKeyGroupsStateHandle, base_location: str,
                  operator_uid: str) -> list[tuple[str, str, str]]:
    """(name, kind, serializer tag) of each state of a handle's database, from its small
    private bundle alone (no SST file is read): what the offline state reader plans with."""
    states, _ = _read_bundle(handle, filesystem.join(base_location, handle.file.path), operator_uid)
    return [(str(name), str(kind), str(tag)) for _, name, kind, tag in states]


def download(handle: IncrementalKeyGroupsStateHandle, base_location: str, target: str,
             operator_uid: str, local: LocalRecoveryStore | None = None,
             keep_copies: bool = False) -> list[list]:
    """Download a handle's database into the new directory `target`; returns its state-id
    table. A missing or truncated file raises RestoreError naming the checkpoint and file.
    With task-local recovery (`local`), each file whose local copy verifies (size and
    checksum) is taken from it instead — SST files as hard links — and counted;
    `keep_copies`: the files read from storage get local copies (the restored database is
    adopted as is, so the next checkpoints reference them)."""
    where = f"operator '{operator_uid}': checkpoint {handle.checkpoint_id}"
    states, files = _bundle(handle, filesystem.join(base_location, handle.file.path),
                            operator_uid, local, keep_copies)
    os.makedirs(target)
    for name, content in files.items():
        if "/" in name or name in ("", ".", ".."):
            raise RestoreError(f"{where}: the incremental snapshot names an invalid file {name!r}")
        with open(os.path.join(target, name), "wb") as f:
            f.write(content)
    for name, f, checksum in zip(handle.sst_names, handle.shared_files, handle.checksums):
        url = filesystem.join(base_location, f.path)
        path = os.path.join(target, name)
        if local is not None and _take_local_copy(local, url, f.size, checksum, path):
            continue
        digest = xxhash.xxh64()
        try:
            with filesystem.open_read(url) as source, open(path, "wb") as out:
                while chunk := source.read(_COPY_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        except FileNotFoundError as e:
            raise RestoreError(f"{where}: the shared state file {url} (SST file {name}) is "
                               f"missing") from e
        size = os.path.getsize(path)
        if size != f.size:
            raise RestoreError(f"{where}: the shared state file {url} (SST file {name}) has "
                               f"{size} bytes, the checkpoint recorded {f.size}: it is truncated "
                               f"or was replaced")
        if digest.hexdigest() != checksum:
            raise RestoreError(f"{where}: the shared state file {url} (SST file {name}) is "
                               f"corrupt: its checksum does not match the one recorded when it "
                               f"was uploaded")
        if local is not None:
            local.count_remote(size)
            if keep_copies:
                local.keep_file(path, url)
    return states


def _bundle(handle: IncrementalKeyGroupsStateHandle, url: str, operator_uid: str,
            local: LocalRecoveryStore | None, keep_copy: bool = False) -> tuple:
    """The handle's bundle, from its local copy when that one is intact (else from `url`,
    then kept as the local copy when `keep_copy`)."""
    path = local.find(url, handle.file.size) if local is not None else None
    if path is not None:
        try:
            bundle = _read_bundle(handle, filesystem.normalize(path), operator_uid)
        except RestoreError as e:
            log.warning("%s; reading %s instead", e, url)
            local.reject(path)
        else:
            local.count_local(handle.file.size)
            return bundle
    data = filesystem.read_checked_file(
        url, None, f"operator '{operator_uid}': checkpoint {handle.checkpoint_id}: the incremental snapshot file {url}")
    bundle = _parse_bundle(handle, data, url, operator_uid)
    if local is not None:
        local.count_remote(handle.file.size)
        if keep_copy:
            local.keep_bytes(data, url)
    return bundle


def _take_local_copy(local: LocalRecoveryStore, url: str, size: int, checksum: str,
                     target: str) -> bool:
    """Put the local copy of the SST file `url` at `target` (a hard link, or a copy across
    file systems) when it has `size` bytes and the xxh64 `checksum`; False otherwise."""
    path = local.find(url, size)
    if path is None:
        return False
    digest = xxhash.xxh64()
    try:
        with open(path, "rb") as source:
            while chunk := source.read(_COPY_CHUNK):
                digest.update(chunk)
        if digest.hexdigest() != checksum:
            log.warning("the local copy %s of %s is corrupt (checksum mismatch); reading the "
                        "remote file", path, url)
            local.reject(path)
            return False
        try:
            os.link(path, target)
        except OSError:
            shutil.copyfile(path, target)
    except OSError as e:
        log.warning("cannot use the local copy %s of %s (%r); reading the remote file", path,
                    url, e)
        local.reject(path)
        return False
    local.count_local(size)
    return True


def restore(backend: "RocksDBKeyedStateBackend",
            handles: Sequence[IncrementalKeyGroupsStateHandle], base_location: str) -> None:
    """Restore the key groups of `backend`'s range from incremental handles."""
    from streamsnap.state.backends.rocksdb.encoding import _kg_bytes

    my = backend.key_group_range
    relevant = []
    for h in handles:
        if h.key_group_end >= backend.max_parallelism:
            raise RestoreError(
                f"operator '{backend.operator_uid}': keyed state handle covers key groups up to "
                f"{h.key_group_end} but max parallelism is {backend.max_parallelism}; the max "
                f"parallelism of a job's state cannot change")
        overlap = min(my.end, h.key_group_end) - max(my.start, h.key_group_start) + 1
        if overlap > 0:
            relevant.append((overlap, h))
    if not relevant:
        return
    relevant.sort(key=lambda pair: -pair[0])
    rest = [h for _, h in relevant]
    if backend._is_empty():
        base = rest.pop(0)
        adopted = not rest and my.start <= base.key_group_start and base.key_group_end <= my.end
        path = os.path.join(backend.directory, f"restore-{base.checkpoint_id}")
        states = download(base, base_location, path, backend.operator_uid, backend.local_store,
                          keep_copies=adopted)
        backend._replace_database(path)
        backend._adopt_states(states, f"checkpoint {base.checkpoint_id}")
        foreign = []          # key groups of the snapshot this subtask does not own
        if base.key_group_start < my.start:
            foreign.append((_kg_bytes(base.key_group_start), _kg_bytes(my.start)))
        if base.key_group_end > my.end:
            foreign.append((_kg_bytes(my.end + 1), _kg_bytes(base.key_group_end + 1)))
        for low, high in foreign:
            backend._db.delete_range(low, high)
        if adopted:
            uploads = {name: Upload(filesystem.join(base_location, f.path), f.size, checksum)
                       for name, f, checksum in zip(base.sst_names, base.shared_files,
                                                    base.checksums)}
            backend._uploads.restored(base.checkpoint_id, uploads)
            if backend.local_store is not None:
                # The next checkpoint builds on these files: retention keeps their local copies.
                paths = (backend.local_store.local_path(u.url) for u in uploads.values())
                backend.local_store.reference(base.checkpoint_id, [p for p in paths if p])
    for h in rest:
        _copy_from(backend, h, base_location)


def _copy_from(backend: "RocksDBKeyedStateBackend", handle: IncrementalKeyGroupsStateHandle,
               base_location: str) -> None:
    """Copy the entries of `backend`'s key groups from another database snapshot."""
    from streamsnap.state.backends.rocksdb.config import _open_db
    from streamsnap.state.backends.rocksdb.encoding import _kg_bytes

    path = os.path.join(backend.directory, f"merge-{handle.checkpoint_id}-{handle.key_group_start}")
    states = download(handle, base_location, path, backend.operator_uid, backend.local_store)
    try:
        sid_map = {int(sid).to_bytes(2, "big"): backend._state_id(name, kind, tag)
                   for sid, name, kind, tag in states}
        _, db, _ = _open_db(path, backend.config)
        try:
            my = backend.key_group_range
            low = max(my.start, handle.key_group_start)
            high = min(my.end, handle.key_group_end) + 1
            options = backend._rocksdict.ReadOptions()
            options.set_iterate_upper_bound(_kg_bytes(high))
            it = db.iter(options)
            it.seek(_kg_bytes(low))
            batch = backend._rocksdict.WriteBatch(raw_mode=True)
            while it.valid():
                key = it.key()
                try:
                    sid = sid_map[key[2:4]]
                except KeyError:
                    raise RestoreError(
                        f"operator '{backend.operator_uid}': checkpoint {handle.checkpoint_id} "
                        f"holds entries of unknown state id {key[2:4].hex()}") from None
                batch.put(key[:2] + sid + key[4:], it.value())
                if len(batch) >= _BATCH_ENTRIES:
                    backend._db.write(batch)
                    batch = backend._rocksdict.WriteBatch(raw_mode=True)
                it.next()
            if len(batch):
                backend._db.write(batch)
            del it
        finally:
            db.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)


__all__ = ["IncrementalSnapshot", "Upload", "UploadTracker", "download", "restore", "shared_directory_of",
           "take_snapshot"]
