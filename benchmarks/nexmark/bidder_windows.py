"""Bids counted per bidder with the vectorized window aggregate (`aggregate_columns`): q11 in
event-time session windows (10 s gap), whose sessions it merges batch at a time; q12 in
processing-time tumbling windows."""

from __future__ import annotations

import pyarrow as pa

import streamsnap as ss
from benchmarks.nexmark import kinds

SESSION_GAP_S = 10
Q11_FIELDS = ("bidder", "bid_count", "window_start", "window_end")
Q12_SCHEMA = pa.schema([("bidder", pa.int64()), ("bid_count", pa.int64()), ("start", pa.int64()),
                        ("end", pa.int64())])


def q11(stream, gap_s: float = SESSION_GAP_S):
    """User sessions: bids per bidder per session (a session closes `gap_s` after its last bid)."""
    return (kinds.bid_stream(stream, "q11 bids").key_by("bidder")
            .window(ss.windows.EventTimeSessionWindows.with_gap(gap_s))
            .aggregate_columns({"bid_count": "count"}, name="q11 sessions"))


def _q12_rows(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([batch.column("bidder"), batch.column("bid_count"), batch.column("window_start"),
                                       batch.column("window_end")], schema=Q12_SCHEMA)


def q12(stream, size_s: float = 10):
    """Processing-time windows: bids per bidder per `size_s` of wall-clock time, the vectorized
    window count (processing-time windows take it as event-time ones do). Windows still open
    when a bounded input ends do not fire (as in Flink)."""
    return (kinds.bid_stream(stream, "q12 bids").key_by("bidder")
            .window(ss.windows.TumblingProcessingTimeWindows.of(size_s))
            .aggregate_columns({"bid_count": "count"}, name="q12 windows")
            .map_batches(_q12_rows, name="q12 rows", output_schema=Q12_SCHEMA))
