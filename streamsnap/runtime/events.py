"""In-band events: what travels between record batches on a data channel.

Flink sends checkpoint barriers, cancel markers and end-of-partition *in* the data stream, in
order with the records, so that "everything before the barrier" is well defined per channel.
Watermarks and watermark statuses (idle/active) travel the same way, so a channel that is not
read (barrier alignment) holds its event-time progress back together with its data. These are
frozen value objects; their wire form (msgpack, never pickle) lives here too so the codec and
the types cannot drift apart.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

import msgpack


class CheckpointType(enum.Enum):
    """What the snapshot is for; savepoints are self-contained and user-owned."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"
    # A savepoint after which the sources stop (stop-with-savepoint).
    TERMINATING_SAVEPOINT = "terminating_savepoint"

    @property
    def is_savepoint(self) -> bool:
        return self is not CheckpointType.CHECKPOINT


@dataclass(frozen=True)
class CheckpointOptions:
    """How one checkpoint is to be taken; travels with its barrier to every task."""

    checkpoint_type: CheckpointType = CheckpointType.CHECKPOINT
    # Directory (fsspec URL) the task writes its files for this checkpoint into.
    target_location: str = ""
    exactly_once: bool = True
    unaligned: bool = False
    # Seconds after which an aligned checkpoint switches to unaligned; None = never.
    aligned_timeout: float | None = None

    def to_wire(self) -> list:
        return [self.checkpoint_type.value, self.target_location, self.exactly_once,
                self.unaligned, self.aligned_timeout]

    @classmethod
    def from_wire(cls, data: list) -> "CheckpointOptions":
        kind, location, exactly_once, unaligned, aligned_timeout = data
        return cls(CheckpointType(kind), location, exactly_once, unaligned, aligned_timeout)


@dataclass(frozen=True)
class CheckpointBarrier:
    checkpoint_id: int
    timestamp: float  # wall-clock seconds when the coordinator triggered it
    options: CheckpointOptions = CheckpointOptions()


@dataclass(frozen=True)
class CancelCheckpointMarker:
    """Tells downstream tasks to stop aligning for (and to decline) a checkpoint."""

    checkpoint_id: int


@dataclass(frozen=True)
class EndOfData:
    """No more records on this channel; barriers may still follow (final checkpoint).

    `drain=False` comes from stop-with-savepoint without draining: downstream operators must
    not flush buffered results (no `end_input`), because the job will resume from the savepoint.
    """

    drain: bool = True


@dataclass(frozen=True)
class EndOfPartition:
    """The channel is closed: nothing follows."""


@dataclass(frozen=True)
class Watermark:
    """Event time reached `timestamp` (epoch ms): no older record follows on this channel."""

    timestamp: int


class WatermarkStatus(enum.Enum):
    """Whether a channel currently drives event time (ACTIVE) or is excluded from it (IDLE).

    Shared by the runtime (in-band events) and `streamsnap.time` (the valve, generators).
    """

    ACTIVE = "active"
    IDLE = "idle"

    @property
    def is_idle(self) -> bool:
        return self is WatermarkStatus.IDLE


Event = Union[CheckpointBarrier, CancelCheckpointMarker, EndOfData, EndOfPartition, Watermark,
              WatermarkStatus]

_BARRIER, _CANCEL, _END_OF_DATA, _END_OF_PARTITION, _WATERMARK, _WATERMARK_STATUS = range(6)


def encode_event(event: Event) -> bytes:
    if isinstance(event, CheckpointBarrier):
        body = [_BARRIER, event.checkpoint_id, event.timestamp, event.options.to_wire()]
    elif isinstance(event, CancelCheckpointMarker):
        body = [_CANCEL, event.checkpoint_id]
    elif isinstance(event, EndOfData):
        body = [_END_OF_DATA, event.drain]
    elif isinstance(event, EndOfPartition):
        body = [_END_OF_PARTITION]
    elif isinstance(event, Watermark):
        body = [_WATERMARK, event.timestamp]
    elif isinstance(event, WatermarkStatus):
        body = [_WATERMARK_STATUS, event.is_idle]
    else:
        raise TypeError(f"not an in-band event: {event!r}")
    return msgpack.packb(body, use_bin_type=True)


def decode_event(payload: bytes) -> Event:
    try:
        body = msgpack.unpackb(payload, raw=False, use_list=True)
        kind = body[0]
        if kind == _BARRIER:
            return CheckpointBarrier(int(body[1]), float(body[2]), CheckpointOptions.from_wire(body[3]))
        if kind == _CANCEL:
            return CancelCheckpointMarker(int(body[1]))
        if kind == _END_OF_DATA:
            return EndOfData(bool(body[1]))
        if kind == _END_OF_PARTITION:
            return EndOfPartition()
        if kind == _WATERMARK:
            return Watermark(int(body[1]))
        if kind == _WATERMARK_STATUS:
            return WatermarkStatus.IDLE if body[1] else WatermarkStatus.ACTIVE
    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as exc:
        raise ValueError(f"malformed event frame: {exc}") from exc
    raise ValueError(f"unknown event kind {kind!r}")
