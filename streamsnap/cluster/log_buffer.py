"""Task log records kept by a JobMaster in the cluster until its client fetches them.

With the JobMaster in the client, task records reach the user's `logging` directly
(runtime/log_relay.py). With the JobMaster inside the barrier stage nothing connects to the
client, so the JobMaster keeps the batches its tasks relay in a bounded buffer and the
attached client asks for them over its control connection (`logs` requests with a cursor),
then re-emits them in its own `logging` as a local JobMaster would.

Batches are numbered per JobMaster epoch; a cursor from another epoch (a failover started a
new JobMaster) reads from the start of the new one. When the buffer is full the oldest
batches go, and the reply counts the records a slow client missed, so it can say so.

Sans-I/O: plain data in and out, no threads or sockets.
"""

from __future__ import annotations

from collections import deque

LIMIT_RECORDS = 5000       # records kept at most (the newest)


class LogBuffer:
    def __init__(self, epoch: int, limit: int = LIMIT_RECORDS):
        self.epoch = epoch
        self._limit = limit
        self._batches: deque[tuple[int, dict]] = deque()   # (sequence number, batch)
        self._records = 0
        self._next = 0

    def append(self, batch: dict) -> None:
        """One `{"type": "logs"}` message of a task (its `records` list, operator, subtask...)."""
        self._batches.append((self._next, batch))
        self._next += 1
        self._records += len(batch.get("records", ()))
        while self._records > self._limit and len(self._batches) > 1:
            _, dropped = self._batches.popleft()
            self._records -= len(dropped.get("records", ()))

    def since(self, epoch: int | None, after: int) -> dict:
        """The batches numbered `after` and later (from 0 if `epoch` is not this buffer's), the
        cursor to ask with next time, and how many records in between were dropped."""
        start = after if epoch == self.epoch else 0
        batches = [batch for n, batch in self._batches if n >= start]
        first_kept = self._batches[0][0] if self._batches else self._next
        missed = max(0, first_kept - start)      # whole batches gone before the client asked
        return {"epoch": self.epoch, "next": self._next, "missed_batches": missed, "batches": batches}


__all__ = ["LogBuffer", "LIMIT_RECORDS"]
