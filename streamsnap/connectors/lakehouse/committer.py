"""The global committer of a lakehouse sink: one table commit per completed checkpoint.

Flink's global committer (an operator coordinator notified of completion, in the terms of the
checkpoint design): the sink's writers — one per subtask — write data files as the stream
flows; at barrier n each closes its files and pre-commits their descriptions (`committables`:
path, size, partition values, stats, the checkpoint id n they belong to and the application id
of the run that wrote them). ONE committer per sink, a driver component in the JobMaster, makes
them visible in one table commit when checkpoint n completes. Why one and not one per subtask:
a table format commits optimistically — p subtasks committing concurrently conflict and retry,
leave p table versions per checkpoint, and a reader may see part of a checkpoint; one commit
per checkpoint is atomic, conflict-free and one version per checkpoint.

How the committables reach the committer: each writer sends its checkpoint's files to the
driver component *before* it acknowledges the checkpoint (the same control connection, so they
arrive first), and keeps every file not yet known committed in the sink's operator state. On a
restore (a task failure, or the JobMaster's process SIGKILLed in cluster mode, whose next
JobMaster has an empty memory) subtask 0 re-sends the restored checkpoint's committables
(union state: all subtasks'), and the committer commits those the table does not have yet.
Reading them from the restored checkpoint on the JobMaster would need the operator state's
format here; the writers already have it decoded.

Idempotence: every commit carries an application transaction (Delta's `txn` action; Iceberg's
snapshot summary) `app id -> checkpoint id`, the app id naming the job, the sink's uid and the
run. A file whose checkpoint id is at most its app's committed version is already in the table
and is skipped, so a commit repeated after a failover adds nothing twice. The run is part of
the app id because checkpoint ids restart at 1 in a fresh checkpoint directory: a new run of
the same job must not mistake its checkpoint 3 for an earlier run's.

Files of checkpoints that never completed are never planned into a commit; the table-specific
part deletes them when a restore tells which files survive (`cleanup`).

`CommitPlan` and `decide` below are the sans-I/O decision logic (unit-tested message by
message); `GlobalCommitter` drives them against a `TableCommitter` (Delta, Iceberg): decisions
on the JobMaster's loop, the table I/O on one worker thread per sink.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from streamsnap.errors import ConfigurationError, StreamsnapError

log = logging.getLogger(__name__)

NO_CHECKPOINT = 0   # the checkpoint id of files written by a job without checkpointing
END_OF_INPUT = 2 ** 62   # the "checkpoint" a job without checkpointing commits at: its end


class FinalCommitError(StreamsnapError):
    """The commits at the job's end failed: rows the job wrote are not in the table. Raised by
    `on_finished`, so the job fails (keeping its checkpoints to resume from) instead of ending
    FINISHED over a table that lacks them."""


def application_id(job_id: str, uid: str, run_id: str) -> str:
    """The application transaction id of one run's sink: what its commits are recognised by."""
    return f"streamsnap-{job_id}-{uid}-{run_id}"


@dataclass(frozen=True)
class Commit:
    """One table commit: `files` made visible with the application transactions `transactions`
    (app id -> checkpoint id; empty without checkpointing)."""

    checkpoint_id: int
    files: tuple[dict, ...]
    transactions: Mapping[str, int]


@dataclass(frozen=True)
class CommitRequest:
    """What the loop hands the committer's worker for completed checkpoint `checkpoint_id`:
    every pending file of a checkpoint up to it (also files of an earlier request still in
    flight: the worker reads the table's transactions first and leaves out what it has)."""

    checkpoint_id: int
    files: tuple[dict, ...]
    transactional: bool = True

    @property
    def apps(self) -> set[str]:
        return {f["app_id"] for f in self.files}


def decide(request: CommitRequest, committed_versions: Mapping[str, int | None]) -> tuple[Commit | None, tuple[str, ...]]:
    """The commit of `request` given the table's transactions (app id -> last committed
    checkpoint id, or None); with the paths the table already has. None: nothing to add."""
    versions = committed_versions if request.transactional else {}
    done = tuple(f["path"] for f in request.files if _already_committed(f, versions))
    todo = tuple(sorted((f for f in request.files if not _already_committed(f, versions)), key=lambda f: f["path"]))
    if not todo:
        return None, done
    transactions = {f["app_id"]: request.checkpoint_id for f in todo} if request.transactional else {}
    return Commit(request.checkpoint_id, todo, transactions), done


@dataclass
class CommitPlan:
    """Which pre-committed files are pending, and which a completed checkpoint commits; no I/O.

    `committed_versions` (app id -> the app's last committed checkpoint id in the table, or
    None) comes from the table; `apps_to_check` says which apps a plan needs it for.
    """

    app_id: str
    pending: dict[str, dict] = field(default_factory=dict)   # path -> committable
    last_completed: int = NO_CHECKPOINT

    def precommitted(self, files: Iterable[dict]) -> None:
        """A writer's files of a checkpoint (or, recovered, of the restored checkpoint)."""
        for f in files:
            self.pending.setdefault(f["path"], dict(f))

    def apps_to_check(self, checkpoint_id: int) -> set[str]:
        return {f["app_id"] for f in self.pending.values() if f["checkpoint_id"] <= checkpoint_id}

    def request(self, checkpoint_id: int, transactional: bool = True) -> CommitRequest:
        """Checkpoint `checkpoint_id` completed: the request for its commit."""
        self.last_completed = max(self.last_completed, checkpoint_id)
        due = tuple(sorted((dict(f) for f in self.pending.values() if f["checkpoint_id"] <= checkpoint_id),
                           key=lambda f: f["path"]))
        return CommitRequest(checkpoint_id, due, transactional)

    def plan(self, checkpoint_id: int, committed_versions: Mapping[str, int | None],
             transactional: bool = True) -> Commit | None:
        """`request` and `decide` at once (files the table has are settled); None: nothing to add."""
        commit, done = decide(self.request(checkpoint_id, transactional), committed_versions)
        self.settled(done)
        return commit

    def settled(self, paths: Iterable[str]) -> None:
        """These files are in the table."""
        for path in paths:
            self.pending.pop(path, None)

    def committed(self, commit: Commit) -> None:
        self.settled(f["path"] for f in commit.files)

    def failover(self) -> list[dict]:
        """The attempt failed: files of checkpoints that did not complete are dropped (their
        writers write them again after the restore); returns them. Files of a completed
        checkpoint whose commit failed (or is still in flight) stay, and are committed by the
        restore's commit unless the table has them by then."""
        dropped = [f for f in self.pending.values() if f["checkpoint_id"] > self.last_completed]
        for f in dropped:
            del self.pending[f["path"]]
        return dropped

    def uncommitted(self) -> list[dict]:
        return list(self.pending.values())


def _already_committed(f: dict, versions: Mapping[str, int | None]) -> bool:
    version = versions.get(f["app_id"])
    return version is not None and f["checkpoint_id"] <= version


class TableCommitter(ABC):
    """The table-format part of the global committer (runs on the JobMaster)."""

    @abstractmethod
    def committed_versions(self, apps: set[str]) -> dict[str, int | None]:
        """Each app's last committed checkpoint id in the table (None: never, or no table)."""

    @abstractmethod
    def commit(self, commit: Commit) -> None:
        """Make `commit.files` visible in one table commit carrying `commit.transactions`."""

    @abstractmethod
    def cleanup(self, keep: set[str], current_token: str) -> list[str]:
        """Delete this sink's data files no commit references: not in the table, not in `keep`,
        not written by the current attempt (`current_token` in their name). Returns them."""


@dataclass(frozen=True)
class CommitOutcome:
    """What the worker did for one request: the commit (None: the table had it all), the paths
    the table already had, the commit's duration, and what a restore's cleanup deleted."""

    commit: Commit | None
    done: tuple[str, ...]
    seconds: float
    deleted: tuple[str, ...] = ()


@dataclass
class _Requested:
    request: CommitRequest
    epoch: int                                  # the committer's failover count when requested
    future: concurrent.futures.Future


class _InlineExecutor:
    """Runs the commit at once on the caller's thread: a committer outside a JobMaster (tests)."""

    def submit(self, fn: Callable[[], CommitOutcome]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn())
        except Exception as exc:   # handed to the loop's settling, which reports it
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Nothing runs in the background."""


class GlobalCommitter:
    """The driver component of a lakehouse sink: receives the writers' messages and the
    coordinator's completions on the JobMaster's loop, and runs the table I/O on one worker
    thread of its own, so a commit that takes seconds (an Iceberg commit of many files, an
    object store) does not hold up acknowledgements, barriers and heartbeats.

    Order: requests run one at a time in the order the loop made them (checkpoint order), and
    their outcomes are settled on the loop in that order. Each request holds every file due up
    to its checkpoint, including those of a request still in flight; the worker reads the
    table's transactions right before committing, so whichever of the two commits first adds
    them and the other leaves them out. A failed commit is reported to the loop, which fails
    over as before; its files stay pending, and the restore's commit (queued behind anything
    still in flight) adds what the table lacks. A failure of a request made before the latest
    failover is not reported again: the restore's commit covers it.

    The tasks hear that checkpoint n completed (and let go of its files in their sink state)
    only once the table has n: `committed_through` tells the JobMaster when (`on_committed`).
    Otherwise a later checkpoint could complete while n's commit is in flight, its sink state
    without n's files, and a JobMaster that dies then would leave a restore nothing to commit.
    """

    def __init__(self, name: str, table_factory: Callable[[str], TableCommitter]):
        """table_factory(uid): the table part, given the sink's uid (its files' names carry a tag of it)."""
        self.name = name
        self._table_factory = table_factory
        self._table: TableCommitter | None = None
        self._uid = ""
        self._plan: CommitPlan | None = None
        self._fail: Callable[..., None] | None = None
        self._hooks: dict = {}
        self._post: Callable[[Callable[[], None]], None] = lambda fn: fn()
        self._on_committed: Callable[[int], None] = lambda checkpoint_id: None
        self._executor: _InlineExecutor | concurrent.futures.ThreadPoolExecutor = _InlineExecutor()
        self._requested: deque[_Requested] = deque()
        self._epoch = 0
        self.committed_through = NO_CHECKPOINT
        self._failures: list[str] = []   # commit failures of the current attempt, not yet covered by a restore
        self._ending = False
        # One entry per table commit made: checkpoint id, files, seconds (the benchmarks' commit share).
        self.commits: list[dict] = []

    # --------------------------------------------------------------- wiring (jobmaster.py)
    def attach(self, *, job_id: str, run_id: str, uid: str, fail: Callable[..., None],
               hooks: dict | None = None, post: Callable[[Callable[[], None]], None] | None = None,
               on_committed: Callable[[int], None] | None = None, executor=None) -> None:
        """Called by the JobMaster that hosts the component: who we are, how to fail over
        (`fail(cause, recurs=...)`; recurs: a restart would fail the same way), how to run
        something on its loop (`post`; given, the commits run on a worker thread, else inline)
        and whom to tell that the table has every checkpoint up to an id (`on_committed`).
        `executor` (`submit(fn) -> Future`) replaces the worker thread in unit tests."""
        self._plan = CommitPlan(application_id(job_id, uid, run_id))
        self._uid = uid
        self._fail = fail
        self._hooks = dict(hooks or {})
        if post is not None:
            self._post = post
            self._executor = executor or concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"commit-{uid}")
        if on_committed is not None:
            self._on_committed = on_committed

    @property
    def table(self) -> TableCommitter:
        if self._table is None:
            self._table = self._table_factory(self._uid)
        return self._table

    @property
    def plan(self) -> CommitPlan:
        if self._plan is None:
            raise RuntimeError(f"sink {self.name}: the committer was not attached to a JobMaster")
        return self._plan

    # --------------------------------------------------------------- messages (the loop)
    def on_message(self, subtask: int, message: dict) -> None:
        op = message["op"]
        if op == "precommit":
            self.plan.precommitted(message["files"])
        elif op == "recover":
            # The restored checkpoint completed: what it pre-committed is committed now.
            self.plan.precommitted(message["files"])
            self._request(int(message["checkpoint_id"]), cleanup_token=message["token"])
        else:
            raise ValueError(f"sink {self.name}: unknown committer message {op!r}")

    def notify_checkpoint_complete(self, checkpoint) -> None:
        self._request(checkpoint.checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """An aborted checkpoint's files stay pending: the next completed one commits them."""

    def on_failover(self) -> None:
        self._epoch += 1
        self._failures.clear()   # the restore's commit adds what the failed ones did not
        dropped = self.plan.failover()
        if dropped:
            log.info("sink %s: %d file(s) of uncompleted checkpoints dropped; the restore deletes them",
                     self.name, len(dropped))

    def on_finished(self, checkpointing: bool) -> None:
        """Without checkpoints the end of input is the commit point (no transaction to record).
        Either way every commit requested is waited for: the table is complete when the job is.
        A failed commit whose files are still not in the table raises FinalCommitError: the
        job's tasks are done, so no failover can commit them any more, and the user must hear it."""
        self._ending = True
        try:
            if not checkpointing:
                self._request(END_OF_INPUT, transactional=False)
            self.drain()
        finally:
            self.stop_worker()
        left = self.plan.uncommitted()
        if left and self._failures:
            raise FinalCommitError(f"{len(left)} data file(s) written by the job are not in the table: "
                                   f"{self._failures[-1]}")
        if left:
            log.warning("sink %s: %d file(s) no checkpoint committed were left out at job end", self.name, len(left))

    def drain(self) -> None:
        """Wait (on the loop) for every requested commit, and settle them."""
        concurrent.futures.wait([r.future for r in self._requested])
        self._settle()

    def stop_worker(self) -> None:
        """The job ended: a commit in flight finishes; queued ones are dropped (a restore of the
        job's latest checkpoint commits their files, as after a JobMaster's death)."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    # --------------------------------------------------------------- the commit
    def _request(self, checkpoint_id: int, transactional: bool = True, cleanup_token: str | None = None) -> None:
        request = self.plan.request(checkpoint_id, transactional)
        keep = frozenset(self.plan.pending)
        future = self._executor.submit(lambda: self._run(request, keep, cleanup_token))
        self._requested.append(_Requested(request, self._epoch, future))
        future.add_done_callback(lambda _: self._post(self._settle))

    def _run(self, request: CommitRequest, keep: frozenset[str], cleanup_token: str | None) -> CommitOutcome:
        """The worker's part: read the table's transactions, commit what it lacks, and after a
        restore's commit delete the files no checkpoint will commit."""
        versions = self.table.committed_versions(request.apps) if request.transactional and request.files else {}
        commit, done = decide(request, versions)
        started = time.monotonic()
        if commit is not None:
            self._test_pause(request.checkpoint_id)
            self.table.commit(commit)
        seconds = time.monotonic() - started
        deleted: tuple[str, ...] = ()
        if cleanup_token is not None:   # files pending besides those now in the table are kept
            in_table = set(done) | {f["path"] for f in (commit.files if commit is not None else ())}
            deleted = tuple(self.table.cleanup(set(keep) - in_table, cleanup_token))
        return CommitOutcome(commit, done, seconds, deleted)

    def _settle(self) -> None:
        """On the loop: the outcomes of the finished requests at the head of the queue, in order."""
        while self._requested and self._requested[0].future.done():
            requested = self._requested.popleft()
            if requested.future.cancelled():
                continue
            error = requested.future.exception()
            if error is None:
                self._committed(requested.request, requested.future.result())
            elif requested.epoch != self._epoch:
                log.warning("sink %s: the commit of checkpoint %d, requested before a failover, failed (%r); "
                            "the restore's commit adds its files", self.name, requested.request.checkpoint_id, error)
            else:
                self._report(requested.request.checkpoint_id, error)

    def _committed(self, request: CommitRequest, outcome: CommitOutcome) -> None:
        self.plan.settled(outcome.done)
        if outcome.commit is not None:
            self.plan.committed(outcome.commit)
            self.commits.append({"checkpoint_id": request.checkpoint_id, "files": len(outcome.commit.files),
                                 "seconds": outcome.seconds})
            log.info("sink %s: committed %d file(s) of checkpoint %d in %.3f s", self.name,
                     len(outcome.commit.files), request.checkpoint_id, outcome.seconds)
        for path in outcome.deleted:
            log.info("sink %s: deleted %s (written for a checkpoint that never completed)", self.name, path)
        if request.transactional:
            self.committed_through = max(self.committed_through, request.checkpoint_id)
            self._on_committed(self.committed_through)

    def _report(self, checkpoint_id: int, error: BaseException) -> None:
        """A commit of the current attempt failed: fail over (the files stay pending, and the
        restore's commit adds them) — or, at the job's end, leave it to `on_finished` to raise."""
        recurs = isinstance(error, ConfigurationError)   # the stream does not fit the table: every replay the same
        what = "at the end of input" if checkpoint_id == END_OF_INPUT else f"of checkpoint {checkpoint_id}"
        if recurs:
            cause = f"sink {self.name}: the commit {what} is refused: {error}"
            log.error("%s", cause)
        else:
            cause = f"sink {self.name}: the commit {what} failed: {error!r}"
            log.error("sink %s: the commit %s failed", self.name, what, exc_info=error)
        self._failures.append(cause)
        if self._fail is not None and not self._ending:
            self._fail(cause, recurs=recurs)

    def _test_pause(self, checkpoint_id: int) -> None:
        """Test hook (STREAMSNAP_TEST_HOOKS): mark that the commit of a completed checkpoint is
        about to run, and before the first commit of checkpoint `table_commit_pause_at` wait, so a
        test can SIGKILL the JobMaster between a checkpoint's completion and its commit."""
        directory = self._hooks.get("table_commit_dir")
        if not directory:
            return
        marker = os.path.join(directory, f"table-commit-{checkpoint_id}")
        first = not os.path.exists(marker)
        with open(marker + ".tmp", "w") as out:   # renamed into place: a test never reads it half-written
            out.write(str(os.getpid()))
        os.replace(marker + ".tmp", marker)
        if first and checkpoint_id == self._hooks.get("table_commit_pause_at"):
            time.sleep(float(self._hooks.get("table_commit_pause", 0)))
