"""State handles: how a task describes the state it wrote for a checkpoint.

A task writes its snapshot into files under the checkpoint's location and acknowledges with
handles that point at them. The coordinator gathers them into `_metadata`; restore reads them
back and redistributes them (keyed state by key group, operator state by list element).

Paths in a handle are relative to the checkpoint (or savepoint) directory when the file lies
inside it, which makes savepoints relocatable; shared files of incremental snapshots are named
relative to the job directory (`../shared/...`). All handles have a msgpack/JSON-safe wire form.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# How the elements of an operator list state are redistributed on restore.
SPLIT_DISTRIBUTE = "split"      # elements are dealt out evenly (Flink's ListState)
UNION = "union"                 # every subtask gets all elements (Flink's UnionListState)
BROADCAST = "broadcast"         # every subtask holds the same copy; one copy is restored to all
DISTRIBUTION_MODES = (SPLIT_DISTRIBUTE, UNION, BROADCAST)


@dataclass(frozen=True)
class FileHandle:
    """A file in checkpoint storage: `path` relative to the checkpoint directory, or a URL."""

    path: str
    size: int

    def to_wire(self) -> dict:
        return {"path": self.path, "size": self.size}

    @classmethod
    def from_wire(cls, data: dict) -> "FileHandle":
        return cls(str(data["path"]), int(data["size"]))


@dataclass(frozen=True)
class KeyGroupsStateHandle:
    """Keyed state of one subtask: key groups [start, end] in one file.

    `offsets` maps each key group that has data to (offset, length) of its block, so restore
    with another parallelism reads only the key groups a subtask now owns.
    """

    file: FileHandle
    key_group_start: int
    key_group_end: int  # inclusive
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    # Files of an incremental snapshot this handle also depends on (shared between checkpoints).
    shared_files: tuple[FileHandle, ...] = ()
    # The states the file holds, (name, kind, serializer tag) each, so a reader can plan on the
    # driver (`streamsnap.state_processor`); None: written before handles listed them.
    states: tuple[tuple[str, str, str], ...] | None = None
    # Entries (keys) per state name in the file, counted when it was written, so metadata needs
    # no pass over the file; None: written before handles counted them.
    keys: tuple[tuple[str, int], ...] | None = None

    @property
    def size(self) -> int:
        return self.file.size

    def to_wire(self) -> dict:
        wire = {
            "file": self.file.to_wire(),
            "key_groups": [self.key_group_start, self.key_group_end],
            "offsets": [[kg, off, length] for kg, (off, length) in sorted(self.offsets.items())],
            "shared": [f.to_wire() for f in self.shared_files],
        }
        if self.states is not None:
            wire["states"] = [list(s) for s in self.states]
        if self.keys is not None:
            wire["keys"] = [list(k) for k in self.keys]
        return wire

    @classmethod
    def from_wire(cls, data: dict) -> "KeyGroupsStateHandle":
        start, end = data["key_groups"]
        states, keys = data.get("states"), data.get("keys")
        return cls(
            FileHandle.from_wire(data["file"]), int(start), int(end),
            {int(kg): (int(off), int(length)) for kg, off, length in data["offsets"]},
            tuple(FileHandle.from_wire(f) for f in data.get("shared", ())),
            None if states is None else tuple((str(n), str(k), str(t)) for n, k, t in states),
            None if keys is None else tuple((str(n), int(c)) for n, c in keys),
        )


@dataclass(frozen=True)
class IncrementalKeyGroupsStateHandle:
    """Keyed state of one subtask as an incremental RocksDB snapshot: a native RocksDB
    checkpoint whose SST files live in the job's `shared/` directory, reused by later
    checkpoints, and whose small files (MANIFEST, CURRENT, OPTIONS, the state-id table) are
    bundled into one private `file` inside the checkpoint directory.

    `shared_files[i]` is the upload of the database's SST file `sst_names[i]`;
    `new_shared[i]` tells whether this checkpoint uploaded it (False: uploaded by an earlier
    checkpoint and reused, so it must still be registered when this one is acknowledged);
    `checksums[i]` is its xxh64 (hex), verified when it is downloaded again.
    The database holds key groups [start, end]; restoring another range opens it and keeps
    only the key groups the subtask owns. Only the RocksDB backend restores these handles;
    savepoints are always full (`KeyGroupsStateHandle`).
    """

    file: FileHandle
    key_group_start: int
    key_group_end: int  # inclusive
    checkpoint_id: int
    shared_files: tuple[FileHandle, ...] = ()
    sst_names: tuple[str, ...] = ()
    new_shared: tuple[bool, ...] = ()
    checksums: tuple[str, ...] = ()

    def __post_init__(self):
        if not len(self.shared_files) == len(self.sst_names) == len(self.new_shared) \
                == len(self.checksums):
            raise ValueError(f"incremental handle of checkpoint {self.checkpoint_id}: "
                             f"{len(self.shared_files)} shared files, {len(self.sst_names)} SST "
                             f"names, {len(self.new_shared)} new flags and {len(self.checksums)} "
                             f"checksums must match")

    @property
    def offsets(self) -> dict[int, tuple[int, int]]:
        """No per-key-group blocks: the whole database covers the handle's range."""
        return {}

    @property
    def size(self) -> int:
        """Full size: the private file and every SST file the snapshot consists of."""
        return self.file.size + sum(f.size for f in self.shared_files)

    @property
    def incremental_size(self) -> int:
        """Bytes this checkpoint uploaded: the private file and the new SST files."""
        return self.file.size + sum(f.size for f, new in zip(self.shared_files, self.new_shared)
                                    if new)

    def reused_files(self) -> tuple[FileHandle, ...]:
        return tuple(f for f, new in zip(self.shared_files, self.new_shared) if not new)

    def to_wire(self) -> dict:
        return {
            "type": "incremental",
            "file": self.file.to_wire(),
            "key_groups": [self.key_group_start, self.key_group_end],
            "checkpoint_id": self.checkpoint_id,
            "shared": [[name, f.to_wire(), bool(new), checksum] for name, f, new, checksum
                       in zip(self.sst_names, self.shared_files, self.new_shared, self.checksums)],
        }

    @classmethod
    def from_wire(cls, data: dict) -> "IncrementalKeyGroupsStateHandle":
        start, end = data["key_groups"]
        shared = data.get("shared", ())
        return cls(FileHandle.from_wire(data["file"]), int(start), int(end),
                   int(data["checkpoint_id"]),
                   tuple(FileHandle.from_wire(f) for _, f, _, _ in shared),
                   tuple(str(name) for name, _, _, _ in shared),
                   tuple(bool(new) for _, _, new, _ in shared),
                   tuple(str(checksum) for _, _, _, checksum in shared))


@dataclass(frozen=True)
class ChangelogSegmentHandle:
    """One uploaded segment of a keyed backend's changelog (`state.backends.changelog`): the
    writes between two cuts, per key group, in the job's `shared/` directory.
    `checksum` is the file's xxh64 (hex)."""

    seq: int
    file: FileHandle
    checksum: str

    def to_wire(self) -> list:
        return [self.seq, self.file.to_wire(), self.checksum]

    @classmethod
    def from_wire(cls, data: list) -> "ChangelogSegmentHandle":
        seq, file, checksum = data
        return cls(int(seq), FileHandle.from_wire(file), str(checksum))


@dataclass(frozen=True)
class ChangelogStateHandle:
    """Keyed state of one subtask in changelog mode: the materialization (an incremental RocksDB
    snapshot whose files, bundle included, all live in `shared/`; None: the empty state) that
    holds the log up to segment `materialized_upto`, and the log segments after it, in order.

    `file` is the checkpoint's private manifest (it names the same materialization and
    segments; restore checks they agree). `materialization_new`: this is the first checkpoint
    to reference the materialization (its files count as written by it); `new_segments[i]`:
    this checkpoint uploaded `segments[i]` (False: reused, so it must still be registered when
    this one is acknowledged). Only the RocksDB backend restores these handles.
    """

    file: FileHandle
    key_group_start: int
    key_group_end: int  # inclusive
    checkpoint_id: int
    materialization_id: int
    materialized_upto: int
    materialization: IncrementalKeyGroupsStateHandle | None
    materialization_new: bool
    segments: tuple[ChangelogSegmentHandle, ...] = ()
    new_segments: tuple[bool, ...] = ()

    def __post_init__(self):
        if len(self.segments) != len(self.new_segments):
            raise ValueError(f"changelog handle of checkpoint {self.checkpoint_id}: "
                             f"{len(self.segments)} segments and {len(self.new_segments)} new flags")

    @property
    def offsets(self) -> dict[int, tuple[int, int]]:
        return {}

    def _materialization_files(self) -> tuple[FileHandle, ...]:
        m = self.materialization
        return () if m is None else (m.file, *m.shared_files)

    @property
    def shared_files(self) -> tuple[FileHandle, ...]:
        """Every file in `shared/` it consists of: the materialization's and the segments'."""
        return (*self._materialization_files(), *(s.file for s in self.segments))

    @property
    def size(self) -> int:
        return self.file.size + sum(f.size for f in self.shared_files)

    @property
    def incremental_size(self) -> int:
        """Bytes written for this checkpoint: the manifest, the new segments, and the
        materialization's new files when this is the first checkpoint referencing it."""
        m = self.materialization
        materialized = 0 if m is None or not self.materialization_new else m.incremental_size
        return (self.file.size + materialized
                + sum(s.file.size for s, new in zip(self.segments, self.new_segments) if new))

    def reused_files(self) -> tuple[FileHandle, ...]:
        reused = [] if self.materialization_new else list(self._materialization_files())
        if self.materialization is not None and self.materialization_new:
            reused += self.materialization.reused_files()
        return (*reused, *(s.file for s, new in zip(self.segments, self.new_segments) if not new))

    def to_wire(self) -> dict:
        return {
            "type": "changelog",
            "file": self.file.to_wire(),
            "key_groups": [self.key_group_start, self.key_group_end],
            "checkpoint_id": self.checkpoint_id,
            "materialization": [self.materialization_id, self.materialized_upto,
                                None if self.materialization is None else self.materialization.to_wire(),
                                self.materialization_new],
            "segments": [[*s.to_wire(), bool(new)] for s, new in zip(self.segments, self.new_segments)],
        }

    @classmethod
    def from_wire(cls, data: dict) -> "ChangelogStateHandle":
        start, end = data["key_groups"]
        mid, upto, materialization, new = data["materialization"]
        segments = data.get("segments", ())
        return cls(FileHandle.from_wire(data["file"]), int(start), int(end), int(data["checkpoint_id"]),
                   int(mid), int(upto),
                   None if materialization is None else IncrementalKeyGroupsStateHandle.from_wire(materialization),
                   bool(new), tuple(ChangelogSegmentHandle.from_wire(s[:3]) for s in segments),
                   tuple(bool(s[3]) for s in segments))


KeyedStateHandle = KeyGroupsStateHandle | IncrementalKeyGroupsStateHandle | ChangelogStateHandle
# Handles whose shared files are checked for existence before a restore, and whose reused
# files must still be registered when acknowledged.
SHARED_STATE_HANDLES = (IncrementalKeyGroupsStateHandle, ChangelogStateHandle)


def keyed_handle_from_wire(data: dict) -> KeyedStateHandle:
    """A keyed state handle from its wire form (full, incremental or changelog)."""
    if data.get("type") == "incremental":
        return IncrementalKeyGroupsStateHandle.from_wire(data)
    if data.get("type") == "changelog":
        return ChangelogStateHandle.from_wire(data)
    return KeyGroupsStateHandle.from_wire(data)


def incremental_size(handle) -> int:
    """Bytes a handle's checkpoint wrote itself (full handles: all of them)."""
    return getattr(handle, "incremental_size", handle.size)


@dataclass(frozen=True)
class OperatorStateHandle:
    """Operator (non-keyed) list states of one subtask in one file.

    `states` maps a state name to its distribution mode and the (offset, length) of each of
    its elements, so elements can be dealt out to another number of subtasks.
    """

    file: FileHandle
    states: dict[str, tuple[str, tuple[tuple[int, int], ...]]] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return self.file.size

    def to_wire(self) -> dict:
        return {
            "file": self.file.to_wire(),
            "states": {name: [mode, [list(o) for o in offsets]]
                       for name, (mode, offsets) in sorted(self.states.items())},
        }

    @classmethod
    def from_wire(cls, data: dict) -> "OperatorStateHandle":
        return cls(
            FileHandle.from_wire(data["file"]),
            {str(name): (str(mode), tuple((int(o), int(n)) for o, n in offsets))
             for name, (mode, offsets) in data["states"].items()},
        )


@dataclass(frozen=True)
class OperatorSubtaskState:
    """Everything one subtask of one operator snapshotted."""

    keyed: tuple[KeyedStateHandle, ...] = ()
    operator: tuple[OperatorStateHandle, ...] = ()
    # In-flight data of an unaligned checkpoint (runtime.channel_state), kept with the task's
    # head operator.
    channel: tuple[FileHandle, ...] = ()

    @property
    def state_size(self) -> int:
        return (sum(h.size for h in self.keyed) + sum(h.size for h in self.operator)
                + sum(h.size for h in self.channel))

    @property
    def incremental_size(self) -> int:
        """Bytes written for this checkpoint itself (shared files reused from earlier
        checkpoints not counted)."""
        return (sum(incremental_size(h) for h in self.keyed) + sum(h.size for h in self.operator)
                + sum(h.size for h in self.channel))

    def files(self) -> list[FileHandle]:
        """Files owned exclusively by this snapshot (shared files are reference counted)."""
        return [h.file for h in self.keyed] + [h.file for h in self.operator] + list(self.channel)

    def to_wire(self) -> dict:
        wire = {"keyed": [h.to_wire() for h in self.keyed],
                "operator": [h.to_wire() for h in self.operator]}
        if self.channel:
            wire["channel"] = [h.to_wire() for h in self.channel]
        return wire

    @classmethod
    def from_wire(cls, data: dict) -> "OperatorSubtaskState":
        return cls(tuple(keyed_handle_from_wire(h) for h in data.get("keyed", ())),
                   tuple(OperatorStateHandle.from_wire(h) for h in data.get("operator", ())),
                   tuple(FileHandle.from_wire(h) for h in data.get("channel", ())))


# What a task acknowledges with: operator uid -> its subtask state.
TaskStateSnapshot = dict[str, OperatorSubtaskState]


def task_state_to_wire(snapshot: TaskStateSnapshot) -> dict:
    return {uid: state.to_wire() for uid, state in snapshot.items()}


def task_state_from_wire(data: dict) -> TaskStateSnapshot:
    return {str(uid): OperatorSubtaskState.from_wire(state) for uid, state in data.items()}
