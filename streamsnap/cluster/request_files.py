"""The JobMaster's side of control through the checkpoint directory (cluster/storage_control.py).

Clients that cannot reach the control port (a laptop with a Connect session to managed compute)
write signed request files; the JobMaster in the cluster (cluster/in_cluster.py) polls for them
and answers each exactly as it answers a request from the control port, into a response file.
"""

from __future__ import annotations

import logging

from streamsnap.cluster import storage_control

log = logging.getLogger(__name__)


class RequestFileWatch:
    """Mixin of the ClusterJobMaster: `_watch_request_files`, posted once at start.

    Needs `_storage_control` (a StorageControl) and `_request_files_seen` (a set), set by the
    master, and its `status`, `outcome`, `settings`, `_answer(conn, message)` and `_timers`."""

    def _watch_request_files(self) -> None:
        """Every storage_control.POLL seconds: answer the requests of clients that cannot reach the
        control port, exactly as those that can (a look lists the requests only when the pending
        marker says there are new ones: `StorageControl.poll`)."""
        if self.status.is_terminal or self.outcome is not None:
            return
        try:
            requests = self._storage_control.poll(self._request_files_seen)
        except OSError as exc:
            log.warning("job '%s': could not read its request files: %s", self.settings.job_name, exc)
            requests = []
        for request in requests:
            arguments = request.get("arguments") if isinstance(request.get("arguments"), dict) else {}
            self._answer(RequestFileReply(self._storage_control, request["id"]),
                         {**arguments, "type": "client", "id": request["id"], "call": request.get("call")})
        self._timers.call_later(storage_control.POLL, self._watch_request_files)


class RequestFileReply:
    """Where `_answer` sends a request file's reply: its signed response file."""

    def __init__(self, box: storage_control.StorageControl, request_id: str):
        self._box = box
        self._request_id = request_id

    def send(self, reply: dict) -> bool:
        try:
            self._box.answer(self._request_id, reply)
        except OSError as exc:     # the client times out naming the directory; the log says why
            log.warning("could not answer request file %s: %s", self._request_id, exc)
            return False
        return True


__all__ = ["RequestFileWatch", "RequestFileReply"]
