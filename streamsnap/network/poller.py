"""A task's data connections, driven by the task's own thread.

Flink gives its network stack threads of its own (Netty). In CPython that costs a GIL
hand-off for every frame: the I/O thread wakes, waits for the interpreter, queues the frame,
wakes the task thread, which waits for the interpreter in turn. So here the task's mailbox
thread drives its sockets itself: after each unit of work it sends what it queued (non-blocking)
and reads what arrived; when idle it sleeps in `select()` on those sockets plus a wake-up socket
that other threads (control messages, the acceptor) poke. No frame ever changes threads.

Credit-based flow control is unchanged: receivers grant credits and return one per consumed
frame (batched up to half the window, to save syscalls); senders send data only with credit.
Events need no credit but keep their place behind queued data.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections import deque

import msgpack

from streamsnap.network import auth
from streamsnap.network.acceptor import Acceptor
from streamsnap.network.channels import ChannelId, InputChannel, OutputChannel
from streamsnap.network.frames import (
    FrameDecoder, FrameError, FrameKind, decode_credit, decode_frame_size, encode_credit, encode_frame,
    encode_frame_size,
)

log = logging.getLogger(__name__)

# Marker frame appended to an input channel when its connection closes; the task decides
# whether that was orderly (after end-of-partition) or a lost upstream.
CONNECTION_CLOSED = None

_RECV_BYTES = 1 << 18  # larger frames are received in place (FrameDecoder.writable)


class _Connection:
    __slots__ = ("sock", "decoder", "input", "output", "sending", "unreturned", "pending_out",
                 "events", "closed")

    def __init__(self, sock: socket.socket, input_channel: InputChannel | None = None,
                 output_channel: OutputChannel | None = None):
        self.sock = sock
        # Inputs receive record batch frames; outputs only credits back.
        self.decoder = FrameDecoder(_RECV_BYTES if input_channel is not None else 4096)
        self.input = input_channel
        self.output = output_channel
        self.sending: list[memoryview] | None = None  # the rest of a partly sent frame
        self.unreturned = 0                           # consumed frames whose credit is not sent yet
        self.pending_out = bytearray()                # credit frames not yet written
        self.events = selectors.EVENT_READ
        self.closed = False


class ConnectionLost(ConnectionError):
    """A downstream task closed its connection while data was still queued for it."""


class TaskNetwork:
    """All data connections of one task, polled by the task thread."""

    def __init__(self, name: str):
        self._name = name
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._wake_pending = False
        self._arrived: deque[_Connection] = deque()  # accepted by other threads, not registered yet
        self._inputs: dict[int, _Connection] = {}
        self._outputs: list[_Connection] = []
        self._connections: list[_Connection] = []
        self._frame_rows: int | None = None           # the last size announced to the senders
        self.error: BaseException | None = None

    # ------------------------------------------------------------------ any thread
    def wake(self) -> None:
        """Interrupt `poll`: something for the task thread arrived (a mail, a connection)."""
        with self._lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        try:
            self._wake_w.send(b"\x00")
        except (BlockingIOError, OSError):
            pass  # a wake-up byte is already waiting to be read

    def add_input(self, sock: socket.socket, channel: InputChannel) -> None:
        """An authenticated, identified upstream connection (called by the acceptor thread)."""
        sock.setblocking(False)
        self._arrived.append(_Connection(sock, input_channel=channel))
        channel.connected.set()
        self.wake()

    # ------------------------------------------------------------------ task thread
    def add_output(self, sock: socket.socket, channel: OutputChannel) -> None:
        sock.setblocking(False)
        conn = _Connection(sock, output_channel=channel)
        self._connections.append(conn)
        self._outputs.append(conn)
        self._selector.register(sock, selectors.EVENT_READ, conn)

    def return_credit(self, channel: InputChannel) -> None:
        """The task consumed one data frame of `channel`: its sender may send another."""
        conn = self._inputs.get(channel.index)
        if conn is None or conn.closed:
            return
        conn.unreturned += 1
        if conn.unreturned * 2 >= channel.credits:
            self._grant(conn, conn.unreturned)
            conn.unreturned = 0

    def announce_frame_rows(self, rows: int) -> None:
        """Ask every upstream sender to cut data frames at `rows` rows (buffer debloating)."""
        self._frame_rows = rows
        frame = encode_frame_size(rows)
        for conn in self._inputs.values():
            if not conn.closed:
                conn.pending_out += frame
                self._write_credits(conn)

    def poll(self, timeout: float | None = 0.0) -> None:
        """Send what can be sent, read what arrived; wait up to `timeout` if nothing did."""
        self._register_arrivals()
        self.flush()
        for key, mask in self._selector.select(timeout):
            conn = key.data
            if conn is None:
                self._drain_wake()
                self._register_arrivals()
                continue
            if conn.closed:
                continue
            if mask & selectors.EVENT_READ:
                self._read(conn)
            if mask & selectors.EVENT_WRITE and not conn.closed:
                if conn.output is not None:
                    self._send(conn)
                else:
                    self._write_credits(conn)
        if self.error is not None:
            raise self.error

    def flush(self) -> None:
        """Send queued frames of every output that has credit (never blocks)."""
        for conn in self._outputs:
            if not conn.closed and (conn.sending is not None or conn.output.has_queued()):
                self._send(conn)

    def shutdown_outputs(self) -> None:
        """All output is queued in the kernel: send FIN after it, but keep reading.

        Closing a socket whose receive buffer holds unread bytes (credits the receiver sent
        back) makes the kernel reset the connection and drop what it had not transmitted yet —
        possibly the end-of-partition. So a finishing task half-closes and waits for each
        receiver to close its end (`outputs_closed`), which it does once it read that event.
        """
        for conn in self._outputs:
            if not conn.closed:
                try:
                    conn.sock.shutdown(socket.SHUT_WR)
                except OSError as exc:
                    self._lost(conn, exc)

    def outputs_closed(self) -> bool:
        return all(conn.closed for conn in self._outputs)

    def close_input(self, channel: InputChannel) -> None:
        """The channel delivered its end of partition: nothing more will come, let the sender go."""
        conn = self._inputs.get(channel.index)
        if conn is None or conn.closed:
            return
        conn.closed = True
        self._selector.unregister(conn.sock)
        conn.sock.close()

    def close(self) -> None:
        for conn in self._connections:
            if not conn.closed:
                conn.closed = True
                conn.sock.close()
        while self._arrived:
            self._arrived.popleft().sock.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    # ------------------------------------------------------------------ internals
    def _register_arrivals(self) -> None:
        while self._arrived:
            conn = self._arrived.popleft()
            self._connections.append(conn)
            self._inputs[conn.input.index] = conn
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)
            if self._frame_rows is not None:   # a sender connecting late hears the current size
                conn.pending_out += encode_frame_size(self._frame_rows)
            self._grant(conn, conn.input.credits)  # the initial window

    def _drain_wake(self) -> None:
        # Drain first, then clear the flag: clearing first would let a concurrent `wake()` set
        # the flag and write a byte this drain swallows, losing every later wake-up.
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            self._wake_pending = False

    def _want_write(self, conn: _Connection, want: bool) -> None:
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
        if events != conn.events:
            self._selector.modify(conn.sock, events, conn)
            conn.events = events

    def _read(self, conn: _Connection) -> None:
        try:
            received = conn.sock.recv_into(conn.decoder.writable())
        except BlockingIOError:
            return
        except OSError as exc:
            self._lost(conn, exc)
            return
        if not received:
            self._lost(conn, None)
            return
        try:
            if conn.input is not None:
                channel = conn.input
                for kind, payload in conn.decoder.received(received):
                    if kind is not FrameKind.DATA and kind is not FrameKind.EVENT \
                            and kind is not FrameKind.PRIORITY_EVENT:
                        raise FrameError(f"unexpected {kind.name} frame on input channel {channel.channel_id}")
                    channel.on_frame(kind, payload)
            else:
                for kind, payload in conn.decoder.received(received):
                    if kind is FrameKind.CREDIT:
                        conn.output.add_credit(decode_credit(payload))
                    elif kind is FrameKind.FRAME_SIZE:
                        conn.output.frame_rows = decode_frame_size(payload)
                    else:
                        raise FrameError(f"unexpected {kind.name} frame on output channel {conn.output.channel_id}")
                self._send(conn)
        except FrameError as exc:
            self._lost(conn, exc)

    def _send(self, conn: _Connection) -> None:
        channel = conn.output
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
                self._want_write(conn, True)
                return
            conn.sending = None
            channel.sent_head()
        self._want_write(conn, False)

    def _grant(self, conn: _Connection, credits: int) -> None:
        conn.pending_out += encode_credit(credits)
        self._write_credits(conn)

    def _write_credits(self, conn: _Connection) -> None:
        if not conn.pending_out:
            self._want_write(conn, False)
            return
        try:
            sent = conn.sock.send(conn.pending_out)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._lost(conn, exc)
            return
        del conn.pending_out[:sent]
        self._want_write(conn, bool(conn.pending_out))

    def _lost(self, conn: _Connection, exc: BaseException | None) -> None:
        if conn.closed:
            return
        conn.closed = True
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass  # never registered, or already removed
        conn.sock.close()
        if conn.input is not None:
            if exc is not None:
                log.debug("input channel %s closed: %s", conn.input.channel_id, exc)
            conn.input.on_frame(CONNECTION_CLOSED, b"" if exc is None else str(exc).encode())
        else:
            conn.output.closed = True
            if conn.sending is not None or not conn.output.is_drained():
                self.error = ConnectionLost(
                    f"downstream of channel {conn.output.channel_id} closed the connection"
                    + (f": {exc}" if exc else ""))


class DataServer:
    """Listens for this task's upstream connections and hands identified ones to the task."""

    def __init__(self, bind_host: str, secret: bytes, task_name: str,
                 expected: dict[ChannelId, InputChannel], network: TaskNetwork,
                 peer_timeout: float | None = None):
        self._expected = expected
        self._network = network
        self._claimed: set[ChannelId] = set()
        self._claim_lock = threading.Lock()
        self._acceptor = Acceptor(bind_host, secret, f"task {task_name}", self._identify, peer_timeout)
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
        self._network.add_input(sock, channel)


def connect_output(address: tuple[str, int], secret: bytes, channel_id: ChannelId,
                   source: str | None = None, peer_timeout: float | None = None) -> socket.socket:
    """Connect and authenticate to a downstream task (from local address `source`, if given;
    silent for `peer_timeout` s: lost), and name the channel."""
    sock = auth.connect(address, secret, source=source, peer_timeout=peer_timeout)
    try:
        sock.sendall(encode_frame(FrameKind.HELLO, msgpack.packb(channel_id.to_wire(), use_bin_type=True)))
    except BaseException:
        sock.close()
        raise
    return sock
