"""A Bloom filter over 64-bit hashes, in numpy, for skipping state lookups of values a distinct
set cannot hold.

Why: a window's `count_distinct` looks up every distinct value of a batch in the window's set,
and on RocksDB most of those lookups are for values the set has never seen (Nexmark q16: 73 %
of 3.6 M lookups on the busy subtask, ~2 µs each, a probe of every level-0 file's filter). A
filter answers "certainly not seen" for those with a few numpy operations. It is not state: the
window distinct sets (`window_distinct.DistinctSets`) keep one only for windows created in this
process — empty then, so the filter has seen every value they hold — and a restored window has
none and keeps its lookups. The vectorized window operator keeps one per window start of the
windows its index holds (all that have state, restored ones included), so a window new to a
batch is known new without a lookup. A filter never says "not seen" for a value it was given (no false
negatives); it says "maybe" for about 1 % of the others.

Blocked: a value's `PROBES` bits all lie in one 64-bit word (chosen by the hash's low bits, the
bits by six 6-bit fields of its high ones), so a test is one gather and a compare per value and
an insert one OR, instead of a gather per probe; the price, more false positives at the same
size, is paid in bits per value (16 rather than 10). Scalable: it starts with room for
`capacity` values and, each time its newest layer is full, adds a layer four times as large (a value
is maybe seen if any layer says so), so memory follows the values added; each layer has more
bits per value than the one before, so the whole stays near 1 % however many layers it grows.
"""

from __future__ import annotations

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
PROBES = 6                       # bits per value, each from a 6-bit field above the word index
_FIELDS = [np.uint64(64 - 6 * (i + 1)) for i in range(PROBES)]
_SIX = np.uint64(63)
_ONE = np.uint64(1)


def mix(x: np.ndarray) -> np.ndarray:
    """64-bit finalizer (splitmix64's): spreads every input bit over every output bit, so the
    word index and the bit fields below are independent."""
    x = np.asarray(x, dtype=np.uint64)
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _masks(hashes: np.ndarray) -> np.ndarray:
    """Each hash's word mask: the bits its six fields (the hash's top 36 bits) name."""
    mask = np.left_shift(_ONE, (hashes >> _FIELDS[0]) & _SIX)
    for shift in _FIELDS[1:]:
        mask |= np.left_shift(_ONE, (hashes >> shift) & _SIX)
    return mask


class _Layer:
    __slots__ = ("words", "capacity", "count", "_index")

    def __init__(self, capacity: int, bits_per_value: int):
        self.capacity = capacity
        words = 1
        while words * 64 < capacity * bits_per_value:      # a power of two: index by mask
            words *= 2
        self.words = np.zeros(words, dtype=np.uint64)
        self._index = np.uint64(words - 1)                 # word index from the low bits (< 2**28 words)
        self.count = 0

    def contains(self, hashes: np.ndarray, masks: np.ndarray) -> np.ndarray:
        return (self.words[hashes & self._index] & masks) == masks

    def add(self, hashes: np.ndarray, masks: np.ndarray) -> None:
        np.bitwise_or.at(self.words, hashes & self._index, masks)
        self.count += len(hashes)


def name_hashes(names: list) -> np.ndarray:
    """Mixed uint64 hashes of hashable Python values (state keys such as (key, window start)),
    by Python's hash: filters live in one process, so its per-process string seed is harmless."""
    return mix(np.fromiter((hash(n) for n in names), dtype=np.int64, count=len(names)).view(np.uint64))


def _by_start(starts: np.ndarray) -> list:
    """(start, positions of `starts` equal to it) per distinct value of `starts` (ints)."""
    distinct, inverse = np.unique(starts, return_inverse=True)
    if len(distinct) == 1:
        return [(distinct[0].item(), slice(None))]
    return [(start, np.flatnonzero(inverse == i)) for i, start in enumerate(distinct.tolist())]


class SeenFilter:
    """Hashes added (`add`) and a test for them (`might_contain`): False only for hashes never
    added. Hashes are uint64, already mixed (`mix`)."""

    __slots__ = ("layers", "bits_per_value")

    def __init__(self, capacity: int = 1 << 12, bits_per_value: int = 16):
        if capacity < 1 or bits_per_value < 1:
            raise ValueError(f"SeenFilter needs capacity and bits_per_value >= 1, got {capacity}, "
                             f"{bits_per_value}")
        self.bits_per_value = bits_per_value
        self.layers = [_Layer(capacity, bits_per_value)]

    def might_contain(self, hashes: np.ndarray) -> np.ndarray:
        """Per hash: False when it was certainly never added, True when it may have been."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        masks = _masks(hashes)
        out = self.layers[0].contains(hashes, masks)
        for layer in self.layers[1:]:
            rest = np.flatnonzero(~out)
            if not len(rest):
                break
            out[rest] = layer.contains(hashes[rest], masks[rest])
        return out

    def add(self, hashes: np.ndarray) -> None:
        """Remember these hashes (a new layer, four times as large, when the newest one is full)."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        masks = _masks(hashes)
        while len(hashes):
            layer = self.layers[-1]
            room = layer.capacity - layer.count
            if room <= 0:
                layer = _Layer(layer.capacity * 4, self.bits_per_value + 2 * len(self.layers))
                self.layers.append(layer)
                room = layer.capacity
            layer.add(hashes[:room], masks[:room])
            hashes, masks = hashes[room:], masks[room:]

    @property
    def nbytes(self) -> int:
        return sum(layer.words.nbytes for layer in self.layers)

    def __len__(self) -> int:
        return sum(layer.count for layer in self.layers)


class FiltersByStart:
    """A `SeenFilter` per window start: what is kept about a start's windows goes with them
    (`drop` when the start is cleaned up)."""

    __slots__ = ("filters",)

    def __init__(self):
        self.filters: dict[int, SeenFilter] = {}

    def add(self, starts: np.ndarray, hashes: np.ndarray) -> None:
        """Remember `hashes[i]` under window start `starts[i]`."""
        for start, positions in _by_start(starts):
            seen = self.filters.get(start)
            if seen is None:
                seen = self.filters[start] = SeenFilter()
            seen.add(hashes[positions])

    def might_contain(self, starts: np.ndarray, hashes: np.ndarray, unknown: bool) -> np.ndarray:
        """Per hash, whether its start's filter may hold it; `unknown` for a start with none."""
        out = np.full(len(hashes), unknown, dtype=bool)
        for start, positions in _by_start(starts):
            seen = self.filters.get(start)
            if seen is not None:
                out[positions] = seen.might_contain(hashes[positions])
        return out

    def drop(self, start: int) -> None:
        self.filters.pop(start, None)

    def __len__(self) -> int:
        return len(self.filters)


__all__ = ["FiltersByStart", "SeenFilter", "mix", "name_hashes"]
