"""Authentication of connections, and credit-based flow control through a real loopback socket."""

import socket
import threading
import time

import pyarrow as pa
import pytest

from streamsnap.errors import AuthenticationError
from streamsnap.network import auth
from streamsnap.network.channels import ChannelId, InputChannel, OutputChannel
from streamsnap.network.frames import FrameKind, decode_batches, encode_batches
from streamsnap.network.poller import CONNECTION_CLOSED, ConnectionLost, DataServer, TaskNetwork, connect_output

SECRET = b"s" * 32
CHANNEL = ChannelId(0, "up", 0, "down", 0)


def _listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def test_handshake_accepts_the_right_secret_and_refuses_a_wrong_one():
    server = _listener()
    results = {}

    def accept(n):
        for _ in range(n):
            sock, _ = server.accept()
            try:
                auth.accept_handshake(sock, SECRET, timeout=2)
                results.setdefault("ok", 0)
                results["ok"] += 1
            except AuthenticationError as exc:
                results["refused"] = str(exc)
            finally:
                sock.close()
    t = threading.Thread(target=accept, args=(2,))
    t.start()
    auth.connect(server.getsockname(), SECRET).close()
    with pytest.raises((AuthenticationError, ConnectionError)):
        auth.connect(server.getsockname(), b"w" * 32)
    t.join(5)
    assert results["ok"] == 1
    assert "failed authentication" in results["refused"]


def _data_server(credits=2):
    network = TaskNetwork("receiver")
    channel = InputChannel(0, CHANNEL, credits=credits)
    server = DataServer("127.0.0.1", SECRET, "test-task", {CHANNEL: channel}, network)
    server.start()
    return network, server, channel


def _poll_until(condition, *networks, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        for network in networks:
            network.poll(0.01)


def test_data_server_refuses_garbage_and_unauthenticated_peers_and_keeps_serving():
    network, server, channel = _data_server()
    try:
        garbage = socket.create_connection(server.address)
        garbage.sendall(b"GET / HTTP/1.1\r\n\r\n" + b"x" * 100)
        with pytest.raises((AuthenticationError, ConnectionError)):
            connect_output(server.address, b"bad" * 11, CHANNEL)
        _poll_until(lambda: server.refused == 2, network)
        assert not channel.connected.is_set()
        sock = connect_output(server.address, SECRET, CHANNEL)  # the real peer still gets in
        assert channel.connected.wait(5)
        sock.close()
        garbage.close()
    finally:
        server.stop()
        network.close()


def test_unknown_channel_is_refused():
    network, server, channel = _data_server()
    try:
        connect_output(server.address, SECRET, ChannelId(9, "x", 0, "down", 0))
        _poll_until(lambda: server.refused == 1, network)
        assert not channel.connected.is_set()
    finally:
        server.stop()
        network.close()


def _pair(credits=2, queue=2):
    receiver, server, channel = _data_server(credits)
    sender = TaskNetwork("sender")
    output = OutputChannel(0, CHANNEL, max_queued_frames=queue)
    sender.add_output(connect_output(server.address, SECRET, CHANNEL), output)
    assert channel.connected.wait(5)
    _poll_until(lambda: output.credit == credits, receiver, sender)  # the initial grant arrived
    return receiver, server, channel, sender, output


def test_a_receiver_that_does_not_read_stops_the_sender_at_its_credit():
    """Backpressure: with 2 credits and a 2-frame output queue, at most 4 frames are buffered."""
    receiver, server, channel, sender, output = _pair(credits=2, queue=2)
    frame = encode_batches([pa.RecordBatch.from_pylist([{"v": i} for i in range(1000)])])
    try:
        produced = 0
        for _ in range(200):  # a producer that respects availability, both ends polled
            if output.is_available():
                output.enqueue(FrameKind.DATA, frame)
                produced += 1
            sender.poll(0.001)
            receiver.poll(0.001)
        assert produced == 4  # 2 credits in flight + 2 queued, nothing more
        assert len(channel.frames) == 2 and output.queued_data_frames == 2
        assert channel.peak_buffered_bytes <= 2 * frame.size
        # The consumer takes both frames and returns their credit (one grant for half the window).
        for _ in range(2):
            kind, payload = channel.pop()
            assert kind is FrameKind.DATA and decode_batches(payload)[0].num_rows == 1000
            receiver.return_credit(channel)
        _poll_until(lambda: output.queued_data_frames == 0, receiver, sender)
        _poll_until(lambda: len(channel.frames) == 2, receiver, sender)
    finally:
        sender.close()
        server.stop()
        receiver.close()


def test_events_need_no_credit_but_keep_their_order():
    receiver, server, channel, sender, output = _pair(credits=2, queue=10)
    frame = encode_batches([pa.RecordBatch.from_pylist([{"v": 1}])])
    try:
        for _ in range(3):
            output.enqueue(FrameKind.DATA, frame)
        output.enqueue(FrameKind.EVENT, b"\x91\x03")
        _poll_until(lambda: len(channel.frames) == 2, receiver, sender)
        for _ in range(20):
            sender.poll(0.001)
            receiver.poll(0.001)
        # Only 2 data frames had credit; the event waits behind the third data frame.
        assert [k for k, _ in channel.frames] == [FrameKind.DATA, FrameKind.DATA]
        channel.pop()
        receiver.return_credit(channel)
        _poll_until(lambda: len(channel.frames) == 3, receiver, sender)
        assert [k for k, _ in channel.frames] == [FrameKind.DATA, FrameKind.DATA, FrameKind.EVENT]
    finally:
        sender.close()
        server.stop()
        receiver.close()


def test_a_priority_event_overtakes_queued_data_without_credit_and_is_announced_on_arrival():
    """Unaligned barriers: under backpressure the event jumps the sender's queue, reaches the
    receiver at once, and keeps its stream position behind the frames the receiver holds."""
    receiver, server, channel, sender, output = _pair(credits=2, queue=10)
    frames = [encode_batches([pa.RecordBatch.from_pylist([{"v": i}])]) for i in range(5)]
    try:
        for frame in frames:
            output.enqueue(FrameKind.DATA, frame)
        output.enqueue(FrameKind.EVENT, b"\x91\x03")
        _poll_until(lambda: len(channel.frames) == 2, receiver, sender)   # credit for 2 only
        overtaken = output.enqueue_priority(b"\x91\x07")
        assert overtaken == [(FrameKind.DATA, bytes(f)) for f in frames[2:]] + [(FrameKind.EVENT, b"\x91\x03")]
        _poll_until(lambda: len(channel.frames) == 3, receiver, sender)
        assert list(channel.announcements) == [(b"\x91\x07", True)]
        assert [k for k, _ in channel.frames] == [FrameKind.DATA, FrameKind.DATA, FrameKind.EVENT]
        # The overtaken frames still follow, in their order, as credit returns.
        for _ in range(3):
            channel.pop()
            receiver.return_credit(channel)
        _poll_until(lambda: len(channel.frames) == 4, receiver, sender)
        assert [decode_batches(p)[0].column("v")[0].as_py() for _, p in list(channel.frames)[:3]] == [2, 3, 4]
        assert channel.frames[3] == (FrameKind.EVENT, b"\x91\x03")
    finally:
        sender.close()
        server.stop()
        receiver.close()


def test_a_priority_event_never_cuts_into_the_frame_being_sent():
    output = OutputChannel(0, CHANNEL, max_queued_frames=4)
    output.add_credit(1)
    output.enqueue(FrameKind.DATA, b"abc")
    output.enqueue(FrameKind.DATA, b"def")
    assert output.next_sendable() is not None     # the poller starts sending "abc"
    assert output.enqueue_priority(b"P") == [(FrameKind.DATA, b"def")]
    output.sent_head()
    assert bytes(output.next_sendable()[1]) == b"P"
    output.sent_head()
    assert output.queued_data_frames == 1 and output.queued_bytes == 3


def test_a_closed_downstream_with_data_queued_is_an_error_and_a_closed_upstream_a_marker():
    receiver, server, channel, sender, output = _pair(credits=1, queue=5)
    frame = encode_batches([pa.RecordBatch.from_pylist([{"v": 1}])])
    try:
        for _ in range(3):
            output.enqueue(FrameKind.DATA, frame)
        _poll_until(lambda: len(channel.frames) == 1, receiver, sender)
        receiver.close()  # the downstream task dies
        with pytest.raises(ConnectionLost, match="closed the connection"):
            for _ in range(100):
                sender.poll(0.01)
    finally:
        sender.close()
        server.stop()
    receiver, server, channel, sender, output = _pair()
    try:
        sender.close()  # the upstream task dies
        _poll_until(lambda: bool(channel.frames), receiver)
        assert channel.frames[-1][0] is CONNECTION_CLOSED
    finally:
        server.stop()
        receiver.close()


def test_no_wake_up_is_lost_while_the_task_polls():
    """Regression: a wake-up racing the drain of the wake socket was once swallowed for good.

    A thread keeps waking the poller; each `poll` must return promptly. Had the poller lost a
    wake-up, its pending flag would stay set with no byte to read, and every later poll would
    sleep its full timeout.
    """
    network = TaskNetwork("waker")
    stop = threading.Event()

    def waker():
        while not stop.is_set():
            network.wake()
            time.sleep(0)
    thread = threading.Thread(target=waker, daemon=True)
    thread.start()
    try:
        slowest = 0.0
        deadline = time.monotonic() + 3.0
        polls = 0
        while time.monotonic() < deadline:
            started = time.monotonic()
            network.poll(1.0)
            slowest = max(slowest, time.monotonic() - started)
            polls += 1
        assert slowest < 0.5, f"a wake-up was lost: poll slept {slowest:.2f} s (after {polls} polls)"
    finally:
        stop.set()
        thread.join(5)
        network.close()
