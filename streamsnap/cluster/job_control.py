"""A client's authenticated connection to a job's JobMaster in the cluster.

`JobClient`s of jobs whose JobMaster runs in the barrier stage (cluster/in_cluster.py) — the
submitter's own, and `ss.jobs.attach` from any process — ask it over this connection: the
control endpoint's handshake proves the job's secret (read from `job.secret` in the job's
directory), requests and replies are msgpack maps, and result objects travel as
`wire_objects` values. A request that cannot be answered raises a StreamsnapError naming it.
"""

from __future__ import annotations

import itertools
import threading

from streamsnap.errors import StreamsnapError
from streamsnap.network.control import connect_control


class LeaderUnavailable(StreamsnapError):
    """No JobMaster answers right now (it failed over, or has not started): ask again."""


class JobControl:
    def __init__(self, address: tuple[str, int], secret: bytes, job_id: str):
        self.address = tuple(address)
        self.job_id = job_id
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._waiting: dict[int, list] = {}
        self._closed = threading.Event()
        self._connection = connect_control(self.address, secret, f"client-{job_id[:8]}",
                                           self._on_message, self._on_close)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def call(self, call: str, timeout: float = 60.0, **arguments):
        """Send one request and wait for its reply's value."""
        request_id = next(self._ids)
        slot = [threading.Event(), None]
        with self._lock:
            self._waiting[request_id] = slot
        if not self._connection.send({"type": "client", "id": request_id, "call": call, **arguments}):
            raise LeaderUnavailable(f"the JobMaster of job {self.job_id} at {self.address} is gone")
        if not slot[0].wait(timeout):
            with self._lock:
                self._waiting.pop(request_id, None)
            raise TimeoutError(f"the JobMaster of job {self.job_id} did not answer {call!r} within {timeout:g} s")
        reply = slot[1]
        if reply is None:
            raise LeaderUnavailable(f"the connection to the JobMaster of job {self.job_id} closed before it "
                                  f"answered {call!r} (it failed over or ended; ask again)")
        if not reply.get("ok"):
            raise StreamsnapError(f"job {self.job_id}: {call} failed: {reply.get('error')}")
        return reply.get("value")

    def close(self) -> None:
        self._connection.close()

    def _on_message(self, _conn, message: dict) -> None:
        if message.get("type") != "reply":
            return      # e.g. a "cancel" meant for tasks: not ours
        with self._lock:
            slot = self._waiting.pop(message.get("id"), None)
        if slot is not None:
            slot[1] = message
            slot[0].set()

    def _on_close(self, _conn, _error) -> None:
        self._closed.set()
        with self._lock:
            waiting, self._waiting = list(self._waiting.values()), {}
        for slot in waiting:
            slot[0].set()
