"""Window Top-N with ties: per window, the rows ranked n or better by one column, emitted when
the window fires (Flink SQL's Window TopN, ``RANK() OVER (PARTITION BY window_start, window_end
ORDER BY by DESC) <= n``).

RANK semantics: a row's rank is 1 + the number of the window's rows strictly better than it,
so rows that tie share a rank and all of them are kept (n = 1 gives every row tied for the
maximum: Nexmark q7). Nulls (and NaN) rank after every value. Each output row is the input
row plus ``window_start``, ``window_end`` (epoch ms, end exclusive) and its rank.

Two phases, as the window aggregates of window_all (window_all.py):

* **local** (`WindowTopNCandidatesOperator`, the upstream's parallelism, no state): per batch,
  numpy ranks each (row, window) pair among the batch's rows of that window (`np.partition`
  for a batch within one window, else a lexsort; no Python per row) and keeps the rows ranked
  n or better in one of their windows. A row of
  the window's final top n has no more better rows in its batch than in the whole window, so
  it is always kept. Rows that may be late at the global stage (a window of theirs late by
  this subtask's watermark, see window_all.py) are all kept, so that the global stage judges
  their lateness (late side output) as one operator would.
* **global** (parallelism 1): the keyed window operator (windows.py) under the constant key,
  its contents `RankContents` — the window's best rows, ties kept, in keyed state — and
  `RankedRows` emitting them with their ranks when the window fires.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.runtime.operators.base import OperatorContext, OperatorFactory
from streamsnap.runtime.operators.window_all import LocalWindowStage
from streamsnap.runtime.operators.windows import WindowContents
from streamsnap.time.windows import WindowAssigner


@dataclass(frozen=True)
class Ranking:
    """Rank by one column: `n` ranks kept, best first (`descending`: the highest value)."""

    n: int
    by: str
    descending: bool = True
    rank_column: str | None = "rank"

    def sort_key(self, row: dict) -> tuple:
        value = row[self.by]
        if value is None or value != value:          # null and NaN rank last
            return (1, 0)
        return (0, -value if self.descending else value)

    def insert(self, top: list, row: dict) -> list:
        """`top` (best first, ranks <= n, ties kept; changed in place) with `row` in its place."""
        key = self.sort_key(row)
        keys = [self.sort_key(r) for r in top]
        better = sum(k < key for k in keys)
        if better >= self.n:
            return top
        at = better + sum(k == key for k in keys)    # after the rows it ties with
        top.insert(at, row)
        keys.insert(at, key)
        if len(top) > self.n:
            last = keys[self.n - 1]
            cut = self.n
            while cut < len(top) and keys[cut] == last:
                cut += 1
            del top[cut:]
        return top

    def ranked(self, top: list, window) -> list[dict]:
        out, rank, previous = [], 0, None
        for position, row in enumerate(top, start=1):
            key = self.sort_key(row)
            if key != previous:
                rank, previous = position, key
            extra = {"window_start": window.start, "window_end": window.end}
            if self.rank_column is not None:
                extra[self.rank_column] = rank
            out.append({**row, **extra})
        return out


class RankContents(WindowContents):
    """A window's best rows (ranks <= n, ties kept), best first."""

    kind = "top_n"

    def __init__(self, ranking: Ranking):
        self.ranking = ranking

    def add(self, contents, row):
        return self.ranking.insert([] if contents is None else contents, row)

    def copy(self, contents):
        return list(contents)          # rows are never changed, only the list

    def merge(self, a, b):
        for row in b:
            a = self.ranking.insert(a, row)
        return a

    def elements(self, contents):
        return list(contents)

    def result(self, contents):
        raise TypeError("a window top-N emits its rows through RankedRows")


class RankedRows:
    """The window function of the global stage: the window's rows with window and rank."""

    def __init__(self, ranking: Ranking):
        self.ranking = ranking

    def process(self, key, context, elements: list) -> list[dict]:
        return self.ranking.ranked(elements, context.window)


def pair_ranks(values: np.ndarray, missing: np.ndarray, starts: np.ndarray, descending: bool) -> np.ndarray:
    """RANK() of each (row, window) pair among the pairs of its window: 1 + how many are
    strictly better (`missing` values rank last, tied with each other)."""
    if values.dtype.kind == "f":
        order_values = -values if descending else values
    else:
        order_values = ~values if descending else values       # ~v = -v - 1: no overflow
    order_values = np.where(missing, 0, order_values)
    order = np.lexsort((order_values, missing, starts))
    s_starts, s_missing, s_values = starts[order], missing[order], order_values[order]
    positions = np.arange(len(order))
    group_first = np.r_[True, s_starts[1:] != s_starts[:-1]]
    value_first = group_first | np.r_[True, (s_values[1:] != s_values[:-1]) | (s_missing[1:] != s_missing[:-1])]
    sorted_ranks = (np.maximum.accumulate(np.where(value_first, positions, 0))
                    - np.maximum.accumulate(np.where(group_first, positions, 0)) + 1)
    ranks = np.empty(len(order), dtype=np.int64)
    ranks[order] = sorted_ranks
    return ranks


def best_pairs(values: np.ndarray, missing: np.ndarray, starts: np.ndarray, n: int,
               descending: bool) -> np.ndarray:
    """Which (row, window) pairs rank `n` or better in their window (`pair_ranks` <= n). A
    batch within one window (the common case) needs no sort: rank <= n is value >= the n-th
    best value, found by `np.partition`."""
    if not len(starts) or starts[0] != starts.min() or starts[0] != starts.max():
        return pair_ranks(values, missing, starts, descending) <= n
    score = values if descending else (-values if values.dtype.kind == "f" else ~values)
    present = score[~missing] if missing.any() else score
    if len(present) < n:           # every value ranks <= n, and the missing ones rank next
        return np.ones(len(score), dtype=bool)
    threshold = np.partition(present, len(present) - n)[len(present) - n]
    return (score >= threshold) & ~missing


def column_for_ranking(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values, missing) of a numeric or boolean column: nulls and NaN are missing."""
    if pa.types.is_boolean(column.type):
        column = pc.cast(column, pa.int64())
    if column.null_count:
        missing = column.is_null().to_numpy(zero_copy_only=False)
        values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
    else:
        missing = np.zeros(len(column), dtype=bool)
        values = column.to_numpy(zero_copy_only=False)
    if values.dtype.kind == "f":
        missing = missing | np.isnan(values)
    else:
        values = values.astype(np.int64, copy=False)
    return values, missing


class WindowTopNCandidatesOperator(LocalWindowStage):
    """The local phase: the rows of each batch that can still make their window's top n."""

    def __init__(self, ctx: OperatorContext, assigner: WindowAssigner, allowed_lateness: int,
                 ranking: Ranking, timestamps):
        super().__init__(ctx, assigner, allowed_lateness, timestamps)
        self.ranking = ranking
        self.reduces = assigner.is_event_time   # processing time: the global stage's clock decides

    def reduce(self, batch: pa.RecordBatch, rows: np.ndarray, starts: np.ndarray, maybe_late: np.ndarray) -> None:
        values, missing = column_for_ranking(batch.column(self.ranking.by))
        keep = np.zeros(batch.num_rows, dtype=bool)
        keep[rows[best_pairs(values[rows], missing[rows], starts, self.ranking.n, self.ranking.descending)]] = True
        keep[rows[maybe_late]] = True
        if keep.all():
            self.output.emit(batch)
        elif keep.any():
            self.output.emit(batch.filter(pa.array(keep)))


@dataclass(frozen=True)
class WindowTopNCandidatesFactory(OperatorFactory):
    assigner: WindowAssigner
    allowed_lateness: int
    ranking: Ranking
    timestamps: object = None
    input_format = "batch"

    def create(self, ctx: OperatorContext) -> WindowTopNCandidatesOperator:
        return WindowTopNCandidatesOperator(ctx, self.assigner, self.allowed_lateness, self.ranking,
                                            self.timestamps)

    def describe(self) -> str:
        return f"window_all({type(self.assigner).__name__}).top_n({self.ranking.n}) (local)"


__all__ = ["Ranking", "RankContents", "RankedRows", "WindowTopNCandidatesOperator",
           "WindowTopNCandidatesFactory", "best_pairs", "pair_ranks"]
