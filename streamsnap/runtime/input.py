"""The checkpointed input of a task (Flink's CheckpointedInputGate).

Reads the next item from the task's input channels, round robin over the channels that have
frames and are not blocked. Data frames are decoded into Arrow batches for the operators (and
their credit returned to the sender); events go to the barrier handler, which decides when the
task snapshots. A channel the aligner blocks is simply not read any more, so its sender runs
out of credit and stops: alignment needs no buffering here.

Watermarks, watermark statuses and ends of partition go to `InputWatermarks` (sans-I/O, in
`streamsnap/time/`): a valve per logical input, combined over the inputs of a two-input
operator. `poll_next` hands out what it decides — a new `Watermark` or a `WatermarkStatus` —
in order with the batches, only when it changes. A
blocked channel's watermarks wait behind its data, like everything else on it.
"""

from __future__ import annotations

import logging
from collections import deque

import pyarrow as pa

from streamsnap.checkpoint.reasons import CheckpointFailureReason
from streamsnap.network.channels import InputChannel
from streamsnap.network.frames import FrameKind, decode_batches
from streamsnap.network.poller import CONNECTION_CLOSED, TaskNetwork
from streamsnap.runtime.barriers import AlignmentMetrics, create_barrier_handler
from streamsnap.runtime.events import (
    CancelCheckpointMarker, CheckpointBarrier, EndOfData, EndOfPartition, Watermark, WatermarkStatus,
    decode_event,
)
from streamsnap.time.input_watermarks import InputWatermarks

log = logging.getLogger(__name__)


class UpstreamLostError(ConnectionError):
    """An input connection closed before its end-of-partition: the upstream task is gone."""


class CheckpointedInput:
    """`input_of[i]`: the logical input of channel i (default: all channels are input 0)."""

    def __init__(self, channels: list[InputChannel], network: TaskNetwork, task, exactly_once: bool, clock,
                 task_name: str, input_of: list[int] | None = None):
        self.channels = channels
        self._network = network
        self._task = task
        self._blocked = [False] * len(channels)
        self._end_of_data = [False] * len(channels)
        self._end_of_partition = [False] * len(channels)
        self.drain = True  # False once any channel ended without draining
        # Decoded batches and valve decisions (Watermark / WatermarkStatus), in arrival order.
        self._decoded: deque[pa.RecordBatch | Watermark | WatermarkStatus] = deque()
        input_of = input_of or [0] * len(channels)
        if len(input_of) != len(channels):
            raise ValueError(f"input_of has {len(input_of)} entries for {len(channels)} channels")
        self._time = InputWatermarks(input_of)
        self._input_of = input_of
        self._next = 0
        # The logical input of the batches poll_next hands out: all batches queued in
        # `_decoded` come from the one data frame read last, so one value covers them.
        self.last_input = 0
        self.handler = create_barrier_handler(exactly_once, len(channels), self, clock, task_name)
        self.bytes_consumed = 0

    # -------------------------------------------------------- BarrierHandlerActions
    def block_channel(self, channel: int) -> None:
        self._blocked[channel] = True

    def resume_channel(self, channel: int) -> None:
        self._blocked[channel] = False

    def trigger_checkpoint(self, barrier: CheckpointBarrier, metrics: AlignmentMetrics) -> None:
        self._task.trigger_checkpoint_on_barrier(barrier, metrics)

    def abort_checkpoint(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        self._task.abort_checkpoint_on_barrier(checkpoint_id, reason)

    # -------------------------------------------------------- reading
    @property
    def all_end_of_data(self) -> bool:
        return all(self._end_of_data)

    @property
    def all_end_of_partition(self) -> bool:
        return all(self._end_of_partition)

    def is_blocked(self, channel: int) -> bool:
        return self._blocked[channel]

    def poll_next(self) -> pa.RecordBatch | Watermark | WatermarkStatus | None:
        """The next batch of records or change of the input's watermark / status, or None
        when no unblocked channel has anything now."""
        if self._decoded:
            return self._decoded.popleft()
        channels = self.channels
        n = len(channels)
        scanned = 0
        while scanned < n:
            i = self._next
            channel = channels[i]
            if not channel.frames or self._blocked[i]:
                self._next = (i + 1) % n
                scanned += 1
                continue
            kind, payload = channel.pop()
            if kind is FrameKind.DATA:
                self._next = (i + 1) % n
                self.handler.add_processed_bytes(len(payload))
                self.bytes_consumed += len(payload)
                self._network.return_credit(channel)
                self.last_input = self._input_of[i]
                batches = decode_batches(payload)
                if not batches:
                    continue
                self._decoded.extend(batches[1:])
                return batches[0]
            if kind is FrameKind.EVENT:
                self._on_event(i, decode_event(payload))
                if self._decoded:   # the valve advanced the input's watermark or status
                    return self._decoded.popleft()
                scanned = 0  # the event may have blocked or released channels
                continue
            if kind is CONNECTION_CLOSED:
                if not self._end_of_partition[i]:
                    detail = payload.decode(errors="replace")
                    raise UpstreamLostError(
                        f"lost the connection from upstream subtask {channel.channel_id.source_vertex}"
                        f"#{channel.channel_id.source_index}" + (f" ({detail})" if detail else ""))
                continue
            raise ValueError(f"unexpected frame {kind!r} on input channel {channel.channel_id}")
        return None

    def _on_event(self, channel: int, event) -> None:
        if isinstance(event, CheckpointBarrier):
            self.handler.process_barrier(event, channel)
        elif isinstance(event, CancelCheckpointMarker):
            self.handler.process_cancellation_barrier(event, channel)
        elif isinstance(event, EndOfData):
            self._end_of_data[channel] = True
            self.drain = self.drain and event.drain
        elif isinstance(event, EndOfPartition):
            self._end_of_data[channel] = True
            self._end_of_partition[channel] = True
            self._network.close_input(self.channels[channel])
            self.handler.process_end_of_partition(channel)
            self._decoded.extend(self._time.on_end_of_partition(channel))
        elif isinstance(event, Watermark):
            self._decoded.extend(self._time.on_watermark(channel, event.timestamp))
        elif isinstance(event, WatermarkStatus):
            self._decoded.extend(self._time.on_status(channel, event))
        else:
            raise ValueError(f"unknown event {event!r}")
