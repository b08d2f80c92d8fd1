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
    decoded = decode_batches(encode_batches([full, empty, full]))
    assert [b.num_rows for b in decoded] == [2, 0, 2]
    assert decoded[0].to_pylist() == full.to_pylist()
    assert decoded[1].schema == schema
    assert decoded[0].column(1).null_count == 1


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
