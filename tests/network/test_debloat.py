"""Buffer debloating, message by message: the frame size a receiver asks for follows the rows
it consumes per busy second, ignores idle time and noise, and stays within its bounds; the ask
travels over a real connection to the sender; a writer cuts frames at it."""

from __future__ import annotations

import pyarrow as pa
import pytest

from streamsnap.network.debloat import BufferDebloater
from streamsnap.network.frames import FrameError, FrameKind, decode_frame_size, encode_frame_size
from streamsnap.runtime.output import _frames
from tests.network.test_auth_and_flow_control import _pair, _poll_until


def _debloater(**kw):
    return BufferDebloater(**{"target": 1.0, "channels": 2, "frames_per_channel": 8, "max_rows": 65536,
                              "smoothing": 1.0, **kw})


def test_frame_size_is_rows_per_busy_second_times_target_over_frames_in_flight():
    d = _debloater()
    assert d.update(0.0, 0, 0.0) is None                 # the first sample only starts the clock
    # 16,000 rows in 0.2 s, never idle: 80,000 rows/s; 1 s of it over 2 x 8 frames = 5,000 rows.
    assert d.update(0.2, 16_000, 0.0) == 5_000
    # Half the next 0.2 s idle: the same 16,000 rows took 0.1 busy seconds, 160,000 rows/s.
    assert d.update(0.4, 32_000, 0.1) == 10_000


def test_idle_samples_and_small_changes_are_not_announced():
    d = _debloater()
    d.update(0.0, 0, 0.0)
    assert d.update(0.2, 16_000, 0.0) == 5_000
    assert d.update(0.4, 16_000, 0.195) is None          # 5 ms busy: says nothing about the rate
    assert d.update(0.6, 32_800, 0.195) is None          # 84,000 rows/s: 5,250 rows, within 25 %
    assert d.announced == 5_000
    assert d.update(0.8, 48_800 + 20_000, 0.195) == 11_250


def test_frames_stay_within_min_and_the_batch_size():
    d = _debloater(max_rows=4096)
    d.update(0.0, 0, 0.0)
    assert d.update(0.2, 10_000_000, 0.0) is None        # would be huge: never above the batch size
    assert d.update(0.4, 10_000_001, 0.0) == 64          # 5 rows/s: the floor
    assert d.due(0.5) is False and d.due(0.7) is True
    with pytest.raises(ValueError, match="debloat target"):
        BufferDebloater(target=0, channels=1, frames_per_channel=8, max_rows=100)


def test_frame_size_frames_round_trip_and_reject_bad_payloads():
    from streamsnap.network.frames import FrameDecoder

    [(kind, payload)] = list(FrameDecoder(64).feed(encode_frame_size(1234)))
    assert kind is FrameKind.FRAME_SIZE and decode_frame_size(payload) == 1234
    with pytest.raises(FrameError, match="4 bytes"):
        decode_frame_size(b"\x00\x01")
    with pytest.raises(FrameError, match="0 rows"):
        decode_frame_size(b"\x00\x00\x00\x00")


def test_a_receivers_frame_size_reaches_its_sender_and_later_senders():
    receiver, server, channel, sender, output = _pair(credits=2, queue=2)
    try:
        assert output.frame_rows is None
        receiver.announce_frame_rows(300)
        _poll_until(lambda: output.frame_rows == 300, receiver, sender)
        receiver.announce_frame_rows(120)
        _poll_until(lambda: output.frame_rows == 120, receiver, sender)
    finally:
        sender.close()
        server.stop()
        receiver.close()


def test_the_writer_cuts_frames_at_the_asked_size_keeping_rows_and_schemas():
    a = pa.RecordBatch.from_pylist([{"v": i} for i in range(250)])
    b = pa.RecordBatch.from_pylist([{"v": i} for i in range(250, 300)])
    c = pa.RecordBatch.from_pylist([{"w": "x"}] * 30)
    frames = _frames([a, b, c], 100)
    assert [sum(x.num_rows for x in f) for f in frames] == [100, 100, 100, 30]
    assert [r["v"] for f in frames[:3] for x in f for r in x.to_pylist()] == list(range(300))
    assert all(len({x.schema for x in f}) == 1 for f in frames)
    # Without an ask: one frame per run of batches sharing a schema, uncut.
    assert [[x.num_rows for x in f] for f in _frames([a, b, c], None)] == [[250, 50], [30]]
