"""The global committer's decisions, message by message (connectors/lakehouse/committer.py):
which files a completed checkpoint commits, what a repeated commit adds (nothing), what a
failover drops, and what a restore hands back."""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace

import pytest

from streamsnap.connectors.lakehouse.committer import (Commit, CommitPlan, FinalCommitError, GlobalCommitter, TableCommitter,
                                                       application_id)
from streamsnap.errors import ConfigurationError

APP = application_id("job", "delta", "run1")
OLD = application_id("job", "delta", "run0")


def f(path: str, checkpoint_id: int, app: str = APP) -> dict:
    return {"path": path, "checkpoint_id": checkpoint_id, "app_id": app, "size": 1}


def test_a_completed_checkpoint_commits_its_files_and_older_ones_with_its_id_as_the_transaction():
    plan = CommitPlan(APP)
    plan.precommitted([f("a", 1), f("b", 2)])
    plan.precommitted([f("c", 3)])               # checkpoint 3's barrier passed, it has not completed
    commit = plan.plan(2, {APP: None})
    assert [x["path"] for x in commit.files] == ["a", "b"] and commit.transactions == {APP: 2}
    plan.committed(commit)
    assert [x["path"] for x in plan.uncommitted()] == ["c"]


def test_files_the_table_already_has_by_their_apps_transaction_are_not_committed_again():
    plan = CommitPlan(APP)
    plan.precommitted([f("a", 4), f("b", 5), f("old", 3, OLD), f("old2", 4, OLD)])
    commit = plan.plan(5, {APP: 4, OLD: 3})      # a commit of 4 had run before the failover
    assert [x["path"] for x in commit.files] == ["b", "old2"]
    assert commit.transactions == {APP: 5, OLD: 5}
    plan.committed(commit)
    assert plan.plan(5, {APP: 5, OLD: 5}) is None and plan.uncommitted() == []


def test_a_repeated_commit_of_the_same_checkpoint_adds_nothing():
    plan = CommitPlan(APP)
    plan.precommitted([f("a", 7)])
    assert plan.plan(7, {APP: 7}) is None
    assert plan.uncommitted() == []


def test_an_aborted_checkpoints_files_are_committed_by_the_next_completed_one():
    plan = CommitPlan(APP)
    plan.precommitted([f("a", 1)])               # checkpoint 1 aborted
    plan.precommitted([f("b", 2)])
    assert [x["path"] for x in plan.plan(2, {}).files] == ["a", "b"]


def test_a_failover_drops_uncompleted_checkpoints_files_but_keeps_a_completed_one_whose_commit_failed():
    plan = CommitPlan(APP)
    plan.precommitted([f("a", 1), f("b", 2)])
    assert plan.plan(1, {}) is not None          # its commit then failed: not marked committed
    assert [x["path"] for x in plan.failover()] == ["b"]
    assert [x["path"] for x in plan.uncommitted()] == ["a"]


def test_duplicates_of_a_file_from_a_restore_union_state_count_once():
    plan = CommitPlan(APP)
    plan.precommitted([f("a", 1), f("a", 1), f("b", 1)])
    assert len(plan.plan(1, {}).files) == 2


def test_without_checkpointing_the_commit_carries_no_transaction():
    plan = CommitPlan(APP)
    plan.precommitted([f("a", 0)])
    commit = plan.plan(2 ** 62, {}, transactional=False)
    assert commit.transactions == {} and len(commit.files) == 1


class _Table(TableCommitter):
    """An in-memory table: its log of commits and the apps' transactions."""

    def __init__(self, fail: bool = False, refuse: str | None = None):
        self.refuse = refuse
        self.commits: list[Commit] = []
        self.versions: dict[str, int] = {}
        self.fail = fail
        self.cleaned: list[tuple] = []

    def committed_versions(self, apps):
        return {a: self.versions.get(a) for a in apps}

    def commit(self, commit):
        if self.fail:
            raise OSError("the object store is down")
        if self.refuse:
            raise ConfigurationError(self.refuse)
        self.commits.append(commit)
        self.versions.update(commit.transactions)

    def cleanup(self, keep, current_token):
        self.cleaned.append((frozenset(keep), current_token))
        return []


def _committer(table: _Table, failures: list) -> GlobalCommitter:
    committer = GlobalCommitter("Delta(t)", lambda uid: table)
    committer.attach(job_id="job", run_id="run1", uid="delta",
                     fail=lambda cause, recurs=False: failures.append((cause, recurs)))
    return committer


def _complete(committer, checkpoint_id):
    committer.notify_checkpoint_complete(SimpleNamespace(checkpoint_id=checkpoint_id))


def test_the_driver_component_commits_once_per_completed_checkpoint_with_every_subtasks_files():
    table, failures = _Table(), []
    committer = _committer(table, failures)
    committer.on_message(0, {"op": "precommit", "checkpoint_id": 1, "files": [f("s0-1", 1)]})
    committer.on_message(1, {"op": "precommit", "checkpoint_id": 1, "files": [f("s1-1", 1)]})
    _complete(committer, 1)
    committer.on_message(0, {"op": "precommit", "checkpoint_id": 2, "files": []})
    _complete(committer, 2)                      # nothing new: no empty commit
    assert [(c.checkpoint_id, len(c.files)) for c in table.commits] == [(1, 2)]
    assert table.versions == {APP: 1} and failures == []


def test_a_restore_commits_what_the_restored_checkpoint_pre_committed_once_and_cleans_up():
    table, failures = _Table(), []
    first = _committer(table, failures)
    first.on_message(0, {"op": "precommit", "checkpoint_id": 3, "files": [f("a", 3)]})
    _complete(first, 3)
    first.on_message(0, {"op": "precommit", "checkpoint_id": 4, "files": [f("b", 4)]})
    # Checkpoint 4 completes and the JobMaster is SIGKILLed before its commit; the next one
    # (empty memory) restores 4, whose sink state still lists a (its notification raced) and b.
    second = _committer(table, failures)
    second.on_message(0, {"op": "recover", "checkpoint_id": 4, "files": [f("a", 3), f("b", 4)], "token": "-run1-a1-"})
    assert [[x["path"] for x in c.files] for c in table.commits] == [["a"], ["b"]]
    assert table.versions == {APP: 4} and table.cleaned == [(frozenset(), "-run1-a1-")]
    # A second restore of the same checkpoint (another failure at once) commits nothing again.
    second.on_message(0, {"op": "recover", "checkpoint_id": 4, "files": [f("a", 3), f("b", 4)], "token": "-run1-a2-"})
    assert len(table.commits) == 2


def test_a_failed_commit_fails_the_job_over_and_keeps_the_files_for_the_next_commit():
    table, failures = _Table(fail=True), []
    committer = _committer(table, failures)
    committer.on_message(0, {"op": "precommit", "checkpoint_id": 1, "files": [f("a", 1)]})
    _complete(committer, 1)
    [(cause, recurs)] = failures
    assert "commit of checkpoint 1 failed" in cause and "object store" in cause and not recurs
    table.fail = False
    committer.on_failover()
    committer.on_message(0, {"op": "recover", "checkpoint_id": 1, "files": [f("a", 1)], "token": "-run1-a1-"})
    assert [[x["path"] for x in c.files] for c in table.commits] == [["a"]]


def test_a_stream_that_does_not_fit_the_table_fails_the_job_without_a_restart():
    table, failures = _Table(refuse="column 'total' is long in the stream but string in the table"), []
    committer = _committer(table, failures)
    committer.on_message(0, {"op": "precommit", "checkpoint_id": 1, "files": [f("a", 1)]})
    _complete(committer, 1)
    [(cause, recurs)] = failures
    assert recurs and "column 'total'" in cause and table.commits == []


def test_an_unknown_message_is_refused_by_name():
    committer = _committer(_Table(), [])
    with pytest.raises(ValueError, match="unknown committer message 'data'"):
        committer.on_message(0, {"op": "data"})


class _StepExecutor:
    """The committer's worker, stepped by the test: no threads."""

    def __init__(self):
        self.queued: list = []

    def submit(self, fn):
        future = concurrent.futures.Future()
        self.queued.append((fn, future))
        return future

    def run_next(self):
        fn, future = self.queued.pop(0)
        try:
            future.set_result(fn())
        except Exception as exc:
            future.set_exception(exc)

    def shutdown(self, wait=True, cancel_futures=False):
        for _, future in self.queued:
            future.cancel()


def _stepped(table: _Table, failures: list, committed: list, loop: list) -> tuple[GlobalCommitter, _StepExecutor]:
    executor = _StepExecutor()
    committer = GlobalCommitter("Delta(t)", lambda uid: table)
    committer.attach(job_id="job", run_id="run1", uid="delta", fail=lambda cause, recurs=False: failures.append(cause),
                     post=loop.append, on_committed=committed.append, executor=executor)
    return committer, executor


def _run_loop(loop: list) -> None:
    while loop:
        loop.pop(0)()


def test_a_checkpoint_completing_while_the_previous_commit_is_in_flight_commits_only_what_the_table_lacks():
    table, failures, committed, loop = _Table(), [], [], []
    committer, worker = _stepped(table, failures, committed, loop)
    committer.on_message(0, {"op": "precommit", "checkpoint_id": 1, "files": [f("a", 1)]})
    _complete(committer, 1)
    committer.on_message(0, {"op": "precommit", "checkpoint_id": 2, "files": [f("b", 2)]})
    _complete(committer, 2)                      # commit 1 has not run yet: the loop is not held up
    assert table.commits == [] and committed == [] and committer.committed_through == 0
    worker.run_next()
    worker.run_next()                            # request 2 also held "a"; the table had it by then
    assert [[x["path"] for x in c.files] for c in table.commits] == [["a"], ["b"]]
    assert committed == []                       # outcomes are settled on the loop, in order
    _run_loop(loop)
    assert committed == [1, 2] and committer.plan.uncommitted() == [] and failures == []
    assert [c["checkpoint_id"] for c in committer.commits] == [1, 2]


def test_a_failed_commit_is_reported_once_and_the_next_queued_commit_adds_its_files():
    table, failures, committed, loop = _Table(fail=True), [], [], []
    committer, worker = _stepped(table, failures, committed, loop)
    committer.on_message(0, {"op": "precommit", "checkpoint_id": 1, "files": [f("a", 1)]})
    _complete(committer, 1)
    committer.on_message(0, {"op": "precommit", "checkpoint_id": 2, "files": [f("b", 2)]})
    _complete(committer, 2)
    worker.run_next()
    table.fail = False
    worker.run_next()
    _run_loop(loop)
    assert len(failures) == 1 and "checkpoint 1 failed" in failures[0]
    # Checkpoint 2's transaction covers a: a restore of 2 finds nothing to add.
    assert [[x["path"] for x in c.files] for c in table.commits] == [["a", "b"]] and table.versions == {APP: 2}
    assert committed == [2]


@pytest.mark.parametrize("in_flight_succeeds", [True, False])
def test_a_commit_in_flight_at_a_failover_is_finished_or_redone_by_the_restore_never_both(in_flight_succeeds):
    table, failures, committed, loop = _Table(fail=not in_flight_succeeds), [], [], []
    committer, worker = _stepped(table, failures, committed, loop)
    committer.on_message(0, {"op": "precommit", "checkpoint_id": 1, "files": [f("a", 1)]})
    _complete(committer, 1)
    committer.on_message(0, {"op": "precommit", "checkpoint_id": 2, "files": [f("b", 2)]})   # never completes
    committer.on_failover()                      # a task died while commit 1 was in flight
    committer.on_message(0, {"op": "recover", "checkpoint_id": 1, "files": [f("a", 1)], "token": "-run1-a1-"})
    worker.run_next()                            # the in-flight commit ends
    table.fail = False
    worker.run_next()                            # then the restore's, queued behind it
    _run_loop(loop)
    assert [[x["path"] for x in c.files] for c in table.commits] == [["a"]] and table.versions == {APP: 1}
    assert failures == []                        # the restore's commit covered the failed one
    assert committed[-1] == 1 and committer.plan.uncommitted() == []
    assert table.cleaned == [(frozenset(), "-run1-a1-")]   # b (never completed) is not kept


def test_the_job_end_waits_for_the_commits_in_flight():
    table, failures, committed, loop = _Table(), [], [], []
    committer = GlobalCommitter("Delta(t)", lambda uid: table)
    committer.attach(job_id="job", run_id="run1", uid="delta", fail=lambda cause, recurs=False: failures.append(cause),
                     post=loop.append)         # a real worker thread
    committer.on_message(0, {"op": "precommit", "checkpoint_id": 1, "files": [f("a", 1)]})
    _complete(committer, 1)
    committer.on_finished(checkpointing=True)
    assert [c.checkpoint_id for c in table.commits] == [1] and committer.committed_through == 1


def test_a_commit_failing_at_the_job_end_raises_instead_of_failing_over():
    table, failures = _Table(fail=True), []
    committer = _committer(table, failures)     # commits inline: no worker thread
    committer.on_message(0, {"op": "precommit", "checkpoint_id": 0, "files": [f("a", 0)]})
    with pytest.raises(FinalCommitError, match=r"1 data file\(s\) written by the job are not in the table: "
                                               r".*the commit at the end of input failed.*object store"):
        committer.on_finished(checkpointing=False)   # the end of input is the commit point
    assert failures == [] and table.commits == []    # no failover asked: no task is left to restore


def test_the_final_checkpoints_failed_commit_raises_at_the_end_even_after_it_asked_for_a_failover():
    table, failures = _Table(fail=True), []
    committer = _committer(table, failures)
    committer.on_message(0, {"op": "precommit", "checkpoint_id": 1, "files": [f("a", 1)]})
    _complete(committer, 1)                          # reported: a failover the ending job will not run
    assert len(failures) == 1
    with pytest.raises(FinalCommitError, match="object store"):
        committer.on_finished(checkpointing=True)


def test_a_failure_reported_before_the_end_whose_files_a_later_commit_added_is_not_raised_again():
    table, failures, committed, loop = _Table(fail=True), [], [], []
    committer, worker = _stepped(table, failures, committed, loop)
    committer.on_message(0, {"op": "precommit", "checkpoint_id": 1, "files": [f("a", 1)]})
    _complete(committer, 1)
    worker.run_next()
    _run_loop(loop)                              # reported: the failover is on its way
    table.fail = False
    committer.on_message(0, {"op": "precommit", "checkpoint_id": 2, "files": [f("b", 2)]})
    _complete(committer, 2)                      # the final checkpoint, covering a too
    worker.run_next()
    committer.on_finished(True)                  # the job ended before the failover ran: nothing lacks
    assert [[x["path"] for x in c.files] for c in table.commits] == [["a", "b"]] and len(failures) == 1
