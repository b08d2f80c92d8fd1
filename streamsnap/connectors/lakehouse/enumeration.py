"""Which table versions each subtask of a continuous table source has enumerated (pure logic).

A continuous Delta / Iceberg source has no central enumerator: every subtask reads the table's
log itself, version after version, and takes the files it owns (`owner_of(path, parallelism)`,
as the monitored FileSource does), so no file is taken twice within a run. Subtasks advance at
their own pace, so at a checkpoint each one has enumerated up to its own `next` version.

That fact is the source-global (union) state, a few integers instead of a list of files: an
element `[generation, parallelism, subtask, next]` says "in that generation (the run between two
restores), with that parallelism, subtask `subtask` took its files of every version < next".
After a restore — with any parallelism — every subtask starts enumerating again at the smallest
`next` of the last generation and skips a file of version v when some earlier generation's owner
of it had already passed v (`v < next[owner_of(path, p)]`): it was taken then, and it is either
finished or in the restored split state. A generation is forgotten once every subtask of a later
one starts beyond its largest `next`, so the state stays as small as the number of restores
whose subtasks had not caught up with each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamsnap.connectors.files import owner_of
from streamsnap.errors import RestoreError


@dataclass(frozen=True)
class Generation:
    """One run's enumeration progress: `nexts[i]` is subtask i's next version to enumerate."""
    number: int
    parallelism: int
    nexts: tuple[int, ...]

    def took(self, path: str, version: int) -> bool:
        return version < self.nexts[owner_of(path, self.parallelism)]


class Enumeration:
    """One subtask's enumeration of versions: where it is, and which files it takes."""

    def __init__(self, subtask: int, parallelism: int, start: int,
                 inherited: tuple[Generation, ...] = (), generation: int = 0):
        self.subtask = subtask
        self.parallelism = parallelism
        self.next_version = start
        self.inherited = inherited
        self.generation = generation

    def takes(self, path: str, version: int) -> bool:
        """Whether this subtask reads file `path`, added in `version`: it owns the file now and
        no subtask of an earlier generation took it."""
        if owner_of(path, self.parallelism) != self.subtask:
            return False
        return not any(g.took(path, version) for g in self.inherited)

    def enumerated(self, version: int) -> None:
        """Every file of `version` (and of all before it) has been taken or left to others."""
        if version < self.next_version:
            raise ValueError(f"version {version} enumerated twice (next is {self.next_version})")
        self.next_version = version + 1

    def elements(self) -> list[list[int]]:
        """This subtask's global-state elements; the inherited generations (the same in every
        subtask) are reported by subtask 0 only."""
        own = [[self.generation, self.parallelism, self.subtask, self.next_version]]
        if self.subtask == 0:
            own += [[g.number, g.parallelism, i, n] for g in self.inherited for i, n in enumerate(g.nexts)]
        return own

    @classmethod
    def restore(cls, elements: list, subtask: int, parallelism: int, what: str) -> Enumeration:
        """The enumeration of subtask `subtask` of `parallelism` after a restore of `elements`
        (the union of every old subtask's `elements()`)."""
        by_generation: dict[int, dict] = {}
        for element in elements:
            try:
                number, old_parallelism, index, next_version = (int(x) for x in element)
            except (TypeError, ValueError) as exc:
                raise RestoreError(f"{what}: cannot restore the enumerated versions from {element!r}; "
                                   f"expected [generation, parallelism, subtask, next version]") from exc
            entry = by_generation.setdefault(number, {"parallelism": old_parallelism, "nexts": {}})
            if entry["parallelism"] != old_parallelism:
                raise RestoreError(f"{what}: generation {number} of the enumerated versions has two "
                                   f"parallelisms ({entry['parallelism']} and {old_parallelism})")
            entry["nexts"][index] = next_version
        generations = []
        for number in sorted(by_generation):
            entry = by_generation[number]
            missing = sorted(set(range(entry["parallelism"])) - set(entry["nexts"]))
            if missing:
                raise RestoreError(f"{what}: the checkpoint lacks the enumerated versions of subtask(s) "
                                   f"{missing} of {entry['parallelism']} (generation {number}); it "
                                   f"was not written by this source")
            nexts = tuple(entry["nexts"][i] for i in range(entry["parallelism"]))
            generations.append(Generation(number, entry["parallelism"], nexts))
        if not generations:
            raise RestoreError(f"{what}: the checkpoint holds no enumerated versions of this "
                               f"continuous source (was it taken by a bounded one?)")
        start = min(generations[-1].nexts)
        inherited = tuple(g for g in generations if max(g.nexts) > start)
        return cls(subtask, parallelism, start, inherited, generations[-1].number + 1)
