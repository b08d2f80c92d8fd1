"""Fused per-row chains (runtime/operators/row_chain.py): a run of chained map / filter / flat_map operators
gives what the same operators give unfused — rows, order, per-operator counts, watermarks, and
the error of the operator whose function raised, with the row it was given."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.properties import examples

from streamsnap.clock import ManualScheduler
from streamsnap.errors import UsageError, UserFunctionError
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.runtime.operators.functions import FunctionOperatorFactory
from streamsnap.runtime.operators.row_chain import RowRun, fuse_row_chains

from tests.runtime.support import Sink


def _ctx(name: str) -> OperatorContext:
    return OperatorContext(name=name, uid=name, subtask_index=0, parallelism=1, max_parallelism=128,
                           attempt=0, job_id="job", task_name="chain (1/1)", timers=ManualScheduler(),
                           clock=ManualScheduler())


def _chain(steps: list, fused: bool, extra_target=None):
    """Operators for `steps` ((kind, function) pairs) chained into a Sink, opened; fused or not.
    extra_target: a second consumer of the first operator's output."""
    operators = [FunctionOperatorFactory(kind, fn).create(_ctx(f"{kind}-{i}")) for i, (kind, fn) in enumerate(steps)]
    sink = Sink()
    for i, op in enumerate(operators):
        targets = [operators[i + 1]] if i + 1 < len(operators) else [sink]
        if i == 0 and extra_target is not None:
            targets.append(extra_target)
        op.output = Output(targets)
    for op in operators:
        op.initialize_state()
        op.open()
    runs = fuse_row_chains(operators) if fused else []
    return operators, sink, runs


def _counts(operators):
    return [(op.records_in, op.output.records_out) for op in operators]


# Per-row functions of each kind, picked by index so hypothesis can combine them.
def _add(row):
    return {**row, "v": row["v"] + 1}


def _double(row):
    row["v"] *= 2          # in place, returns the same dict
    return row


def _odd(row):
    return row["v"] % 2


def _small(row):
    return row["v"] < 50


def _split(row):
    for j in range(row["v"] % 3):
        yield {"v": row["v"] + j, "j": j}


def _one_or_none(row):
    return None if row["v"] % 4 == 0 else {"v": row["v"] * 3}


def _as_list(row):
    return [{"v": row["v"]}, {"v": -row["v"]}]


FUNCTIONS = {"map": [_add, _double], "filter": [_odd, _small], "flat_map": [_split, _one_or_none, _as_list]}
STEP = st.sampled_from([(kind, fn) for kind, fns in FUNCTIONS.items() for fn in fns])


@settings(max_examples=examples(150), deadline=None)
@given(steps=st.lists(STEP, min_size=1, max_size=5),
       batches=st.lists(st.lists(st.integers(-20, 60), max_size=30), min_size=1, max_size=4),
       arrow=st.booleans())
def test_a_fused_chain_gives_the_rows_and_counts_of_the_unfused_one(steps, batches, arrow):
    results = []
    for fused in (False, True):
        operators, sink, runs = _chain(steps, fused)
        assert len(runs) == (1 if fused and len(steps) > 1 else 0)
        for values in batches:
            rows = [{"v": v} for v in values]
            operators[0].process(pa.RecordBatch.from_pylist(rows) if arrow and rows else rows)
        operators[0].process_watermark(7)
        results.append((sink.items, _counts(operators)))
    assert results[0] == results[1]


def _raise_on(value):
    def fn(row):
        if row["v"] == value:
            raise ValueError(f"{value} is cursed")
        return row
    return fn


def _errors_unfused_and_fused(steps, error: type) -> list:
    """The `error` the chain of `steps` raises on rows 0..11, run unfused and fused."""
    errors = []
    for fused in (False, True):
        operators, _, _ = _chain(steps, fused)
        with pytest.raises(error) as info:
            operators[0].process([{"v": v} for v in range(12)])
        errors.append(info.value)
    return errors


@pytest.mark.parametrize("steps, failing", [
    ([("map", _add), ("map", _raise_on(5)), ("filter", _odd)], "map-1"),
    ([("flat_map", _split), ("filter", lambda r: 1 / (r["v"] - 9)), ("map", _add)], "filter-1"),
    ([("map", _add), ("flat_map", lambda r: iter([r, {"bad": 1 / 0}]))], "flat_map-1"),
    ([("flat_map", _split), ("flat_map", _split), ("map", _raise_on(10))], "map-2"),
])
def test_a_raising_function_is_reported_by_its_own_operator_fused_or_not(steps, failing):
    unfused, fused = _errors_unfused_and_fused(steps, UserFunctionError)
    assert fused.operator == unfused.operator == failing
    assert fused.record == unfused.record
    assert fused.traceback_text == unfused.traceback_text
    assert "streamsnap" not in fused.traceback_text.replace("tests/runtime", "")   # only the user's frames


@pytest.mark.parametrize("steps, failing, problem", [
    ([("flat_map", lambda r: [r, r["v"]]), ("map", _add)], "flat_map-0", "function produced int"),
    ([("filter", _small), ("map", lambda r: [r])], "map-1", "map function returned list"),
])
def test_a_function_returning_no_row_is_a_usage_error_of_its_own_operator_fused_or_not(steps, failing, problem):
    """Not restarted (a DataError): the replay would call the function on the same rows."""
    unfused, fused = _errors_unfused_and_fused(steps, UsageError)
    assert fused.operator == unfused.operator == failing and fused.row == unfused.row == {"v": 0}
    assert problem in str(fused) and str(fused) == str(unfused)


def test_an_operator_with_a_second_consumer_or_a_side_output_ends_the_run():
    other = Sink()
    steps = [("map", _add), ("map", _add), ("filter", _odd), ("map", _add)]
    operators, sink, runs = _chain(steps, fused=True, extra_target=other)
    # map-0 feeds map-1 and `other`: the run starts after it.
    assert [[op.ctx.name for op in run.operators] for run in runs] == [["map-1", "filter-2", "map-3"]]
    operators[0].process([{"v": 1}, {"v": 2}])
    assert other.items == [{"v": 2}, {"v": 3}]
    assert sink.items == [{"v": 4}]
    # A side output on the second operator: map-0 -> map-1 may fuse, not further.
    operators, sink, _ = _chain(steps, fused=False)
    operators[1].output = Output([operators[2]], side={"late": [Sink()]})
    runs = fuse_row_chains(operators)
    assert [[op.ctx.name for op in run.operators] for run in runs] == [["map-0", "map-1"], ["filter-2", "map-3"]]
    operators[0].process([{"v": 1}, {"v": 2}])
    assert sink.items == [{"v": 4}]


def test_watermarks_and_statuses_still_pass_every_operator_of_a_fused_run():
    seen = []

    class Watching(Sink):
        def process_watermark(self, timestamp):
            seen.append(timestamp)
            super().process_watermark(timestamp)

    operators, sink, runs = _chain([("map", _add), ("filter", _odd)], fused=True)
    assert runs
    operators[0].output = Output([operators[1]])
    operators[1].output = Output([watcher := Watching()])
    operators[0].process([{"v": 2}])
    operators[0].process_watermark(40)
    assert watcher.items == [{"v": 3}, ("watermark", 40)] and seen == [40]


def test_only_map_filter_and_flat_map_can_be_fused():
    with pytest.raises(ValueError, match="cannot be fused"):
        RowRun([FunctionOperatorFactory("map", _add).create(_ctx("m")), _FakeKind()])


class _FakeKind:
    kind = "process"
    ctx = _ctx("p")
