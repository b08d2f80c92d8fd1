"""The JobMaster's watch over a detached job's submitter (cluster/submitter_lease.py).

A detached job's Spark job belongs to a submitter process outside the client; if that process
dies, Spark ends the job's stage and no stage retry brings the next attempt. So the JobMaster in
the cluster (cluster/in_cluster.py) checks the submitter's lease and, once it expired, starts a
replacement submitter (cluster/detached.py) whose new Spark job resumes the job.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


class SubmitterWatch:
    """Mixin of the ClusterJobMaster: `_watch_submitter`, posted once at start for a detached job.

    Uses the master's `status`, `outcome`, `registry`, `settings`, `_job`, `_record`,
    `_publish()` and `_timers`; sets `_submitter_replaced`."""

    _submitter_replaced = False

    def _watch_submitter(self) -> None:
        """Every RENEW seconds: has the detached job's submitter stopped renewing its lease?
        Then start a replacement (cluster/submitter_lease.py) — once per JobMaster: the
        replacement's new Spark job brings the next one."""
        from streamsnap.cluster import detached
        from streamsnap.cluster.submitter_lease import RENEW, SubmitterLease, expired

        if self.status.is_terminal or self._submitter_replaced or self.outcome is not None:
            return
        try:
            lease = SubmitterLease(self.registry).current()
        except OSError as exc:
            log.warning("job '%s': could not read the submitter's lease: %s", self.settings.job_name, exc)
            lease = None
        if expired(lease, time.time()):
            self._submitter_replaced = True
            lost = (f"the submitter of detached job '{self.settings.job_name}' (pid {lease.get('pid')} on "
                    f"{lease.get('host')}) stopped renewing its lease {time.time() - lease['renewed_at']:.0f} s ago")
            pid, host, log_file = detached.replace(self._job, self.settings.job_name, lease)
            log.warning("job '%s': %s; started a replacement submitter (pid %d on %s, log %s), which resubmits "
                        "the job from its latest completed checkpoint", self.settings.job_name, lost, pid, host,
                        log_file)
            self._record["submitter_lost"] = {"cause": lost, "at": time.time(), "replacement": {
                "pid": pid, "host": host, "log": log_file}}
            self._publish()
            return
        self._timers.call_later(RENEW, self._watch_submitter)


__all__ = ["SubmitterWatch"]
