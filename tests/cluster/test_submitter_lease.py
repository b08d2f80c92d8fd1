"""The detached submitter's lease (cluster/submitter_lease.py): generations fence older
submitters, and a lease counts as lost only once it has not been renewed for the timeout."""

from __future__ import annotations

import pytest

from streamsnap.cluster.registry import JobRegistry
from streamsnap.cluster.submitter_lease import SubmitterLease, SupersededSubmitter, expired


def test_a_lease_expires_only_after_the_timeout_and_a_missing_one_never_does():
    assert not expired(None, now=1_000.0)
    assert not expired({"pid": 1}, now=1_000.0)                 # not renewed yet: left alone
    assert not expired({"renewed_at": 990.0}, now=1_000.0, timeout=15.0)
    assert not expired({"renewed_at": 985.0}, now=1_000.0, timeout=15.0)
    assert expired({"renewed_at": 984.9}, now=1_000.0, timeout=15.0)


def test_a_replacement_takes_the_next_generation_and_the_old_submitter_is_fenced(tmp_path):
    leases = SubmitterLease(JobRegistry(str(tmp_path), "job-1"))
    assert leases.current() is None and leases.latest_generation() == -1
    first = leases.take({"pid": 11, "host": "a"})
    assert first == 0 and leases.current()["pid"] == 11
    leases.renew(first, {"pid": 11, "host": "a", "session_id": "s-1"})
    assert leases.current()["session_id"] == "s-1"

    second = leases.take({"pid": 22, "host": "b"})
    assert second == 1
    current = leases.current()
    assert (current["generation"], current["pid"]) == (1, 22)
    with pytest.raises(SupersededSubmitter, match="submitter 0 of job job-1 was replaced by submitter 1"):
        leases.renew(first, {"pid": 11, "host": "a"})
    assert leases.current()["pid"] == 22                         # the fenced renewal wrote nothing
