"""Control of a job through its checkpoint directory, for clients that cannot reach the cluster.

A client of a job whose JobMaster runs in the cluster normally asks it over the control port
named in the job's record (cluster/job_control.py). From outside the cluster's network — a
laptop holding a Spark Connect session to managed compute — that port is unreachable, but the
checkpoint directory is not. So the same requests also travel as files:

* the client writes `control/requests/<id>.json`: the call, its arguments, the time, and an
  HMAC-SHA256 of all of it with the job's secret (`job.secret`: whoever can read the
  checkpoint directory can control the job, as over the control port);
* then it overwrites `control/pending` with that id: one small object whose change says "there
  is something to list";
* every `POLL` seconds the JobMaster reads `control/pending` — a GET, where listing the
  directory is a LIST, per job per second on an object store — and lists the requests only when
  the marker changed, and every `FULL_LISTING` seconds regardless (`ListingSchedule`). It
  answers each authentic, fresh request exactly as it answers one from the control port,
  writes `control/responses/<id>.json` (signed the same way) and deletes the request. A
  forged or stale request (older than `MAX_AGE`) is deleted unanswered and logged;
* the client waits for the response file, checks its MAC and deletes it.

The marker is read before the listing, and every request is written before its marker, so a
request is never missed: a marker written before the read names a request the listing sees; one
written after it changes the marker (ids are unique) and the next poll lists.

A request written while the job fails over is answered by the next JobMaster. JSON, never
pickle; the MAC binds the request id, so a response cannot be replayed for another request.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
import uuid

from streamsnap.checkpoint import filesystem
from streamsnap.cluster.registry import JobRegistry
from streamsnap.errors import StreamsnapError

log = logging.getLogger(__name__)

POLL = 1.0            # seconds between the JobMaster's looks at the pending marker
FULL_LISTING = 30.0   # seconds after which it lists the requests even if the marker did not change
CLIENT_POLL = 0.2     # seconds between the client's looks for its response
MAX_AGE = 300.0       # seconds after which an unanswered request is stale (clock skew included)


class StorageControlError(StreamsnapError):
    """A request through files was not answered, or its answer is not authentic."""


def sign(secret: bytes, body: dict) -> dict:
    """`body` with its MAC (over the canonical JSON of every other field)."""
    return dict(body, mac=_mac(secret, body))


def verify(secret: bytes, signed: dict) -> dict | None:
    """The body of `signed` if its MAC is right, else None."""
    body = {k: v for k, v in signed.items() if k != "mac"}
    mac = signed.get("mac")
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(secret, body)):
        return None
    return body


def fresh(body: dict, now: float, max_age: float = MAX_AGE) -> bool:
    at = body.get("at")
    return isinstance(at, (int, float)) and abs(now - at) <= max_age


def _mac(secret: bytes, body: dict) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(secret, canonical, hashlib.sha256).hexdigest()


UNREADABLE = object()   # the pending marker could not be read: list, to be sure


class ListingSchedule:
    """When the JobMaster lists the request directory (no I/O: fed the marker and the time).

    It lists on its first look (requests written while no JobMaster led), whenever the pending
    marker differs from the one read before its last listing (or could not be read), and every
    `full_listing` seconds (stale requests are deleted; a client that wrote no marker is heard).
    A listing that failed is not recorded, so the next look lists again."""

    def __init__(self, full_listing: float = FULL_LISTING):
        self.full_listing = full_listing
        self._marker = UNREADABLE
        self._listed_at: float | None = None

    def should_list(self, marker, now: float) -> bool:
        return (self._listed_at is None or marker is UNREADABLE or marker != self._marker
                or now - self._listed_at >= self.full_listing)

    def listed(self, marker, now: float) -> None:
        """A listing succeeded; `marker` is what was read before it."""
        self._marker, self._listed_at = marker, now


class StorageControl:
    def __init__(self, registry: JobRegistry, secret: bytes):
        self.registry = registry
        self._secret = secret
        base = filesystem.join(registry.job_directory, "control")
        self.requests = filesystem.join(base, "requests")
        self.responses = filesystem.join(base, "responses")
        self.pending = filesystem.join(base, "pending")
        self._schedule = ListingSchedule()

    # ------------------------------------------------------------------ the client side
    def call(self, call: str, timeout: float = 60.0, **arguments):
        """Ask the job's JobMaster (whichever leads when it looks) and wait for its answer."""
        request_id = uuid.uuid4().hex
        request = sign(self._secret, {"id": request_id, "call": call, "arguments": arguments, "at": time.time()})
        filesystem.write_atomic(filesystem.join(self.requests, f"{request_id}.json"), json.dumps(request).encode())
        filesystem.write_atomic(self.pending, request_id.encode())   # after the request: see the module doc
        response_url = filesystem.join(self.responses, f"{request_id}.json")
        deadline = time.monotonic() + timeout
        while True:
            try:
                signed = json.loads(filesystem.read_bytes(response_url))
                break
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    filesystem.delete(filesystem.join(self.requests, f"{request_id}.json"))
                    raise TimeoutError(f"job {self.registry.job_id}: no JobMaster answered {call!r} through "
                                       f"{filesystem.user_path(self.requests)} within {timeout:g} s (is the "
                                       f"job running?)") from None
                time.sleep(CLIENT_POLL)
        filesystem.delete(response_url)
        body = verify(self._secret, signed)
        if body is None or body.get("id") != request_id:
            raise StorageControlError(f"job {self.registry.job_id}: the answer to {call!r} in "
                               f"{filesystem.user_path(response_url)} is not authentic (bad MAC); ignored")
        if not body.get("ok"):
            raise StreamsnapError(f"job {self.registry.job_id}: {call} failed: {body.get('error')}")
        return body.get("value")

    # ------------------------------------------------------------------ the JobMaster side
    def poll(self, seen: set[str]) -> list[dict]:
        """`take_requests`, when the schedule says to list: one read of the pending marker per
        call, a listing only when it changed (or every FULL_LISTING seconds)."""
        try:
            marker = filesystem.read_if_exists(self.pending)
        except OSError as exc:
            log.warning("job %s: could not read %s (%s); listing the requests", self.registry.job_id,
                        self.pending, exc)
            marker = UNREADABLE
        now = time.monotonic()
        if not self._schedule.should_list(marker, now):
            return []
        taken = self.take_requests(seen)
        self._schedule.listed(marker, now)
        return taken

    def take_requests(self, seen: set[str]) -> list[dict]:
        """Authentic, fresh requests not in `seen` (their ids are added); others are deleted."""
        fs, path = filesystem.filesystem(self.requests)
        try:
            names = sorted(fs.ls(path, detail=False))
        except FileNotFoundError:
            return []
        taken = []
        for name in names:
            request_id = name.rstrip("/").rsplit("/", 1)[-1].removesuffix(".json")
            if request_id in seen or name.endswith(".tmp") or "." in request_id:
                continue
            url = filesystem.join(self.requests, f"{request_id}.json")
            try:
                body = verify(self._secret, json.loads(filesystem.read_bytes(url)))
            except FileNotFoundError:
                continue
            except ValueError:
                body = None
            if body is None or body.get("id") != request_id or not fresh(body, time.time()):
                log.warning("job %s: deleted a %s request %s from its control directory", self.registry.job_id,
                            "stale" if body is not None else "forged or malformed", url)
                filesystem.delete(url)
                continue
            seen.add(request_id)
            taken.append(body)
        return taken

    def answer(self, request_id: str, reply: dict) -> None:
        """Write the signed answer to `request_id` and delete the request."""
        body = {"id": request_id, "ok": bool(reply.get("ok"))}
        body["value" if body["ok"] else "error"] = reply.get("value") if body["ok"] else reply.get("error")
        filesystem.write_atomic(filesystem.join(self.responses, f"{request_id}.json"),
                                json.dumps(sign(self._secret, body)).encode())
        filesystem.delete(filesystem.join(self.requests, f"{request_id}.json"))


__all__ = ["StorageControl", "StorageControlError", "ListingSchedule", "sign", "verify", "fresh", "POLL",
           "FULL_LISTING"]
