"""Bids counted per bidder: q11 in event-time session windows (10 s gap), with the vectorized
window aggregate (`aggregate_columns`, which merges sessions batch at a time); q12 in
processing-time tumbling windows, a window `.aggregate(...)` with a ProcessWindowFunction adding
the window's bounds, as the windows page teaches."""

from __future__ import annotations

import pyarrow as pa

import streamsnap as ss
from benchmarks.nexmark import kinds

SESSION_GAP_S = 10
Q11_FIELDS = ("bidder", "bid_count", "window_start", "window_end")
Q12_SCHEMA = pa.schema([("bidder", pa.int64()), ("bid_count", pa.int64()), ("start", pa.int64()),
                        ("end", pa.int64())])


class CountRows(ss.AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, row, accumulator):
        return accumulator + 1

    def get_result(self, accumulator):
        return accumulator

    def merge(self, a, b):
        return a + b


class BidderWindow(ss.ProcessWindowFunction):
    """(bidder, bid_count, window start, window end) of a fired window."""

    def process(self, key, context, elements):
        yield {"bidder": key, "bid_count": elements[0], "start": context.window.start, "end": context.window.end}


def q11(stream, gap_s: float = SESSION_GAP_S):
    """User sessions: bids per bidder per session (a session closes `gap_s` after its last bid)."""
    return (kinds.bid_stream(stream, "q11 bids").key_by("bidder")
            .window(ss.windows.EventTimeSessionWindows.with_gap(gap_s))
            .aggregate_columns({"bid_count": "count"}, name="q11 sessions"))


def q12(stream, size_s: float = 10):
    """Processing-time windows: bids per bidder per `size_s` of wall-clock time. Windows still
    open when a bounded input ends do not fire (as in Flink)."""
    return (kinds.bid_stream(stream, "q12 bids").key_by("bidder")
            .window(ss.windows.TumblingProcessingTimeWindows.of(size_s))
            .aggregate(CountRows(), BidderWindow(), name="q12 windows", schema=Q12_SCHEMA))
