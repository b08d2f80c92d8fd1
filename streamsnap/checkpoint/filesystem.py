"""Checkpoint storage paths and files through fsspec, so `file://`, `s3://`, `hdfs://` work alike.

Everything that touches checkpoint files goes through these few functions: URL joining (that
keeps relative handle paths relative), commit-point writes, reads and deletes. A plain local
path is accepted anywhere a URL is and treated as `file://`.

Object stores differ from a disk in three ways these functions hide:

* **Options.** `s3://...` needs an endpoint, credentials, ... (`CheckpointConfig.
  storage_options`). `configure` registers them once per process for a URL prefix — on the
  driver by the environment, on the executors from the deployment — and every call below
  opens its filesystem with the options of the longest registered prefix (else of the last
  registration for the same protocol, so a savepoint target on the same store finds them).
* **No atomic rename.** A commit-point file (`_metadata`, `_checkpoint_id`, ...) is written
  with temp file + rename only where rename is atomic (the local disk); on an object store it
  is one PUT, which makes the object appear whole or not at all.
* **Transient errors.** Calls on an object store are retried on throttling and 5xx answers
  (`storage_retry`), counted; a local disk's errors (ENOSPC) fail at once.

Listings are not cached on object stores: other processes (the executors) write the files the
driver lists.
"""

from __future__ import annotations

import os
import posixpath
import threading
import uuid
from typing import IO, Any, Callable, Mapping, TypeVar

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from streamsnap.checkpoint import storage_retry

T = TypeVar("T")

# Protocols whose listings s3fs-style clients cache (and whose writers are other processes).
OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss", "r2"})

_options_lock = threading.Lock()
_options: dict[str, dict] = {}     # normalized URL prefix -> fsspec storage options


def normalize(url: str) -> str:
    """A URL with an explicit protocol; bare local paths become absolute `file://` URLs."""
    if "://" in url:
        return url.rstrip("/") if url.rstrip("/") else url
    return "file://" + os.path.abspath(os.path.expanduser(url))


def protocol_of(url: str) -> str:
    return normalize(url).partition("://")[0]


def configure(url: str, options: Mapping[str, Any] | None) -> None:
    """Open every URL under `url` with these fsspec storage options (in this process);
    None or {} removes a registration."""
    prefix = normalize(url).rstrip("/")
    with _options_lock:
        if options:
            _options[prefix] = dict(options)
        else:
            _options.pop(prefix, None)


# The package that implements a protocol, for the error that says what to install.
PROTOCOL_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "abfs": "adlfs", "abfss": "adlfs",
                     "az": "adlfs", "hdfs": "pyarrow", "oss": "ossfs"}


def missing_implementation(url: str) -> str | None:
    """Why fsspec cannot open `url` in this Python (its implementation is not installed, or
    the protocol is unknown), with the fix; None when it can."""
    protocol = protocol_of(url)
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        package = PROTOCOL_PACKAGES.get(protocol)
        fix = f"pip install {package}" if package else "install the fsspec implementation it names"
        return f"{protocol}:// needs a package that is not installed ({exc}); fix: {fix}"
    except ValueError as exc:
        return f"{protocol}:// is not a protocol fsspec knows ({exc}); use a local path or a URL such as s3://bucket/path"
    return None


def options_for(url: str) -> dict:
    """The storage options `url` is opened with (see `configure`)."""
    url = normalize(url)
    with _options_lock:
        matches = [p for p in _options if url == p or url.startswith(p + "/")]
        if matches:
            return dict(_options[max(matches, key=len)])
        protocol = protocol_of(url)
        same = [p for p in _options if protocol_of(p) == protocol]
        return dict(_options[same[-1]]) if same else {}


def user_path(url: str) -> str:
    """How to show a location to a user: a plain path for local files, else the URL."""
    url = normalize(url)
    return url[len("file://"):] if url.startswith("file://") else url


def join(base: str, relative: str) -> str:
    """Resolve `relative` (a handle path) against the directory URL `base`.

    An absolute URL in `relative` is returned unchanged; `..` segments are folded.
    """
    if "://" in relative:
        return relative
    base = normalize(base)
    protocol, _, path = base.partition("://")
    return f"{protocol}://{posixpath.normpath(posixpath.join(path or '/', relative))}"


def relative_to(url: str, base: str) -> str:
    """`url` relative to `base` when it lies inside it, else `url` unchanged."""
    url, base = normalize(url), normalize(base).rstrip("/") + "/"
    return url[len(base):] if url.startswith(base) else url


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(fsspec filesystem, path in it) of `url`, opened with its storage options."""
    url = normalize(url)
    options = options_for(url)
    if protocol_of(url) in OBJECT_STORE_PROTOCOLS:
        options.setdefault("use_listings_cache", False)
    return url_to_fs(url, **options)


def has_atomic_rename(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether a rename on `fs` is atomic (a reader sees the old name or the new, whole file)."""
    return isinstance(fs, LocalFileSystem)


def has_directories(url: str) -> bool:
    """Whether directories exist on `url`'s filesystem of their own; an object store has only
    key prefixes, so an empty "directory" (a fresh `shared/`) is not there to be seen."""
    return protocol_of(url) not in OBJECT_STORE_PROTOCOLS


def _call(url: str, what: str, work: Callable[[fsspec.AbstractFileSystem, str], T]) -> T:
    """`work(fs, path)`, retried on an object store's transient errors (never on a local disk)."""
    fs, path = filesystem(url)
    if isinstance(fs, LocalFileSystem):
        return work(fs, path)
    return storage_retry.call(lambda: work(fs, path), f"{what} {url}")


def makedirs(url: str) -> None:
    """Create the directory `url`; nothing on an object store, which has none (and s3fs would
    spend a request per call asking whether the bucket exists)."""
    if has_directories(url):
        _call(url, "makedirs", lambda fs, path: fs.makedirs(path, exist_ok=True))


def open_write(url: str) -> IO[bytes]:
    """A stream to write `url` (not retried: a failed stream fails the snapshot writing it)."""
    fs, path = filesystem(url)
    makedirs(join(url, ".."))
    return fs.open(path, "wb")


def open_read(url: str) -> IO[bytes]:
    fs, path = filesystem(url)
    return fs.open(path, "rb")


def upload(local_path: str, url: str) -> None:
    """Copy the local file `local_path` to `url` as one whole-file transfer (retried)."""
    def put(fs, path):
        if isinstance(fs, LocalFileSystem):
            fs.makedirs(posixpath.dirname(path), exist_ok=True)
        fs.put_file(local_path, path)
    _call(url, "upload to", put)


def read_bytes(url: str) -> bytes:
    return _call(url, "read", lambda fs, path: fs.cat_file(path))


def read_if_exists(url: str) -> bytes | None:
    """The bytes of an optional file (a job's small records), None if it or its directory is absent."""
    try:
        return read_bytes(url)
    except (FileNotFoundError, NotADirectoryError):
        return None


def read_checked_file(url: str, size: int | None, where: str) -> bytes:
    """The bytes of a state file a checkpoint recorded with `size` bytes (None: unchecked);
    a RestoreError starting with `where` (what the file is, of which checkpoint) when it is
    missing or has another size."""
    from streamsnap.errors import RestoreError

    try:
        data = read_bytes(url)
    except FileNotFoundError as e:
        raise RestoreError(f"{where} is missing") from e
    if size is not None and len(data) != size:
        raise RestoreError(f"{where} has {len(data)} bytes, the checkpoint recorded {size}: it is "
                           f"truncated or was replaced")
    return data


def read_range(url: str, offset: int, length: int) -> bytes:
    return _call(url, "read", lambda fs, path: fs.cat_file(path, start=offset, end=offset + length))


def write_atomic(url: str, data: bytes) -> None:
    """Write `data` so readers see either nothing or all of it.

    Where rename is atomic (the local disk): a temp file, fsynced, renamed over `url`, then the
    directory fsynced, so once this returns the write survives a machine crash — a `_metadata`
    must not count as completed before that. On an object store, which has no atomic rename
    (S3's is a copy and a delete): one PUT of the whole object, which appears whole or not at
    all and is durable once the PUT returns.
    """
    fs, path = filesystem(url)
    directory = posixpath.dirname(path)
    if has_atomic_rename(fs):
        fs.makedirs(directory, exist_ok=True)
        temp = posixpath.join(directory, f".{posixpath.basename(path)}.inprogress-{uuid.uuid4().hex}")
        with open(temp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return
    _call(url, "write", lambda fs, path: fs.pipe_file(path, data))


def write_once(url: str, data: bytes) -> None:
    """Write a commit point (`_metadata`): where rename is atomic as `write_atomic`; on an object
    store one conditional PUT that creates the object only if it does not exist, so a file that
    completed a checkpoint is never replaced (a fenced-off writer gets FileExistsError)."""
    fs, _ = filesystem(url)
    if has_atomic_rename(fs):
        write_atomic(url, data)
    elif not create_exclusive(url, data):
        raise FileExistsError(f"{url} already exists and is written only once: another writer (an "
                              f"earlier attempt of this job?) completed it first")


def exists(url: str) -> bool:
    return _call(url, "check", lambda fs, path: fs.exists(path))


def isdir(url: str) -> bool:
    return _call(url, "list", lambda fs, path: fs.isdir(path))


def ls(url: str) -> list[dict]:
    """The entries directly inside the directory `url` (fsspec's detail dicts)."""
    return _call(url, "list", lambda fs, path: fs.ls(path, detail=True))


def delete(url: str, recursive: bool = False) -> None:
    """Delete a file or (recursively) a directory; a missing target is not an error."""
    def rm(fs, path):
        if fs.exists(path):
            try:
                fs.rm(path, recursive=recursive)
            except FileNotFoundError:
                pass      # deleted by a try the store answered with an error (then retried)
    _call(url, "delete", rm)


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def is_local(url: str) -> bool:
    return isinstance(filesystem(url)[0], LocalFileSystem)


def create_exclusive(url: str, data: bytes) -> bool:
    """Create `url` holding `data` unless it exists; True if this call created it.

    Local files use O_EXCL, so of two racing creators exactly one wins; so do object stores
    with conditional PUTs (If-None-Match, which S3 and s3fs's `mode="create"` have). A filesystem
    without either gets check-then-write: a race there is settled by whoever writes last,
    which is why leaders also re-check (fencing)."""
    fs, path = filesystem(url)
    if isinstance(fs, LocalFileSystem):
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        return True

    tries = []

    def create(fs, path):
        tries.append(1)
        try:
            fs.pipe_file(path, data, mode="create")
        except TypeError:       # no conditional writes in this fsspec implementation
            if fs.exists(path):
                raise FileExistsError(url) from None
            fs.pipe_file(path, data)
    try:
        _call(url, "create", create)
    except FileExistsError:
        # Taken by another creator — or, after a retry, by our own earlier try whose answer
        # was lost (then the object holds our bytes).
        return len(tries) > 1 and read_bytes(url) == data
    return True


__all__ = ["normalize", "configure", "options_for", "filesystem", "join", "relative_to", "user_path",
           "makedirs", "open_write", "open_read", "upload", "read_bytes", "read_if_exists",
           "read_checked_file", "read_range", "write_atomic", "write_once", "exists", "isdir", "ls", "delete",
           "unique_name", "is_local", "create_exclusive", "has_atomic_rename", "has_directories", "protocol_of",
           "missing_implementation", "PROTOCOL_PACKAGES", "OBJECT_STORE_PROTOCOLS"]
