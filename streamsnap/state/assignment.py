"""Redistributing one operator's checkpointed state to a (possibly different) parallelism.

This is Flink's StateAssignmentOperation together with its round-robin operator state
repartitioner, for one operator: given what each old subtask wrote, decide what each new
subtask restores. Rescaling is nothing but restoring with another parallelism, so the same
code serves plain recovery (same parallelism) and rescaling.

* Keyed state moves by key group: a new subtask gets every old handle whose key-group range
  intersects its own range, and its backend reads only its key groups (the handles carry
  per-key-group offsets).
* Operator list state moves by element, per state name and distribution mode:
  SPLIT — the elements of all old subtasks, concatenated in old subtask order, cut into
  contiguous chunks whose sizes differ by at most one (the first `total % p` subtasks get one
  more); UNION — every new subtask gets all elements; BROADCAST — every subtask holds the
  same copy, so the copy of the lowest old subtask that wrote the state goes to everyone.

The result only references file ranges; nothing is read here, so the driver can compute it
cheaply and ship it to the tasks (it has a msgpack-safe wire form).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from streamsnap.checkpoint.handles import (BROADCAST, DISTRIBUTION_MODES, SPLIT_DISTRIBUTE, UNION,
                                           FileHandle, KeyGroupsStateHandle,
                                           OperatorSubtaskState, keyed_handle_from_wire)
from streamsnap.errors import RestoreError
from streamsnap.state.key_groups import (KeyGroupRange, check_parallelism,
                                         key_group_range_for_subtask)


@dataclass(frozen=True)
class StateElementRef:
    """One serialized operator-state element: `length` bytes at `offset` of `file`."""

    file: FileHandle
    offset: int
    length: int


@dataclass(frozen=True)
class OperatorStateRestore:
    """The elements of one operator state name a new subtask restores, and their mode."""

    name: str
    mode: str
    elements: tuple[StateElementRef, ...] = ()


@dataclass(frozen=True)
class SubtaskRestoreState:
    """What one new subtask of one operator restores; both state backends accept it.

    `is_restored` is False for a fresh start (no checkpoint), True when restoring from one,
    even if the operator had no state in it (Flink's `isRestored`).
    """

    subtask_index: int
    parallelism: int
    max_parallelism: int
    key_group_range: KeyGroupRange
    keyed: tuple[KeyGroupsStateHandle, ...] = ()
    operator: tuple[OperatorStateRestore, ...] = ()
    is_restored: bool = True
    # In-flight data of an unaligned checkpoint (only at unchanged parallelism).
    channel: tuple[FileHandle, ...] = ()

    @classmethod
    def fresh(cls, subtask_index: int, parallelism: int, max_parallelism: int) -> "SubtaskRestoreState":
        """A subtask that starts without any checkpoint."""
        return cls(subtask_index, parallelism, max_parallelism,
                   key_group_range_for_subtask(max_parallelism, parallelism, subtask_index),
                   is_restored=False)

    def operator_state(self, name: str) -> OperatorStateRestore | None:
        for state in self.operator:
            if state.name == name:
                return state
        return None

    def to_wire(self) -> dict:
        return {
            "subtask": [self.subtask_index, self.parallelism, self.max_parallelism],
            "key_groups": [self.key_group_range.start, self.key_group_range.end],
            "keyed": [h.to_wire() for h in self.keyed],
            "operator": [[s.name, s.mode, [[e.file.to_wire(), e.offset, e.length] for e in s.elements]]
                         for s in self.operator],
            "restored": self.is_restored,
            "channel": [h.to_wire() for h in self.channel],
        }

    @classmethod
    def from_wire(cls, data: dict) -> "SubtaskRestoreState":
        index, parallelism, max_parallelism = (int(x) for x in data["subtask"])
        start, end = data["key_groups"]
        return cls(
            index, parallelism, max_parallelism, KeyGroupRange(int(start), int(end)),
            tuple(keyed_handle_from_wire(h) for h in data["keyed"]),
            tuple(OperatorStateRestore(str(name), str(mode), tuple(
                StateElementRef(FileHandle.from_wire(f), int(off), int(length))
                for f, off, length in elements)) for name, mode, elements in data["operator"]),
            bool(data["restored"]),
            tuple(FileHandle.from_wire(h) for h in data.get("channel", ())),
        )


def _chunk(items: list, parallelism: int, index: int) -> list:
    base, remainder = divmod(len(items), parallelism)
    start = index * base + min(index, remainder)
    return items[start:start + base + (1 if index < remainder else 0)]


def assign_operator_state(subtask_states: Mapping[int, OperatorSubtaskState],
                          max_parallelism: int, new_parallelism: int) -> list[SubtaskRestoreState]:
    """Per new subtask index, what it restores from the old subtasks' `subtask_states`.

    `subtask_states` maps every old subtask index 0..n-1 (n = old parallelism) to its state;
    an empty mapping means the operator had no state in the checkpoint.
    """
    check_parallelism(max_parallelism, new_parallelism)
    old_parallelism = len(subtask_states)
    if set(subtask_states) != set(range(old_parallelism)):
        raise RestoreError(
            f"subtask states must be given for old subtask indices 0..{old_parallelism - 1}, "
            f"got {sorted(subtask_states)}")
    if old_parallelism > max_parallelism:
        raise RestoreError(
            f"the checkpoint has {old_parallelism} subtasks, more than max_parallelism="
            f"{max_parallelism}: the max parallelism cannot change for a job's state")

    keyed: list[KeyGroupsStateHandle] = []
    # name -> (mode, per old subtask index: element refs)
    operator: dict[str, tuple[str, dict[int, list[StateElementRef]]]] = {}
    for old_index in range(old_parallelism):
        state = subtask_states[old_index]
        for handle in state.keyed:
            if not 0 <= handle.key_group_start <= handle.key_group_end < max_parallelism:
                raise RestoreError(
                    f"keyed state of old subtask {old_index} covers key groups "
                    f"[{handle.key_group_start}, {handle.key_group_end}], outside "
                    f"[0, {max_parallelism}): it was written with another max parallelism, "
                    f"which cannot change for a job's state")
            keyed.append(handle)
        for handle in state.operator:
            for name, (mode, offsets) in handle.states.items():
                if mode not in DISTRIBUTION_MODES:
                    raise RestoreError(
                        f"operator state '{name}' of old subtask {old_index} has unknown "
                        f"distribution mode {mode!r}; expected one of {DISTRIBUTION_MODES}")
                known_mode, per_subtask = operator.setdefault(name, (mode, {}))
                if known_mode != mode:
                    raise RestoreError(
                        f"operator state '{name}' was written as {known_mode!r} by one subtask "
                        f"and as {mode!r} by old subtask {old_index}")
                per_subtask.setdefault(old_index, []).extend(
                    StateElementRef(handle.file, off, length) for off, length in offsets)

    if old_parallelism != new_parallelism and any(s.channel for s in subtask_states.values()):
        raise RestoreError(
            f"the checkpoint holds in-flight data (an unaligned checkpoint) of {old_parallelism} "
            f"subtasks, which cannot be redistributed to {new_parallelism}; rescale from a "
            f"savepoint (always aligned) instead")
    result = []
    for index in range(new_parallelism):
        kg_range = key_group_range_for_subtask(max_parallelism, new_parallelism, index)
        mine = tuple(h for h in keyed
                     if kg_range.overlaps(KeyGroupRange(h.key_group_start, h.key_group_end)))
        restores = []
        for name in sorted(operator):
            mode, per_subtask = operator[name]
            if mode == SPLIT_DISTRIBUTE:
                everything = [ref for i in sorted(per_subtask) for ref in per_subtask[i]]
                elements = _chunk(everything, new_parallelism, index)
            elif mode == UNION:
                elements = [ref for i in sorted(per_subtask) for ref in per_subtask[i]]
            else:
                assert mode == BROADCAST
                elements = per_subtask[min(per_subtask)]
            restores.append(OperatorStateRestore(name, mode, tuple(elements)))
        channel = subtask_states[index].channel if old_parallelism == new_parallelism else ()
        result.append(SubtaskRestoreState(index, new_parallelism, max_parallelism, kg_range,
                                          mine, tuple(restores), True, channel))
    return result
