"""One kind of Nexmark event alone, as its own Arrow batch: the front of the queries written on
bids or auctions only (`stream.map_batches(bids, output_schema=nexmark.BID_SCHEMA)`).

The generator's flat stream carries all three kinds in one schema with prefixed nullable
columns; a query about bids wants the bid columns, unprefixed, and nothing else."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.connectors import nexmark


def _of_kind(batch: pa.RecordBatch, kind: int, schema: pa.Schema, prefix: str) -> pa.RecordBatch:
    # The kind's columns are picked before the filter, so it copies those and not the other
    # kinds' (their long `extra` strings among them).
    picked = pa.RecordBatch.from_arrays(
        [batch.column("date_time" if f.name == "date_time" else prefix + f.name) for f in schema], schema=schema)
    return picked.filter(pc.equal(batch.column("event_type"), kind))


def bids(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The bids of a flat batch, as nexmark.BID_SCHEMA."""
    return _of_kind(batch, nexmark.BID, nexmark.BID_SCHEMA, "bid_")


def auctions(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The auctions of a flat batch, as nexmark.AUCTION_SCHEMA."""
    return _of_kind(batch, nexmark.AUCTION, nexmark.AUCTION_SCHEMA, "auction_")


def bid_stream(stream, name: str):
    """`stream`'s bids (vectorized), named `name`."""
    return stream.map_batches(bids, name=name, output_schema=nexmark.BID_SCHEMA)


def auction_stream(stream, name: str):
    """`stream`'s auctions (vectorized), named `name`."""
    return stream.map_batches(auctions, name=name, output_schema=nexmark.AUCTION_SCHEMA)
