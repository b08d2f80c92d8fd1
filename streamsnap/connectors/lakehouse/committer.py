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

`CommitPlan` below is the sans-I/O decision logic (unit-tested message by message);
`GlobalCommitter` drives it against a `TableCommitter` (Delta, Iceberg) on the JobMaster.
"""

from __future__ import annotations

import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from streamsnap.errors import ConfigurationError

log = logging.getLogger(__name__)

NO_CHECKPOINT = 0   # the checkpoint id of files written by a job without checkpointing


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


@dataclass
class CommitPlan:
    """Which pre-committed files a completed checkpoint makes visible; no I/O.

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

    def plan(self, checkpoint_id: int, committed_versions: Mapping[str, int | None],
             transactional: bool = True) -> Commit | None:
        """The commit for completed checkpoint `checkpoint_id`: every pending file of a checkpoint
        up to it that the table does not have yet. None when there is nothing to add."""
        self.last_completed = max(self.last_completed, checkpoint_id)
        due = [f for f in self.pending.values() if f["checkpoint_id"] <= checkpoint_id]
        done = [f for f in due if _already_committed(f, committed_versions)]
        for f in done:
            del self.pending[f["path"]]
        todo = tuple(sorted((f for f in due if not _already_committed(f, committed_versions)),
                            key=lambda f: f["path"]))
        if not todo:
            return None
        transactions = {f["app_id"]: checkpoint_id for f in todo} if transactional else {}
        return Commit(checkpoint_id, todo, transactions)

    def committed(self, commit: Commit) -> None:
        for f in commit.files:
            self.pending.pop(f["path"], None)

    def failover(self) -> list[dict]:
        """The attempt failed: files of checkpoints that did not complete are dropped (their
        writers write them again after the restore); returns them. Files of a completed
        checkpoint whose commit failed stay and are committed with the next one."""
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


class GlobalCommitter:
    """The driver component of a lakehouse sink: receives the writers' messages and the
    coordinator's completions, and commits through a TableCommitter on the JobMaster's loop."""

    def __init__(self, name: str, table_factory: Callable[[str], TableCommitter]):
        """table_factory(uid): the table part, given the sink's uid (its files' names carry a tag of it)."""
        self.name = name
        self._table_factory = table_factory
        self._table: TableCommitter | None = None
        self._uid = ""
        self._plan: CommitPlan | None = None
        self._fail: Callable[..., None] | None = None
        self._hooks: dict = {}

    # --------------------------------------------------------------- wiring (jobmaster.py)
    def attach(self, *, job_id: str, run_id: str, uid: str, fail: Callable[..., None],
               hooks: dict | None = None) -> None:
        """Called by the JobMaster that hosts the component: who we are, and how to fail over
        (`fail(cause, recurs=...)`; recurs: a restart would fail the same way)."""
        self._plan = CommitPlan(application_id(job_id, uid, run_id))
        self._uid = uid
        self._fail = fail
        self._hooks = dict(hooks or {})

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

    # --------------------------------------------------------------- messages
    def on_message(self, subtask: int, message: dict) -> None:
        op = message["op"]
        if op == "precommit":
            self.plan.precommitted(message["files"])
        elif op == "recover":
            # The restored checkpoint completed: what it pre-committed is committed now.
            checkpoint_id = int(message["checkpoint_id"])
            self.plan.precommitted(message["files"])
            if self._commit(checkpoint_id):
                keep = {f["path"] for f in self.plan.uncommitted()}
                for path in self.table.cleanup(keep, message["token"]):
                    log.info("sink %s: deleted %s (written for a checkpoint that never completed)", self.name, path)
        else:
            raise ValueError(f"sink {self.name}: unknown committer message {op!r}")

    def notify_checkpoint_complete(self, checkpoint) -> None:
        self._commit(checkpoint.checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """An aborted checkpoint's files stay pending: the next completed one commits them."""

    def on_failover(self) -> None:
        dropped = self.plan.failover()
        if dropped:
            log.info("sink %s: %d file(s) of uncompleted checkpoints dropped; the restore deletes them",
                     self.name, len(dropped))

    def on_finished(self, checkpointing: bool) -> None:
        """Without checkpoints the end of input is the commit point (no transaction to record)."""
        if not checkpointing:
            self._commit(2 ** 62, transactional=False)
        elif self.plan.uncommitted():
            log.warning("sink %s: %d file(s) no checkpoint committed were left out at job end",
                        self.name, len(self.plan.uncommitted()))

    # --------------------------------------------------------------- the commit
    def _commit(self, checkpoint_id: int, transactional: bool = True) -> bool:
        """Plan and run the commit of `checkpoint_id`; False (and a failover) if it failed."""
        plan = self.plan
        try:
            versions = self.table.committed_versions(plan.apps_to_check(checkpoint_id)) if transactional else {}
            commit = plan.plan(checkpoint_id, versions, transactional)
            if commit is None:
                return True
            self._test_pause(checkpoint_id)
            started = time.monotonic()
            self.table.commit(commit)
        except ConfigurationError as exc:   # the stream does not fit the table: every replay the same
            log.error("sink %s: the commit of checkpoint %d is refused: %s", self.name, checkpoint_id, exc)
            if self._fail is not None:
                self._fail(f"sink {self.name}: the commit of checkpoint {checkpoint_id} is refused: {exc}", recurs=True)
            return False
        except Exception as exc:   # the files stay pending; the failover's restore commits them
            log.exception("sink %s: the commit of checkpoint %d failed", self.name, checkpoint_id)
            if self._fail is not None:
                self._fail(f"sink {self.name}: the commit of checkpoint {checkpoint_id} failed: {exc!r}")
            return False
        plan.committed(commit)
        log.info("sink %s: committed %d file(s) of checkpoint %d in %.3f s", self.name, len(commit.files),
                 checkpoint_id, time.monotonic() - started)
        return True

    def _test_pause(self, checkpoint_id: int) -> None:
        """Test hook (STREAMSNAP_TEST_HOOKS): mark that the commit of a completed checkpoint is
        about to run, and before the first commit of checkpoint `table_commit_pause_at` wait, so a
        test can SIGKILL the JobMaster between a checkpoint's completion and its commit."""
        directory = self._hooks.get("table_commit_dir")
        if not directory:
            return
        marker = os.path.join(directory, f"table-commit-{checkpoint_id}")
        first = not os.path.exists(marker)
        with open(marker, "w") as out:
            out.write(str(os.getpid()))
        if first and checkpoint_id == self._hooks.get("table_commit_pause_at"):
            time.sleep(float(self._hooks.get("table_commit_pause", 0)))
