"""The stateless Nexmark queries beyond q0-q2 — q10 (log to files), q14 (calculation), q21 (add
channel id), q22 (URL directories) — each one `map_batches` on the bids: Arrow compute and
numpy over the batch, no Python per row (the docs' advice for selections and projections)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import streamsnap as ss
from benchmarks.nexmark import kinds

DOLLAR_TO_EURO = 0.908


DAY_MS, MINUTE_MS = 86_400_000, 60_000


def utc_text(times: pa.Array, fmt: str, unit_ms: int) -> pa.Array:
    """Epoch-ms `times` formatted in UTC with `fmt`, whose finest field is `unit_ms` long (a day
    for "%Y-%m-%d", a minute for "%H:%M"): each distinct unit is formatted once and taken per
    row — a batch spans a few minutes, and strftime per row was half of q10's cost."""
    units, inverse = np.unique(times.to_numpy(zero_copy_only=False) // unit_ms, return_inverse=True)
    text = pc.strftime(pa.array(units * unit_ms, pa.timestamp("ms")), format=fmt)
    return text.take(pa.array(inverse.reshape(-1)))


Q10_SCHEMA = pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                        ("date_time", pa.int64()), ("extra", pa.string()), ("dt", pa.string()),
                        ("hm", pa.string())])


def _logged(batch: pa.RecordBatch) -> pa.RecordBatch:
    b = kinds.bids(batch)
    times = b.column("date_time")
    return pa.RecordBatch.from_arrays([b.column("auction"), b.column("bidder"), b.column("price"), times,
                                       b.column("extra"), utc_text(times, "%Y-%m-%d", DAY_MS),
                                       utc_text(times, "%H:%M", MINUTE_MS)], schema=Q10_SCHEMA)


def q10(stream):
    """Log to file system: every bid with its UTC day (dt) and minute (hm), the columns Flink's
    q10 partitions its files by; `q10_sink` is where they go."""
    return stream.map_batches(_logged, name="q10", output_schema=Q10_SCHEMA)


def q10_sink(directory: str) -> ss.sinks.FileSink:
    """q10's output: Parquet part files with two-phase commit in Hive-style `dt=.../hm=...`
    directories (Flink's bucket assigner); dt and hm live in the paths, not the files."""
    return ss.sinks.FileSink(directory, format="parquet", mode="overwrite", partition_by=["dt", "hm"])


Q14_SCHEMA = pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.float64()),
                        ("bid_time_type", pa.string()), ("date_time", pa.int64()), ("extra", pa.string()),
                        ("c_counts", pa.int64())])
HOUR_MS = 3_600_000


def _calculated(batch: pa.RecordBatch) -> pa.RecordBatch:
    b = kinds.bids(batch)
    euros = b.column("price").to_numpy(zero_copy_only=False) * DOLLAR_TO_EURO
    keep = (euros > 1_000_000) & (euros < 50_000_000)
    b, euros = b.filter(pa.array(keep)), euros[keep]
    hour = b.column("date_time").to_numpy(zero_copy_only=False) // HOUR_MS % 24
    kind = np.select([(hour >= 8) & (hour <= 18), (hour <= 6) | (hour >= 20)], ["dayTime", "nightTime"],
                     "otherTime")
    return pa.RecordBatch.from_arrays(
        [b.column("auction"), b.column("bidder"), pa.array(euros), pa.array(kind, pa.string()),
         b.column("date_time"), b.column("extra"), pc.cast(pc.count_substring(b.column("extra"), "c"), pa.int64())],
        schema=Q14_SCHEMA)


def q14(stream):
    """Calculation: bids priced 1 M-50 M in euros, with the time-of-day type and the count of
    'c' in `extra`."""
    return stream.map_batches(_calculated, name="q14", output_schema=Q14_SCHEMA)


Q21_SCHEMA = pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                        ("channel", pa.string()), ("channel_id", pa.string())])
HOT_CHANNELS = pa.array(["apple", "google", "facebook", "baidu"])    # ids "0".."3"


def _with_channel_id(batch: pa.RecordBatch) -> pa.RecordBatch:
    b = kinds.bids(batch)
    hot = pc.cast(pc.index_in(pc.utf8_lower(b.column("channel")), value_set=HOT_CHANNELS), pa.string())
    from_url = pc.struct_field(pc.extract_regex(b.column("url"), pattern=r"(?:&|^)channel_id=(?P<id>[^&]*)"), [0])
    channel_id = pc.coalesce(hot, from_url)
    keep = pc.is_valid(channel_id)
    return pa.RecordBatch.from_arrays(
        [b.column("auction").filter(keep), b.column("bidder").filter(keep), b.column("price").filter(keep),
         b.column("channel").filter(keep), channel_id.filter(keep)], schema=Q21_SCHEMA)


def q21(stream):
    """Add channel id: the hot channels' fixed ids, else the url's channel_id parameter; bids
    with neither are dropped."""
    return stream.map_batches(_with_channel_id, name="q21", output_schema=Q21_SCHEMA)


Q22_SCHEMA = pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                        ("channel", pa.string()), ("dir1", pa.string()), ("dir2", pa.string()),
                        ("dir3", pa.string())])


def _directories(batch: pa.RecordBatch) -> pa.RecordBatch:
    b = kinds.bids(batch)
    parts = pc.split_pattern(b.column("url"), "/")
    return pa.RecordBatch.from_arrays(
        [b.column("auction"), b.column("bidder"), b.column("price"), b.column("channel"),
         *(pc.list_element(parts, i) for i in (3, 4, 5))], schema=Q22_SCHEMA)


def q22(stream):
    """Get URL directories: the url's path parts 3-5 (split at '/')."""
    return stream.map_batches(_directories, name="q22", output_schema=Q22_SCHEMA)
