"""Which windows are due, for sliding windows kept as slices (window slicing).

A sliding window of `size` every `slide` is a run of consecutive slices of ``gcd(size,
slide)``: each row belongs to one slice but to ``size / slide`` windows. Keeping one partial
aggregate per (key, slice) instead of per (key, window) adds a row to one state entry, not to
every window it is in, and a window's result is merged from its slices when it fires — the
slice sharing of Flink's window aggregations (`SliceSharedAssigner`, `SliceAssigners.hopping`).

This index (in memory, rebuilt from the keyed state on restore, like the timers of
`AlignedWindowIndex`) lists per slice start the keys with state in that slice, and
`progress`: the time up to which windows have fired — every window whose end - 1 is at or
before it is done. Advancing time makes due the window ends after `progress` that overlap a
registered slice, each merging the slices inside it, and cleans the slices whose last window
is done. Windows end at the slide's boundaries plus the size, so time passing over empty
stretches costs nothing: the next due end is found from the next registered slice.

Sans-I/O: plain Python, no state backend; the operator reads, merges and deletes the slices.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field

from streamsnap.time.watermarks import MIN_WATERMARK
from streamsnap.time.windows import window_start


@dataclass
class DueSlices:
    """What advancing time to `time` makes due: the window `ends` to fire (ascending), the
    slice starts each merges (`windows`, per end), the slices no window needs any more
    (`clean`), and the registrations (`chunks`: start -> [(names, key groups)]) of all of those."""

    time: int
    ends: list[int] = field(default_factory=list)
    windows: list[list[int]] = field(default_factory=list)
    clean: list[int] = field(default_factory=list)
    chunks: dict[int, list[tuple[list, list]]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.ends or self.clean)


class SliceIndex:
    """Slice start -> keys with state in that slice, and the windows' progress."""

    def __init__(self, size: int, slide: int, offset: int = 0, progress: int = MIN_WATERMARK):
        if size <= 0 or slide <= 0:
            raise ValueError(f"window size and slide must be positive, got {size} and {slide}")
        self.size, self.slide, self.offset = size, slide, offset
        self.slice = math.gcd(size, slide)
        self.progress = progress
        self._keys: dict[int, list[tuple[list, list]]] = {}
        self._counts: dict[int, int] = {}

    def __len__(self) -> int:
        """(key, slice) entries registered."""
        return sum(self._counts.values())

    # ------------------------------------------------------------------ geometry
    def slice_start(self, time: int) -> int:
        return window_start(time, self.offset, self.slice)

    def first_end(self, start: int) -> int:
        """The end of the earliest window that contains the slice starting at `start`."""
        earliest = start + self.slice - self.size       # a window must start at or after this
        return window_start(earliest - 1, self.offset, self.slide) + self.slide + self.size

    def last_end(self, start: int) -> int:
        """The end of the latest window that contains the slice starting at `start`."""
        return window_start(start, self.offset, self.slide) + self.size

    def _first_candidate(self) -> int:
        """The earliest window end not yet done (end - 1 after `progress`)."""
        return window_start(self.progress - self.size + 1, self.offset, self.slide) + self.slide + self.size

    # ------------------------------------------------------------------ registration
    def add(self, start: int, keys: list, key_groups: list) -> None:
        """New (key, slice) entries (no state before) in the slice starting at `start`."""
        if not keys:
            return
        self._keys.setdefault(start, []).append((keys, key_groups))
        self._counts[start] = self._counts.get(start, 0) + len(keys)

    def next_time(self) -> int | None:
        """The earliest time at which something becomes due (None: no slice registered)."""
        if not self._keys:
            return None
        first = min(self._keys)
        return min(max(self.first_end(first), self._first_candidate()), self.last_end(first)) - 1

    def due(self, time: int) -> DueSlices:
        """The windows and slices due when time advances to `time` (call `retire` after)."""
        result = DueSlices(time)
        if not self._keys or time <= self.progress:
            return result
        starts = sorted(self._keys)
        end = max(self._first_candidate(), self.first_end(starts[0]))
        while end - 1 <= time:
            i = bisect_left(starts, end - self.size)
            if i == len(starts):
                break
            if starts[i] >= end:            # no slice in this window: jump to the next one's
                end = self.first_end(starts[i])
                continue
            j = bisect_left(starts, end, i)
            result.ends.append(end)
            result.windows.append(starts[i:j])
            end += self.slide
        result.clean = [s for s in starts if self.last_end(s) - 1 <= time]
        for s in sorted({s for w in result.windows for s in w} | set(result.clean)):
            result.chunks[s] = self._keys[s]
        return result

    def retire(self, due: DueSlices) -> None:
        """`due`'s windows fired and its clean slices were deleted; progress is `due.time`."""
        for start in due.clean:
            self._keys.pop(start, None)
            self._counts.pop(start, None)
        self.progress = max(self.progress, due.time)


__all__ = ["DueSlices", "SliceIndex"]
