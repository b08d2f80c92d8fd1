"""Rows of window partials stored as fixed-width bytes, written and read a batch at a time.

Why: the vectorized window operators keep per (key, window), per (key, slice) or per key's
sessions a row of partial aggregates (flags, int64 counts and sums, float64 sums, minima and
maxima). Stored as msgpack lists, a batch paid a pack per row on write and an unpack plus a
transposition in Python on read (with the rows' lists built from numpy first): about a sixth
of Nexmark q17's window subtask. As bytes, a batch's rows are encoded with one `tobytes` and
decoded with one `frombuffer`.

Layout of a value: a header of one byte per field saying its kind (``i``: int64, ``f``:
float64), then one or more rows (several for a key's sessions), each field a little-endian
8-byte word. The header keeps the state self-describing (a savepoint is read without the job
that wrote it) and lets a field change kind between batches (an int column that becomes
float). Values written before this layout (msgpack lists: a row, or a list of rows) are read
as before; rows holding strings (the min/max of a string column) are still written as lists
(`encode` says so by returning None).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamsnap.state.errors import StateError

_INT, _FLOAT = ord("i"), ord("f")


def encode(columns: Sequence[np.ndarray], counts: np.ndarray | None = None) -> list | None:
    """One value per row of `columns` (numeric arrays of equal length), or, with `counts`, one
    per run of `counts[i]` consecutive rows (None where a count is 0). None when a column is
    not numeric (strings): the caller stores lists."""
    if any(c.dtype == object for c in columns):
        return None
    fields = len(columns)
    rows = len(columns[0])
    header = bytes(_FLOAT if c.dtype.kind == "f" else _INT for c in columns)
    words = np.empty((rows, fields), dtype="<i8")
    for j, column in enumerate(columns):
        if header[j] == _FLOAT:
            words[:, j] = np.asarray(column, dtype="<f8").view("<i8")
        else:
            words[:, j] = column
    width = 8 * fields
    if counts is None:
        size = fields + width
        out = np.empty((rows, size), dtype=np.uint8)
        out[:, :fields] = np.frombuffer(header, dtype=np.uint8)
        out[:, fields:] = words.view(np.uint8).reshape(rows, width)
        raw = out.tobytes()
        return [raw[i:i + size] for i in range(0, rows * size, size)]
    raw = words.tobytes()
    cut = np.r_[0, np.cumsum(counts)].tolist()
    return [header + raw[a * width:b * width] if b > a else None for a, b in zip(cut[:-1], cut[1:])]


def decode(values: Sequence, fields: int, nested: bool = False, owner: str | None = None) -> tuple[np.ndarray, list]:
    """(rows per value, the rows' columns): `values` as `encode` wrote them (None: no rows),
    each column an array (int64 or float64) over the rows of every value in order. Values of
    the older layout are msgpack lists: a row, or with `nested` a list of rows; any of those
    in `values` (or headers that differ) take the per-value path, with columns as tuples.
    `owner`: the operator named in errors."""
    present = [v for v in values if v is not None]
    if present and all(type(v) is bytes for v in present):
        counts, columns = _decode_bytes(present, fields, owner)
        if len(present) == len(values):
            return counts, columns
        out = np.zeros(len(values), dtype=np.int64)
        out[[i for i, v in enumerate(values) if v is not None]] = counts
        return out, columns
    rows: list = []
    counts = np.zeros(len(values), dtype=np.int64)
    for i, value in enumerate(values):
        if value is None:
            continue
        if type(value) is bytes:
            mine = _rows_list(value, fields, owner)
        else:
            mine = value if nested else [value]
        rows += mine
        counts[i] = len(mine)
    if not rows:
        return counts, [() for _ in range(fields)]
    return counts, list(zip(*rows))


def _decode_bytes(values: Sequence[bytes], fields: int, owner: str | None) -> tuple[np.ndarray, list]:
    where = f"operator '{owner}': " if owner else ""
    width = 8 * fields
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    counts, rest = np.divmod(lengths - fields, width)
    if rest.any() or (counts < 1).any():
        bad = int(np.flatnonzero(rest | (counts < 1))[0])
        raise StateError(f"{where}a stored window partial of {lengths[bad]} bytes is not rows of {fields} fields "
                         f"({fields} + a multiple of {width} bytes): the state was written by a job with "
                         f"other aggregates; restore it into the job it was taken from")
    buffer = np.frombuffer(b"".join(values), dtype=np.uint8)
    if (counts == 1).all():
        table = buffer.reshape(len(values), fields + width)
        headers, body = table[:, :fields], table[:, fields:]
    else:
        starts = np.r_[0, np.cumsum(lengths)[:-1]]
        at = starts[:, None] + np.arange(fields)
        headers = buffer[at]
        keep = np.ones(len(buffer), dtype=bool)
        keep[at.ravel()] = False
        body = buffer[keep]
    header = headers[0]
    if not (headers == header).all():
        return decode([_rows_list(v, fields, owner) for v in values], fields, nested=True, owner=owner)
    if not np.isin(header, (_INT, _FLOAT)).all():
        raise StateError(f"{where}a stored window partial has the field kinds {bytes(header)!r}, not i/f: it was "
                         f"not written by this operator")
    words = np.ascontiguousarray(body).view("<i8").reshape(-1, fields).T.copy()
    return counts, [words[j].view("<f8") if header[j] == _FLOAT else words[j] for j in range(fields)]


def _rows_list(value: bytes, fields: int, owner: str | None) -> list:
    """One value's rows as lists of Python numbers (values read one by one)."""
    _, columns = _decode_bytes([value], fields, owner)
    return [list(row) for row in zip(*(c.tolist() for c in columns))]


def with_first_cleared(value, fields: int):
    """A one-row value with its first field (a window's pending flag) set to 0 / False."""
    if type(value) is bytes:
        return value[:fields] + bytes(8) + value[fields + 8:]
    return [False] + value[1:]


__all__ = ["decode", "encode", "with_first_cleared"]
