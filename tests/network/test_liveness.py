"""Noticing a silent peer (network/liveness.py) and a task's addresses on one machine posing as
several hosts (network/addresses.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from streamsnap.network import auth, liveness
from streamsnap.network.addresses import advertised_host, source_address
from streamsnap.network.liveness import ProbePlan

PARTITION = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "scripts", "partition")


@pytest.mark.parametrize("timeout", [2, 2.5, 3, 4, 5, 6, 10, 30, 60, 300])
def test_a_silent_peer_is_given_up_within_the_peer_timeout_never_later(timeout):
    plan = ProbePlan.for_timeout(timeout)
    assert plan.bound <= timeout and plan.user_timeout == timeout
    assert plan.idle >= 1 and plan.interval >= 1 and 1 <= plan.count <= liveness.PROBES
    assert plan.bound >= timeout - 1          # whole seconds: at most one early


def test_the_default_plan_probe_by_probe():
    plan = ProbePlan.for_timeout(5.0)
    assert (plan.idle, plan.interval, plan.count) == (2, 1, 3)
    # Silence: no probe before `idle`, then one a second; the third unanswered ends it at 5 s.
    assert [plan.probes_sent(t) for t in (0, 1.9, 2.0, 2.5, 3.0, 4.0, 4.9)] == [0, 0, 1, 1, 2, 3, 3]
    assert [plan.lost(t) for t in (0, 2.0, 4.0, 4.99, 5.0, 30)] == [False, False, False, False, True, True]
    # Data sent and unacknowledged: the user timeout, even while the peer was heard recently.
    assert not plan.lost(0.5, unacknowledged_for=4.9)
    assert plan.lost(0.5, unacknowledged_for=5.0)


@pytest.mark.parametrize("bad", [1.9, 0, -1, float("nan")])
def test_a_timeout_below_what_the_kernel_can_count_is_refused(bad):
    with pytest.raises(ValueError, match="peer_timeout must be at least 2 s"):
        ProbePlan.for_timeout(bad)


def test_the_host_a_worker_states_wins_over_the_address_spark_saw(monkeypatch):
    monkeypatch.delenv("SPARK_LOCAL_HOSTNAME", raising=False)
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    # A client-mode executor is seen at its connection's source address: 127.0.0.1 for every alias.
    assert advertised_host("127.0.0.1") == "127.0.0.1"
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.3")
    assert advertised_host("127.0.0.1") == "127.0.0.3"
    monkeypatch.setenv("SPARK_LOCAL_HOSTNAME", "worker-7.example")
    assert advertised_host("127.0.0.1") == "worker-7.example"


def test_connections_leave_from_a_loopback_alias_only():
    assert source_address("127.0.0.3") == "127.0.0.3"
    # 127.0.0.1 is the kernel's choice anyway; names and real addresses are routed by the host.
    assert [source_address(h) for h in ("127.0.0.1", "worker-7.example", "10.1.2.3", "::1", "", None)] \
        == [None] * 6


def test_an_authenticated_connection_leaves_from_its_host_and_is_armed():
    secret = auth.new_secret()
    with socket.socket() as server:
        server.bind(("127.0.0.3", 0))
        server.listen()
        address = server.getsockname()
        accepted = []

        def accept():
            sock, peer = server.accept()
            accepted.append(peer)
            auth.accept_handshake(sock, secret)
            sock.close()

        import threading
        thread = threading.Thread(target=accept)
        thread.start()
        sock = auth.connect(address, secret, source="127.0.0.2", peer_timeout=5.0)
        thread.join(30)
        try:
            assert accepted[0][0] == "127.0.0.2"
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 2
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 5000
        finally:
            sock.close()


@pytest.mark.faults
@pytest.mark.skipif(shutil.which("nft") is None or os.geteuid() != 0,
                    reason="needs nft (apt-get install -y nftables; .ci/run installs it) and root")
def test_a_partitioned_peer_fails_a_blocked_read_instead_of_hanging_it():
    """Real sockets, a real drop rule: the reader of an idle connection hears nothing at all, and
    still learns within the peer timeout that its peer is gone (ETIMEDOUT)."""
    # Addresses of its own: the multi-host tests' Workers (127.0.0.2, .3) may be running meanwhile.
    a, b = "127.0.0.42", "127.0.0.43"
    with socket.socket() as server:
        server.bind((b, 0))
        server.listen()
        client = socket.create_connection(server.getsockname(), source_address=(a, 0))
        peer, _ = server.accept()
        with client, peer:
            liveness.arm(peer, 2.0)
            subprocess.run([sys.executable, PARTITION, "cut", a, b], check=True, timeout=30)
            try:
                peer.settimeout(60)
                started = time.monotonic()
                with pytest.raises(TimeoutError) as info:
                    peer.recv(1)
                assert info.value.errno == 110          # ETIMEDOUT: given up, not a socket timeout
                print(f"silent peer noticed after {time.monotonic() - started:.1f} s (peer_timeout 2 s)")
            finally:
                subprocess.run([sys.executable, PARTITION, "heal", a, b], check=True, timeout=30)


def test_the_partition_script_refuses_addresses_off_the_loopback_network():
    for args, message in ((["10.0.0.1", "127.0.0.2"], "10.0.0.1 is not on 127.0.0.0/8"),
                          (["host-a", "127.0.0.2"], "'host-a' is not an IP address"),
                          (["127.0.0.2", "127.0.0.2"], "cut 127.0.0.2 from itself")):
        done = subprocess.run([sys.executable, PARTITION, "cut", *args], capture_output=True, text=True, timeout=30)
        assert done.returncode != 0 and message in done.stderr, done.stderr
