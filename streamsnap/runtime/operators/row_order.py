"""The order of rows by some of their columns, as `deduplicate(order_by=...)` and `top_n(by=...)`
rank them (SQL's ORDER BY inside ROW_NUMBER() OVER).

`RowOrder.before(a, b)` compares two rows column by column, each ascending or descending, with
no sort key built per row: those operators compare a new row with one or a few held rows, so a
comparison costs less than keying every row. Ties are decided by the operators (arrival order).
Checked at build time against the stream's schema when it is known; a null in an order column
fails the job naming the operator, column and row (a rank needs a value to rank by).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.errors import ConfigurationError, DataError
from streamsnap.runtime.schemas import describe_row


def _columns(value, what: str, parameter: str) -> tuple[str, ...]:
    columns = (value,) if isinstance(value, str) else value
    if not isinstance(columns, (list, tuple)) or not columns \
            or not all(isinstance(c, str) and c for c in columns):
        raise ConfigurationError(
            f"{what}: {parameter} takes a column name or a list of column names, got {value!r}")
    return tuple(columns)


@dataclass(frozen=True)
class RowOrder:
    """Rows ordered by `columns`, each descending or not; `before(a, b)`: a ranks ahead of b."""

    columns: tuple[str, ...]
    descending: tuple[bool, ...]

    @classmethod
    def of(cls, columns, descending, what: str, parameter: str, schema: pa.Schema | None = None) -> "RowOrder":
        """Build-time checks: column names (present in `schema` when it is known) and one
        direction for all columns or one per column."""
        columns = _columns(columns, what, parameter)
        if isinstance(descending, bool):
            descending = (descending,) * len(columns)
        elif not isinstance(descending, (list, tuple)) or len(descending) != len(columns) \
                or not all(isinstance(d, bool) for d in descending):
            raise ConfigurationError(
                f"{what}: descending must be True/False or a list of one True/False per column of "
                f"{parameter}={list(columns)}, got {descending!r}")
        if schema is not None:
            for column in columns:
                if column not in schema.names:
                    raise ConfigurationError(
                        f"{what}: {parameter} names the column {column!r}, which the stream does not "
                        f"have (its columns: {', '.join(schema.names)}); name one of them, or add the "
                        f"column with map first")
        return cls(columns, tuple(descending))

    def __post_init__(self) -> None:
        # One C call reads a row's order values; with one direction for every column they
        # compare as tuples (or scalars) without a Python loop.
        object.__setattr__(self, "_values", itemgetter(*self.columns))
        object.__setattr__(self, "_direction", self.descending[0] if len(set(self.descending)) == 1 else None)

    def before(self, a: dict, b: dict) -> bool:
        """True when row a ranks strictly ahead of row b."""
        direction = self._direction
        if direction is not None:
            values = self._values
            return values(a) > values(b) if direction else values(a) < values(b)
        column = self.columns[0]   # mixed directions: most rows differ in the first column
        x, y = a[column], b[column]
        if x != y:
            return (x > y) if self.descending[0] else (x < y)
        for column, descending in zip(self.columns[1:], self.descending[1:]):
            x, y = a[column], b[column]
            if x != y:
                return (x > y) if descending else (x < y)
        return False

    def values(self, row: dict):
        """The row's order values, as `before_values` compares them (one value for one column)."""
        return self._values(row)

    def before_values(self, a, b) -> bool:
        """`before` for order values (`values`): a ranks strictly ahead of b."""
        direction = self._direction
        if direction is not None:
            return a > b if direction else a < b
        for x, y, descending in zip(a, b, self.descending):
            if x != y:
                return (x > y) if descending else (x < y)
        return False

    def ranks(self, columns: list[np.ndarray]) -> np.ndarray | None:
        """Dense ranks of the rows given as one array per order column: ``rank[a] < rank[b]``
        exactly when row a is before row b, ties equal. None when a column is not integer,
        float or string, or holds NaN (the per-row comparison decides those)."""
        codes = []
        for values, descending in zip(columns, self.descending):
            if values.dtype.kind == "f" and np.isnan(values).any():
                return None
            if values.dtype.kind not in "iuf" and not (values.dtype.kind == "O" and _all_str(values)):
                return None
            inverse = np.unique(values, return_inverse=True)[1].reshape(-1).astype(np.int64)
            codes.append(-inverse if descending else inverse)
        order = np.lexsort(codes[::-1])          # lexsort's last key is the primary one
        ordered = np.stack([c[order] for c in codes])
        step = np.r_[True, (ordered[:, 1:] != ordered[:, :-1]).any(axis=0)] if len(order) else np.zeros(0, bool)
        ranks = np.empty(len(order), dtype=np.int64)
        ranks[order] = np.cumsum(step) - 1
        return ranks

    def stable_order(self, columns: list[pa.Array]) -> np.ndarray | None:
        """Row positions best first, given one Arrow array per order column; rows that tie
        keep their position order (one stable Arrow sort, any type Arrow orders: numbers,
        strings, timestamps, dates, decimals). None when a column holds a null or a NaN, which
        have no place in this order, or is of another type (the per-row comparison decides
        those)."""
        for values in columns:
            if not _sortable(values.type) or values.null_count:
                return None
            if pa.types.is_floating(values.type) and pc.any(pc.is_nan(values)).as_py():
                return None
        table = pa.RecordBatch.from_arrays(columns, names=[str(i) for i in range(len(columns))])
        keys = [(str(i), "descending" if d else "ascending") for i, d in enumerate(self.descending)]
        return pc.sort_indices(table, sort_keys=keys).to_numpy().astype(np.int64)

    def check(self, row: dict, operator: str) -> None:
        """Fails on a row without a value to rank by (DataError naming operator, column, row)."""
        try:
            values = self._values(row)
            if values is not None and (len(self.columns) == 1 or None not in values):
                return
        except KeyError:
            pass
        for column in self.columns:
            if row.get(column) is None:
                raise DataError(
                    f"operator '{operator}': the row has no value in the order column '{column}' "
                    f"({'missing' if column not in row else 'null'})\n  row: {describe_row(row)}\n"
                    f"  fix: filter such rows out or fill the column before ranking",
                    operator=operator, field=column, row=row)


def _sortable(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
            or pa.types.is_temporal(t) or pa.types.is_decimal(t))


def _all_str(values: np.ndarray) -> bool:
    return all(v.__class__ is str for v in values.tolist())


__all__ = ["RowOrder"]
