"""Accepting connections: every peer is authenticated before its connection is handed on.

Shared by the driver's control endpoint and every task's data endpoint. Each accepted socket
gets a short-lived thread for the handshake (so a silent peer delays nobody else); a peer that
fails it — wrong secret, garbage, silence past the deadline, an unexpected first frame — is
logged and dropped, and the endpoint keeps serving. `stop()` aborts handshakes still running.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Callable

from streamsnap.errors import AuthenticationError
from streamsnap.network import auth, liveness
from streamsnap.network.frames import FrameError

log = logging.getLogger(__name__)

# What a peer can make go wrong before it is accepted; anything else is our bug and propagates.
REFUSAL_ERRORS = (AuthenticationError, FrameError, OSError, ConnectionError, TimeoutError, ValueError,
                  StopIteration)


class Acceptor:
    def __init__(self, bind_host: str, secret: bytes, name: str,
                 on_accepted: Callable[[socket.socket, tuple], None], peer_timeout: float | None = None):
        """`on_accepted(sock, peer)` runs after authentication; raising a refusal error rejects.
        peer_timeout: seconds of silence after which an accepted peer is lost (network/liveness.py)."""
        self._secret = secret
        self._peer_timeout = peer_timeout
        self._name = name
        self._on_accepted = on_accepted
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((bind_host, 0))
        self._sock.listen(128)
        self._sock.settimeout(0.2)
        self.address = (bind_host, self._sock.getsockname()[1])
        self.refused = 0
        self._stopping = False
        self._lock = threading.Lock()
        self._pending: dict[threading.Thread, socket.socket] = {}
        self._thread = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5)
        with self._lock:
            pending = dict(self._pending)
        for sock in pending.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a handshake blocked on a silent peer
            except OSError:
                pass  # already closed by its thread
        for thread in pending:
            thread.join(5)
        self._sock.close()

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                sock, peer = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stopping:
                    return
                raise
            thread = threading.Thread(target=self._handshake, args=(sock, peer),
                                      name=f"{self._name}-handshake", daemon=True)
            with self._lock:
                self._pending[thread] = sock
            thread.start()

    def _handshake(self, sock: socket.socket, peer: tuple) -> None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            liveness.arm(sock, self._peer_timeout)
            auth.accept_handshake(sock, self._secret)
            if self._stopping:
                raise ConnectionError("endpoint is shutting down")
            self._on_accepted(sock, peer)
        except REFUSAL_ERRORS as exc:
            self.refused += 1
            log.warning("%s refused a connection from %s:%s: %s", self._name, peer[0], peer[1], exc)
            sock.close()
        finally:
            with self._lock:
                self._pending.pop(threading.current_thread(), None)
