"""How an edge distributes an upstream subtask's batches over the downstream subtasks.

Forward (one-to-one), rebalance (round robin), broadcast (to all) and hash by key group (each
key group belongs to exactly one downstream subtask, contiguous ranges as in Flink, so state can
be redistributed when parallelism changes). The partitioner is the edge's description; at
runtime each writer asks it for a `ChannelSelector` holding its per-writer state. Routing is
vectorized: one stable sort and zero-copy slices per Arrow batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa

from streamsnap.graph.keys import KeySelector
from streamsnap.runtime import shipped_key_groups
from streamsnap.runtime.batches import Batch, num_rows
from streamsnap.state.key_groups import subtasks_for_key_groups


class ChannelSelector(ABC):
    @abstractmethod
    def route(self, batch: Batch) -> Iterator[tuple[int, Batch]]:
        """Yield (channel index, part of the batch) pairs; parts may be empty-free."""


class Partitioner(ABC):
    name: str = "partitioner"
    # Whether every upstream subtask talks to every downstream subtask.
    all_to_all: bool = True

    @abstractmethod
    def create_selector(self, num_channels: int, subtask_index: int) -> ChannelSelector: ...

    def __str__(self) -> str:
        return self.name


class _Single(ChannelSelector):
    def route(self, batch: Batch):
        yield 0, batch


@dataclass(frozen=True, eq=False)
class ForwardPartitioner(Partitioner):
    name = "forward"
    all_to_all = False

    def create_selector(self, num_channels: int, subtask_index: int) -> ChannelSelector:
        if num_channels != 1:
            raise ValueError(f"a forward edge has exactly one channel per subtask, got {num_channels}")
        return _Single()


class _RoundRobin(ChannelSelector):
    def __init__(self, num_channels: int, start: int):
        self._n = num_channels
        self._next = start % num_channels

    def route(self, batch: Batch):
        channel = self._next
        self._next = (channel + 1) % self._n
        yield channel, batch


@dataclass(frozen=True, eq=False)
class RebalancePartitioner(Partitioner):
    """Round robin, batch by batch (a batch is the unit on the wire, so this stays balanced)."""

    name = "rebalance"

    def create_selector(self, num_channels: int, subtask_index: int) -> ChannelSelector:
        return _RoundRobin(num_channels, subtask_index)


class _All(ChannelSelector):
    def __init__(self, num_channels: int):
        self._channels = range(num_channels)

    def route(self, batch: Batch):
        for channel in self._channels:
            yield channel, batch


@dataclass(frozen=True, eq=False)
class BroadcastPartitioner(Partitioner):
    name = "broadcast"

    def create_selector(self, num_channels: int, subtask_index: int) -> ChannelSelector:
        return _All(num_channels)


_MASK_SPLIT_MAX = 8


def sort_key(values: np.ndarray, bound: int) -> np.ndarray:
    """`values` (all in 0..bound-1) in the narrowest unsigned type: NumPy's stable sort of
    8- and 16-bit integers is a radix sort, several times faster than sorting int64."""
    if bound <= 1 << 8:
        return values.astype(np.uint8, copy=False)
    if bound <= 1 << 16:
        return values.astype(np.uint16, copy=False)
    return values


def split_by_channel(batch: Batch, channels: np.ndarray, num_channels: int) -> Iterator[tuple[int, Batch]]:
    """Split `batch` by the per-row channel array, keeping row order within each channel."""
    if num_channels == 1:
        if num_rows(batch):
            yield 0, batch
        return
    if isinstance(batch, pa.RecordBatch):
        if num_channels <= _MASK_SPLIT_MAX:
            # A few comparisons over the channel array beat any sort (O(n) per channel).
            for channel in range(num_channels):
                positions = np.flatnonzero(channels == channel)
                if not positions.size:
                    continue
                yield channel, batch if positions.size == batch.num_rows else batch.take(pa.array(positions))
            return
        order = np.argsort(sort_key(channels, num_channels), kind="stable")
        counts = np.bincount(channels, minlength=num_channels)
        ordered = batch.take(pa.array(order))
        offset = 0
        for channel, count in enumerate(counts.tolist()):
            if count:
                yield channel, ordered.slice(offset, count)
                offset += count
        return
    buckets: list[list] = [[] for _ in range(num_channels)]
    for row, channel in zip(batch, channels.tolist()):
        buckets[channel].append(row)
    for channel, rows in enumerate(buckets):
        if rows:
            yield channel, rows


class _ByKeyGroup(ChannelSelector):
    def __init__(self, key: KeySelector, max_parallelism: int, num_channels: int, ship_key_groups: bool):
        self._key = key
        self._max_parallelism = max_parallelism
        self._n = num_channels
        self._ship = ship_key_groups

    def route(self, batch: Batch):
        if not num_rows(batch):
            return
        if self._n == 1 and self._ship:
            # One channel into a per-row keyed `process`: every key group goes there, and that
            # receiver keys its rows anyway (refusing null keys as a data error, as here).
            yield 0, batch
            return
        key_groups = self._key.key_groups(batch, self._max_parallelism)
        channels = subtasks_for_key_groups(key_groups, self._max_parallelism, self._n)
        if self._ship and isinstance(batch, pa.RecordBatch):
            batch = shipped_key_groups.attach(batch, key_groups, self._max_parallelism)
        yield from split_by_channel(batch, channels, self._n)


@dataclass(frozen=True, eq=False)
class KeyGroupPartitioner(Partitioner):
    """Hash partitioning by key group: key -> key group -> the subtask owning that group.

    ship_key_groups: the routed Arrow batches carry their rows' key groups to the receiver
    (runtime/shipped_key_groups.py); only for an edge into a per-row keyed `process` keyed by
    this very `key` and `max_parallelism`."""

    key: KeySelector
    max_parallelism: int
    ship_key_groups: bool = False
    name = "hash"

    def create_selector(self, num_channels: int, subtask_index: int) -> ChannelSelector:
        return _ByKeyGroup(self.key, self.max_parallelism, num_channels, self.ship_key_groups)

    def __str__(self) -> str:
        return f"hash({self.key.describe()})"
