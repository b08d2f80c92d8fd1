"""streamsnap's Python worker daemon (cluster/worker_daemon.py): the embedded session's workers
fork from it with streamsnap imported, and a preload that fails leaves a working plain daemon."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest

from streamsnap.cluster.worker_daemon import MARKER

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _marker(_):
    yield os.environ.get(MARKER)


@pytest.mark.spark
def test_the_embedded_sessions_python_workers_fork_from_the_preloading_daemon(spark):
    marks = spark.sparkContext.parallelize(range(2), 2).mapPartitions(_marker).collect()
    assert all(m and m.startswith("preloaded ") for m in marks), marks


def _start_daemon(code: str) -> tuple[int, str]:
    """Run a worker daemon the way Spark does (argv: the worker module; the port comes back as
    4 bytes on stdout; closing stdin stops it): (its port, its stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    daemon = subprocess.Popen([sys.executable, "-c", code, "pyspark.worker"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd="/")
    try:
        port = struct.unpack("!i", daemon.stdout.read(4))[0]
        daemon.stdin.close()
        daemon.wait(60)
        return port, daemon.stderr.read().decode()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_a_preload_that_fails_leaves_pyspark_daemon_serving_with_a_warning():
    port, stderr = _start_daemon(
        "import streamsnap.cluster.worker_daemon as d\n"
        "d.PRELOAD = ('json', 'streamsnap_no_such_module', 'csv')\n"
        "d.main()\n")
    assert 0 < port < 65536
    assert "streamsnap worker daemon: not preloaded: importing streamsnap_no_such_module failed" in stderr, stderr


def test_preload_accounts_for_what_it_imported(monkeypatch):
    from streamsnap.cluster import worker_daemon

    monkeypatch.delenv(MARKER, raising=False)
    assert worker_daemon.preload(("json", "csv")).startswith("preloaded 2 modules in ")
    assert os.environ[MARKER].startswith("preloaded 2 modules")
    assert worker_daemon.preload(("json", "streamsnap_no_such_module")).startswith(
        "not preloaded: importing streamsnap_no_such_module failed (ModuleNotFoundError")
