"""What the operator tests share: a chain target that records what an operator emits."""

from __future__ import annotations

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
