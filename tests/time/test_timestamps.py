import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from streamsnap.errors import DataError
from streamsnap.time import TimestampError, assign_timestamp, extract_timestamps


def batch(**columns):
    return pa.RecordBatch.from_pydict(columns)


def test_integer_column_becomes_int64():
    for kind in (pa.int64(), pa.int32(), pa.uint32(), pa.uint64(), pa.int16()):
        out = extract_timestamps(batch(ts=pa.array([3, 1, 2], type=kind), v=[1, 2, 3]), "ts")
        assert out.dtype == np.int64 and out.tolist() == [3, 1, 2]


@pytest.mark.parametrize("unit, raw, millis", [
    ("s", [1, -1], [1000, -1000]),
    ("ms", [1500, -1], [1500, -1]),
    ("us", [1_500_999, -1], [1500, -1]),           # floors: -1 us is in millisecond -1
    ("ns", [2_000_000_001, -1_000_001], [2000, -2]),
])
def test_timestamp_columns_convert_to_milliseconds(unit, raw, millis):
    column = pa.array(raw, type=pa.timestamp(unit, tz="UTC"))
    assert extract_timestamps(batch(t=column), "t").tolist() == millis


def test_datetime_values_give_epoch_milliseconds():
    moment = dt.datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    column = pa.array([moment], type=pa.timestamp("us", tz="UTC"))
    assert extract_timestamps(batch(t=column), "t").tolist() == [int(moment.timestamp() * 1000)]


def test_table_and_dictionary_columns():
    table = pa.Table.from_batches([batch(t=[1, 2]), batch(t=[3])])
    assert extract_timestamps(table, "t").tolist() == [1, 2, 3]
    encoded = pa.array([5, 5, 7]).dictionary_encode()
    assert extract_timestamps(batch(t=encoded), "t").tolist() == [5, 5, 7]


def test_missing_column_names_field_columns_and_fix():
    with pytest.raises(TimestampError) as err:
        extract_timestamps(batch(time=[1], v=[2]), "ts", operator="windows")
    message = str(err.value)
    assert "operator 'windows'" in message and "'ts' is missing" in message
    assert "['time', 'v']" in message and "with_timestamp_assigner" in message
    assert err.value.field == "ts" and isinstance(err.value, DataError)   # no restart replays past it


def test_null_names_first_null_row():
    with pytest.raises(TimestampError) as err:
        extract_timestamps(batch(ts=[1, 2, None, None], v=[0, 1, 2, 3]), "ts")
    message = str(err.value)
    assert "'ts' is null" in message and "row: {'ts': None, 'v': 2}" in message and "fill the nulls" in message
    assert "row 2" not in message and err.value.batch_index == 2   # located by the source, not shown


def test_float_column_names_first_non_integer_row():
    with pytest.raises(TimestampError) as err:
        extract_timestamps(batch(ts=[1.0, 2.0, 2.5, 3.7]), "ts", operator="src")
    message = str(err.value)
    assert "operator 'src'" in message and "type double" in message
    assert "first offending value: 2.5" in message and "row: {'ts': 2.5}" in message and "pa.int64()" in message


def test_string_column_is_rejected():
    with pytest.raises(TimestampError, match=r"(?s)type string.*'2024-01-01'.*cast it"):
        extract_timestamps(batch(ts=["2024-01-01"]), "ts")


def test_uint64_beyond_int64_names_row():
    column = pa.array([1, 2 ** 64 - 1], type=pa.uint64())
    with pytest.raises(TimestampError, match=r"holds 18446744073709551615.*\n  row: \{'ts': 18446744073709551615\}"):
        extract_timestamps(batch(ts=column), "ts")


def test_function_assigner_runs_per_row():
    out = extract_timestamps(batch(a=[1, 2], b=[10, 20]), lambda row: row["a"] * row["b"])
    assert out.dtype == np.int64 and out.tolist() == [10, 40]
    np_int = extract_timestamps(batch(a=[4]), lambda row: np.int32(row["a"]))
    assert np_int.tolist() == [4]


@pytest.mark.parametrize("bad", [1.5, "3", None, True, 2 ** 64])
def test_function_assigner_bad_result_names_row_and_fix(bad):
    with pytest.raises(TimestampError) as err:
        extract_timestamps(batch(a=[1, 2]), lambda row: 1 if row["a"] == 1 else bad, "op")
    message = str(err.value)
    assert "operator 'op'" in message and "row: {'a': 2}" in message and err.value.batch_index == 1
    assert "int of epoch milliseconds" in message


def test_assign_timestamp_for_one_record():
    assert assign_timestamp("ts", {"ts": 12}) == 12
    assert assign_timestamp(lambda r: r["x"] + 1, {"x": 1}) == 2
    with pytest.raises(TimestampError, match=r"'ts' is missing\n  row: \{'t': 1\}"):
        assign_timestamp("ts", {"t": 1})
    with pytest.raises(TimestampError, match=r"'ts' is 1.5 \(float\), not an int.*\n  row: \{'ts': 1.5\}"):
        assign_timestamp("ts", {"ts": 1.5})
    with pytest.raises(TimestampError, match=r"'ts' is None, not an int.*\n  row: \{'ts': None\}\n  fix: .*filter"):
        assign_timestamp("ts", {"ts": None})


def test_the_per_row_path_takes_datetimes_as_the_columnar_path_takes_timestamp_columns():
    # A timestamp column reaches per-row functions as datetimes (zone-less ones are UTC).
    column = pa.array([1_500, -1], type=pa.timestamp("ms"))
    rows = batch(t=column).to_pylist()
    assert [assign_timestamp("t", row) for row in rows] == extract_timestamps(batch(t=column), "t").tolist()
    zoned = dt.datetime(2026, 1, 1, 1, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert assign_timestamp("t", {"t": zoned}) == int(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc).timestamp() * 1000)
    assert assign_timestamp(lambda r: r["t"], {"t": dt.datetime(1970, 1, 1, 0, 0, 1)}) == 1000
    with pytest.raises(TimestampError, match=r"'t' is datetime.date"):
        assign_timestamp("t", {"t": dt.date(2026, 1, 1)})


def test_a_window_results_time_is_its_windows_last_millisecond_vectorized_and_per_row():
    from streamsnap.time.timestamps import WindowEndTimestamps

    stamp = WindowEndTimestamps()
    results = batch(window_start=[0, 1000], window_end=[1000, 2000], count=[3, 4])
    assert extract_timestamps(results, stamp).tolist() == [999, 1999]
    assert assign_timestamp(stamp, {"window_start": 0, "window_end": 1000}) == 999
    assert stamp == WindowEndTimestamps() and stamp != "window_end"


def test_a_window_result_without_window_end_fails_naming_the_column_and_the_fix():
    from streamsnap.time.timestamps import WindowEndTimestamps

    with pytest.raises(TimestampError, match="window_end.*missing(.|\n)*keep window_end"):
        extract_timestamps(batch(count=[3]), WindowEndTimestamps(), "after the window")
    with pytest.raises(TimestampError, match="no 'window_end' column(.|\n)*assign_timestamps_and_watermarks"):
        assign_timestamp(WindowEndTimestamps(), {"count": 3})
