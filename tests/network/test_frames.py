import pyarrow as pa
import pytest

from streamsnap.network.frames import (
    FrameDecoder, FrameError, FrameKind, decode_batches, decode_credit, decode_message, encode_batches,
    encode_credit, encode_frame, encode_message,
)
from streamsnap.runtime.events import (
    CancelCheckpointMarker, CheckpointBarrier, CheckpointOptions, CheckpointType, EndOfData, EndOfPartition,
    decode_event, encode_event,
)


def test_record_batches_round_trip_with_nulls_and_empty_batches():
    schema = pa.schema([("k", pa.string()), ("v", pa.int64()), ("f", pa.float64())])
    full = pa.RecordBatch.from_pylist([{"k": "a", "v": 1, "f": 0.5}, {"k": None, "v": None, "f": None}], schema=schema)
    empty = pa.RecordBatch.from_pylist([], schema=schema)
    for parts in ([full], [empty], [full, empty, full]):
        decoded = decode_batches(encode_batches(parts))
        assert len(decoded) == 1, "a frame carries its parts as one batch"
        assert decoded[0].schema == schema
        assert decoded[0].to_pylist() == [row for part in parts for row in part.to_pylist()]
        assert decoded[0].column(1).null_count == sum(part.column(1).null_count for part in parts)


def test_decoder_reassembles_frames_split_at_every_byte():
    payloads = [encode_frame(FrameKind.EVENT, b"x" * n) for n in (0, 1, 7, 300)] + [encode_credit(5)]
    stream = b"".join(payloads)
    decoder = FrameDecoder()
    frames = []
    for i in range(len(stream)):
        frames.extend(decoder.feed(stream[i:i + 1]))
    assert [(k, len(p)) for k, p in frames[:4]] == [(FrameKind.EVENT, n) for n in (0, 1, 7, 300)]
    assert frames[4][0] is FrameKind.CREDIT and decode_credit(frames[4][1]) == 5
    assert decoder.buffered_bytes == 0


def test_decoder_rejects_unknown_kinds_and_huge_lengths():
    with pytest.raises(FrameError, match="unknown frame kind"):
        list(FrameDecoder().feed(b"\x00\x00\x00\x00\x63"))
    with pytest.raises(FrameError, match="byte frame"):
        list(FrameDecoder().feed(b"\xff\xff\xff\xff\x01"))


def test_garbage_is_not_arrow_and_not_a_message():
    with pytest.raises(FrameError, match="Arrow IPC"):
        decode_batches(b"definitely not arrow")
    with pytest.raises(FrameError):
        decode_message(b"\xc1\xc1")
    kind, payload = next(FrameDecoder().feed(encode_message({"type": "ack", "n": 1})))
    assert kind is FrameKind.MESSAGE and decode_message(payload) == {"type": "ack", "n": 1}


@pytest.mark.parametrize("event", [
    CheckpointBarrier(7, 123.5, CheckpointOptions(CheckpointType.TERMINATING_SAVEPOINT, "file:///sp", False)),
    CancelCheckpointMarker(9), EndOfData(), EndOfData(drain=False), EndOfPartition(),
])
def test_events_round_trip(event):
    assert decode_event(encode_event(event)) == event


def test_malformed_event_is_a_clear_error():
    with pytest.raises(ValueError, match="malformed event"):
        decode_event(b"\x93\x00")


def test_large_frames_are_received_in_place_and_small_ones_around_them_survive():
    big = encode_frame(FrameKind.DATA, bytes(range(256)) * 1000)   # 256 000 bytes: received in place
    stream = encode_frame(FrameKind.EVENT, b"e1") + big + encode_credit(7) + big + encode_frame(FrameKind.EVENT, b"e2")
    for chunk in (1, 7, 4096, 70_000, len(stream)):
        decoder = FrameDecoder(chunk_bytes=chunk, direct_bytes=1 << 16)
        frames, pos = [], 0
        while pos < len(stream):
            target = decoder.writable()
            n = min(len(target), len(stream) - pos)
            target[:n] = stream[pos:pos + n]
            pos += n
            frames.extend(decoder.received(n))
        assert [(k, bytes(p)) for k, p in frames] == [
            (FrameKind.EVENT, b"e1"), (FrameKind.DATA, bytes(range(256)) * 1000), (FrameKind.CREDIT, (7).to_bytes(4, "big")),
            (FrameKind.DATA, bytes(range(256)) * 1000), (FrameKind.EVENT, b"e2")], chunk
        assert decoder.buffered_bytes == 0


def test_feed_and_received_can_be_mixed_mid_frame():
    payload = b"x" * 100_000
    stream = encode_frame(FrameKind.DATA, payload) + encode_frame(FrameKind.EVENT, b"after")
    decoder = FrameDecoder(chunk_bytes=1000, direct_bytes=1000)
    frames = list(decoder.feed(stream[:5000]))          # header seen: the body goes in place
    target = decoder.writable()
    target[:3000] = stream[5000:8000]
    frames += decoder.received(3000)
    frames += decoder.feed(stream[8000:])                # the rest of the body and the next frame
    assert [(k, bytes(p)) for k, p in frames] == [(FrameKind.DATA, payload), (FrameKind.EVENT, b"after")]
