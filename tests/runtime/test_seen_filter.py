"""The Bloom filter of values a window's distinct sets have stored (runtime/operators/seen_filter.py):
never "not seen" for a value it was given, however the values arrive and however many layers
it grows; under 2 % "maybe" for others as it grows; bad sizes refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsnap.runtime.operators.seen_filter import SeenFilter, mix
from tests.properties import examples


@settings(max_examples=examples(60))
@given(st.lists(st.lists(st.integers(-(2 ** 63), 2 ** 63 - 1), max_size=300), max_size=12),
       st.integers(1, 64))
def test_a_value_added_is_never_reported_unseen(batches, capacity):
    seen = SeenFilter(capacity=capacity)
    added: list[int] = []
    for batch in batches:
        hashes = mix(np.array(batch, dtype=np.int64).view(np.uint64))
        seen.add(hashes)
        added.extend(batch)
        everything = mix(np.array(added, dtype=np.int64).view(np.uint64))
        assert seen.might_contain(everything).all()
    assert len(seen) == len(added)


def test_false_positives_stay_near_one_percent_as_it_grows():
    seen = SeenFilter(capacity=1_000)
    rng = np.random.default_rng(3)
    for size in (1_000, 8_000, 60_000):
        seen.add(mix(rng.integers(0, 2 ** 62, size - len(seen), dtype=np.int64).view(np.uint64)))
        others = mix(rng.integers(2 ** 62, 2 ** 63 - 1, 50_000, dtype=np.int64).view(np.uint64))
        assert seen.might_contain(others).mean() < 0.02, size
    assert len(seen.layers) > 3                 # it grew by layers, each four times as large
    assert seen.nbytes < 60_000 * 12            # a few bytes per value, nowhere near a set's


def test_an_empty_filter_has_seen_nothing_and_bad_sizes_are_refused():
    hashes = mix(np.arange(1000, dtype=np.uint64))
    assert not SeenFilter().might_contain(hashes).any()
    with pytest.raises(ValueError, match="capacity and bits_per_value >= 1"):
        SeenFilter(capacity=0)
    with pytest.raises(ValueError, match="capacity and bits_per_value >= 1"):
        SeenFilter(bits_per_value=0)
