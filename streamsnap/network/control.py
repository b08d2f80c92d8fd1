"""Control RPC between the driver (JobMaster) and its tasks: msgpack messages over TCP.

The driver listens; each task opens one authenticated connection and keeps it for its life.
Through it the task registers (pid, host, data port), reports status, acknowledges or declines
checkpoints and ships collected rows; the driver sends peer addresses, checkpoint triggers,
notifications and cancellation. The connection doubles as the failure detector: when a task
process dies, the kernel closes its socket and the driver learns at once — much sooner than
Spark reports the failed barrier stage.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Callable

from streamsnap.network import auth
from streamsnap.network.acceptor import Acceptor
from streamsnap.network.frames import FrameDecoder, FrameError, FrameKind, decode_message, encode_message

log = logging.getLogger(__name__)


class ControlConnection:
    """One authenticated control connection; reads on its own thread, writes under a lock."""

    def __init__(self, sock: socket.socket, name: str,
                 on_message: Callable[["ControlConnection", dict], None],
                 on_close: Callable[["ControlConnection", BaseException | None], None]):
        self._sock = sock
        self.name = name
        self._on_message = on_message
        self._on_close = on_close
        self._send_lock = threading.Lock()
        self._closed = threading.Event()
        self.peer = sock.getpeername()
        self.context: object = None  # what the owner associates with it (e.g. the task attempt)
        self._thread = threading.Thread(target=self._read_loop, name=f"{name}-control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def send(self, message: dict) -> bool:
        """Send one message; returns False if the connection is already gone."""
        data = encode_message(message)
        with self._send_lock:
            if self._closed.is_set():
                return False
            try:
                self._sock.sendall(data)
                return True
            except OSError as exc:
                log.debug("control send on %s failed: %s", self.name, exc)
                self._shutdown()
                return False

    def close(self) -> None:
        self._shutdown()
        if threading.current_thread() is not self._thread and self._thread.is_alive():
            self._thread.join(5)

    def _shutdown(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already disconnected by the peer
            self._sock.close()

    def _read_loop(self) -> None:
        decoder = FrameDecoder()
        error: BaseException | None = None
        try:
            while not self._closed.is_set():
                try:
                    data = self._sock.recv(1 << 20)
                except OSError as exc:
                    if not self._closed.is_set():
                        error = exc
                    break
                if not data:
                    break
                for kind, payload in decoder.feed(data):
                    if kind is not FrameKind.MESSAGE:
                        raise FrameError(f"unexpected {kind.name} frame on a control connection")
                    self._on_message(self, decode_message(payload))
        except FrameError as exc:
            log.warning("closing control connection %s: %s", self.name, exc)
            error = exc
        except BaseException as exc:
            log.exception("control message handler on %s failed", self.name)
            error = exc
        finally:
            was_open = not self._closed.is_set()
            self._shutdown()
            if was_open or error is not None:
                self._on_close(self, error)


class ControlServer:
    """The driver's control endpoint. Refuses (and logs) anything that fails authentication."""

    def __init__(self, bind_host: str, secret: bytes,
                 on_connect: Callable[[ControlConnection], None],
                 on_message: Callable[[ControlConnection, dict], None],
                 on_close: Callable[[ControlConnection, BaseException | None], None],
                 peer_timeout: float | None = None):
        self._on_connect = on_connect
        self._on_message = on_message
        self._on_close = on_close
        self._lock = threading.Lock()
        self._connections: list[ControlConnection] = []
        self._closing = False
        self._acceptor = Acceptor(bind_host, secret, "control endpoint", self._accepted, peer_timeout)
        self.address = self._acceptor.address

    @property
    def refused(self) -> int:
        return self._acceptor.refused

    def start(self) -> None:
        self._acceptor.start()

    def close(self) -> None:
        self._closing = True
        self._acceptor.stop()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            conn.close()

    def _accepted(self, sock: socket.socket, peer) -> None:
        conn = ControlConnection(sock, f"control-{peer[0]}:{peer[1]}", self._on_message, self._on_close)
        with self._lock:
            if self._closing:
                raise ConnectionError("the control endpoint is closing")
            self._connections.append(conn)
        self._on_connect(conn)
        conn.start()


def connect_control(address: tuple[str, int], secret: bytes, name: str,
                    on_message: Callable[[ControlConnection, dict], None],
                    on_close: Callable[[ControlConnection, BaseException | None], None],
                    source: str | None = None, peer_timeout: float | None = None) -> ControlConnection:
    sock = auth.connect(address, secret, source=source, peer_timeout=peer_timeout)
    conn = ControlConnection(sock, name, on_message, on_close)
    conn.start()
    return conn
