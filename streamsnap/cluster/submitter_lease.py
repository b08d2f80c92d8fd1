"""Who submits a detached job's Spark job now, and whether that process is still alive.

A detached Connect job's Spark job belongs to its submitter, a process in the cluster that
Spark knows nothing about (cluster/detached.py). If that process dies, the Connect server keeps
the orphaned Spark job for minutes, then cancels it — and nothing would submit the job again.
So the submitter holds a lease in the job's directory, and the job's JobMaster watches it:

* `submitters/<g>`: created exclusively by the g-th submitter (the first one, then each
  replacement). The newest generation owns the job; an older submitter that sees a newer one
  stops (fencing, as JobMaster epochs do);
* `submitters/<g>.lease`: rewritten by submitter g every `RENEW` seconds (its pid, host, Connect
  session id, the wall-clock time of the renewal). A lease not renewed for `TIMEOUT` seconds
  has expired: the JobMaster starts a replacement, which takes generation g+1, interrupts the
  orphaned Spark job in the dead submitter's session (joined by id) and submits a new one — a
  failover from the latest completed checkpoint, charged to the restart strategy.

Liveness compares wall clocks of the submitter's and the JobMaster's hosts: clock skew must be
well under `TIMEOUT`. The decision (`expired`) is a pure function of the lease and the time.
"""

from __future__ import annotations

import json
import time

from streamsnap.checkpoint import filesystem
from streamsnap.cluster.registry import JobRegistry, numbered, take_next
from streamsnap.errors import StreamsnapError

LEASE_DIR = "submitters"
RENEW = 2.0          # seconds between a submitter's renewals
TIMEOUT = 15.0       # seconds without a renewal after which the submitter counts as lost


class SupersededSubmitter(StreamsnapError):
    """A newer submitter took the job over: this one must not submit anything any more."""


def expired(lease: dict | None, now: float, timeout: float = TIMEOUT) -> bool:
    """Whether the submitter holding `lease` counts as lost at wall-clock time `now`.

    No lease at all is not expiry: a job submitted before leases existed, or one whose
    submitter has not written its first renewal yet, is left alone."""
    if not lease or "renewed_at" not in lease:
        return False
    return now - float(lease["renewed_at"]) > timeout


class SubmitterLease:
    def __init__(self, registry: JobRegistry):
        self.registry = registry
        self.directory = filesystem.join(registry.job_directory, LEASE_DIR)

    def generations(self) -> list[int]:
        return numbered(self.directory)

    def latest_generation(self) -> int:
        return max(self.generations(), default=-1)

    def take(self, owner: dict) -> int:
        """Become the job's submitter: create `submitters/<g>` for the next free g, exclusively,
        and write its first lease."""
        generation = take_next(self.directory, owner)
        self.renew(generation, owner)
        return generation

    def renew(self, generation: int, owner: dict) -> None:
        """Rewrite generation `generation`'s lease; SupersededSubmitter if a newer one exists."""
        latest = self.latest_generation()
        if latest > generation:
            raise SupersededSubmitter(f"submitter {generation} of job {self.registry.job_id} was replaced by "
                                      f"submitter {latest}")
        filesystem.write_atomic(self._lease_url(generation),
                                json.dumps(dict(owner, generation=generation, renewed_at=time.time())).encode())

    def current(self) -> dict | None:
        """The newest generation's lease (with its `generation`), or None if there is none yet."""
        generation = self.latest_generation()
        if generation < 0:
            return None
        try:
            lease = json.loads(filesystem.read_bytes(self._lease_url(generation)))
        except FileNotFoundError:
            return None
        return dict(lease, generation=generation)

    def _lease_url(self, generation: int) -> str:
        return filesystem.join(self.directory, f"{generation}.lease")


__all__ = ["SubmitterLease", "SupersededSubmitter", "expired", "RENEW", "TIMEOUT"]
