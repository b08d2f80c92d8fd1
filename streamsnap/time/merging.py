"""Which session windows exist for a key, and where their state lives (Flink's MergingWindowSet).

Session windows grow and merge as elements arrive, possibly out of order: ``[1, 11)`` and
``[15, 25)`` become one session once an element at 9 arrives. Moving a window's contents and
timers at every merge would be costly, so each in-flight window maps to a *state window*: the
window under which its contents are actually stored, which stays put while the window grows.
When windows merge, the merge function is told the new window, the windows it swallowed, the
state window that survives, and the state windows to fold into it — so the operator merges
contents, trigger state and timers once, and never for a window that did not really change.

The mapping itself is keyed state: persist `to_pairs()` for the current key (e.g. in a
ValueState) and rebuild with `MergingWindowSet(assigner, pairs)` for that key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from streamsnap.time.windows import TimeWindow

# (merge result, windows merged into it, its state window, state windows to fold into that)
MergeFunction = Callable[[TimeWindow, list[TimeWindow], TimeWindow, list[TimeWindow]], None]


class MergingWindowSet:
    """The in-flight windows of one key of a merging assigner, each with its state window."""

    def __init__(self, assigner: Any, pairs: Iterable[tuple[TimeWindow, TimeWindow]] = ()):
        if not getattr(assigner, "is_merging", False):
            raise TypeError(f"MergingWindowSet needs a merging window assigner (session "
                            f"windows), got {type(assigner).__name__}")
        self._assigner = assigner
        self._state_windows: dict[TimeWindow, TimeWindow] = dict(pairs)

    @property
    def windows(self) -> list[TimeWindow]:
        return list(self._state_windows)

    def state_window(self, window: TimeWindow) -> TimeWindow | None:
        """Where `window`'s contents are stored (None: not in flight)."""
        return self._state_windows.get(window)

    def retire_window(self, window: TimeWindow) -> None:
        """The window fired and was purged/cleaned up: forget it."""
        if self._state_windows.pop(window, None) is None:
            raise KeyError(f"window {window} is not in flight for this key")

    def to_pairs(self) -> list[tuple[TimeWindow, TimeWindow]]:
        """(window, state window) pairs, to persist as the key's state."""
        return list(self._state_windows.items())

    def add_window(self, new_window: TimeWindow, merge_function: MergeFunction) -> TimeWindow:
        """Add `new_window`, merging as the assigner decides; returns the window it ended up
        in (the new window itself when nothing merged). Add elements and run triggers only on
        that returned window."""
        results: list[tuple[TimeWindow, list[TimeWindow]]] = []
        self._assigner.merge_windows([*self._state_windows, new_window],
                                     lambda merged, result: results.append((result, merged)))
        resulting = new_window
        for result, merged in results:
            if new_window in merged:
                resulting = result
                if new_window not in self._state_windows:     # it has no state of its own
                    merged = [w for w in merged if w != new_window]
            state_window = self._state_windows[merged[0]]
            swallowed = [self._state_windows.pop(w) for w in merged]
            self._state_windows[result] = state_window
            # Nothing to merge when an existing window only absorbed the new one unchanged.
            if merged != [result]:
                merge_function(result, merged, state_window,
                               [s for s in swallowed if s != state_window])
        if resulting == new_window:
            self._state_windows.setdefault(new_window, new_window)
        return resulting
