"""The job graph's layout for the web UI (web/graph_layout.py): columns by longest path,
few crossings, arrows from box to box with their partitioning, and bad graphs named."""

from __future__ import annotations

import pytest

from streamsnap.web.graph_layout import BOX_HEIGHT, BOX_WIDTH, MARGIN, columns, layout, to_json


def test_a_pipeline_runs_left_to_right_one_column_per_task():
    result = layout(["src", "sum", "out"], [("src", "sum", "hash"), ("sum", "out", "rebalance")])
    assert [result.boxes[v].column for v in ("src", "sum", "out")] == [0, 1, 2]
    assert len({result.boxes[v].y for v in ("src", "sum", "out")}) == 1        # one row
    first, second = result.arrows
    assert (first.label, second.label) == ("hash", "rebalance")
    src, total = result.boxes["src"], result.boxes["sum"]
    assert first.points == ((src.x + BOX_WIDTH, src.y + BOX_HEIGHT / 2), (total.x, total.y + BOX_HEIGHT / 2))
    assert first.label_at == ((first.points[0][0] + first.points[1][0]) / 2, src.y + BOX_HEIGHT / 2)
    assert result.width == 2 * MARGIN + 3 * BOX_WIDTH + 2 * (total.x - src.x - BOX_WIDTH)
    assert result.height == 2 * MARGIN + BOX_HEIGHT


def test_a_task_goes_into_the_column_of_its_longest_path_and_boxes_never_overlap():
    # a -> b -> d, a -> d (skips a column), c -> d (a second source)
    edges = [("a", "b", "forward"), ("b", "d", "hash"), ("a", "d", "broadcast"), ("c", "d", "hash")]
    assert columns(["a", "b", "c", "d"], edges) == {"a": 0, "b": 1, "c": 0, "d": 2}
    result = layout(["a", "b", "c", "d"], edges)
    boxes = list(result.boxes.values())
    for i, p in enumerate(boxes):
        for q in boxes[i + 1:]:
            apart = p.x + p.width <= q.x or q.x + q.width <= p.x or p.y + p.height <= q.y or q.y + q.height <= p.y
            assert apart, (p, q)
        assert 0 <= p.x and p.x + p.width <= result.width and 0 <= p.y and p.y + p.height <= result.height
    assert [a.label for a in result.arrows] == ["forward", "hash", "broadcast", "hash"]


def test_barycenter_ordering_uncrosses_two_parallel_pipelines():
    # Listed crosswise: a1 feeds b1 and a2 feeds b2, but b2 is listed before b1.
    edges = [("a1", "b1", "hash"), ("a2", "b2", "hash")]
    result = layout(["a1", "a2", "b2", "b1"], edges)
    assert result.boxes["a1"].row == result.boxes["b1"].row and result.boxes["a2"].row == result.boxes["b2"].row


def test_layout_as_json_and_bad_graphs_named():
    doc = to_json(layout(["s", "t"], [("s", "t", "forward")]))
    assert [n["id"] for n in doc["nodes"]] == ["s", "t"] and doc["edges"][0]["ship_strategy"] == "forward"
    assert layout([], []).boxes == {}
    with pytest.raises(ValueError, match=r"edge s -> x names a vertex that is not in the graph"):
        layout(["s"], [("s", "x", "hash")])
    with pytest.raises(ValueError, match=r"cycle through 'a'"):
        columns(["a", "b"], [("a", "b", "hash"), ("b", "a", "hash")])
