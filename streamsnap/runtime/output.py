"""Record writers: a subtask's network outputs (Flink's RecordWriter over a ResultPartition).

A writer routes each emitted batch over its edge's channels, accumulates small parts per
channel, and turns them into one Arrow IPC data frame when a channel holds `batch_size` rows or
its oldest row waited `buffer_timeout` seconds. Events (barriers, cancel markers, watermarks and
watermark statuses, end of data / partition) first flush what is pending, so they stay in order
behind the records emitted before them.
"""

from __future__ import annotations

import time

import pyarrow as pa

from streamsnap.graph.execution_graph import OutputGate
from streamsnap.network.channels import OutputChannel
from streamsnap.network.frames import FrameKind, encode_batches
from streamsnap.runtime.batches import Batch, num_rows, to_record_batch
from streamsnap.runtime.events import Event, Watermark, WatermarkStatus, encode_event

CONVERT_FIRST_MIN_ROWS = 64


class RecordWriter:
    def __init__(self, gate: OutputGate, channels: list[OutputChannel],
                 subtask_index: int, batch_size: int, buffer_timeout: float,
                 schema: pa.Schema | None = None):
        self.gate = gate
        self.channels = channels
        self._selector = gate.partitioner.create_selector(len(channels), subtask_index)
        self._batch_size = batch_size
        self._timeout = buffer_timeout
        self._schema = schema
        n = len(channels)
        self._parts: list[list[Batch]] = [[] for _ in range(n)]
        self._rows = [0] * n
        self._since: list[float | None] = [None] * n
        self.records_out = 0
        # Rows routed over several channels become Arrow before they are routed: one conversion,
        # then the partitioner's vectorized split (key groups hashed column-wise, takes) instead
        # of a Python loop over dicts. A few rows (a rate-limited source) and a single channel
        # keep the rows, converted a whole network batch at a time when the channel flushes
        # (measured: converting first costs a single channel a few per cent).
        self._convert_first = n > 1

    # The writer is the last target of an operator's Output, hence `process`.
    def process(self, batch: Batch) -> None:
        if self._convert_first and type(batch) is list and len(batch) >= CONVERT_FIRST_MIN_ROWS:
            batch = to_record_batch(batch, self._schema)
        flush_now = self._timeout <= 0
        for channel, part in self._selector.route(batch):
            n = num_rows(part)
            if not n:
                continue
            self._parts[channel].append(part)
            self._rows[channel] += n
            self.records_out += n
            if self._since[channel] is None:
                self._since[channel] = time.monotonic()
            if flush_now or self._rows[channel] >= self._batch_size:
                self._flush(channel)

    def _flush(self, channel: int) -> None:
        parts = self._parts[channel]
        if not parts:
            return
        batches: list[pa.RecordBatch] = []
        rows: list = []
        for part in parts:
            if isinstance(part, list):
                rows.extend(part)
                continue
            if rows:
                batches.append(to_record_batch(rows, self._schema))
                rows = []
            batches.append(part)
        if rows:
            batches.append(to_record_batch(rows, self._schema))
        # One frame per run of batches sharing a schema (an IPC stream has one schema).
        start = 0
        target = self.channels[channel]
        for i in range(1, len(batches) + 1):
            if i == len(batches) or batches[i].schema != batches[start].schema:
                target.enqueue(FrameKind.DATA, encode_batches(batches[start:i]))
                start = i
        self._parts[channel] = []
        self._rows[channel] = 0
        self._since[channel] = None

    def flush_all(self) -> None:
        for channel in range(len(self.channels)):
            self._flush(channel)

    def flush_due(self, now: float) -> float | None:
        """Flush channels whose oldest row waited long enough; returns the next deadline."""
        next_deadline = None
        for channel, since in enumerate(self._since):
            if since is None:
                continue
            due = since + self._timeout
            if due <= now:
                self._flush(channel)
            elif next_deadline is None or due < next_deadline:
                next_deadline = due
        return next_deadline

    # Watermarks and statuses are chain output like records: the writer sends them in band to
    # every channel, behind the records emitted before them.
    def process_watermark(self, timestamp: int) -> None:
        self.broadcast_event(Watermark(timestamp))

    def process_watermark_status(self, status: WatermarkStatus) -> None:
        self.broadcast_event(status)

    def broadcast_event(self, event: Event) -> None:
        self.flush_all()
        payload = encode_event(event)
        for target in self.channels:
            target.enqueue(FrameKind.EVENT, payload)

    def broadcast_priority_event(self, event: Event) -> list[list[tuple[FrameKind, bytes]]]:
        """Send `event` (an unaligned barrier) ahead of the frames queued on every channel,
        after flushing pending rows into frames; returns, per channel, the frames it overtook —
        the output side of the checkpoint's channel state."""
        self.flush_all()
        payload = encode_event(event)
        return [target.enqueue_priority(payload) for target in self.channels]

    def is_available(self) -> bool:
        for target in self.channels:
            if not target.is_available():
                return False
        return True

    def is_drained(self) -> bool:
        return all(target.is_drained() for target in self.channels)

    @property
    def peak_queued_bytes(self) -> int:
        return max((c.peak_queued_bytes for c in self.channels), default=0)
