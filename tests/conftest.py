"""Shared fixtures: one embedded Spark session for the whole run (it takes ~9 s to start)."""

from __future__ import annotations

import logging
import threading

import pytest
from tests import properties

SPARK_SLOTS = 16

properties.load()   # reproducible property tests in CI (tests/properties.py)


@pytest.fixture(scope="session")
def spark():
    from streamsnap.cluster.spark_session import embedded_session

    session = embedded_session(SPARK_SLOTS)
    yield session
    session.stop()


@pytest.fixture
def no_leaked_threads():
    """Fail the test if streamsnap threads outlive the job (tasks, ports, loops)."""
    before = {t.ident for t in threading.enumerate()}
    yield
    import time
    # A leaked thread runs on for good; one still ending gets time on a loaded machine.
    deadline = time.monotonic() + 30
    while True:
        leaked = [t for t in threading.enumerate()
                  if t.ident not in before and t.is_alive()
                  and (t.name.startswith(("jobmaster-", "control-", "spark-job-", "web-", "status-")))]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not leaked, f"threads left running after the job: {[t.name for t in leaked]}"


@pytest.fixture(autouse=True)
def _cancel_leftover_jobs(monkeypatch):
    """A test that fails half-way must not leave its job running into the next test."""
    from streamsnap.cluster.jobmaster import JobMaster

    started = []
    original = JobMaster.start

    def start(self):
        started.append(self)
        original(self)
    monkeypatch.setattr(JobMaster, "start", start)
    yield
    for master in started:
        if not master.wait_terminal(0):
            master.cancel()
            master.wait_terminal(60)


@pytest.fixture(autouse=True)
def _quiet_py4j():
    logging.getLogger("py4j").setLevel(logging.WARNING)
    yield


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """A Kafka-protocol broker on 127.0.0.1 for the session, started and stopped by
    scripts/kafka-broker; yields its bootstrap address."""
    from benchmarks import local_kafka

    directory = str(tmp_path_factory.mktemp("kafka-broker"))
    address = local_kafka.start_broker(directory)
    yield address
    local_kafka.stop_broker(directory)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """An S3-compatible server (moto's) on 127.0.0.1 for the session, started by scripts/s3-server
    on first use in this xdist worker; yields a benchmarks.local_s3.LocalS3 (endpoint, storage
    options, `new_bucket()`)."""
    from benchmarks import local_s3

    directory = str(tmp_path_factory.mktemp("s3-server"))
    server = local_s3.start_server(directory)
    yield server
    local_s3.stop_server(directory)


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory):
    """A Spark Connect server on 127.0.0.1 in front of a Spark standalone cluster (scripts/
    spark-connect and scripts/spark-standalone: a Master and 2 Workers x 4 cores, each its own
    JVM, executors in JVMs of their own), started once on first use; yields its sc:// URL. A
    classic and a Connect session cannot share one Python process, so tests drive it from a
    driver subprocess."""
    import json
    import os
    import subprocess
    import sys

    scripts = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
    cluster_dir = str(tmp_path_factory.mktemp("spark-standalone-for-connect"))
    directory = str(tmp_path_factory.mktemp("spark-connect"))
    out = subprocess.run([sys.executable, os.path.join(scripts, "spark-standalone"), "start", cluster_dir,
                          "--workers", "2", "--cores", "4", "--memory", "2g"], capture_output=True, text=True, timeout=180)
    if out.returncode != 0:
        raise RuntimeError(f"scripts/spark-standalone start failed: {out.stderr or out.stdout}")
    with open(os.path.join(cluster_dir, "cluster.json")) as f:
        master = json.load(f)["master_url"]
    try:
        # spark.cores.max states the slots a Connect client may count on (it cannot ask the scheduler).
        out = subprocess.run([sys.executable, os.path.join(scripts, "spark-connect"), "start", directory, "--master",
                              master, "--conf", "spark.cores.max=8", "--conf", "spark.executor.memory=1g"],
                             capture_output=True, text=True, timeout=180)
        if out.returncode != 0:
            raise RuntimeError(f"scripts/spark-connect start failed: {out.stderr or out.stdout}")
        yield out.stdout.strip().splitlines()[-1]
        subprocess.run([sys.executable, os.path.join(scripts, "spark-connect"), "stop", directory], check=True,
                       timeout=60)
    finally:
        subprocess.run([sys.executable, os.path.join(scripts, "spark-standalone"), "stop", cluster_dir], check=True,
                       timeout=60)
