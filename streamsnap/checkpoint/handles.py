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

    @property
    def size(self) -> int:
        return self.file.size

    def to_wire(self) -> dict:
        return {
            "file": self.file.to_wire(),
            "key_groups": [self.key_group_start, self.key_group_end],
            "offsets": [[kg, off, length] for kg, (off, length) in sorted(self.offsets.items())],
            "shared": [f.to_wire() for f in self.shared_files],
        }

    @classmethod
    def from_wire(cls, data: dict) -> "KeyGroupsStateHandle":
        start, end = data["key_groups"]
        return cls(
            FileHandle.from_wire(data["file"]), int(start), int(end),
            {int(kg): (int(off), int(length)) for kg, off, length in data["offsets"]},
            tuple(FileHandle.from_wire(f) for f in data.get("shared", ())),
        )


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

    keyed: tuple[KeyGroupsStateHandle, ...] = ()
    operator: tuple[OperatorStateHandle, ...] = ()

    @property
    def state_size(self) -> int:
        return sum(h.size for h in self.keyed) + sum(h.size for h in self.operator)

    def files(self) -> list[FileHandle]:
        """Files owned exclusively by this snapshot (shared files are reference counted)."""
        return [h.file for h in self.keyed] + [h.file for h in self.operator]

    def to_wire(self) -> dict:
        return {"keyed": [h.to_wire() for h in self.keyed],
                "operator": [h.to_wire() for h in self.operator]}

    @classmethod
    def from_wire(cls, data: dict) -> "OperatorSubtaskState":
        return cls(tuple(KeyGroupsStateHandle.from_wire(h) for h in data.get("keyed", ())),
                   tuple(OperatorStateHandle.from_wire(h) for h in data.get("operator", ())))


# What a task acknowledges with: operator uid -> its subtask state.
TaskStateSnapshot = dict[str, OperatorSubtaskState]


def task_state_to_wire(snapshot: TaskStateSnapshot) -> dict:
    return {uid: state.to_wire() for uid, state in snapshot.items()}


def task_state_from_wire(data: dict) -> TaskStateSnapshot:
    return {str(uid): OperatorSubtaskState.from_wire(state) for uid, state in data.items()}
