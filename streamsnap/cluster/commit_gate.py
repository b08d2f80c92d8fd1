"""The commit gate: nothing passes before the sinks' global committers have it in their tables.

notify-checkpoint-complete reaches the tasks only after every global committer (the driver
component of a lakehouse sink, connectors/lakehouse/committer.py) has committed that
checkpoint's table transaction, and in checkpoint order. Why: a task that hears checkpoint n
completed lets go of n's files in its sink state. Were it told before the table has n, a later
checkpoint could complete without n's files in its state, and a JobMaster that dies with n's
commit in flight would leave a restore nothing to commit: those rows would be lost.

Likewise the job's end: it is FINISHED only once every committer made its last commits. One
that failed then cannot be failed over any more (the tasks are done), so `finish` says so and
the JobMaster fails the job — keeping its checkpoints to resume from — rather than report
FINISHED over a table that lacks rows.

A job without global committers passes every notification at once. Pure logic, no I/O: the
JobMaster calls `hold` as the coordinator notifies, `release` whenever a committer's
`committed_through` advances, `clear` when the attempt's tasks are going (the restore re-sends
their files to the committers), and `finish` as the job's input is done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from streamsnap.errors import StreamsnapError


class CommitGate:
    """Completion notifications (one per task and checkpoint) held until the tables have them.

    `components`: the sinks' driver components; the global committers among them have
    `committed_through` (the table has every checkpoint up to this id)."""

    def __init__(self, components: Iterable[object] = ()):
        self._components = list(components)
        self._committers = [c for c in self._components if hasattr(c, "committed_through")]
        self._held: list[tuple[int, Callable[[], None]]] = []

    @property
    def committed_through(self) -> int | None:
        """The latest checkpoint every committer has in its table (None: no committers, no gate)."""
        return min((c.committed_through for c in self._committers), default=None)

    @property
    def held(self) -> list[int]:
        """The checkpoint ids of the notifications waiting, in the order they will be sent."""
        return [checkpoint_id for checkpoint_id, _ in self._held]

    def hold(self, checkpoint_id: int, notify: Callable[[], None]) -> None:
        """Checkpoint `checkpoint_id` completed: `notify` (tell one task) once the tables have it."""
        self._held.append((checkpoint_id, notify))
        self.release()

    def release(self) -> None:
        """A committer committed (or a notification arrived): send what the tables have, oldest
        checkpoint first; the rest keep waiting."""
        through = self.committed_through
        self._held.sort(key=lambda entry: entry[0])   # stable: a checkpoint's tasks keep their order
        due = [entry for entry in self._held if through is None or entry[0] <= through]
        self._held = self._held[len(due):]            # sorted and `through` is one bound: `due` is a prefix
        for _, notify in due:
            notify()

    def clear(self) -> None:
        """The attempt failed: its tasks are going, nothing held is sent."""
        self._held.clear()

    def finish(self, checkpointing: bool, latest_checkpoint: str | None) -> str | None:
        """The job's input is done: every component makes its last commits (`on_finished`). None
        when all did; else why the job fails, with what to do (resume from `latest_checkpoint`,
        the job's latest completed checkpoint, whose restore commits the files again)."""
        failures = []
        for component in self._components:
            if hasattr(component, "on_finished"):
                try:
                    component.on_finished(checkpointing)
                except StreamsnapError as exc:   # a committer that could not commit
                    failures.append(f"sink {getattr(component, 'name', component)}: {exc}")
        if not failures:
            return None
        fix = ("run the job again once the table can be written" if latest_checkpoint is None else
               f"its checkpoints are kept: once the table can be written, resume from the latest one with "
               f"execute(restore_from={latest_checkpoint!r}) to commit them")
        return f"the job read all its input, but its final table commit failed; {fix}:\n" + "\n".join(failures)
