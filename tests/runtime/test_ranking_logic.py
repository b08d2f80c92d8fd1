"""The pure logic of deduplicate and top_n (runtime/operators/deduplicate.py, top_n.py,
row_order.py), row by row without Spark, against plain-Python references."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from streamsnap.errors import ConfigurationError, DataError
from streamsnap.runtime.operators.deduplicate import check_keep, replaces, ttl_config
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
