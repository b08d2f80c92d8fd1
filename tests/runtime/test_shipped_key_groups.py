"""Key groups shipped by a hash edge's sender (runtime/shipped_key_groups.py): the keyed
receiver scopes its state with exactly the key groups it would compute itself, never shows the
column to the user's function, and keys batches without it as before."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import streamsnap as ss
from streamsnap.clock import ManualScheduler
from streamsnap.graph.keys import KeySelector
from streamsnap.graph.partitioners import KeyGroupPartitioner
from streamsnap.network.frames import decode_batches, encode_batches
from streamsnap.runtime import shipped_key_groups
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.runtime.operators.process import KeyedProcessOperator
from streamsnap.state.key_groups import assign_to_key_group
from tests.runtime.support import Sink

MAX_PARALLELISM = 128


class SeenKeyGroups(ss.KeyedProcessFunction):
    """Emits each row as the function saw it, with the key group its state was scoped to."""

    def open(self, ctx):
        self.count = ctx.get_state(ss.ValueStateDescriptor("count", default=0))

    def process_element(self, row, ctx):
        self.count.update(self.count.value() + 1)
        yield {**row, "kg": self.count._backend._current_key_group, "count": self.count.value()}


def keyed_operator(key) -> tuple[KeyedProcessOperator, Sink]:
    clock = ManualScheduler()
    ctx = OperatorContext(name="count", uid="count", subtask_index=0, parallelism=1,
                          max_parallelism=MAX_PARALLELISM, attempt=0, job_id="job", task_name="count (1/1)",
                          timers=clock, clock=clock)
    op = KeyedProcessOperator(ctx, SeenKeyGroups(), KeySelector.of(key))
    op.output = Output([sink := Sink()])
    op.initialize_state()
    op.open()
    return op, sink


def routed(partitioner: KeyGroupPartitioner, batch: pa.RecordBatch, channels: int) -> list[pa.RecordBatch]:
    """What every channel receives: each routed part through the wire format."""
    out = []
    for _, part in partitioner.create_selector(channels, 0).route(batch):
        out.extend(decode_batches(encode_batches([part])))
    return out


@pytest.mark.parametrize("key", ["word", "n", ["word", "n"], lambda r: r["word"][:1]])
def test_the_receiver_uses_the_shipped_key_groups_and_they_are_its_own(key):
    rows = [{"word": f"w{i % 37}", "n": i % 5} for i in range(500)]
    batch = pa.RecordBatch.from_pylist(rows)
    selector = KeySelector.of(key).for_operator("count")
    parts = routed(KeyGroupPartitioner(selector, MAX_PARALLELISM, ship_key_groups=True), batch, 3)
    assert all(p.schema.names[-1] == shipped_key_groups.KEY_GROUP_COLUMN for p in parts)
    shipped, sink_shipped = keyed_operator(key)
    for part in parts:
        shipped.process(part)
    plain, sink_plain = keyed_operator(key)
    for part in routed(KeyGroupPartitioner(selector, MAX_PARALLELISM), batch, 3):
        plain.process(part)
    assert sink_shipped.rows() == sink_plain.rows()
    assert len(sink_shipped.rows()) == 500
    for row in sink_shipped.rows():
        assert shipped_key_groups.KEY_GROUP_COLUMN not in row
        k = selector.keys_of_rows([row])[0]
        assert row["kg"] == assign_to_key_group(k, MAX_PARALLELISM)


def test_only_marked_edges_ship_and_row_lists_are_keyed_by_the_receiver():
    rows = [{"word": f"w{i % 7}"} for i in range(50)]
    unmarked = KeyGroupPartitioner(KeySelector.of("word"), MAX_PARALLELISM)
    for _, part in unmarked.create_selector(2, 0).route(pa.RecordBatch.from_pylist(rows)):
        assert shipped_key_groups.KEY_GROUP_COLUMN not in part.schema.names
    marked = KeyGroupPartitioner(KeySelector.of("word"), MAX_PARALLELISM, ship_key_groups=True)
    op, sink = keyed_operator("word")
    for _, part in marked.create_selector(2, 0).route(rows):
        assert isinstance(part, list)          # a few rows routed as dicts: nothing to attach to
        op.process(part)
    assert len(sink.rows()) == 50
    assert all(r["kg"] == assign_to_key_group(r["word"], MAX_PARALLELISM) for r in sink.rows())


def test_a_user_field_of_the_same_name_is_not_taken_for_the_shipped_column():
    batch = pa.RecordBatch.from_pydict({"word": ["a", "b"], shipped_key_groups.KEY_GROUP_COLUMN: [7, 9]})
    assert shipped_key_groups.detach(batch) == (batch, None)
    op, sink = keyed_operator("word")
    op.process(batch)
    assert [r[shipped_key_groups.KEY_GROUP_COLUMN] for r in sink.rows()] == [7, 9]
    assert [r["kg"] for r in sink.rows()] == [assign_to_key_group(w, MAX_PARALLELISM) for w in "ab"]


def test_key_groups_beyond_int16_are_shipped_wide():
    batch = pa.RecordBatch.from_pydict({"k": [1, 2, 3]})
    attached = shipped_key_groups.attach(batch, np.array([0, 40_000, 65_535]), 1 << 16)
    assert shipped_key_groups.detach(attached)[1] == [0, 40_000, 65_535]
    assert shipped_key_groups.detach(attached)[0].equals(batch)


def test_one_channel_is_not_hashed_and_the_receiver_refuses_null_keys_as_data():
    from streamsnap.errors import NullKeyError

    rows = [{"word": "a"}, {"word": None}]
    marked = KeyGroupPartitioner(KeySelector.of("word").for_operator("count"), MAX_PARALLELISM, ship_key_groups=True)
    [(channel, part)] = list(marked.create_selector(1, 0).route(rows))
    assert channel == 0 and part is rows
    op, _ = keyed_operator("word")
    with pytest.raises(NullKeyError, match="field 'word' is None"):
        op.process(pa.RecordBatch.from_pylist(rows))
    with pytest.raises(NullKeyError):
        op.process(rows)
