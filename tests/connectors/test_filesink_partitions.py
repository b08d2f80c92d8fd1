"""FileSink partition_by (Hive-style directories): the pure path logic, then the writer on real
files (no Spark) — one part per directory through checkpoints, a failure resumed exactly, the
columns read back from the paths — and bad settings failing when built."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import streamsnap as ss
from streamsnap.connectors.filesink.partitions import (DEFAULT_PARTITION, check_columns, check_partition_by,
                                                       directory, escape, split)
from streamsnap.connectors.filesink.rolling import RollingPolicy
from tests.connectors.test_filesink_rolling import Clock, checkpoint, writer as rolling_writer

HIVE = ds.partitioning(pa.schema([("dt", pa.string()), ("hm", pa.string())]), flavor="hive")


# ===================================================================== paths
def test_values_are_escaped_as_hive_escapes_path_names():
    assert escape("2026-11-28") == "2026-11-28"
    assert escape("14:05") == "14%3A05"
    assert escape("a/b=c%d") == "a%2Fb%3Dc%25d"
    assert escape(None) == escape("") == DEFAULT_PARTITION
    assert (escape(True), escape(7), escape(1.5)) == ("true", "7", "1.5")
    assert directory(("dt", "hm"), ["2026-11-28", "14:05"]) == "dt=2026-11-28/hm=14%3A05"


def test_split_groups_rows_by_directory_without_the_partition_columns():
    batch = pa.RecordBatch.from_pylist([
        {"v": 1, "dt": "d1", "hm": "a"}, {"v": 2, "dt": "d2", "hm": "a"}, {"v": 3, "dt": "d1", "hm": "a"},
        {"v": 4, "dt": None, "hm": "b"}, {"v": 5, "dt": "d1", "hm": "b"}])
    parts = split(batch, ("dt", "hm"))
    assert [(d, b.schema.names, b.column("v").to_pylist()) for d, b in parts] == [
        ("dt=d1/hm=a", ["v"], [1, 3]), ("dt=d2/hm=a", ["v"], [2]),
        (f"dt={DEFAULT_PARTITION}/hm=b", ["v"], [4]), ("dt=d1/hm=b", ["v"], [5])]
    (only,) = split(batch.slice(0, 1), ("dt",))
    assert only[0] == "dt=d1" and only[1].schema.names == ["v", "hm"]


@pytest.mark.parametrize("bad, match", [
    ([], r"partition_by is empty.*leave it out"),
    ("dt", r"must be a list of column names such as \['dt', 'hm'\]"),
    (["dt", 3], r"3 is not a column name"),
    (["dt", ""], r"'' is not a column name"),
    (["dt", "dt"], r"names \['dt'\] more than once"),
])
def test_bad_partition_by_fails_when_the_sink_is_built(bad, match):
    with pytest.raises(ss.ConfigurationError, match=match):
        ss.sinks.FileSink("/tmp/x", partition_by=bad)
    with pytest.raises(ss.ConfigurationError, match=match):
        check_partition_by(bad)


def test_partition_columns_must_be_in_the_rows_and_leave_some():
    with pytest.raises(ss.ConfigurationError, match=r"partition column 'hm' is not in the rows.*map_batches"):
        check_columns(("dt", "hm"), ["v", "dt"], "FileSink 'x'")
    with pytest.raises(ss.ConfigurationError, match="takes every column"):
        check_columns(("dt",), ["dt"], "FileSink 'x'")
    with pytest.raises(ss.ConfigurationError, match="compact=True .* partition directories"):
        ss.sinks.FileSink("/tmp/x", partition_by=["dt"], compact=True)


def test_a_missing_partition_column_fails_at_sink_to_naming_it():
    env = ss.StreamEnvironment()
    stream = env.from_source(ss.sources.Generator(lambda i: {"v": i, "dt": "d"}, count=3))
    with pytest.raises(ss.ConfigurationError, match=r"partition column 'hm' is not in the rows \(columns \['v', 'dt'\]\)"):
        stream.sink_to(ss.sinks.FileSink("/tmp/x", partition_by=["dt", "hm"]))


# ===================================================================== the writer, on real files
def writer(path, clock, attempt=0, fmt="parquet", rolling=None):
    return rolling_writer(path, clock, rolling or RollingPolicy.on_checkpoint(), attempt=attempt, fmt=fmt,
                          partition_by=["dt", "hm"])


def read(path):
    rows = ds.dataset(str(path), format="parquet", partitioning=HIVE).to_table().to_pylist()
    return sorted((r["v"], r["dt"], r["hm"]) for r in rows)


def hidden(path):
    return sorted(f for _, _, names in os.walk(path) for f in names if f.startswith("."))


def rows(*values):
    return [{"v": v, "dt": f"d{v % 2}", "hm": f"10:0{v % 3}"} for v in values]


def test_rows_go_to_their_directories_and_commit_at_the_checkpoint(tmp_path):
    clock = Clock()
    w = writer(tmp_path, clock)
    w.write(rows(*range(6)))
    assert read(tmp_path) == []                  # pending until the checkpoint completes
    checkpoint(w, 1)
    assert read(tmp_path) == sorted((v, f"d{v % 2}", f"10:0{v % 3}") for v in range(6))
    assert sorted(os.listdir(tmp_path / "dt=d0")) == ["hm=10%3A00", "hm=10%3A01", "hm=10%3A02"]
    (name,) = os.listdir(tmp_path / "dt=d0" / "hm=10%3A00")
    assert pq.read_table(tmp_path / "dt=d0" / "hm=10%3A00" / name).schema.names == ["v"]
    assert hidden(tmp_path) == []


def test_jsonl_leaves_the_partition_columns_out_of_the_lines(tmp_path):
    w = writer(tmp_path, Clock(), fmt="jsonl")
    w.write(rows(4))
    checkpoint(w, 1)
    (name,) = os.listdir(tmp_path / "dt=d0" / "hm=10%3A01")
    assert open(tmp_path / "dt=d0" / "hm=10%3A01" / name).read() == '{"v": 4}\n'


def test_a_failure_mid_part_resumes_every_directory_exactly(tmp_path):
    clock = Clock()
    policy = RollingPolicy(rollover_interval=5, inactivity_interval=None)
    w = writer(tmp_path, clock, rolling=policy)
    w.write(rows(0, 1, 2))
    state = checkpoint(w, 1)                     # the last completed checkpoint: parts open
    assert len(state) == 3 and {s["dir"] for s in state} == {"dt=d0/hm=10%3A00", "dt=d1/hm=10%3A01",
                                                            "dt=d0/hm=10%3A02"}
    w.write(rows(3, 4))                          # after the barrier: replayed
    clock.now += 6
    w.prepare_commit(2)                          # rolls, never completes
    w.close()
    assert read(tmp_path) == []
    restored = writer(tmp_path, clock, attempt=1, rolling=policy)
    restored.recover(state)
    assert len(hidden(tmp_path)) == 3            # only the checkpoint's segments are left
    restored.write(rows(3, 4))
    restored.end_input()
    checkpoint(restored, 2)
    assert read(tmp_path) == sorted((v, f"d{v % 2}", f"10:0{v % 3}") for v in range(5))
    assert hidden(tmp_path) == []
