"""Channel state of unaligned checkpoints: what the recorder copies, the file, the replay."""

from __future__ import annotations

import pyarrow as pa
import pytest

from streamsnap.checkpoint.handles import FileHandle
from streamsnap.errors import RestoreError
from streamsnap.network.channels import ChannelId, InputChannel, OutputChannel
from streamsnap.network.frames import FrameKind, decode_batches, encode_batches
from streamsnap.runtime.channel_state import (
    ChannelStateSnapshot, InputChannelStateRecorder, read_channel_state, restore_channel_state,
)
from streamsnap.runtime.events import (
    CheckpointBarrier, CheckpointOptions, EndOfPartition, Watermark, encode_event,
)

UNALIGNED = CheckpointOptions(unaligned=True)


def data(v):
    return bytes(memoryview(encode_batches([pa.RecordBatch.from_pylist([{"v": v}])])))


def barrier(cid):
    return encode_event(CheckpointBarrier(cid, 0.0, UNALIGNED))


def channels(n=2):
    return [InputChannel(i, ChannelId(0, "up", i, "down", 0), 4) for i in range(n)]


def test_recorder_copies_what_is_queued_and_what_arrives_up_to_each_channels_barrier():
    ins = channels()
    ins[0].on_frame(FrameKind.DATA, data(1))
    ins[0].on_frame(FrameKind.PRIORITY_EVENT, barrier(3))   # its position, behind data 1
    ins[0].on_frame(FrameKind.DATA, data(2))                 # overtaken upstream: not ours
    ins[1].on_frame(FrameKind.DATA, data(10))
    recorder = InputChannelStateRecorder(ins)
    recording = recorder.prepare(3)
    recorder.start(3, (0, 1))
    assert not recording.done.is_set()
    ins[1].on_frame(FrameKind.EVENT, encode_event(Watermark(5)))
    ins[1].on_frame(FrameKind.DATA, data(11))
    ins[1].on_frame(FrameKind.EVENT, barrier(3))
    ins[1].on_frame(FrameKind.DATA, data(12))                # after the barrier: not ours
    assert recording.done.is_set()
    assert recording.frames[0] == [(FrameKind.DATA, data(1))]
    assert recording.frames[1] == [(FrameKind.DATA, data(10)), (FrameKind.EVENT, encode_event(Watermark(5))),
                                   (FrameKind.DATA, data(11))]
    recorder.check_stopped(3, 0)
    recorder.completed(3)


def test_end_of_partition_ends_a_channels_recording_and_discard_releases_the_writer():
    ins = channels()
    recorder = InputChannelStateRecorder(ins)
    recording = recorder.prepare(1)
    recorder.start(1, (0, 1))
    ins[0].on_frame(FrameKind.EVENT, encode_event(EndOfPartition()))
    assert not recording.done.is_set()
    recorder.discard(1)
    assert recording.done.is_set() and recording.discarded
    assert ins[1].on_arrival is None


def test_a_channel_said_to_be_at_its_barrier_before_it_arrived_is_an_error():
    ins = channels(1)
    recorder = InputChannelStateRecorder(ins)
    recorder.prepare(2)
    recorder.start(2, (0,))
    with pytest.raises(RuntimeError, match="before the recorder saw it arrive"):
        recorder.check_stopped(2, 0)


def _snapshot(tmp_path, ins, outs_frames):
    recorder = InputChannelStateRecorder(ins)
    recording = recorder.prepare(7)
    recorder.start(7, tuple(range(len(ins))))
    for channel in ins:
        channel.on_frame(FrameKind.EVENT, barrier(7))
    out_id = ChannelId(1, "down", 0, "sink", 0)
    snapshot = ChannelStateSnapshot(7, str(tmp_path), "op", [(out_id, outs_frames)], recording,
                                    {c.index: c.channel_id for c in ins})
    return snapshot, out_id


def test_the_file_round_trips_and_restores_in_front_of_the_channels(tmp_path):
    ins = channels()
    ins[0].on_frame(FrameKind.DATA, data(1))
    snapshot, out_id = _snapshot(tmp_path, ins, [(FrameKind.DATA, data(99))])
    handle = snapshot.run()
    assert snapshot.persisted_bytes == len(data(1)) + len(data(99))
    saved_in, saved_out = read_channel_state(handle, str(tmp_path), 7)
    assert saved_in == {ins[0].channel_id: [(FrameKind.DATA, data(1))]}
    assert saved_out == {out_id: [(FrameKind.DATA, data(99))]}

    fresh = channels()
    fresh[0].on_frame(FrameKind.DATA, data(2))       # arrived from the network before the replay
    output = OutputChannel(0, out_id, 4)
    assert restore_channel_state([handle], str(tmp_path), 7, "op (1/1)", fresh, [output]) > 0
    assert [fresh[0].pop()[1] for _ in range(2)] == [data(1), data(2)]
    assert output.queued_data_frames == 1


def test_a_corrupt_or_foreign_channel_state_file_is_a_restore_error_naming_it(tmp_path):
    ins = channels()
    ins[0].on_frame(FrameKind.DATA, data(1))
    snapshot, _ = _snapshot(tmp_path, ins, [])
    handle = snapshot.run()
    path = tmp_path / handle.path
    raw = bytearray(path.read_bytes())
    raw[-20] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(RestoreError, match=f"{handle.path} of checkpoint 7 is corrupt"):
        read_channel_state(handle, str(tmp_path), 7)
    with pytest.raises(RestoreError, match="is missing"):
        read_channel_state(FileHandle("nope", 3), str(tmp_path), 7)


def test_in_flight_data_of_a_channel_the_job_does_not_have_is_refused(tmp_path):
    ins = channels()
    ins[0].on_frame(FrameKind.DATA, data(1))
    snapshot, _ = _snapshot(tmp_path, ins, [])
    handle = snapshot.run()
    other = [InputChannel(0, ChannelId(5, "else", 0, "down", 0), 4)]
    with pytest.raises(RestoreError, match="which this job does not have.*savepoint"):
        restore_channel_state([handle], str(tmp_path), 7, "op (1/1)", other, [])


class _Network:
    def __init__(self):
        self.credits = 0

    def return_credit(self, channel):
        self.credits += 1

    def close_input(self, channel):
        pass


class _Task:
    def __init__(self):
        self.recordings = {}

    def trigger_checkpoint_on_barrier(self, barrier, metrics, recording=None):
        assert metrics.unaligned
        self.recordings[barrier.checkpoint_id] = recording

    def abort_checkpoint_on_barrier(self, checkpoint_id, reason):
        raise AssertionError(f"unexpected abort of {checkpoint_id}: {reason}")


def test_a_snapshot_between_slices_of_a_frame_records_the_rest_first_and_restored_frames_take_no_credit():
    from streamsnap.clock import ManualScheduler
    from streamsnap.runtime.input import CheckpointedInput

    ins = channels()
    network, task = _Network(), _Task()
    gate = CheckpointedInput(ins, network, task, True, ManualScheduler(), "down (1/1)", unaligned=True)
    gate._slice_rows = 4                       # as if the chain were slow: slices of 4 rows
    big = bytes(memoryview(encode_batches([pa.RecordBatch.from_pydict({"v": list(range(10))})])))
    ins[0].on_frame(FrameKind.DATA, big)
    first = gate.poll_next()
    assert first.column("v").to_pylist() == [0, 1, 2, 3]
    ins[1].on_frame(FrameKind.PRIORITY_EVENT, barrier(9))   # arrives while rows 4..9 wait
    gate.poll_priority()
    recording = task.recordings[9]
    assert recording is not None and not recording.done.is_set()
    leftover = recording.frames[0][0]
    assert leftover[0] is FrameKind.DATA
    assert [r["v"] for b in decode_batches(leftover[1]) for r in b.to_pylist()] == [4, 5, 6, 7, 8, 9]
    # The task itself still processes them, after the snapshot.
    rest = []
    while (item := gate.poll_next()) is not None:
        rest += item.column("v").to_pylist() if isinstance(item, pa.RecordBatch) else []
    assert rest[:6] == [4, 5, 6, 7, 8, 9]
    # A restored frame is consumed without returning credit; a received one returns it.
    fresh = channels(1)
    gate2 = CheckpointedInput(fresh, network, _Task(), True, ManualScheduler(), "d (1/1)", unaligned=True)
    fresh[0].prepend_recovered([(FrameKind.DATA, data(1))])
    fresh[0].on_frame(FrameKind.DATA, data(2))
    before = network.credits
    assert gate2.poll_next().column("v").to_pylist() == [1, 2]   # merged, restored one first
    assert network.credits == before + 1


def test_overtaken_protocol_events_are_not_replayed(tmp_path):
    from streamsnap.runtime.events import CancelCheckpointMarker, EndOfData

    ins = channels()
    out = [(FrameKind.DATA, data(5)), (FrameKind.EVENT, barrier(6)), (FrameKind.EVENT, encode_event(Watermark(9))),
           (FrameKind.EVENT, encode_event(CancelCheckpointMarker(4))), (FrameKind.EVENT, encode_event(EndOfData()))]
    snapshot, out_id = _snapshot(tmp_path, ins, out)
    _, saved_out = read_channel_state(snapshot.run(), str(tmp_path), 7)
    assert saved_out == {out_id: [(FrameKind.DATA, data(5)), (FrameKind.EVENT, encode_event(Watermark(9)))]}
