"""Window partials as fixed-width bytes (`partial_rows`): round trips of every numeric kind,
runs of rows per key, values of the older msgpack-list layout and of other field kinds read
alongside, and the refusal of bytes that are not rows of the operator's fields."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsnap.runtime.operators import partial_rows
from streamsnap.state.errors import StateError

_INTS = st.integers(-2**63, 2**63 - 1)
_FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=64)


@st.composite
def _table(draw):
    kinds = draw(st.lists(st.sampled_from("ifb"), min_size=1, max_size=7))
    rows = draw(st.integers(0, 12))
    columns = []
    for kind in kinds:
        values = draw(st.lists({"i": _INTS, "f": _FLOATS, "b": st.booleans()}[kind], min_size=rows, max_size=rows))
        columns.append(np.array(values, dtype={"i": np.int64, "f": np.float64, "b": bool}[kind]))
    return columns


def _same(decoded, columns):
    assert len(decoded) == len(columns)
    for got, want in zip(decoded, columns):
        got = np.asarray(got)
        assert got.dtype.kind == ("f" if want.dtype.kind == "f" else "i")
        np.testing.assert_array_equal(got, want.astype(got.dtype))
        if want.dtype.kind == "f":    # bit for bit: -0.0 and NaN payloads too
            assert got.tobytes() == want.tobytes()


@settings(max_examples=200, deadline=None)
@given(_table())
def test_rows_round_trip_bit_for_bit(columns):
    values = partial_rows.encode(columns)
    assert len(values) == len(columns[0]) and all(type(v) is bytes for v in values)
    counts, decoded = partial_rows.decode(values, len(columns))
    assert counts.tolist() == [1] * len(values)
    if values:
        _same(decoded, columns)


@settings(max_examples=200, deadline=None)
@given(_table(), st.data())
def test_runs_of_rows_per_key_round_trip_with_empty_keys_as_none(columns, data):
    rows = len(columns[0])
    cuts = sorted(data.draw(st.lists(st.integers(0, rows), max_size=5)))
    counts = np.diff([0, *cuts, rows])
    values = partial_rows.encode(columns, counts)
    assert [v is None for v in values] == (counts == 0).tolist()
    got_counts, decoded = partial_rows.decode(values + [None], len(columns), nested=True)
    assert got_counts.tolist() == counts.tolist() + [0]
    if rows:
        _same(decoded, columns)
        per_key = [list(map(list, zip(*(c.tolist() for c in partial_rows.decode([v], len(columns), nested=True)[1]))))
                   for v in values if v is not None]
        flat = list(map(list, zip(*(c.tolist() for c in decoded))))
        expected = [flat[a:b] for a, b in zip(np.r_[0, np.cumsum(counts)][:-1], np.cumsum(counts)) if b > a]
        assert repr(per_key) == repr(expected)          # (NaN != NaN: compared as text)


def test_lists_of_the_older_layout_and_other_field_kinds_read_alongside():
    ints = partial_rows.encode([np.array([1, 0]), np.array([3, 4])])
    floats = partial_rows.encode([np.array([1]), np.array([2.5])])
    counts, columns = partial_rows.decode([ints[0], [True, 7], floats[0], ints[1]], 2)
    assert counts.tolist() == [1, 1, 1, 1]
    assert [list(c) for c in columns] == [[1, True, 1, 0], [3, 7, 2.5, 4]]
    # sessions: a key's rows as a list of lists
    sessions = partial_rows.encode([np.array([10, 20]), np.array([15, 25])], np.array([2]))
    counts, columns = partial_rows.decode([[[1, 2], [3, 4]], None, sessions[0]], 2, nested=True)
    assert counts.tolist() == [2, 0, 2] and [list(c) for c in columns] == [[1, 3, 10, 20], [2, 4, 15, 25]]
    assert partial_rows.with_first_cleared(ints[0], 2) == partial_rows.encode([np.array([0]), np.array([3])])[0]
    assert partial_rows.with_first_cleared([True, 3], 2) == [False, 3]


def test_strings_are_left_to_lists():
    assert partial_rows.encode([np.array([1]), np.array(["a"], dtype=object)]) is None


@pytest.mark.parametrize("value", [b"ii" + bytes(15), b"i" + bytes(8), b"xx" + bytes(16)])
def test_bytes_that_are_not_rows_of_these_fields_fail_naming_the_state(value):
    with pytest.raises(StateError, match="window partial"):
        partial_rows.decode([value], 2)
    with pytest.raises(StateError, match="operator 'q17 window': a stored window partial"):
        partial_rows.decode([value], 2, owner="q17 window")
