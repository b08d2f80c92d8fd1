"""The commit gate (cluster/commit_gate.py), message by message: completion notifications reach
the tasks only once every global committer has the checkpoint in its table, in checkpoint order;
and a job whose last commits failed does not end FINISHED."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from streamsnap.cluster.commit_gate import CommitGate
from streamsnap.errors import StreamsnapError


class _Tasks:
    """What the tasks were told: (checkpoint id, task) in order."""

    def __init__(self):
        self.told: list[tuple[int, int]] = []

    def complete(self, gate: CommitGate, checkpoint_id: int, *tasks: int) -> None:
        """The coordinator notifies `tasks` that `checkpoint_id` completed, through the gate."""
        for task in tasks:
            gate.hold(checkpoint_id, lambda c=checkpoint_id, t=task: self.told.append((c, t)))


def _committers(*through: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(committed_through=t) for t in through]


def test_without_global_committers_every_notification_passes_at_once():
    tasks, gate = _Tasks(), CommitGate()
    tasks.complete(gate, 1, 0, 1)
    assert tasks.told == [(1, 0), (1, 1)] and gate.held == [] and gate.committed_through is None


def test_a_notification_waits_until_the_committer_has_its_checkpoint():
    tasks, (committer,) = _Tasks(), _committers(0)
    gate = CommitGate([committer])
    tasks.complete(gate, 1, 0, 1)
    assert tasks.told == [] and gate.held == [1, 1]
    gate.release()                                   # nothing committed yet: still held
    assert tasks.told == []
    committer.committed_through = 1
    gate.release()
    assert tasks.told == [(1, 0), (1, 1)] and gate.held == []


def test_every_committer_must_have_the_checkpoint():
    tasks, (delta, iceberg) = _Tasks(), _committers(0, 0)
    gate = CommitGate([delta, iceberg])
    tasks.complete(gate, 3, 0)
    delta.committed_through = 3
    gate.release()
    assert tasks.told == [] and gate.committed_through == 0
    iceberg.committed_through = 3
    gate.release()
    assert tasks.told == [(3, 0)]


def test_notifications_are_sent_in_checkpoint_order_and_only_up_to_the_committed_one():
    tasks, (committer,) = _Tasks(), _committers(0)
    gate = CommitGate([committer])
    for checkpoint_id in (4, 2, 3):                  # 2 arriving after 4: out of order
        tasks.complete(gate, checkpoint_id, 0)
    committer.committed_through = 3                  # one commit covers 2 and 3
    gate.release()
    assert tasks.told == [(2, 0), (3, 0)] and gate.held == [4]
    committer.committed_through = 4
    gate.release()
    assert tasks.told == [(2, 0), (3, 0), (4, 0)]


def test_a_notification_for_an_already_committed_checkpoint_passes_at_once():
    tasks = _Tasks()
    tasks.complete(CommitGate(_committers(5)), 5, 2)
    assert tasks.told == [(5, 2)]


def test_a_failover_drops_what_is_held_and_a_later_commit_sends_nothing_of_it():
    tasks, (committer,) = _Tasks(), _committers(0)
    gate = CommitGate([committer])
    tasks.complete(gate, 1, 0)
    gate.clear()                                     # the attempt's tasks are going
    committer.committed_through = 1
    gate.release()
    assert tasks.told == [] and gate.held == []


class _Component:
    """A sink's driver component at the job's end: its last commits succeed or raise."""

    def __init__(self, name: str, error: Exception | None = None):
        self.name, self.error, self.finished = name, error, []

    def on_finished(self, checkpointing: bool) -> None:
        self.finished.append(checkpointing)
        if self.error is not None:
            raise self.error


def test_the_job_end_finishes_every_component_and_passes_when_all_committed():
    collect, delta = _Component("collect"), _Component("Delta(t)")
    assert CommitGate([collect, delta]).finish(True, "/ckpt/job/chk-4") is None
    assert collect.finished == delta.finished == [True]


def test_a_final_commit_that_failed_fails_the_job_naming_the_sink_and_the_checkpoint_to_resume_from():
    failing = _Component("Delta(t)", StreamsnapError("3 data file(s) written by the job are not in the table"))
    other = _Component("Iceberg(db.t)")
    gate = CommitGate([failing, other])
    why = gate.finish(True, "/ckpt/job/chk-4")
    assert "final table commit failed" in why and "sink Delta(t): 3 data file(s)" in why
    assert "execute(restore_from='/ckpt/job/chk-4')" in why and other.finished == [True]   # the others still finish
    assert "run the job again" in CommitGate([failing]).finish(False, None)


def test_a_bug_in_a_component_is_not_taken_for_a_failed_commit():
    with pytest.raises(KeyError):
        CommitGate([_Component("Delta(t)", KeyError("oops"))]).finish(True, None)
