"""Faults of many hosts, on one machine: a Spark standalone cluster of two Workers, each a host of
its own address (scripts/spark-standalone --hosts: 127.0.0.2 and .3, its own scratch directory)
with room for the whole job, the driver and its JobMaster on 127.0.0.1. The chaos job (filter +
two keyed stages, p=3, its slots spread over both hosts) must commit exactly the failure-free
output, with one restart a fault:

* a network partition between two hosts (scripts/partition: nftables drops their packets, no
  FIN, no RST), healed after 10 s: noticed within `NetworkConfig.peer_timeout`, not only once it
  heals, and nothing of the cut-off attempt is left running;
* a partition between a host and the driver (its subtasks' control connections to the JobMaster
  cut, both ways), healed once noticed;
* a host lost: the Worker JVM, its executor and its Python workers SIGKILLed at once
  (scripts/spark-standalone kill-host); the job goes on with the two hosts left.

One Spark application serves every job (multi_host.Session); the host loss comes last, as the
lost host does not come back."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import time

import psutil
import pytest

from streamsnap.state.local_recovery import ROOT_NAME
from tests.integration import fault_figures, multi_host
from tests.integration.multi_host import CLUSTER_SCRIPT, PARTITION_SCRIPT

pytestmark = [pytest.mark.spark, pytest.mark.faults]

PARTITION_SECONDS = 10
PEER_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("spark-hosts"))
    cluster = multi_host.start_cluster(directory)
    try:
        session = multi_host.Session(cluster, directory)
        try:
            yield cluster, session
        finally:
            session.close()
    finally:
        multi_host.stop_cluster(directory)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def subtask_hosts(info: dict) -> set[str]:
    return {s["host"] for s in info["subtasks"]}


def test_each_worker_is_a_host_of_its_own_address_that_its_subtasks_advertise(hosts):
    cluster, _ = hosts
    addresses = {h["address"] for h in cluster["hosts"].values()}
    assert addresses == {"127.0.0.2", "127.0.0.3"}
    assert len({h["local_dir"] for h in cluster["hosts"].values()}) == multi_host.HOSTS


needs_nft = pytest.mark.skipif(shutil.which("nft") is None or os.geteuid() != 0,
                               reason="needs nft (apt-get install -y nftables; .ci/run installs it) and root")


def partitioned_run(session, tmp_path, scenario: str, sides, heal_once_noticed: bool = False):
    """Run the chaos job, cut `sides(info)` (two addresses) apart with scripts/partition once a
    checkpoint completed, for PARTITION_SECONDS or — `heal_once_noticed` — until the job noticed
    (its first failover). Asserts one restart, noticed while still cut, a clean heal, exact
    output, and nothing of the cut-off attempt left; returns (info of the cut-off attempt, result)."""
    # 12 s of input: on a loaded machine the first checkpoint may come seconds in, and the cut
    # must fall while rows still flow.
    job = session.run(tmp_path, scenario, {"network": {"peer_timeout": PEER_TIMEOUT}}, n=18_000)
    info = job.info()
    a, b = sides(info)
    cut_at = time.time()
    partition = subprocess.Popen([sys.executable, PARTITION_SCRIPT, "cut", a, b, "--for", str(PARTITION_SECONDS)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if heal_once_noticed:
            while not job.info()["recoveries"] and partition.poll() is None:
                time.sleep(0.2)
            partition.terminate()           # it heals on SIGTERM
        result = job.result()
        output, _ = partition.communicate(timeout=PARTITION_SECONDS + 60)
    finally:
        if partition.poll() is None:
            partition.terminate()
            partition.wait(30)
        subprocess.run([sys.executable, PARTITION_SCRIPT, "heal", a, b], check=True, timeout=30)
    assert partition.returncode == 0, output
    # Only this cut: another test (tests/network/test_liveness.py) may cut its own pair meanwhile.
    assert " ".join(sorted((a, b))) not in subprocess.run(
        [sys.executable, PARTITION_SCRIPT, "list"], capture_output=True, text=True, check=True).stdout.splitlines(), \
        "a partition rule outlived the script"
    # One fault, one restart — noticed while the network was still cut (a closed connection
    # would only come after it healed; without liveness probes there is no restart at all).
    fault_figures.report(scenario, faults=1, restarts=result["restarts"], fault_at=cut_at,
                         recoveries=result["recoveries"])
    assert result["restarts"] == 1, result
    noticed = result["recoveries"][0]["failed_at"] - cut_at
    print(f"{scenario}: noticed after {noticed:.1f} s (peer_timeout {PEER_TIMEOUT:g} s)")
    assert noticed < PARTITION_SECONDS, result["recoveries"]
    job.assert_exact()
    # Nothing of the cut-off attempt still runs: its subtasks' data endpoints are gone.
    for s in info["subtasks"]:
        if s["data_address"]:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(tuple(s["data_address"]), timeout=10).close()
    return info, result


@needs_nft
def test_a_partition_between_two_hosts_is_noticed_failed_over_and_healed_exactly_once(hosts, tmp_path):
    cluster, session = hosts

    def two_hosts(info):
        # Every subtask advertises its executor's host (never the machine's name or 127.0.0.1),
        # and each host runs a slot: the partition cuts the data channels between them.
        assert subtask_hosts(info) == {h["address"] for h in cluster["hosts"].values()}, info
        return sorted(subtask_hosts(info))[:2]

    partitioned_run(session, tmp_path, "partition host-host", two_hosts)


@needs_nft
def test_a_partition_between_a_host_and_the_driver_is_noticed_and_failed_over_exactly_once(hosts, tmp_path):
    """The driver (127.0.0.1: its JobMaster's control port) cut from a host: its subtasks' control
    connections leave from the host's own address (network/addresses.py), so the rule cuts them
    — while Spark's executor-to-driver RPC, which leaves from 127.0.0.1, still carries the
    cancellation of the cut-off barrier tasks. Healed once the JobMaster noticed, so that the
    new attempt's subtasks on that host can register."""
    _, session = hosts

    def host_and_driver(info):
        busiest = max(subtask_hosts(info), key=lambda h: sum(s["host"] == h for s in info["subtasks"]))
        return busiest, "127.0.0.1"

    partitioned_run(session, tmp_path, "partition host-driver", host_and_driver, heal_once_noticed=True)


def test_a_lost_host_is_recovered_from_on_the_hosts_left_exactly_once(hosts, tmp_path):
    cluster, session = hosts
    job = session.run(tmp_path, "host lost", {"local_recovery": True})
    info = job.info()
    # Local-recovery copies stay on their host: under its own scratch directory. (Spark places
    # the three barrier tasks on the executors' free cores: sometimes all on one host.) The first
    # completed checkpoint may precede any row reaching a keyed stage — no keyed state, no copy —
    # so a copy is waited for: the next checkpoints, every 0.5 s, hold keyed state.
    deadline = time.monotonic() + 30
    for h in cluster["hosts"].values():
        if h["address"] in subtask_hosts(info):
            while not glob.glob(os.path.join(h["local_dir"], "**", ROOT_NAME), recursive=True):
                assert time.monotonic() < deadline, h
                time.sleep(0.1)
    victim = sorted(subtask_hosts(info))[0]
    worker = next(name for name, h in cluster["hosts"].items() if h["address"] == victim)
    lost_at = time.time()
    killed = subprocess.run([sys.executable, CLUSTER_SCRIPT, "kill-host", cluster["directory"], worker],
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == 0, killed.stderr
    pids = [int(p) for p in killed.stdout.split()]
    # The Worker JVM, its executor JVM and the Python workers below it: a whole host.
    assert len(pids) >= 3 and cluster["hosts"][worker]["pid"] in pids, killed.stdout
    deadline = time.monotonic() + 60     # SIGKILL is delivered at once, the exits take a moment
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, [p for p in pids if alive(p)]
        time.sleep(0.05)
    result = job.result()
    fault_figures.report("host lost", faults=1, restarts=result["restarts"], fault_at=lost_at,
                         recoveries=result["recoveries"])
    assert result["restarts"] == 1, result
    assert victim not in result["hosts"] and len(result["hosts"]) == multi_host.HOSTS - 1, result
    recovery = result["recoveries"][0]
    print(f"host loss noticed after {recovery['failed_at'] - lost_at:.1f} s, first output "
          f"{recovery.get('first_output_at', float('nan')) - recovery['failed_at']:.1f} s after that: {recovery}")
    job.assert_exact()
    # The lost host's keyed state came back from checkpoint storage; the survivors' from their
    # host's local copies.
    host_of = {f"{s['vertex']}#{s['index']}": s["host"] for s in info["subtasks"]}
    restored = {name: c for name, c in recovery["restore"]["subtasks"].items() if c["local_files"] + c["remote_files"]}
    # A restore may read no state files at all: the host can be killed right after the first
    # checkpoint, which the rate-limited sources can complete before any row reached a keyed
    # stage (empty keyed state: nothing written, nothing read) — then there is nothing to say
    # about where state came from.
    assert not restored or {host_of[name] for name in restored} == subtask_hosts(info), recovery["restore"]
    for name, counts in restored.items():
        if host_of[name] == victim:
            assert counts["local_files"] == 0 and counts["remote_files"] > 0, (name, counts)
        else:
            assert counts["local_files"] > 0, (name, counts)
