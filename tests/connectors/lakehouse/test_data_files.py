"""Data files of a lakehouse writer (connectors/lakehouse/data_files.py), on real files: one file
per partition, rolling at the target size, partition columns left out for Delta and kept for
Iceberg, stats for data skipping, and the cleanup of files no commit references."""

from __future__ import annotations

import datetime
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamsnap.connectors.lakehouse.data_files import (DataFileWriter, delete_unreferenced, partition_directory,
                                                        widest_schema)
from streamsnap.connectors.lakehouse.table_sink import table_schema, to_table_types
from streamsnap.errors import ConfigurationError


def _batch(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"region": [["eu", "us"][i % 2] for i in range(start, start + n)],
                                       "order": list(range(start, start + n)),
                                       "note": [None if i % 5 == 0 else f"n{i}" for i in range(start, start + n)]})


def test_one_file_per_partition_without_the_partition_column_and_with_stats(tmp_path):
    writer = DataFileWriter(str(tmp_path), ["region"], "part-abc-run-a0-s0-", to_table_types)
    writer.write(_batch(10))
    writer.write(_batch(10, start=10))
    files = sorted(writer.close_all(), key=lambda f: f["path"])
    assert [f["path"].split("/")[0] for f in files] == ["region=eu", "region=us"]
    assert [f["partition"] for f in files] == [["eu"], ["us"]]
    eu = pq.read_table(tmp_path / files[0]["path"])
    assert eu.column_names == ["order", "note"] and eu.column("order").to_pylist() == list(range(0, 20, 2))
    assert files[0]["stats"] == {"rows": 10, "nulls": {"order": 0, "note": 2},
                                 "min": {"order": 0, "note": "n12"}, "max": {"order": 18, "note": "n8"}}
    assert files[0]["size"] == os.path.getsize(tmp_path / files[0]["path"])
    assert widest_schema(files).names == ["region", "order", "note"]   # the table's schema, partition column too
    assert writer.close_all() == []                                      # nothing written since


def test_files_roll_at_the_target_size_and_iceberg_keeps_partition_columns(tmp_path, monkeypatch):
    import streamsnap.connectors.lakehouse.data_files as data_files

    monkeypatch.setattr(data_files, "ROW_GROUP_ROWS", 100)   # a row group per 100 rows: sizes grow as written
    writer = DataFileWriter(str(tmp_path), ["region"], "part-abc-run-a0-s0-", to_table_types, target_file_size=2048,
                            partition_columns_in_files=True)
    for k in range(20):
        writer.write(_batch(200, start=k * 200))
    files = writer.close_all()
    assert len(files) > 2 and sum(f["stats"]["rows"] for f in files) == 4000
    assert all(pq.read_schema(tmp_path / f["path"]).names == ["region", "order", "note"] for f in files)


def test_types_map_to_what_tables_store_and_unstorable_ones_are_named():
    schema = table_schema(pa.schema([("at", pa.timestamp("ns", "Asia/Tokyo")), ("u", pa.uint32()),
                                     ("s", pa.large_string()), ("nested", pa.struct([("t", pa.timestamp("ms"))]))]))
    assert schema.field("at").type == pa.timestamp("us", "UTC") and schema.field("u").type == pa.int64()
    assert schema.field("s").type == pa.string() and schema.field("nested").type == pa.struct([("t", pa.timestamp("us"))])
    with pytest.raises(ConfigurationError, match=r"column 'nested.clock' has type time64\[us\]"):
        table_schema(pa.schema([("nested", pa.struct([("clock", pa.time64("us"))]))]))
    tokyo = datetime.datetime(2026, 1, 1, 9, tzinfo=datetime.timezone(datetime.timedelta(hours=9)))
    batch = to_table_types(pa.RecordBatch.from_pydict({"at": pa.array([tokyo], pa.timestamp("ns", "Asia/Tokyo"))}))
    assert batch.column(0).to_pylist()[0] == tokyo                           # the same instant


def test_partition_directories_escape_values_and_name_nulls_as_hive_does():
    assert partition_directory(["a", "b"], ("x/y", None)) == "a=x%2Fy/b=__HIVE_DEFAULT_PARTITION__"
    assert partition_directory(["d"], (datetime.date(2026, 1, 2),)) == "d=2026-01-02"


def test_cleanup_deletes_only_this_sinks_unreferenced_files_of_earlier_attempts(tmp_path):
    (tmp_path / "k=1").mkdir()
    names = {"part-abc-run-a0-s0-1-x.parquet": True,      # an earlier attempt's, unreferenced: deleted
             "part-abc-run-a0-s0-2-y.parquet": False,     # referenced by the table
             "part-abc-run-a1-s0-1-z.parquet": False,     # the current attempt is writing it
             "part-other-run-a0-s0-1-w.parquet": False}   # another sink's
    for name in names:
        (tmp_path / "k=1" / name).write_bytes(b"x")
    deleted = delete_unreferenced(str(tmp_path), "part-abc-", {"part-abc-run-a0-s0-2-y.parquet"}, "-run-a1-")
    assert [os.path.basename(p) for p in deleted] == [n for n, gone in names.items() if gone]
    assert sorted(os.listdir(tmp_path / "k=1")) == sorted(n for n, gone in names.items() if not gone)


def test_only_columns_with_few_distinct_values_are_dictionary_encoded_and_every_value_reads_back(tmp_path):
    """A dictionary over mostly distinct values (a running total, an id) costs more than the rest
    of the write and grows the file: those columns are written plain (compressed), keys and
    categories with a dictionary."""
    n = 20_000
    batch = pa.RecordBatch.from_pydict({"key": [i % 100 for i in range(n)], "total": [i * 7 for i in range(n)],
                                        "region": [["eu", "us"][i % 2] for i in range(n)],
                                        "tags": [[i % 3] for i in range(n)]})
    writer = DataFileWriter(str(tmp_path), [], "part-abc-run-a0-s0-", to_table_types)
    writer.write(batch)
    [written] = writer.close_all()
    parquet = pq.ParquetFile(tmp_path / written["path"])
    group = parquet.metadata.row_group(0)
    encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)}
    assert "RLE_DICTIONARY" in encodings["key"] and "RLE_DICTIONARY" in encodings["region"]
    assert "RLE_DICTIONARY" not in encodings["total"]
    assert parquet.read().to_pydict() == pa.Table.from_batches([batch]).to_pydict()
