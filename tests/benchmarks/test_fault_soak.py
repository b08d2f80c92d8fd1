"""The fault soak's command line refuses what it cannot run before it starts anything."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("args, message", [
    (["--kinds", "slot,flood"], "--kinds takes some of slot, partition, enospc, host; got flood"),
    (["--minutes", "1", "--every", "60"], "leave room for one fault before the last --quiet-tail seconds"),
    (["--every", "5"], "--every must be at least 30 s"),
])
def test_bad_arguments_fail_at_once_saying_what_is_allowed(args, message, tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.fault_soak", *args, "--keep", str(tmp_path / "soak")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "soak").exists(), "nothing started"
