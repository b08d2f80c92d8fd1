"""A Bloom filter over 64-bit hashes, in numpy, for skipping state lookups of values a distinct
set cannot hold.

Why: a window's `count_distinct` looks up every distinct value of a batch in the window's set,
and on RocksDB most of those lookups are for values the set has never seen (Nexmark q16: 73 %
of 3.6 M lookups on the busy subtask, ~2 µs each, a probe of every level-0 file's filter). A
filter answers "certainly not seen" for those with a few numpy gathers. It is not state: the
window distinct sets (`window_distinct.DistinctSets`) keep one only for windows created in this
process — empty then, so the filter has seen every value they hold — and a restored window has
none and keeps its lookups. A filter never says "not seen" for a value it was given (no false
negatives); it says "maybe" for about 1 % of the others at its capacity.

Scalable: it starts with room for `capacity` values and, each time its newest layer is full,
adds a layer twice as large (a value is maybe seen if any layer says so), so memory follows the
values added. Each layer has two bits per value more than the one before (false positives
~0.8 %, 0.3 %, 0.1 %, ...), so the whole stays under ~1.5 % however many layers it grows.
"""

from __future__ import annotations

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_LOW = np.uint64(0xFFFFFFFF)


def mix(x: np.ndarray) -> np.ndarray:
    """64-bit finalizer (splitmix64's): spreads every input bit over every output bit, so the
    probes below can take their positions from the low and high halves."""
    x = np.asarray(x, dtype=np.uint64)
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class _Layer:
    __slots__ = ("words", "bits", "capacity", "count", "probes")

    def __init__(self, capacity: int, bits_per_value: int):
        self.capacity = capacity
        self.bits = max(64, -(-capacity * bits_per_value // 64) * 64)
        self.words = np.zeros(self.bits // 64, dtype=np.uint64)
        self.count = 0
        self.probes = max(1, round(bits_per_value * 0.693))     # the optimum: ln 2 per bit per value

    def positions(self, hashes: np.ndarray) -> np.ndarray:
        """Bit positions, one row per hash (double hashing: h1 + i * h2)."""
        h1 = hashes & _LOW
        h2 = (hashes >> np.uint64(32)) | np.uint64(1)
        steps = np.arange(self.probes, dtype=np.uint64)
        return (h1[:, None] + steps[None, :] * h2[:, None]) % np.uint64(self.bits)

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        pos = self.positions(hashes)
        got = (self.words[pos >> np.uint64(6)] >> (pos & np.uint64(63))) & np.uint64(1)
        return got.all(axis=1)

    def add(self, hashes: np.ndarray) -> None:
        pos = self.positions(hashes).ravel()
        np.bitwise_or.at(self.words, pos >> np.uint64(6), np.left_shift(np.uint64(1), pos & np.uint64(63)))
        self.count += len(hashes)


class SeenFilter:
    """Hashes added (`add`) and a test for them (`might_contain`): False only for hashes never
    added. Hashes are uint64, already mixed (`mix`)."""

    __slots__ = ("layers",)

    def __init__(self, capacity: int = 1 << 12, bits_per_value: int = 10):
        if capacity < 1 or bits_per_value < 1:
            raise ValueError(f"SeenFilter needs capacity and bits_per_value >= 1, got {capacity}, "
                             f"{bits_per_value}")
        self.layers = [_Layer(capacity, bits_per_value)]

    def might_contain(self, hashes: np.ndarray) -> np.ndarray:
        """Per hash: False when it was certainly never added, True when it may have been."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        out = self.layers[0].contains(hashes)
        for layer in self.layers[1:]:
            rest = np.flatnonzero(~out)
            if not len(rest):
                break
            out[rest] = layer.contains(hashes[rest])
        return out

    def add(self, hashes: np.ndarray) -> None:
        """Remember these hashes (a new layer, twice as large, when the newest one is full)."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        while len(hashes):
            layer = self.layers[-1]
            room = layer.capacity - layer.count
            if room <= 0:
                bits_per_value = round(layer.bits / layer.capacity) + 2
                layer = _Layer(layer.capacity * 2, bits_per_value)
                self.layers.append(layer)
                room = layer.capacity
            layer.add(hashes[:room])
            hashes = hashes[room:]

    @property
    def nbytes(self) -> int:
        return sum(layer.words.nbytes for layer in self.layers)

    def __len__(self) -> int:
        return sum(layer.count for layer in self.layers)


__all__ = ["SeenFilter", "mix"]
