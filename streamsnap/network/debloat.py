"""Buffer debloating (Flink's FLIP-183): frames sized so in-flight data is about `target` seconds.

Why: credit-based flow control bounds in-flight data in *frames* per channel (the receiver's
credits plus the sender's queue), not in time. Frames of `batch_size` rows that a fast consumer
takes in milliseconds take a slow one seconds — a RocksDB-bound keyed subtask, or any subtask
under backpressure — and an aligned barrier queues behind all of them, so the checkpoint waits
for seconds of data. Here the receiving task measures how many rows it consumes per second of
not being idle (a task waiting for input is not the bottleneck, so idle time does not lower the
rate), smooths it, and asks its senders to cut frames of

    rows per second x target / (input channels x frames in flight per channel)

rows, within [`min_rows`, `max_rows`] (`max_rows` = the configured batch size, so debloating only
ever shrinks frames). A new size is announced only when it differs from the last one by more
than `threshold`, so senders are not told about noise.

Sans-I/O: the task calls `update(now, consumed_rows, idle_seconds)` with its own counters; what
to announce comes back. The task sends it to its senders (`FrameKind.FRAME_SIZE`), and a
sender's record writer cuts frames at the announced size (`runtime/output.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

PERIOD = 0.2            # seconds between two updates (Flink: 200 ms)
SMOOTHING = 0.3         # weight of the newest throughput sample in the moving average
THRESHOLD = 0.25        # announce a size differing from the announced one by more than this share
MIN_ROWS = 64           # frames smaller than this cost more per row than they save in latency
MIN_BUSY = 0.02         # seconds of non-idle time a sample needs to say anything about the rate


@dataclass
class BufferDebloater:
    target: float               # seconds of processing the in-flight data should amount to
    channels: int               # input channels of the task
    frames_per_channel: int     # frames one channel can have in flight: credits + sender's queue
    max_rows: int               # the configured batch size: frames never grow beyond it
    min_rows: int = MIN_ROWS
    period: float = PERIOD
    smoothing: float = SMOOTHING
    threshold: float = THRESHOLD

    def __post_init__(self) -> None:
        if self.target <= 0:
            raise ValueError(f"debloat target must be > 0 seconds, got {self.target!r}")
        self.min_rows = min(self.min_rows, self.max_rows)
        self.rate: float | None = None          # rows per non-idle second, smoothed
        self.announced = self.max_rows          # what the senders cut at now
        self._last: tuple[float, int, float] | None = None   # (time, rows consumed, idle seconds)

    def due(self, now: float) -> bool:
        return self._last is None or now - self._last[0] >= self.period

    def update(self, now: float, consumed_rows: int, idle_seconds: float) -> int | None:
        """Take a sample of the task's counters; the frame size (rows) to announce, or None."""
        last, self._last = self._last, (now, consumed_rows, idle_seconds)
        if last is None:
            return None
        busy = (now - last[0]) - (idle_seconds - last[2])
        if busy < MIN_BUSY:
            return None                          # (nearly) idle: no evidence about the rate
        sample = max(0, consumed_rows - last[1]) / busy
        self.rate = sample if self.rate is None else self.rate + self.smoothing * (sample - self.rate)
        rows = round(self.rate * self.target / max(1, self.channels * self.frames_per_channel))
        rows = max(self.min_rows, min(self.max_rows, rows))
        if abs(rows - self.announced) <= self.threshold * self.announced:
            return None
        self.announced = rows
        return rows


__all__ = ["BufferDebloater"]
