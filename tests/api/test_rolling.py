"""Rolling aggregations: build-time checks and bad rows, without Spark."""

import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.api.rolling import RollingAggregate, RollingReduce


class _Value:
    def __init__(self):
        self.v = None

    def value(self):
        return self.v

    def update(self, v):
        self.v = v


class _Ctx:
    operator_name, subtask_index = "sum(temp)", 1

    def get_state(self, descriptor):
        return _Value()


def _run(function, rows):
    function.open(_Ctx())
    return [out for row in rows for out in function.process_element(row, None)]


def test_sum_keeps_the_first_rows_other_fields_and_min_by_the_extreme_row():
    rows = [{"k": 1, "temp": 5, "at": "a"}, {"k": 1, "temp": 2, "at": "b"}, {"k": 1, "temp": 9, "at": "c"}]
    assert _run(RollingAggregate("sum", "temp"), rows) == [
        {"k": 1, "temp": 5, "at": "a"}, {"k": 1, "temp": 7, "at": "a"}, {"k": 1, "temp": 16, "at": "a"}]
    assert [r["at"] for r in _run(RollingAggregate("min_by", "temp"), rows)] == ["a", "b", "b"]
    assert [r["temp"] for r in _run(RollingAggregate("max", "temp"), rows)] == [5, 5, 9]


def test_emitted_rows_are_copies_of_the_state():
    out = _run(RollingReduce(lambda a, b: {"n": a["n"] + b["n"]}), [{"n": 1}, {"n": 2}])
    out[0]["n"] = 100                                   # downstream changing its row
    assert out == [{"n": 100}, {"n": 3}]


def test_a_non_numeric_value_names_operator_field_and_row():
    with pytest.raises(ss.DataError) as info:
        _run(RollingAggregate("sum", "temp"), [{"k": 1, "temp": 5}, {"k": 1, "temp": "hot"}])
    text = str(info.value)
    assert "operator 'sum(temp)' (subtask 1)" in text and "'hot' (str) in field 'temp'" in text
    assert "{'k': 1, 'temp': 'hot'}" in text and "fix:" in text and info.value.field == "temp"
    with pytest.raises(ss.DataError, match="the row has no field 'temp'"):
        _run(RollingAggregate("max", "temp"), [{"k": 1}])


def test_a_reduce_returning_no_dict_names_the_fix():
    with pytest.raises(ss.DataError, match="returned 3 of type int, not a dict"):
        _run(RollingReduce(lambda a, b: 3), [{"n": 1}, {"n": 2}])


def test_build_time_checks_name_the_field():
    env = ss.StreamEnvironment(parallelism=1)
    keyed = env.from_collection([{"k": 1, "temp": 2.0}], schema=pa.schema([("k", pa.int64()), ("temp", pa.float64())]),
                                name="rows").key_by("k")
    with pytest.raises(ss.ConfigurationError, match=r"sum\('tmp'\): the stream has no field 'tmp' \(its fields: k, temp\)"):
        keyed.sum("tmp")
    with pytest.raises(ss.ConfigurationError, match="takes the name of a numeric field"):
        keyed.max(3)
    with pytest.raises(ss.ConfigurationError, match="reduce needs a function"):
        keyed.reduce("sum")
