import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from streamsnap.graph.keys import KeySelector
from streamsnap.graph.partitioners import (
    BroadcastPartitioner, ForwardPartitioner, KeyGroupPartitioner, RebalancePartitioner, split_by_channel,
)
from streamsnap.state.key_groups import assign_to_key_group, subtask_for_key_group

ROWS = [{"key": f"k{i % 7}", "value": i} for i in range(100)]


def route(partitioner, batch, n, subtask=0):
    out = {}
    for channel, part in partitioner.create_selector(n, subtask).route(batch):
        rows = part.to_pylist() if isinstance(part, pa.RecordBatch) else part
        out.setdefault(channel, []).extend(rows)
    return out


@pytest.mark.parametrize("as_arrow", [False, True])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_hash_partitioning_sends_each_key_to_the_subtask_owning_its_key_group(as_arrow, n):
    batch = pa.RecordBatch.from_pylist(ROWS) if as_arrow else ROWS
    out = route(KeyGroupPartitioner(KeySelector.of("key"), 128), batch, n)
    assert sorted(r["value"] for rows in out.values() for r in rows) == list(range(100))
    for channel, rows in out.items():
        for r in rows:
            assert subtask_for_key_group(128, n, assign_to_key_group(r["key"], 128)) == channel
        values = [r["value"] for r in rows]
        assert values == sorted(values)  # order within a channel is preserved


def test_arrow_and_row_batches_route_identically():
    p = KeyGroupPartitioner(KeySelector.of(["key", "value"]), 64)
    by_rows = route(p, ROWS, 4)
    by_arrow = route(p, pa.RecordBatch.from_pylist(ROWS), 4)
    assert by_rows == by_arrow


def test_function_keys():
    p = KeyGroupPartitioner(KeySelector.of(lambda r: r["value"] % 2), 16)
    out = route(p, ROWS, 2)
    assert {len({r["value"] % 2 for r in rows}) for rows in out.values()} == {1} or len(out) == 1


def test_rebalance_is_round_robin_per_batch_starting_at_the_subtask():
    selector = RebalancePartitioner().create_selector(3, subtask_index=1)
    channels = [next(iter(selector.route([{"v": i}])))[0] for i in range(6)]
    assert channels == [1, 2, 0, 1, 2, 0]


def test_broadcast_and_forward():
    assert sorted(route(BroadcastPartitioner(), ROWS, 3)) == [0, 1, 2]
    assert all(len(rows) == 100 for rows in route(BroadcastPartitioner(), ROWS, 3).values())
    assert list(route(ForwardPartitioner(), ROWS, 1)) == [0]
    with pytest.raises(ValueError):
        ForwardPartitioner().create_selector(2, 0)


def test_split_by_channel_skips_empty_channels():
    batch = pa.RecordBatch.from_pylist([{"v": i} for i in range(4)])
    parts = list(split_by_channel(batch, np.array([2, 0, 2, 2]), 4))
    assert [(c, p.num_rows) for c, p in parts] == [(0, 1), (2, 3)]


@given(st.integers(1, 300).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.integers(0, n - 1), max_size=200))))
def test_split_by_channel_keeps_every_row_in_order_for_any_channel_count(case):
    n, channels = case  # up to 8 channels by masks, more by a radix sort: same result
    batch = pa.RecordBatch.from_pydict({"row": list(range(len(channels)))})
    parts = list(split_by_channel(batch, np.array(channels, dtype=np.int64), n))
    assert [c for c, _ in parts] == sorted({*channels})
    for channel, part in parts:
        assert part.column("row").to_pylist() == [i for i, c in enumerate(channels) if c == channel]


def test_missing_key_column_is_a_clear_error():
    with pytest.raises(KeyError, match="no column 'nope'"):
        route(KeyGroupPartitioner(KeySelector.of("nope"), 8), ROWS, 2)
    with pytest.raises(KeyError, match="no column 'nope'"):
        route(KeyGroupPartitioner(KeySelector.of("nope"), 8), pa.RecordBatch.from_pylist(ROWS), 2)
