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
from streamsnap.network.loop import DataServer, NetworkLoop, connect_output

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


def _data_server():
    events = []
    loop = NetworkLoop("test", lambda: events.append("in"), lambda: events.append("out"), events.append)
    channel = InputChannel(0, CHANNEL, credits=2)
    server = DataServer("127.0.0.1", SECRET, "test-task", {CHANNEL: channel}, loop)
    loop.start()
    server.start()
    return loop, server, channel, events


def test_data_server_refuses_garbage_and_unauthenticated_peers_and_keeps_serving():
    loop, server, channel, events = _data_server()
    try:
        garbage = socket.create_connection(server.address)
        garbage.sendall(b"GET / HTTP/1.1\r\n\r\n" + b"x" * 100)
        with pytest.raises((AuthenticationError, ConnectionError)):
            connect_output(server.address, b"bad" * 11, CHANNEL)
        deadline = time.monotonic() + 5
        while server.refused < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.refused == 2
        assert not channel.connected.is_set()
        sock = connect_output(server.address, SECRET, CHANNEL)  # the real peer still gets in
        assert channel.connected.wait(5)
        sock.close()
        garbage.close()
    finally:
        server.stop()
        loop.stop()


def test_unknown_channel_is_refused():
    loop, server, channel, _ = _data_server()
    try:
        connect_output(server.address, SECRET, ChannelId(9, "x", 0, "down", 0))
        deadline = time.monotonic() + 5
        while server.refused < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.refused == 1 and not channel.connected.is_set()
    finally:
        server.stop()
        loop.stop()


def test_a_receiver_that_does_not_read_stops_the_sender_at_its_credit():
    """Backpressure: with 2 credits and a 2-frame output queue, at most 4 frames are buffered."""
    in_loop, server, channel, _ = _data_server()
    out_events = []
    out_loop = NetworkLoop("sender", lambda: None, lambda: out_events.append("drained"), out_events.append)
    out_loop.start()
    output = OutputChannel(0, CHANNEL, max_queued_frames=2)
    batch = pa.RecordBatch.from_pylist([{"v": i} for i in range(1000)])
    frame = encode_batches([batch])
    try:
        out_loop.add_output(connect_output(server.address, SECRET, CHANNEL), output)
        assert channel.connected.wait(5)
        produced = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # a producer that respects availability
            if output.is_available():
                output.enqueue(FrameKind.DATA, frame)
                out_loop.output_ready()
                produced += 1
            else:
                time.sleep(0.01)
        assert produced == 4  # 2 credits in flight + 2 queued, nothing more
        assert len(channel.frames) == 2
        assert channel.peak_buffered_bytes <= 2 * frame.size
        # The consumer reads one frame and returns its credit: exactly one more can flow.
        kind, payload = channel.pop()
        assert kind is FrameKind.DATA and decode_batches(payload)[0].num_rows == 1000
        in_loop.return_credit(channel)
        deadline = time.monotonic() + 3
        while output.queued_data_frames > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert output.queued_data_frames == 1 and len(channel.frames) == 2
    finally:
        out_loop.stop()
        server.stop()
        in_loop.stop()


def test_events_need_no_credit_but_keep_their_order():
    in_loop, server, channel, _ = _data_server()
    out_loop = NetworkLoop("sender", lambda: None, lambda: None, lambda e: None)
    out_loop.start()
    output = OutputChannel(0, CHANNEL, max_queued_frames=10)
    frame = encode_batches([pa.RecordBatch.from_pylist([{"v": 1}])])
    try:
        out_loop.add_output(connect_output(server.address, SECRET, CHANNEL), output)
        assert channel.connected.wait(5)
        for _ in range(3):
            output.enqueue(FrameKind.DATA, frame)
        output.enqueue(FrameKind.EVENT, b"\x91\x03")
        out_loop.output_ready()
        deadline = time.monotonic() + 3
        while len(channel.frames) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        # Only 2 data frames had credit; the event waits behind the third data frame.
        assert [k for k, _ in channel.frames] == [FrameKind.DATA, FrameKind.DATA]
        channel.pop()
        in_loop.return_credit(channel)
        deadline = time.monotonic() + 3
        while len(channel.frames) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [k for k, _ in channel.frames] == [FrameKind.DATA, FrameKind.DATA, FrameKind.EVENT]
    finally:
        out_loop.stop()
        server.stop()
        in_loop.stop()


def test_no_wake_up_is_lost_under_a_stream_of_small_frames():
    """Regression: the loop once swallowed a wake-up byte and stopped sending for good.

    Producer and consumer wait on the loops' callbacks like a task's mailbox does, so a lost
    wake-up shows as a stall.
    """
    input_ready, output_ready = threading.Event(), threading.Event()
    in_loop = NetworkLoop("test", input_ready.set, lambda: None, lambda e: None)
    channel = InputChannel(0, CHANNEL, credits=2)
    server = DataServer("127.0.0.1", SECRET, "test-task", {CHANNEL: channel}, in_loop)
    in_loop.start()
    server.start()
    out_loop = NetworkLoop("sender", lambda: None, output_ready.set, lambda e: None)
    out_loop.start()
    output = OutputChannel(0, CHANNEL, max_queued_frames=2)
    frame = encode_batches([pa.RecordBatch.from_pylist([{"v": 1}])])
    total = 5000
    received = 0
    try:
        out_loop.add_output(connect_output(server.address, SECRET, CHANNEL), output)
        assert channel.connected.wait(5)

        def consume():
            nonlocal received
            while received < total:
                input_ready.clear()
                while channel.frames:
                    channel.pop()
                    received += 1
                    in_loop.return_credit(channel)
                if received < total and not channel.frames and not input_ready.wait(2):
                    return  # stalled: nothing arrived for 2 s
        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        sent = 0
        while sent < total:
            output_ready.clear()
            if output.is_available():
                output.enqueue(FrameKind.DATA, frame)
                out_loop.output_ready()
                sent += 1
            elif not output.is_available() and not output_ready.wait(2):
                break  # stalled: no capacity freed for 2 s
        consumer.join(10)
        assert sent == total and received == total, f"stalled: sent {sent}, received {received} of {total}"
    finally:
        out_loop.stop()
        server.stop()
        in_loop.stop()
