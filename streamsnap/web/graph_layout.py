"""Where the web UI draws each task of the job graph: a layered left-to-right layout (pure).

The UI draws the job graph as a picture (boxes for tasks, arrows labelled with their
partitioning), as Flink's dashboard does. Job graphs are small DAGs, so a simple Sugiyama-style
layout is enough and keeps the page free of a graph library: each vertex goes into the column
of its longest path from a source, columns are ordered by the mean row of their inputs
(barycenter sweeps, fewer crossings), and an edge runs from the right side of its source box
to the left side of its target box, its label at its middle. Coordinates are SVG user units.
"""

from __future__ import annotations

from dataclasses import dataclass

BOX_WIDTH = 230
BOX_HEIGHT = 92
COLUMN_GAP = 110
ROW_GAP = 36
MARGIN = 16
SWEEPS = 4


@dataclass(frozen=True)
class Box:
    id: str
    column: int
    row: int
    x: float
    y: float
    width: float = BOX_WIDTH
    height: float = BOX_HEIGHT


@dataclass(frozen=True)
class Arrow:
    source: str
    target: str
    label: str                          # the partitioning: forward, hash, rebalance, broadcast
    points: tuple[tuple[float, float], ...]
    label_at: tuple[float, float]


@dataclass(frozen=True)
class Layout:
    boxes: dict[str, Box]
    arrows: tuple[Arrow, ...]
    width: float
    height: float


def columns(vertices: list[str], edges: list[tuple[str, str, str]]) -> dict[str, int]:
    """Each vertex's column: the length of its longest path from a source (0 for sources)."""
    known = set(vertices)
    inputs: dict[str, list[str]] = {v: [] for v in vertices}
    for source, target, _ in edges:
        if source not in known or target not in known:
            raise ValueError(f"edge {source} -> {target} names a vertex that is not in the graph {sorted(known)}")
        inputs[target].append(source)
    column: dict[str, int] = {}
    visiting: set[str] = set()

    def depth(v: str) -> int:
        if v in column:
            return column[v]
        if v in visiting:
            raise ValueError(f"the job graph has a cycle through {v!r}; a job graph is a DAG")
        visiting.add(v)
        column[v] = max((depth(u) + 1 for u in inputs[v]), default=0)
        visiting.discard(v)
        return column[v]

    for v in vertices:
        depth(v)
    return column


def _order(vertices: list[str], edges: list[tuple[str, str, str]], column: dict[str, int]) -> list[list[str]]:
    """Vertices per column, ordered to cross few edges: barycenter sweeps, left-to-right then back."""
    layers: list[list[str]] = [[] for _ in range(max(column.values(), default=-1) + 1)]
    for v in vertices:                      # the graph's own order first: stable, deterministic
        layers[column[v]].append(v)
    inputs: dict[str, list[str]] = {v: [] for v in vertices}
    outputs: dict[str, list[str]] = {v: [] for v in vertices}
    for source, target, _ in edges:
        inputs[target].append(source)
        outputs[source].append(target)

    def sweep(layer_indices, neighbours):
        for i in layer_indices:
            position = {v: p for layer in layers for p, v in enumerate(layer)}

            def centre(v: str, here: int) -> float:
                near = neighbours[v]
                return sum(position[u] for u in near) / len(near) if near else float(here)
            layers[i] = sorted(layers[i], key=lambda v: (centre(v, layers[i].index(v)), layers[i].index(v)))

    for _ in range(SWEEPS // 2):
        sweep(range(1, len(layers)), inputs)
        sweep(range(len(layers) - 2, -1, -1), outputs)
    return layers


def layout(vertices: list[str], edges: list[tuple[str, str, str]]) -> Layout:
    """Boxes and arrows for vertex ids (in the graph's order) and (source, target, partitioning) edges."""
    column = columns(vertices, edges)
    layers = _order(vertices, edges, column)
    tallest = max((len(layer) for layer in layers), default=0)
    height = 2 * MARGIN + tallest * BOX_HEIGHT + max(0, tallest - 1) * ROW_GAP
    boxes = {}
    for c, layer in enumerate(layers):
        used = len(layer) * BOX_HEIGHT + max(0, len(layer) - 1) * ROW_GAP
        top = (height - used) / 2              # each column centred vertically
        for r, v in enumerate(layer):
            boxes[v] = Box(v, c, r, MARGIN + c * (BOX_WIDTH + COLUMN_GAP), top + r * (BOX_HEIGHT + ROW_GAP))
    arrows = []
    for source, target, label in edges:
        a, b = boxes[source], boxes[target]
        start = (a.x + a.width, a.y + a.height / 2)
        end = (b.x, b.y + b.height / 2)
        arrows.append(Arrow(source, target, label, (start, end),
                            ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2)))
    width = 2 * MARGIN + len(layers) * BOX_WIDTH + max(0, len(layers) - 1) * COLUMN_GAP
    return Layout(boxes, tuple(arrows), width, height)


def to_json(result: Layout) -> dict:
    """The layout as the job-details document carries it (`plan`)."""
    return {"width": result.width, "height": result.height,
            "nodes": [{"id": b.id, "x": b.x, "y": b.y, "width": b.width, "height": b.height, "column": b.column,
                       "row": b.row} for b in result.boxes.values()],
            "edges": [{"source": a.source, "target": a.target, "ship_strategy": a.label,
                       "points": [list(p) for p in a.points], "label_at": list(a.label_at)} for a in result.arrows]}
