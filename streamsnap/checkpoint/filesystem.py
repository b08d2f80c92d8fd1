"""Checkpoint storage paths and files through fsspec, so `file://`, `s3://`, `hdfs://` work alike.

Everything that touches checkpoint files goes through these few functions: URL joining (that
keeps relative handle paths relative), atomic writes (temp file + rename), reads and deletes.
A plain local path is accepted anywhere a URL is and treated as `file://`.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from typing import IO

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem


def normalize(url: str) -> str:
    """A URL with an explicit protocol; bare local paths become absolute `file://` URLs."""
    if "://" in url:
        return url.rstrip("/") if url.rstrip("/") else url
    return "file://" + os.path.abspath(os.path.expanduser(url))


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
    return url_to_fs(normalize(url))


def makedirs(url: str) -> None:
    fs, path = filesystem(url)
    fs.makedirs(path, exist_ok=True)


def open_write(url: str) -> IO[bytes]:
    fs, path = filesystem(url)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    return fs.open(path, "wb")


def open_read(url: str) -> IO[bytes]:
    fs, path = filesystem(url)
    return fs.open(path, "rb")


def read_bytes(url: str) -> bytes:
    fs, path = filesystem(url)
    return fs.cat_file(path)


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
    fs, path = filesystem(url)
    return fs.cat_file(path, start=offset, end=offset + length)


def write_atomic(url: str, data: bytes) -> None:
    """Write `data` so readers see either nothing or all of it: temp file, then rename.

    On a local filesystem the file and then its directory are fsynced, so once this returns the
    write survives a machine crash — a `_metadata` must not count as completed before that.
    Object stores make an object durable when its upload completes.
    """
    fs, path = filesystem(url)
    directory = posixpath.dirname(path)
    fs.makedirs(directory, exist_ok=True)
    temp = posixpath.join(directory, f".{posixpath.basename(path)}.inprogress-{uuid.uuid4().hex}")
    if isinstance(fs, LocalFileSystem):
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
    with fs.open(temp, "wb") as out:
        out.write(data)
    fs.mv(temp, path)


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    return fs.exists(path)


def delete(url: str, recursive: bool = False) -> None:
    """Delete a file or (recursively) a directory; a missing target is not an error."""
    fs, path = filesystem(url)
    if fs.exists(path):
        fs.rm(path, recursive=recursive)


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def is_local(url: str) -> bool:
    return isinstance(filesystem(url)[0], LocalFileSystem)


def create_exclusive(url: str, data: bytes) -> bool:
    """Create `url` holding `data` unless it exists; True if this call created it.

    Local files use O_EXCL, so of two racing creators exactly one wins. Object stores get
    check-then-write (conditional puts are not available through fsspec everywhere): a race
    there is settled by whoever writes last, which is why leaders also re-check (fencing)."""
    fs, path = filesystem(url)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    if isinstance(fs, LocalFileSystem):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        return True
    if fs.exists(path):
        return False
    with fs.open(path, "wb") as out:
        out.write(data)
    return True
