"""The `_metadata` file: what a completed checkpoint or savepoint contains, and its on-disk form.

`_metadata` is the commit point of a checkpoint. It is written last and atomically (temp file +
rename on a local disk; one conditional PUT that only creates, on an object store, which has no
atomic rename), so a reader sees either no file (the checkpoint never completed) or a whole one. A
checksum in the first line still catches files damaged afterwards (partial copies, bit rot)::

    streamsnap-checkpoint v1 sha256=<hex digest of the rest>
    {canonical JSON}

It lists every operator of the job, also those with empty state, so restore can tell "this
operator had no state" from "this operator is new". Handle paths stay relative to the
checkpoint directory, so a savepoint can be moved and still restored.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from streamsnap.checkpoint import filesystem
import xxhash

from streamsnap.checkpoint.handles import SHARED_STATE_HANDLES, ChangelogStateHandle, OperatorSubtaskState
from streamsnap.checkpoint.storage import METADATA_FILE_NAME
from streamsnap.errors import RestoreError
from streamsnap.runtime.events import CheckpointType

MAGIC = "streamsnap-checkpoint"
FORMAT_VERSION = 1
_HEADER = re.compile(r"^streamsnap-checkpoint v(\d+) sha256=([0-9a-f]{64})$")


@dataclass(frozen=True)
class OperatorState:
    """The state of one operator (by uid) across all its parallel subtasks."""

    uid: str
    parallelism: int
    max_parallelism: int
    subtask_states: Mapping[int, OperatorSubtaskState] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "subtask_states", MappingProxyType(dict(self.subtask_states)))

    @property
    def state_size(self) -> int:
        return sum(state.state_size for state in self.subtask_states.values())

    @property
    def incremental_size(self) -> int:
        return sum(state.incremental_size for state in self.subtask_states.values())

    def to_wire(self) -> dict:
        return {"parallelism": self.parallelism, "max_parallelism": self.max_parallelism,
                "subtasks": {str(index): state.to_wire()
                             for index, state in sorted(self.subtask_states.items())}}

    @classmethod
    def from_wire(cls, uid: str, data: dict) -> "OperatorState":
        return cls(uid, int(data["parallelism"]), int(data["max_parallelism"]),
                   {int(index): OperatorSubtaskState.from_wire(state)
                    for index, state in data["subtasks"].items()})


@dataclass(frozen=True)
class CheckpointMetadata:
    """Everything needed to restore a job from one checkpoint or savepoint."""

    job_id: str
    checkpoint_id: int
    checkpoint_type: CheckpointType
    trigger_timestamp: float
    completion_timestamp: float
    operators: Mapping[str, OperatorState] = field(default_factory=dict)
    # Unaligned checkpoints only: per subtask ("<vertex>#<index>") whether it snapshotted
    # unaligned, the in-flight bytes it saved and the bytes it processed during alignment.
    in_flight: Mapping[str, tuple[bool, int, int]] = field(default_factory=dict)
    # For `streamsnap ui DIR` after the fact (web/archive.py); absent in files of older versions.
    # Per subtask ("<vertex>#<index>"): its attempt, acknowledgement time and CheckpointMetrics
    # (wire form: sync, async, alignment, start delay, processed, persisted, unaligned).
    subtask_metrics: Mapping[str, tuple[int, float, tuple]] = field(default_factory=dict)
    # The job as deployed: {"name": ..., "vertices": [{"id", "name", "parallelism", "inputs":
    # [vertex ids], "operators": [{"uid", "name"}]}]} (None: not recorded).
    job_graph: Mapping | None = None

    def __post_init__(self):
        object.__setattr__(self, "operators", MappingProxyType(dict(self.operators)))
        object.__setattr__(self, "in_flight", MappingProxyType(dict(self.in_flight)))
        object.__setattr__(self, "subtask_metrics", MappingProxyType(dict(self.subtask_metrics)))

    @property
    def state_size(self) -> int:
        """Full size: every file the checkpoint consists of, shared ones included."""
        return sum(op.state_size for op in self.operators.values())

    @property
    def in_flight_size(self) -> int:
        """Bytes of in-flight data an unaligned checkpoint saved (0 when aligned)."""
        return sum(h.size for op in self.operators.values() for s in op.subtask_states.values()
                   for h in s.channel)

    @property
    def incremental_size(self) -> int:
        """Bytes written for this checkpoint itself: shared files of incremental snapshots
        that earlier checkpoints uploaded are not counted (equals `state_size` when no
        snapshot was incremental)."""
        return sum(op.incremental_size for op in self.operators.values())

    def to_wire(self) -> dict:
        return {"job_id": self.job_id, "checkpoint_id": self.checkpoint_id,
                "checkpoint_type": self.checkpoint_type.value,
                "trigger_timestamp": self.trigger_timestamp,
                "completion_timestamp": self.completion_timestamp,
                "operators": {uid: op.to_wire() for uid, op in sorted(self.operators.items())},
                **({"in_flight": {k: list(v) for k, v in sorted(self.in_flight.items())}} if self.in_flight else {}),
                **({"subtask_metrics": {k: [a, t, list(m)] for k, (a, t, m) in sorted(self.subtask_metrics.items())}}
                   if self.subtask_metrics else {}),
                **({"job_graph": self.job_graph} if self.job_graph is not None else {})}

    @classmethod
    def from_wire(cls, data: dict) -> "CheckpointMetadata":
        return cls(str(data["job_id"]), int(data["checkpoint_id"]),
                   CheckpointType(data["checkpoint_type"]),
                   float(data["trigger_timestamp"]), float(data["completion_timestamp"]),
                   {str(uid): OperatorState.from_wire(str(uid), op)
                    for uid, op in data["operators"].items()},
                   {str(k): (bool(u), int(p), int(b)) for k, (u, p, b) in data.get("in_flight", {}).items()},
                   {str(k): (int(a), float(t), tuple(m)) for k, (a, t, m) in data.get("subtask_metrics", {}).items()},
                   data.get("job_graph"))


def state_file_urls(state: OperatorSubtaskState, base_url: str) -> tuple[list[str], list[str]]:
    """(exclusive, shared) file URLs of a subtask state, handle paths resolved against `base_url`."""
    exclusive = [filesystem.join(base_url, f.path) for f in state.files()]
    shared = [filesystem.join(base_url, f.path) for h in state.keyed for f in h.shared_files]
    return exclusive, shared


def missing_incremental_files(metadata: CheckpointMetadata, base_url: str) -> list[str]:
    """URLs of files of the incremental snapshots in `metadata` that do not exist.

    A full snapshot's file is checked when it is read; an incremental one consists of SST files
    shared with other checkpoints, which retention mistakes or a hand-made cleanup can delete
    independently, so restore checks them up front (one existence test per file).
    """
    missing = []
    for op in metadata.operators.values():
        for state in op.subtask_states.values():
            for handle in state.keyed:
                if not isinstance(handle, SHARED_STATE_HANDLES):
                    continue
                for f in (handle.file, *handle.shared_files):
                    url = filesystem.join(base_url, f.path)
                    if not filesystem.exists(url):
                        missing.append(url)
    return missing


def damaged_changelog_segments(metadata: CheckpointMetadata, base_url: str) -> list[str]:
    """What is wrong with the changelog segments of `metadata` that exist: a size or checksum
    that is not the recorded one. Segments are small (the changes since a materialization) and
    a damaged one would lose those changes, so restore reads and checks them up front, to fall
    back as for a damaged `_metadata`."""
    problems = []
    for op in metadata.operators.values():
        for state in op.subtask_states.values():
            for handle in state.keyed:
                if not isinstance(handle, ChangelogStateHandle):
                    continue
                for segment in handle.segments:
                    url = filesystem.join(base_url, segment.file.path)
                    try:
                        data = filesystem.read_bytes(url)
                    except FileNotFoundError:
                        continue           # reported by missing_incremental_files
                    if len(data) != segment.file.size:
                        problems.append(f"the changelog segment {url} has {len(data)} bytes, the checkpoint "
                                        f"recorded {segment.file.size} (truncated or replaced)")
                    elif xxhash.xxh64(data).hexdigest() != segment.checksum:
                        problems.append(f"the changelog segment {url} is corrupt (checksum mismatch)")
    return problems


def encode_metadata(metadata: CheckpointMetadata) -> bytes:
    body = json.dumps(metadata.to_wire(), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False).encode("utf-8")
    header = f"{MAGIC} v{FORMAT_VERSION} sha256={hashlib.sha256(body).hexdigest()}\n"
    return header.encode("ascii") + body


def decode_metadata(data: bytes, source: str) -> CheckpointMetadata:
    """Parse and verify `_metadata` bytes; `source` names the file in errors."""
    def fail(problem: str) -> RestoreError:
        return RestoreError(f"checkpoint metadata {source} is unusable: {problem}")

    newline = data.find(b"\n")
    if newline < 0:
        if not data.startswith(MAGIC.encode()) and data:
            raise fail(f"not a streamsnap checkpoint metadata file (it does not start with {MAGIC!r})")
        raise fail("truncated: the header line is incomplete (torn write or partial copy)")
    header, body = data[:newline].decode("ascii", "replace"), data[newline + 1:]
    if not header.startswith(MAGIC):
        raise fail(f"not a streamsnap checkpoint metadata file (it does not start with {MAGIC!r})")
    match = _HEADER.match(header)
    if match is None:
        version = re.match(rf"^{MAGIC} v(\d+)\b", header)
        if version and int(version.group(1)) != FORMAT_VERSION:
            raise fail(f"format v{version.group(1)} is not supported; this streamsnap reads "
                       f"v{FORMAT_VERSION}. Restore it with the streamsnap version that wrote it")
        raise fail(f"malformed header line {header[:120]!r}")
    if int(match.group(1)) != FORMAT_VERSION:
        raise fail(f"format v{match.group(1)} is not supported; this streamsnap reads "
                   f"v{FORMAT_VERSION}. Restore it with the streamsnap version that wrote it")
    digest = hashlib.sha256(body).hexdigest()
    if digest != match.group(2):
        raise fail(f"checksum mismatch (the file is torn or corrupted): header says "
                   f"{match.group(2)[:16]}..., content hashes to {digest[:16]}... "
                   f"({len(body)} bytes of content)")
    try:
        return CheckpointMetadata.from_wire(json.loads(body.decode("utf-8")))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise fail(f"malformed content: {exc!r}") from exc


def write_metadata(location_url: str, metadata: CheckpointMetadata) -> str:
    """Write `<location_url>/_metadata` atomically (once, on an object store); returns its URL."""
    url = filesystem.join(location_url, METADATA_FILE_NAME)
    filesystem.write_once(url, encode_metadata(metadata))
    return url


def read_metadata(url: str) -> CheckpointMetadata:
    """Read and verify a `_metadata` file, or raise RestoreError naming the file and the problem."""
    url = filesystem.normalize(url)
    try:
        data = filesystem.read_bytes(url)
    except FileNotFoundError:
        raise RestoreError(
            f"checkpoint metadata {url} is missing: the checkpoint never completed or was "
            f"deleted; pass the directory of a completed checkpoint or savepoint") from None
    except IsADirectoryError:
        raise RestoreError(f"checkpoint metadata {url} is a directory, not a file") from None
    except OSError as exc:
        raise RestoreError(f"checkpoint metadata {url} could not be read: {exc}") from exc
    return decode_metadata(data, url)


__all__ = ["OperatorState", "CheckpointMetadata", "write_metadata", "read_metadata",
           "encode_metadata", "decode_metadata", "state_file_urls", "missing_incremental_files",
           "damaged_changelog_segments", "FORMAT_VERSION", "METADATA_FILE_NAME"]
