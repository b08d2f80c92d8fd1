"""Mutual authentication of every connection with the job's secret, before anything is parsed.

Each job gets a random secret on the driver; it reaches the tasks inside the Spark task closure.
A connection is accepted only after a fixed-size HMAC challenge-response, so an unauthenticated
peer can make us read exactly 64 bytes and nothing more: no frame is decoded, no length is
trusted, nothing is deserialized before the peer proved it holds the secret.

    acceptor  -> MAGIC + server_nonce(32)
    connector -> client_nonce(32) + HMAC(secret, "connector" | server_nonce | client_nonce)
    acceptor  -> HMAC(secret, "acceptor" | client_nonce | server_nonce)
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import time

from streamsnap.errors import AuthenticationError
from streamsnap.network import liveness

MAGIC = b"SSNAPv1\x00"
NONCE_BYTES = 32
MAC_BYTES = 32
HANDSHAKE_TIMEOUT = 10.0


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def _mac(secret: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, role + first + second, hashlib.sha256).digest()


def recv_exactly(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """Read exactly `n` bytes from a blocking socket, honouring an absolute monotonic deadline."""
    chunks, remaining = [], n
    while remaining:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"peer sent {n - remaining} of {n} expected bytes before the deadline")
            sock.settimeout(left)
        chunk = sock.recv(remaining)
        if not chunk:
            raise ConnectionError(f"peer closed the connection after {n - remaining} of {n} bytes")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def accept_handshake(sock: socket.socket, secret: bytes, timeout: float = HANDSHAKE_TIMEOUT) -> None:
    """Authenticate a peer that connected to us; raises AuthenticationError if it cannot."""
    deadline = time.monotonic() + timeout
    server_nonce = os.urandom(NONCE_BYTES)
    sock.settimeout(timeout)
    sock.sendall(MAGIC + server_nonce)
    try:
        reply = recv_exactly(sock, NONCE_BYTES + MAC_BYTES, deadline)
    except (OSError, ConnectionError, TimeoutError) as exc:
        raise AuthenticationError(f"no valid handshake from peer: {exc}") from exc
    client_nonce, mac = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
    if not hmac.compare_digest(mac, _mac(secret, b"connector", server_nonce, client_nonce)):
        raise AuthenticationError("peer failed authentication (wrong or missing job secret)")
    sock.sendall(_mac(secret, b"acceptor", client_nonce, server_nonce))
    sock.settimeout(None)


def connect_handshake(sock: socket.socket, secret: bytes, timeout: float = HANDSHAKE_TIMEOUT) -> None:
    """Authenticate to the peer we connected to, and make it prove it knows the secret too."""
    deadline = time.monotonic() + timeout
    sock.settimeout(timeout)
    hello = recv_exactly(sock, len(MAGIC) + NONCE_BYTES, deadline)
    if hello[:len(MAGIC)] != MAGIC:
        raise AuthenticationError("the peer is not a streamsnap endpoint (bad greeting)")
    server_nonce = hello[len(MAGIC):]
    client_nonce = os.urandom(NONCE_BYTES)
    sock.sendall(client_nonce + _mac(secret, b"connector", server_nonce, client_nonce))
    proof = recv_exactly(sock, MAC_BYTES, deadline)
    if not hmac.compare_digest(proof, _mac(secret, b"acceptor", client_nonce, server_nonce)):
        raise AuthenticationError("the peer could not prove it holds the job secret")
    sock.settimeout(None)


def connect(address: tuple[str, int], secret: bytes, timeout: float = HANDSHAKE_TIMEOUT,
            source: str | None = None, peer_timeout: float | None = None) -> socket.socket:
    """Open an authenticated TCP connection to `address`, from local address `source` if given
    (network/addresses.py: a task's connections leave from its host's address), its peer
    declared lost after `peer_timeout` seconds of silence (network/liveness.py; None: never)."""
    sock = socket.create_connection(address, timeout=timeout,
                                    source_address=(source, 0) if source else None)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        liveness.arm(sock, peer_timeout)
        connect_handshake(sock, secret, timeout)
    except BaseException:
        sock.close()
        raise
    return sock
