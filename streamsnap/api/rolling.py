"""Rolling aggregations of a keyed stream (Flink's `KeyedStream.reduce/sum/min/max/min_by/max_by`).

Each input row updates its key's running result and emits it, so the output has one row per
input row. The running result is keyed `ValueState`, so it is in every checkpoint and savepoint
and moves with its key group on rescale. As in Flink: `sum`/`min`/`max` replace one field of the
key's first row with the running aggregate (the other fields keep the first row's values);
`min_by`/`max_by` emit the whole row that holds the extreme value (the earliest one on ties).
"""

from __future__ import annotations

from typing import Callable

from streamsnap.api.functions import KeyedProcessFunction
from streamsnap.errors import ConfigurationError, DataError
from streamsnap.runtime.schemas import describe_row
from streamsnap.state.descriptors import ValueStateDescriptor

AGGREGATIONS = ("sum", "min", "max", "min_by", "max_by")


def check_field(field, what: str, schema=None) -> str:
    """A build-time check of the field an aggregation reads."""
    if not isinstance(field, str) or not field:
        raise ConfigurationError(f"{what} takes the name of a numeric field, got {field!r}")
    if schema is not None and field not in schema.names:
        raise ConfigurationError(
            f"{what}({field!r}): the stream has no field {field!r} (its fields: {', '.join(schema.names)}); "
            f"name one of them, or add the field with map first")
    return field


class RollingReduce(KeyedProcessFunction):
    """`fn(running, row) -> running`, both dicts; the key's first row starts the running value."""

    def __init__(self, fn: Callable[[dict, dict], dict]):
        self.fn = fn

    def open(self, ctx):
        self._name = ctx.operator_name
        self._subtask = ctx.subtask_index
        self._running = ctx.get_state(ValueStateDescriptor("rolling-reduce"))

    def process_element(self, row, ctx):
        running = self._running.value()
        if running is None:
            result = dict(row)
        else:
            result = self.fn(running, row)
            if not isinstance(result, dict):
                raise DataError(
                    f"operator '{self._name}' (subtask {self._subtask}): the reduce function returned "
                    f"{describe_row(result)} of type {type(result).__name__}, not a dict\n"
                    f"  row: {describe_row(row)}\n  fix: return the combined row as a dict",
                    operator=self._name, subtask=str(self._subtask), row=row)
        self._running.update(result)
        yield dict(result)   # downstream may change its row; the state keeps its own


class RollingAggregate(KeyedProcessFunction):
    """sum / min / max / min_by / max_by of one numeric field, per key."""

    def __init__(self, kind: str, field: str):
        if kind not in AGGREGATIONS:
            raise ConfigurationError(f"unknown rolling aggregation {kind!r}; use one of {', '.join(AGGREGATIONS)}")
        self.kind = kind
        self.field = field

    def open(self, ctx):
        self._name = ctx.operator_name
        self._subtask = ctx.subtask_index
        self._running = ctx.get_state(ValueStateDescriptor(f"rolling-{self.kind}"))

    def _value(self, row):
        value = row.get(self.field) if isinstance(row, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problem = "has no field" if not isinstance(row, dict) or self.field not in row else \
                f"has {value!r} ({type(value).__name__}) in field"
            raise DataError(
                f"operator '{self._name}' (subtask {self._subtask}): {self.kind}({self.field!r}) needs a number, "
                f"but the row {problem} '{self.field}'\n  row: {describe_row(row)}\n"
                f"  fix: filter such rows out or map them to a number before the aggregation",
                operator=self._name, subtask=str(self._subtask), field=self.field, row=row)
        return value

    def process_element(self, row, ctx):
        value = self._value(row)
        running = self._running.value()
        if running is None:
            result = dict(row)
        else:
            held = running[self.field]
            kind = self.kind
            if kind == "sum":
                result = dict(running)
                result[self.field] = held + value
            elif kind in ("min", "max"):
                result = dict(running)
                result[self.field] = min(held, value) if kind == "min" else max(held, value)
            elif (value < held) if kind == "min_by" else (value > held):
                result = dict(row)
            else:
                result = running
        self._running.update(result)
        yield dict(result)


__all__ = ["AGGREGATIONS", "RollingAggregate", "RollingReduce", "check_field"]
