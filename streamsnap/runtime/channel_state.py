"""Channel state: the in-flight data an unaligned checkpoint persists, and its replay.

An unaligned checkpoint snapshots a task before the data ahead of its barriers was processed
(`runtime/unaligned_barriers.py`). That data is saved beside the operator state:

* output side — the frames queued on each output channel that the priority barrier overtook
  (`RecordWriter.broadcast_priority_event` hands them over). A checkpoint that starts aligned
  with an `aligned_timeout` has a snapshot taken aligned, but its barrier may still be turned
  into a priority barrier on an output channel whose queue held it past the timeout; what it
  overtook there is known only then (`TimeoutableBarrier`), so the asynchronous part waits for
  each such barrier to leave its queue, either way;
* input side — on each input channel the handler names, the frames the task had not consumed
  when it took the snapshot, up to that channel's barrier. `InputChannelStateRecorder` copies
  them *as they arrive* (what is queued at the snapshot, then every later arrival until the
  barrier of that checkpoint, a newer one, or the end of the partition arrives), so the state is
  complete once the last barrier arrived, however slowly the task works through its queue.
  Consumption reaches the same frames in the same order, which is what the handler's
  channel-state calls describe; the recorder checks that the two agree.

Only data frames and watermark events are channel state; barriers, cancel markers and ends of
data belong to the checkpoint protocol of the run that wrote them and are never replayed.

After a restore, a task puts the saved input frames in front of each input channel (consumed
without returning credit: the sender never sent them) and queues the saved output frames on its
output channels before producing anything, so the data reaches the operators in the order it
would have without the failure. The file holds raw frames (Arrow IPC, msgpack events) in a
msgpack envelope with an xxh64 checksum; nothing is unpickled.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import msgpack
import xxhash

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.handles import FileHandle
from streamsnap.errors import RestoreError
from streamsnap.network.channels import ChannelId, InputChannel, OutputChannel, TimeoutableBarrier
from streamsnap.network.frames import FrameKind
from streamsnap.runtime.events import (
    CheckpointBarrier, EndOfPartition, Watermark, WatermarkStatus, decode_event,
)
from streamsnap.state.snapshot import StateSnapshot, safe_file_prefix

__all__ = ["ChannelStateSnapshot", "InputChannelStateRecorder", "overtake_outputs", "queue_timeoutable_barrier",
           "read_channel_state", "restore_channel_state"]

MAGIC = b"SSCHANNEL1\n"
_CHECK = 8
Frame = tuple[FrameKind, bytes]


def is_channel_state(kind: FrameKind, payload) -> bool:
    """Data and watermark frames are replayed; protocol events are not."""
    if kind is FrameKind.DATA:
        return True
    return isinstance(decode_event(payload), (Watermark, WatermarkStatus))


@dataclass
class _Recording:
    checkpoint_id: int
    open_channels: set[int]
    frames: dict[int, list[Frame]] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    discarded: bool = False


class InputChannelStateRecorder:
    """Copies the in-flight input frames of the one unaligned checkpoint being recorded.

    Lives on the task thread (channels are filled by the task's own poller); the asynchronous
    snapshot thread only waits on a recording's `done` and then reads its frames.
    """

    def __init__(self, channels: list[InputChannel]):
        self._channels = channels
        self._current: _Recording | None = None
        self._recordings: dict[int, _Recording] = {}

    def prepare(self, checkpoint_id: int, leftovers: dict[int, list[Frame]] | None = None) -> _Recording:
        """The snapshot of `checkpoint_id` is being taken unaligned: its recording, holding
        only `leftovers` (data read off a channel but not processed yet) until `start` names
        the channels (or `completed` says there are none)."""
        recording = _Recording(checkpoint_id, set(), {i: list(f) for i, f in (leftovers or {}).items()})
        self._recordings[checkpoint_id] = recording
        self._current = recording
        return recording

    def start(self, checkpoint_id: int, channels: tuple[int, ...]) -> None:
        recording = self._recordings[checkpoint_id]
        for index in channels:
            recording.frames.setdefault(index, [])
        recording.open_channels.update(channels)   # all of them before any can close
        for index in channels:
            channel = self._channels[index]
            for kind, payload in channel.frames:
                if self._passes(recording, index, kind, payload):
                    break
            else:
                channel.on_arrival = self._on_arrival
        if not recording.open_channels:
            recording.done.set()

    def _passes(self, recording: _Recording, index: int, kind: FrameKind, payload) -> bool:
        """Take one frame of channel `index` in arrival order; True once its barrier came."""
        if kind is FrameKind.EVENT:
            event = decode_event(payload)
            if isinstance(event, CheckpointBarrier) and event.checkpoint_id >= recording.checkpoint_id \
                    or isinstance(event, EndOfPartition):
                self._close(recording, index)
                return True
            if not isinstance(event, (Watermark, WatermarkStatus)):
                return False
        elif kind is not FrameKind.DATA:
            return False   # a lost connection: the task fails and nothing is persisted
        recording.frames[index].append((kind, bytes(payload)))
        return False

    def _on_arrival(self, channel: InputChannel, kind: FrameKind, payload) -> None:
        recording = self._current
        if recording is None or channel.index not in recording.open_channels:
            channel.on_arrival = None
            return
        self._passes(recording, channel.index, kind, payload)

    def _close(self, recording: _Recording, index: int) -> None:
        recording.open_channels.discard(index)
        self._channels[index].on_arrival = None
        if not recording.open_channels:
            recording.done.set()

    def check_stopped(self, checkpoint_id: int, channel: int) -> None:
        """The handler saw `channel` reach its barrier: its arrival must have been seen."""
        recording = self._recordings.get(checkpoint_id)
        if recording is not None and channel in recording.open_channels:
            raise RuntimeError(f"channel {channel} reached the barrier of checkpoint {checkpoint_id} "
                               f"before the recorder saw it arrive")

    def discard(self, checkpoint_id: int) -> None:
        recording = self._recordings.pop(checkpoint_id, None)
        if recording is None:
            return
        recording.discarded = True
        for index in list(recording.open_channels):
            self._channels[index].on_arrival = None
        recording.open_channels.clear()
        recording.done.set()
        if self._current is recording:
            self._current = None

    def completed(self, checkpoint_id: int) -> None:
        """The handler saw every channel reach its barrier; the frames belong to the snapshot
        thread now."""
        recording = self._recordings.pop(checkpoint_id, None)
        if recording is None:
            return
        if self._current is recording:
            self._current = None
        if recording.open_channels:
            raise RuntimeError(f"checkpoint {checkpoint_id}: channels {sorted(recording.open_channels)} "
                               f"reached their barrier before the recorder saw it arrive")
        recording.done.set()


class ChannelStateSnapshot(StateSnapshot[FileHandle]):
    """The asynchronous part: wait until every recorded channel saw its barrier, then write
    the output frames (captured at the snapshot) and the input frames into one file."""

    def __init__(self, checkpoint_id: int, location: str, task_uid: str,
                 outputs: list[tuple[ChannelId, list[Frame] | TimeoutableBarrier]],
                 recording: _Recording | None, input_ids: dict[int, ChannelId]):
        super().__init__(checkpoint_id, location, f"channel state of '{task_uid}'")
        self.task_uid = task_uid
        self._outputs = outputs
        self._recording = recording
        self._input_ids = input_ids   # input channel index -> its id on the wire
        self.persisted_bytes = 0
        # Whether the checkpoint went unaligned at this task: at once, unless it depends on
        # timeout-able barriers, when it is known once `run` returned.
        self.unaligned = not any(isinstance(o, TimeoutableBarrier) for _, o in outputs)

    def _release(self) -> None:
        self._outputs = []
        self._recording = None

    def _wait(self, done: threading.Event) -> None:
        while not done.wait(0.05):
            self._check_not_discarded()
        self._check_not_discarded()

    def _write(self) -> FileHandle | None:
        output_frames = []
        for cid, frames in self._outputs:
            if isinstance(frames, TimeoutableBarrier):
                self._wait(frames.done)
                self.unaligned = self.unaligned or frames.converted
                frames = frames.overtaken
            output_frames.append((cid, frames))
        recording = self._recording
        if recording is not None:
            self._wait(recording.done)
            if recording.discarded:
                self._discard_requested = True
                self._check_not_discarded()
            inputs = [(self._input_ids[i], frames) for i, frames in sorted(recording.frames.items()) if frames]
        else:
            inputs = []
        # The overtaken output may hold protocol events too (an older barrier, end of data);
        # only data and watermarks are replayed.
        outputs = [(cid, kept) for cid, frames in output_frames
                   if (kept := [(k, p) for k, p in frames if is_channel_state(k, p)])]
        if not inputs and not outputs:
            return None
        body = msgpack.packb({
            "in": [[cid.to_wire(), [[int(k), p] for k, p in frames]] for cid, frames in inputs],
            "out": [[cid.to_wire(), [[int(k), p] for k, p in frames]] for cid, frames in outputs],
        }, use_bin_type=True)
        self.persisted_bytes = sum(len(p) for _, frames in inputs + outputs for _, p in frames)
        name = filesystem.unique_name(f"{safe_file_prefix(self.task_uid)}-channels")
        self._url = filesystem.join(self.location, name)
        data = MAGIC + body + xxhash.xxh64_digest(body)
        with filesystem.open_write(self._url) as out:
            out.write(data)
        return FileHandle(name, len(data))


def overtake_outputs(checkpoint_id: int, location: str, task_uid: str, writers, barrier: CheckpointBarrier,
                     inputs: list[InputChannel], recording: _Recording | None) -> ChannelStateSnapshot:
    """Send `barrier` ahead of every writer's queued output and capture what it overtook:
    the synchronous part of an unaligned snapshot's channel state (`recording`: the input side,
    None for a source)."""
    outputs = [(channel.channel_id, frames) for writer in writers
               for channel, frames in zip(writer.channels, writer.broadcast_priority_event(barrier))]
    return ChannelStateSnapshot(checkpoint_id, location, task_uid, outputs, recording,
                                {c.index: c.channel_id for c in inputs})


def queue_timeoutable_barrier(checkpoint_id: int, location: str, task_uid: str, writers,
                              barrier: CheckpointBarrier, deadline: float) -> ChannelStateSnapshot:
    """Send `barrier` aligned on every writer, to be put ahead of the output still queued
    before it at `deadline` (monotonic); the snapshot's channel state is what it overtook."""
    outputs = [(channel.channel_id, pending) for writer in writers
               for channel, pending in zip(writer.channels, writer.broadcast_timeoutable_barrier(barrier, deadline))]
    return ChannelStateSnapshot(checkpoint_id, location, task_uid, outputs, None, {})


def read_channel_state(handle: FileHandle, base_location: str, checkpoint_id: int | None
                       ) -> tuple[dict[ChannelId, list[Frame]], dict[ChannelId, list[Frame]]]:
    """(input frames, output frames) per channel; a damaged file is a RestoreError naming it."""
    url = filesystem.join(base_location, handle.path)
    where = f"channel state file {filesystem.user_path(url)} of checkpoint {checkpoint_id}"
    data = filesystem.read_checked_file(url, None, where)
    body = data[len(MAGIC):-_CHECK]
    if (not data.startswith(MAGIC) or len(data) != handle.size
            or xxhash.xxh64_digest(body) != data[-_CHECK:]):
        raise RestoreError(f"{where} is corrupt (size or checksum mismatch); restore an older "
                           f"checkpoint or a savepoint")
    content = msgpack.unpackb(body, raw=False)

    def frames(side: str) -> dict[ChannelId, list[Frame]]:
        return {ChannelId.from_wire(cid): [(FrameKind(k), p) for k, p in items]
                for cid, items in content[side]}
    return frames("in"), frames("out")


def restore_channel_state(handles, base_location: str, checkpoint_id: int | None, task_name: str,
                          inputs: list[InputChannel], outputs: list[OutputChannel]) -> int:
    """Put the saved frames in front of the task's channels; returns the bytes restored."""
    by_input = {c.channel_id: c for c in inputs}
    by_output = {c.channel_id: c for c in outputs}
    restored = 0
    for handle in handles:
        saved_in, saved_out = read_channel_state(handle, base_location, checkpoint_id)
        for side, saved, channels in (("input", saved_in, by_input), ("output", saved_out, by_output)):
            for cid, frames in saved.items():
                channel = channels.get(cid)
                if channel is None:
                    raise RestoreError(
                        f"{task_name}: checkpoint {checkpoint_id} holds in-flight data of {side} "
                        f"channel {cid}, which this job does not have (the job graph changed); "
                        f"restore from a savepoint, which holds no in-flight data")
                if side == "input":
                    channel.prepend_recovered(frames)
                else:
                    for kind, payload in frames:
                        channel.enqueue(kind, payload)
                restored += sum(len(p) for _, p in frames)
    return restored
