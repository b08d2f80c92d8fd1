"""What the operator tests share: a chain target that records what an operator emits."""

from __future__ import annotations

import itertools

import pyarrow as pa


class Sink:
    """Records rows (a RecordBatch as its rows), watermarks as ("watermark", t) and statuses."""

    def __init__(self):
        self.items = []

    def process(self, batch):
        self.items.extend(batch.to_pylist() if isinstance(batch, pa.RecordBatch) else batch)

    def process_watermark(self, timestamp):
        self.items.append(("watermark", timestamp))

    def process_watermark_status(self, status):
        self.items.append(status)

    def rows(self):
        return [r for r in self.items if isinstance(r, dict)]


class RecordingState:
    """Wraps a ValueState: `calls` gets ("get", keys) per get_many and ("put", keys, deletes)
    per put_many, so a test sees how often an operator goes to its state, and for how many keys."""

    def __init__(self, state, calls: list):
        self.state, self.calls = state, calls

    def get_many(self, keys, **hints):
        self.calls.append(("get", len(keys.unique)))
        return self.state.get_many(keys, **hints)

    def put_many(self, keys, values):
        self.calls.append(("put", len(keys.unique), sum(v is None for v in values)))
        return self.state.put_many(keys, values)

    def take_all(self, keys):
        self.calls.append(("take", len(keys.unique)))
        return self.state.take_all(keys)


def older_layout_encode(columns, counts=None):
    """`partial_rows.encode` as streamsnap stored window partials before it: msgpack lists (a
    row per value, or per key a list of its rows, None for none), for restores of such state."""
    rows = list(map(list, zip(*(c.tolist() for c in columns))))
    if counts is None:
        return rows
    cut = [0, *itertools.accumulate(int(c) for c in counts)]
    return [rows[a:b] or None for a, b in zip(cut[:-1], cut[1:])]
