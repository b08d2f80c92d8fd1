"""A task's network I/O thread: one selector loop for all of its data connections.

The task's mailbox thread never touches a data socket. It queues frames on output channels and
pops frames from input channels; this loop moves bytes between those queues and the sockets,
sends and receives credits, and tells the task (through callbacks) that input arrived, that
output capacity freed up, or that a connection failed. Like Netty's event loop in Flink.

`DataServer` accepts upstream connections: each is authenticated (job secret) and must name an
expected channel in its first frame before it is handed to the loop; anything else is logged
and dropped without affecting the job.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections import deque
from typing import Callable

import msgpack

from streamsnap.network import auth
from streamsnap.network.acceptor import Acceptor
from streamsnap.network.channels import ChannelId, InputChannel, OutputChannel
from streamsnap.network.frames import (
    FrameDecoder, FrameError, FrameKind, decode_credit, encode_credit, encode_frame,
)

log = logging.getLogger(__name__)

# Marker frame appended to an input channel when its connection closes; the task decides
# whether that was orderly (after end-of-partition) or a lost upstream.
CONNECTION_CLOSED = None

_RECV_BYTES = 1 << 20


class _Connection:
    __slots__ = ("sock", "decoder", "input", "output", "sending", "credits_to_return",
                 "pending_out", "write_registered", "closed")

    def __init__(self, sock: socket.socket, input_channel: InputChannel | None = None,
                 output_channel: OutputChannel | None = None):
        self.sock = sock
        self.decoder = FrameDecoder()
        self.input = input_channel
        self.output = output_channel
        self.sending: list[memoryview] | None = None
        self.credits_to_return = 0
        self.pending_out = bytearray()  # credit frames not yet written (input connections)
        self.write_registered = False
        self.closed = False


class NetworkLoop:
    def __init__(self, name: str, on_input: Callable[[], None], on_output: Callable[[], None],
                 on_error: Callable[[BaseException], None]):
        self._name = name
        self._on_input = on_input
        self._on_output = on_output
        self._on_error = on_error
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._wake_pending = False
        self._pending: deque[Callable[[], None]] = deque()
        self._connections: list[_Connection] = []
        self._by_input: dict[int, _Connection] = {}
        self._outputs: list[_Connection] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"{name}-net", daemon=True)

    # ------------------------------------------------------------------ task-facing API
    def start(self) -> None:
        self._thread.start()

    def add_input(self, sock: socket.socket, channel: InputChannel) -> None:
        """Hand an authenticated, identified input connection to the loop (any thread)."""
        sock.setblocking(False)
        self._call_soon(lambda: self._register(_Connection(sock, input_channel=channel)))

    def add_output(self, sock: socket.socket, channel: OutputChannel) -> None:
        sock.setblocking(False)
        self._call_soon(lambda: self._register(_Connection(sock, output_channel=channel)))

    def return_credit(self, channel: InputChannel, credits: int = 1) -> None:
        """The task consumed data frames of `channel`: let its sender send as many more."""
        def grant():
            conn = self._by_input.get(channel.index)
            if conn is not None and not conn.closed:
                conn.credits_to_return += credits
                self._flush_credits(conn)
        self._call_soon(grant)

    def output_ready(self) -> None:
        """Frames were queued on some output channel: try to send them."""
        self._wake()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ loop internals
    def _call_soon(self, fn: Callable[[], None]) -> None:
        self._pending.append(fn)
        self._wake()

    def _wake(self) -> None:
        with self._lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        try:
            self._wake_w.send(b"\x00")
        except (BlockingIOError, OSError):
            pass  # a wake-up byte is already pending; the loop will run anyway

    def _register(self, conn: _Connection) -> None:
        self._connections.append(conn)
        self._selector.register(conn.sock, selectors.EVENT_READ, conn)
        if conn.input is not None:
            self._by_input[conn.input.index] = conn
            conn.credits_to_return = conn.input.credits  # the initial grant
            self._flush_credits(conn)
            conn.input.connected.set()
        else:
            self._outputs.append(conn)

    def _run(self) -> None:
        try:
            while not self._stopping:
                for key, mask in self._selector.select():
                    conn = key.data
                    if conn is None:
                        self._drain_wake()
                        continue
                    if conn.closed:
                        continue
                    if mask & selectors.EVENT_READ:
                        self._read(conn)
                    if mask & selectors.EVENT_WRITE and not conn.closed:
                        if conn.output is not None:
                            self._send(conn)
                        else:
                            self._flush_credits(conn)
                while self._pending:
                    self._pending.popleft()()
                for conn in self._outputs:
                    if not conn.closed:
                        self._send(conn)
        except BaseException as exc:  # the loop must never die silently
            if not self._stopping:
                log.exception("network loop of %s failed", self._name)
                self._on_error(exc)
        finally:
            self._close_all()

    def _drain_wake(self) -> None:
        # Drain first, then clear the flag: clearing first would let a concurrent `_wake()`
        # set the flag and write a byte that this drain then swallows — the flag would stay
        # set with no byte left, and every later wake-up would be lost.
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            self._wake_pending = False

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(_RECV_BYTES)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lost(conn, exc)
            return
        if not data:
            self._lost(conn, None)
            return
        got_input = False
        try:
            for kind, payload in conn.decoder.feed(data):
                if conn.input is not None:
                    if kind in (FrameKind.DATA, FrameKind.EVENT):
                        conn.input.on_frame(kind, payload)
                        got_input = True
                    else:
                        raise FrameError(f"unexpected {kind.name} frame on input channel {conn.input.channel_id}")
                else:
                    if kind is FrameKind.CREDIT:
                        conn.output.add_credit(decode_credit(payload))
                    else:
                        raise FrameError(f"unexpected {kind.name} frame on output channel {conn.output.channel_id}")
        except FrameError as exc:
            self._lost(conn, exc)
            return
        if got_input:
            self._on_input()
        elif conn.output is not None:
            self._send(conn)

    def _send(self, conn: _Connection) -> None:
        channel = conn.output
        freed = False
        while True:
            if conn.sending is None:
                buffers = channel.next_sendable()
                if buffers is None:
                    break
                conn.sending = list(buffers)
            try:
                sent = conn.sock.sendmsg(conn.sending)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                self._lost(conn, exc)
                return
            remaining = []
            for view in conn.sending:
                if sent >= view.nbytes:
                    sent -= view.nbytes
                    continue
                remaining.append(view[sent:])
                sent = 0
            if remaining:
                conn.sending = remaining
                if not conn.write_registered:
                    self._selector.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
                    conn.write_registered = True
                return
            conn.sending = None
            freed |= channel.sent_head()
        if conn.write_registered:
            self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
            conn.write_registered = False
        if freed or channel.is_drained():
            self._on_output()

    def _flush_credits(self, conn: _Connection) -> None:
        if conn.credits_to_return:
            conn.pending_out += encode_credit(conn.credits_to_return)
            conn.credits_to_return = 0
        if not conn.pending_out:
            return
        try:
            sent = conn.sock.send(conn.pending_out)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._lost(conn, exc)
            return
        del conn.pending_out[:sent]
        want_write = bool(conn.pending_out)
        if want_write != conn.write_registered:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0)
            self._selector.modify(conn.sock, events, conn)
            conn.write_registered = want_write

    def _lost(self, conn: _Connection, exc: BaseException | None) -> None:
        if conn.closed:
            return
        conn.closed = True
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        if conn.input is not None:
            if exc is not None:
                log.debug("input channel %s closed: %s", conn.input.channel_id, exc)
            conn.input.frames.append((CONNECTION_CLOSED, b"" if exc is None else str(exc).encode()))
            self._on_input()
        else:
            channel = conn.output
            channel.closed = True
            if not channel.is_drained():
                self._on_error(ConnectionError(
                    f"downstream of channel {channel.channel_id} closed the connection"
                    + (f": {exc}" if exc else "")))
            self._on_output()

    def _close_all(self) -> None:
        for conn in self._connections:
            if not conn.closed:
                conn.closed = True
                conn.sock.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()


class DataServer:
    """Listens for this task's upstream connections and hands identified ones to the loop."""

    def __init__(self, bind_host: str, secret: bytes, task_name: str,
                 expected: dict[ChannelId, InputChannel], loop: NetworkLoop):
        self._expected = expected
        self._loop = loop
        self._claimed: set[ChannelId] = set()
        self._claim_lock = threading.Lock()
        self._acceptor = Acceptor(bind_host, secret, f"task {task_name}", self._identify)
        self.address = self._acceptor.address

    @property
    def refused(self) -> int:
        return self._acceptor.refused

    def start(self) -> None:
        self._acceptor.start()

    def stop(self) -> None:
        self._acceptor.stop()

    def _identify(self, sock: socket.socket, peer) -> None:
        """The first frame must name a channel this task expects and nobody claimed yet."""
        deadline = time.monotonic() + auth.HANDSHAKE_TIMEOUT
        header = auth.recv_exactly(sock, 5, deadline)
        size = int.from_bytes(header[:4], "big")
        if size > 4096:
            raise FrameError(f"a {size} byte HELLO frame is not a channel name")
        kind, payload = next(FrameDecoder().feed(header + auth.recv_exactly(sock, size, deadline)))
        if kind is not FrameKind.HELLO:
            raise FrameError(f"expected HELLO, got {kind.name}")
        channel_id = ChannelId.from_wire(msgpack.unpackb(payload, raw=False))
        with self._claim_lock:
            channel = self._expected.get(channel_id)
            if channel is None or channel_id in self._claimed:
                raise FrameError(f"unexpected or duplicate channel {channel_id}")
            self._claimed.add(channel_id)
        self._loop.add_input(sock, channel)


def connect_output(address: tuple[str, int], secret: bytes, channel_id: ChannelId) -> socket.socket:
    """Connect and authenticate to a downstream task, and name the channel."""
    sock = auth.connect(address, secret)
    try:
        sock.sendall(encode_frame(FrameKind.HELLO, msgpack.packb(channel_id.to_wire(), use_bin_type=True)))
    except BaseException:
        sock.close()
        raise
    return sock
