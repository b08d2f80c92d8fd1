"""Which Kafka transactional ids an exactly-once sink subtask uses, and what it does on restore.

Why it exists: fencing only works if a restored job knows every transactional id its
predecessor may have left a transaction open under. Each subtask therefore draws its ids from a
small fixed pool, `<prefix>-<subtask>-<slot>` for slot 0..pool_size-1, taking the next slot for
each checkpoint interval (a fresh producer per interval, so every transaction has its own
producer epoch and a late commit of an old one can never commit a newer one). The prefix is
derived from the job and the sink's uid, and it travels in the checkpoint, so a job restored
under another name still fences the ids its predecessor used.

On restore (`recovery_plan`): first commit what the restored checkpoint pre-committed (those
transactions belong to a completed checkpoint), then abort everything else by fencing every pool
id of every old subtask this subtask now owns (old subtask s goes to new subtask s % parallelism).

Pure logic, no I/O: the sink (`sink.py`) performs the plan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from streamsnap.errors import StreamsnapError

TXN = "txn"      # a pre-committed transaction: commit it once its checkpoint completed
IDS = "ids"      # which ids a subtask draws from (always in the checkpoint, even with no txn pending)

_PID_LINE = re.compile(r"PID\{Id:(-?\d+),Epoch:(-?\d+)\}")


def default_prefix(job_id: str, uid: str) -> str:
    """The transactional id prefix of a sink: stable for the same job name and sink uid."""
    return f"streamsnap-{job_id[:16]}-{uid}"


def transactional_id(prefix: str, subtask: int, slot: int) -> str:
    return f"{prefix}-{subtask}-{slot}"


def pool_ids(prefix: str, subtask: int, pool_size: int) -> list[str]:
    return [transactional_id(prefix, subtask, slot) for slot in range(pool_size)]


def parse_producer_id(log_line: str) -> tuple[int, int] | None:
    """(producer id, epoch) from librdkafka's `eos` debug line 'Acquired PID{Id:…,Epoch:…}'.

    librdkafka exposes no API for the producer id of a transactional producer; its debug log is
    the one place it states it. The sink fails at start if the line never comes."""
    if "Acquired PID" not in log_line:
        return None
    found = _PID_LINE.search(log_line)
    return (int(found.group(1)), int(found.group(2))) if found else None


def txn_committable(tid: str, producer_id: int, epoch: int, checkpoint_id: int, subtask: int) -> dict:
    return {"kind": TXN, "id": tid, "pid": producer_id, "epoch": epoch, "checkpoint": checkpoint_id,
            "subtask": subtask}


def ids_committable(prefix: str, subtask: int, parallelism: int, pool_size: int) -> dict:
    return {"kind": IDS, "prefix": prefix, "subtask": subtask, "parallelism": parallelism, "pool": pool_size}


class TransactionPoolExhausted(StreamsnapError):
    """Every transactional id of a subtask's pool holds a transaction still waiting for its commit."""


class TransactionPool:
    """The slots of one subtask: which is next, which hold pre-committed transactions."""

    def __init__(self, prefix: str, subtask: int, pool_size: int):
        if pool_size < 2:
            raise ValueError("a transactional id pool needs at least 2 slots (one writing, one committing)")
        self.prefix = prefix
        self.subtask = subtask
        self.pool_size = pool_size
        self._next = 0
        self._pending: dict[int, dict] = {}      # slot -> txn committable

    def take(self) -> tuple[int, str]:
        """The next slot and its transactional id, for the next checkpoint interval's transaction."""
        slot = self._next
        if slot in self._pending:
            waiting = sorted(c["checkpoint"] for c in self._pending.values())
            raise TransactionPoolExhausted(
                f"Kafka sink subtask {self.subtask}: all {self.pool_size} transactional ids hold transactions "
                f"waiting for their checkpoints to complete (checkpoints {waiting}); checkpoints are failing or "
                f"completing slower than they are taken. Fix: look at why checkpoints fail, or raise "
                f"ss.sinks.Kafka(transaction_pool_size=...)")
        self._next = (slot + 1) % self.pool_size
        return slot, transactional_id(self.prefix, self.subtask, slot)

    def next_is_free(self) -> bool:
        """Whether `take` would succeed now (the next slot holds no transaction awaiting commit)."""
        return self._next not in self._pending

    def pre_committed(self, slot: int, committable: dict) -> None:
        self._pending[slot] = committable

    def due(self, checkpoint_id: int) -> list[tuple[int, dict]]:
        """(slot, committable) of the transactions checkpoint `checkpoint_id` covers, oldest first."""
        return sorted(((s, c) for s, c in self._pending.items() if c["checkpoint"] <= checkpoint_id),
                      key=lambda sc: sc[1]["checkpoint"])

    def committed(self, slot: int) -> None:
        self._pending.pop(slot, None)

    def committables(self, parallelism: int) -> list[dict]:
        """What the checkpoint keeps: the ids marker and every transaction not yet committed."""
        pending = sorted(self._pending.values(), key=lambda c: c["checkpoint"])
        return [ids_committable(self.prefix, self.subtask, parallelism, self.pool_size)] + pending


@dataclass(frozen=True)
class RecoveryPlan:
    prefix: str                 # the ids this subtask goes on with
    commit: list[dict]          # txn committables to commit, oldest first
    abort: list[str]            # transactional ids to fence (after the commits)


def recovery_plan(committables: list[dict], subtask: int, parallelism: int, prefix: str,
                  pool_size: int) -> RecoveryPlan:
    """What subtask `subtask` of `parallelism` does with the union of restored committables.

    `prefix` is the configured one, used when the checkpoint names none (it is then only
    this subtask's own pool that may hold leftovers)."""
    markers = [c for c in committables if c.get("kind") == IDS]
    if markers:
        prefix = markers[0]["prefix"]
    owned_old = sorted({m["subtask"] for m in markers if m["subtask"] % parallelism == subtask})
    abort: list[str] = []
    for m in markers:
        if m["subtask"] in owned_old:
            abort += pool_ids(m["prefix"], m["subtask"], m["pool"])
    abort += pool_ids(prefix, subtask, pool_size)
    commit = sorted((c for c in committables if c.get("kind") == TXN and c["subtask"] % parallelism == subtask),
                    key=lambda c: (c["checkpoint"], c["id"]))
    seen: set[str] = set()
    unique_abort = [i for i in abort if not (i in seen or seen.add(i))]
    return RecoveryPlan(prefix, commit, unique_abort)


__all__ = ["default_prefix", "transactional_id", "pool_ids", "parse_producer_id", "txn_committable",
           "ids_committable", "TransactionPool", "TransactionPoolExhausted", "RecoveryPlan", "recovery_plan"]
