"""The pure logic of deduplicate and top_n (runtime/operators/deduplicate.py, top_n.py,
row_order.py), row by row without Spark, against plain-Python references."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.properties import examples

from streamsnap.errors import ConfigurationError, DataError, UserFunctionError
from streamsnap.runtime.operators.deduplicate import KEEP, check_keep, decide_batch, replaces, ttl_config
from streamsnap.runtime.operators.row_order import RowOrder
from streamsnap.runtime.operators.top_n import check_n, insert, ranked

SCHEMA = pa.schema([("k", pa.int64()), ("price", pa.int64()), ("ts", pa.int64()), ("name", pa.string())])


def order(by, descending):
    return RowOrder.of(by, descending, "test", "by", SCHEMA)


def test_row_order_compares_column_by_column_each_in_its_direction():
    o = order(["price", "ts", "name"], [True, False, True])
    assert o.before({"price": 5, "ts": 9, "name": "a"}, {"price": 4, "ts": 1, "name": "z"})
    assert o.before({"price": 5, "ts": 1, "name": "a"}, {"price": 5, "ts": 2, "name": "z"})
    assert o.before({"price": 5, "ts": 1, "name": "b"}, {"price": 5, "ts": 1, "name": "a"})   # strings descend too
    row = {"price": 5, "ts": 1, "name": "b"}
    assert not o.before(row, dict(row))                                                       # a tie is not before
    rng = random.Random(5)
    rows = [{"price": rng.randrange(4), "ts": rng.randrange(4), "name": "x"} for _ in range(40)]
    for descending in (True, False):   # one direction: compared as tuples, as the column loop would
        uniform = order(["price", "ts"], descending)
        mixed_spelling = order(["price", "ts", "name"], [descending, descending, not descending])
        assert all(uniform.before(a, b) == mixed_spelling.before(a, b) for a in rows for b in rows)
        assert any(uniform.before(a, b) for a in rows for b in rows)


def test_top_n_insert_equals_sorting_every_prefix_stably():
    rng = random.Random(7)
    o = order(["price", "ts"], [True, False])
    for n in (1, 3, 10):
        top, rows = [], []
        for i in range(300):
            row = {"price": rng.randrange(20), "ts": rng.randrange(5), "i": i}
            rows.append(row)
            before = list(top)
            at = insert(top, row, n, o)
            expected = sorted(rows, key=lambda r: (-r["price"], r["ts"], r["i"]))[:n]   # ties: arrival order
            assert top == expected
            if at is None:
                assert top == before
            else:   # the emitted rows are exactly the ranks that changed
                changed = [r for r in range(len(top)) if r >= len(before) or before[r] is not top[r]]
                assert changed == list(range(at, len(top)))
                assert ranked(top, at, "rank") == [{**top[r], "rank": r + 1} for r in changed]


def test_deduplicate_keeps_the_first_or_last_by_order_with_ties_to_the_later_arrival_for_last():
    rng = random.Random(3)
    rows = [{"k": rng.randrange(4), "ts": rng.randrange(30), "i": i} for i in range(400)]
    o = RowOrder.of("ts", False, "test", "order_by", SCHEMA)
    for keep in ("first", "last"):
        held: dict = {}
        for row in rows:
            if replaces(keep, o, held.get(row["k"]), row):
                held[row["k"]] = row
        for k in range(4):
            mine = [r for r in rows if r["k"] == k]
            if keep == "first":
                want = min(mine, key=lambda r: (r["ts"], r["i"]))
            else:
                want = max(mine, key=lambda r: (r["ts"], r["i"]))
            assert held[k] is want, (keep, k)
    # without order_by: arrival order
    assert replaces("first", None, None, {"i": 1}) and not replaces("first", None, {"i": 0}, {"i": 1})
    assert replaces("last", None, {"i": 0}, {"i": 1})


@pytest.mark.parametrize("bad, needle", [(0, "n is how many rows"), (-2, "int >= 1"), (True, "got True"),
                                         (2.5, "got 2.5")])
def test_top_n_refuses_a_count_below_one_or_not_an_int(bad, needle):
    with pytest.raises(ConfigurationError, match=needle):
        check_n(bad)


def test_bad_settings_fail_naming_the_setting_and_the_fix():
    with pytest.raises(ConfigurationError, match="keep must be 'first' or 'last'.*got 'newest'"):
        check_keep("newest")
    with pytest.raises(ConfigurationError, match="does not have.*its columns: k, price, ts, name.*add the column"):
        order("cost", True)
    with pytest.raises(ConfigurationError, match="one True/False per column"):
        order(["price", "ts"], [True])
    with pytest.raises(ConfigurationError, match="column name or a list of column names"):
        order([], True)
    with pytest.raises(ConfigurationError, match="ttl must be seconds"):
        ttl_config(-1, "deduplicate")
    assert ttl_config(60, "deduplicate").ttl_ms == 60_000


def test_a_row_without_an_order_value_fails_naming_the_operator_and_column():
    with pytest.raises(DataError, match="(?s)operator .ranked.*order column .price. \\(null\\).*fix: filter"):
        order("price", True).check({"price": None, "ts": 1}, "ranked")


def _row_by_row(keep, o, rows, keys, held):
    """The per-row decision (`replaces`, held row updated as it goes): emitted rows, kept rows."""
    held = list(held)
    emitted, kept = [], {}
    for i, (row, u) in enumerate(zip(rows, keys)):
        if replaces(keep, o, held[u], row):
            held[u] = row
            emitted.append(i)
            kept[u] = i
    return emitted, kept


@given(data=st.data())
@settings(max_examples=examples(300), deadline=None)
def test_a_whole_batch_decided_with_numpy_equals_the_row_by_row_decision(data):
    keep = data.draw(st.sampled_from(KEEP))
    by = data.draw(st.sampled_from([["price"], ["ts", "price"], ["name", "ts"], ["price", "name", "ts"]]))
    o = order(by, data.draw(st.one_of(st.booleans(), st.lists(st.booleans(), min_size=len(by), max_size=len(by)))))
    num_keys = data.draw(st.integers(1, 4))
    n = data.draw(st.integers(1, 30))
    value = {"price": st.integers(-3, 3), "ts": st.integers(0, 3), "name": st.sampled_from(["a", "b", "bb", ""])}
    rows = [{"k": 0, **{c: data.draw(value[c]) for c in ("price", "ts", "name")}} for _ in range(n)]
    keys = [data.draw(st.integers(0, num_keys - 1)) for _ in range(n)]
    held = [data.draw(st.one_of(st.none(), st.fixed_dictionaries({c: value[c] for c in ("price", "ts", "name")})))
            for _ in range(num_keys)]
    batch = pa.RecordBatch.from_pylist(rows, schema=SCHEMA)
    emitted, changed, kept = decide_batch(keep, o, batch, np.array(keys), held)
    expected_emitted, expected_kept = _row_by_row(keep, o, rows, keys, held)
    assert emitted.tolist() == expected_emitted
    assert dict(zip(changed.tolist(), kept.tolist())) == expected_kept


def test_a_batch_with_nulls_or_nan_in_its_order_columns_is_left_to_the_row_by_row_decision():
    o = order(["price"], False)
    nulls = pa.RecordBatch.from_pylist([{"k": 1, "price": None, "ts": 1, "name": "a"}], schema=SCHEMA)
    assert decide_batch("last", o, nulls, np.array([0]), [None]) is None
    floats = pa.RecordBatch.from_pydict({"price": [1.0, float("nan")]})
    assert decide_batch("last", RowOrder.of("price", False, "test", "by"), floats, np.array([0, 0]), [None]) is None


def test_the_batch_path_decides_row_by_row_what_numpy_does_not_order():
    """Order columns numpy does not rank (booleans here) or with nulls: the batch path's row
    by row loop, with the same decisions, and a null naming the column and the fix."""
    from streamsnap.runtime.operators.deduplicate import DeduplicateBatches
    from streamsnap.testing import harness

    h = harness(DeduplicateBatches("last", RowOrder.of("flag", False, "test", "order_by"), None), key_by="k")
    h.process_batch([{"k": 1, "flag": True, "i": 0}, {"k": 1, "flag": False, "i": 1}, {"k": 2, "flag": False, "i": 2},
                     {"k": 1, "flag": True, "i": 3}])
    assert [r["i"] for r in h.output] == [0, 2, 3]          # in batch order; i=1 ranks before i=0
    assert h.state("deduplicate", key=1) == {"flag": True}   # the order values only
    with pytest.raises(DataError, match="no value in the order column 'flag'"):
        h.process_batch([{"k": 1, "flag": None, "i": 4}])


@pytest.mark.parametrize("batches", [False, True])
def test_deduplicate_keeps_only_the_kept_rows_order_values_in_its_state(batches):
    """Later rows are compared by the order columns alone, and the rows emitted are the input's:
    the state holds the kept row's order values, on the per-row and both batch paths."""
    from streamsnap.runtime.operators.deduplicate import Deduplicate, DeduplicateBatches
    from streamsnap.testing import harness

    order = RowOrder.of(["ts", "tie"], False, "test", "order_by")
    h = harness((DeduplicateBatches if batches else Deduplicate)("last", order), key_by="k")
    rows = [{"k": 1, "ts": 5, "tie": "a", "payload": "x" * 50}, {"k": 1, "ts": 3, "tie": "z", "payload": "y"},
            {"k": 2, "ts": 1, "tie": "b", "payload": "z"}]
    if batches:
        h.process_batch(rows)
    else:
        for row in rows:
            h.process(row)
    assert h.output == [rows[0], rows[2]]
    assert h.state("deduplicate", key=1) == {"ts": 5, "tie": "a"}
    assert h.state("deduplicate", key=2) == {"ts": 1, "tie": "b"}


def test_top_n_output_built_from_value_lists_equals_one_dict_per_ranked_row():
    """`emitted` with none of the rows the batch's own: transposed value lists give the batch
    `ranked` dicts make with from_pylist, types and nulls included."""
    import datetime

    from streamsnap.runtime.operators.top_n import emitted, ranked

    schema = pa.schema([("auction", pa.int64()), ("price", pa.float64()), ("who", pa.string()),
                        ("at", pa.timestamp("ms")), ("rank", pa.int64())])
    data = pa.schema(list(schema)[:-1])
    at = datetime.datetime(2026, 11, 29, 8, 0)
    rows = [{"auction": 1, "price": 2.5, "who": "a", "at": at}, {"auction": 1, "price": None, "who": "b", "at": at},
            {"auction": 2, "price": 1.0, "who": None, "at": None}]
    expected = pa.RecordBatch.from_pylist(ranked(rows, 0, "rank"), schema=schema)
    lists = [list(r.values()) for r in rows]
    empty = pa.RecordBatch.from_pylist([], schema=data)
    assert emitted(lists, [1, 2, 3], {}, empty, data, schema, "rank").equals(expected)
    single = pa.schema([("auction", pa.int64()), ("rank", pa.int64())])
    assert emitted([[7]], [1], {}, empty, pa.schema(list(single)[:1]), single, "rank").to_pylist() == \
        [{"auction": 7, "rank": 1}]


@given(data=st.data())
@settings(max_examples=examples(100), deadline=None)
def test_top_n_batches_emit_what_top_n_emits_row_by_row_however_the_rows_are_batched(data):
    """Batches of young keys (every row enters) and of settled ones (most rows are dropped by
    the order columns alone) emit exactly the per-row TopN's rows, ranks and order."""
    from streamsnap.runtime.operators.top_n import TopN, TopNBatches
    from streamsnap.testing import harness

    top = data.draw(st.integers(1, 3))
    o = order(["price", "ts"], [True, False])
    rows = [{"k": data.draw(st.integers(0, 2)), "price": data.draw(st.integers(0, 5)), "ts": i, "name": "x"}
            for i in range(data.draw(st.integers(1, 60)))]
    sizes = data.draw(st.lists(st.integers(1, 12), min_size=1, max_size=20))
    per_row = harness(TopN(top, o), key_by="k")
    for row in rows:
        per_row.process(row)
    schema = pa.schema([("k", pa.int64()), ("price", pa.int64()), ("ts", pa.int64()), ("name", pa.string()),
                        ("rank", pa.int64())])
    batched = harness(TopNBatches(top, o, "rank", schema), key_by="k")
    start = 0
    for size in sizes * 60:
        if start >= len(rows):
            break
        batched.process_batch(rows[start:start + size])
        start += size
    if start < len(rows):
        batched.process_batch(rows[start:])
    assert batched.output == per_row.output


@given(data=st.data())
@settings(max_examples=examples(150), deadline=None)
def test_top_n_batches_rank_any_order_columns_as_top_n_does_row_by_row(data):
    """The batch form's integer ranks (one stable Arrow sort of the stored and the batch's
    rows) against the per-row TopN: order columns of every kind (int, float, string, bool,
    timestamp), each direction, few values so rows tie on all of them (a stored row stays
    ahead of a batch row it ties with, batch rows in arrival order), rankings carried from
    batch to batch. A NaN sends its batch row by row, which must agree too."""
    import datetime
    from unittest import mock

    from streamsnap.runtime.operators.top_n import TopN, TopNBatches
    from streamsnap.testing import harness

    columns = {"price": st.integers(-2, 2), "score": st.sampled_from([0.5, -0.0, 0.0, 1.5]),
               "name": st.sampled_from(["", "a", "b", "é"]), "hot": st.booleans(),
               "at": st.sampled_from([datetime.datetime(2026, 11, 30, h) for h in (1, 2)])}
    by = data.draw(st.lists(st.sampled_from(sorted(columns)), min_size=1, max_size=3, unique=True))
    descending = data.draw(st.lists(st.booleans(), min_size=len(by), max_size=len(by)))
    nan = data.draw(st.booleans()) and "score" in by
    top = data.draw(st.integers(1, 4))
    rows = []
    for i in range(data.draw(st.integers(1, 50))):
        row = {"k": data.draw(st.integers(0, 2)), "i": i, **{c: data.draw(v) for c, v in columns.items()}}
        if nan and data.draw(st.integers(0, 9)) == 0:
            row["score"] = float("nan")
        rows.append(row)
    schema = pa.schema([("k", pa.int64()), ("i", pa.int64()), ("price", pa.int64()), ("score", pa.float64()),
                        ("name", pa.string()), ("hot", pa.bool_()), ("at", pa.timestamp("us"))])
    o = RowOrder.of(by, descending, "test", "by", schema)
    per_row = harness(TopN(top, o), key_by="k")
    for row in rows:
        per_row.process(row)
    backend = data.draw(st.sampled_from(["hashmap", "rocksdb"]))    # rocksdb: values through msgpack
    batched = harness(TopNBatches(top, o, "rank", schema.append(pa.field("rank", pa.int64()))), key_by="k",
                      state_backend=backend)
    sizes = data.draw(st.lists(st.integers(1, 15), min_size=1, max_size=10))
    with mock.patch.object(TopNBatches, "_row_by_row", autospec=True,
                           side_effect=TopNBatches._row_by_row) as row_by_row:
        start = 0
        while start < len(rows):
            size = sizes[start % len(sizes)]
            batched.process_batch(rows[start:start + size])
            start += size
    key = lambda r: tuple(("nan" if isinstance(v, float) and v != v else v) for v in r.values())
    assert [key(r) for r in batched.output] == [key(r) for r in per_row.output]
    if not nan:
        assert row_by_row.call_count == 0


def test_emitted_rows_taken_from_the_batch_and_made_from_state_keep_their_order():
    """`emitted`: the batch's own rows are taken from it, the stored ones built from their
    values, interleaved back in emission order; a batch of another schema builds them all."""
    from streamsnap.runtime.operators.top_n import emitted, ranked

    data = pa.schema([("auction", pa.int64()), ("who", pa.string())])
    schema = data.append(pa.field("rank", pa.int64()))
    batch = pa.RecordBatch.from_pylist([{"auction": 1, "who": "a"}, {"auction": 2, "who": "b"}], schema=data)
    own = [[1, "a"], [2, "b"]]
    stored = [[1, "old"], [2, "older"]]
    rows = [stored[0], own[1], stored[1], own[0], own[1]]
    origin = {id(own[0]): 0, id(own[1]): 1}
    expected = pa.RecordBatch.from_pylist(ranked([dict(zip(data.names, r)) for r in rows], 0, "rank"), schema=schema)
    assert emitted(rows, [1, 2, 3, 4, 5], origin, batch, data, schema, "rank").equals(expected)
    other = batch.cast(pa.schema([("auction", pa.int32()), ("who", pa.string())]))
    assert emitted(rows, [1, 2, 3, 4, 5], origin, other, data, schema, "rank").equals(expected)


def test_rankings_of_dicts_restored_into_the_batch_form_rank_on_and_the_reverse_is_refused():
    """The per-row form's rankings (dicts; also what savepoints before value lists hold) are
    read by the batch form by the schema's names, a missing column as null; the per-row form
    cannot name a value-list ranking and fails saying what to declare."""
    from streamsnap.runtime.operators.top_n import TopN, TopNBatches
    from streamsnap.testing import harness

    o = order(["price"], True)
    schema = pa.schema([("k", pa.int64()), ("price", pa.int64()), ("ts", pa.int64()), ("name", pa.string()),
                        ("rank", pa.int64())])
    def pipeline(function, batches):
        def build(stream):
            keyed = stream.key_by("k")
            return (keyed.process_batches if batches else keyed.process)(function, uid="top")
        return build

    per_row = harness(pipeline(TopN(2, o), False))
    per_row.process({"k": 1, "price": 5, "ts": 1, "name": "a"})
    per_row.process({"k": 1, "price": 3, "ts": 2})                       # no "name": an older row
    batched = harness(pipeline(TopNBatches(2, o, "rank", schema), True), restore=per_row.snapshot())
    batched.process({"k": 1, "price": 4, "ts": 3, "name": "c"})
    assert batched.output == [{"k": 1, "price": 4, "ts": 3, "name": "c", "rank": 2}]
    batched.process({"k": 1, "price": 9, "ts": 4, "name": "d"})
    assert [(r["price"], r["name"], r["rank"]) for r in batched.output[1:]] == [(9, "d", 1), (5, "a", 2)]
    again = harness(pipeline(TopN(2, o), False), restore=batched.snapshot())
    with pytest.raises(UserFunctionError, match="value lists.*declare the stream's schema"):
        again.process({"k": 1, "price": 10, "ts": 5, "name": "e"})


@pytest.mark.parametrize("by", [["price"], ["price", "ts"]])
def test_top_n_batches_fail_on_a_null_order_value_naming_the_column(by):
    from streamsnap.runtime.operators.top_n import TopNBatches
    from streamsnap.testing import harness

    schema = pa.schema([("k", pa.int64()), ("price", pa.int64()), ("ts", pa.int64()), ("rank", pa.int64())])
    h = harness(TopNBatches(2, RowOrder.of(by, [True] * len(by), "test", "by"), "rank", schema), key_by="k")
    h.process_batch([{"k": 1, "price": 3, "ts": 1}, {"k": 1, "price": 4, "ts": 2}])
    assert [(r["price"], r["rank"]) for r in h.output] == [(3, 1), (4, 1), (3, 2)]
    with pytest.raises(DataError, match="no value in the order column 'price' \\(null\\)"):
        h.process_batch([{"k": 1, "price": 5, "ts": 3}, {"k": 2, "price": None, "ts": 4}])
