"""Event-time and processing-time timers of a keyed operator (Flink's InternalTimerService).

A timer is (key, namespace, timestamp): "call me back for this key (and window) at this time".
Timers are keyed state: they must be in every checkpoint, restored with their key, and moved
with their key group when a job is rescaled. So they are stored *in the keyed state backend*,
not beside it: per time domain one MapState (``_timers.<service>.<domain>``) whose entry for a
key maps ``(timestamp, namespace key)`` to True. The backend then snapshots, restores and
redistributes them by key group like any other state (no timer-specific file format, and the
same holds for any backend implementing the keyed state interface).

Firing needs "the earliest timer over all keys", which a per-key map cannot answer, so each
domain also keeps an in-memory heap: an index derived from the backend, rebuilt from it when
the service is created (after the backend restored), never checkpointed. Deleted timers leave
stale heap entries that are skipped when popped, and compacted when they pile up.

Timers fire in timestamp order (ties in registration order), each once; a timer is removed
before it is handed out, so one registered while firing for a time <= the watermark fires in
the same advance. Before handing out a timer the service makes its key the backend's current
key, so `on_timer` reads and writes that key's state, and registers timers for it.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from streamsnap.errors import UsageError
from streamsnap.state.descriptors import MapStateDescriptor
from streamsnap.time.watermarks import MIN_WATERMARK

_COMPACT_MIN_STALE = 64


class TimeDomain(enum.Enum):
    """Which clock a timer follows: EVENT_TIME (watermarks) or PROCESSING_TIME (the wall clock)."""
    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


@dataclass(frozen=True, slots=True)
class Timer:
    """A due timer: the operator's `on_timer` runs for `key` (already the current key)."""

    timestamp: int
    key: Any
    namespace: Any
    domain: TimeDomain


def _identity(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class NamespaceCodec:
    """Namespaces ↔ map keys of the timer state (None, int, str, bytes or tuples of those)."""

    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


# Plain namespaces (None for a KeyedProcessFunction's timers) are stored as they are.
PLAIN_NAMESPACE = NamespaceCodec(_identity, _identity)


class _TimerQueue:
    """One domain's timers: the backend's MapState (the truth) plus a heap (the index)."""

    def __init__(self, backend: Any, state_name: str, domain: TimeDomain, codec: NamespaceCodec):
        self._backend = backend
        self._domain = domain
        self._codec = codec
        self._state = backend.get_state(MapStateDescriptor(state_name))
        self._seq = itertools.count()
        # (key, namespace key, timestamp) -> sequence number of its valid heap entry
        self._live: dict[tuple, int] = {}
        self._heap: list[tuple] = []     # (timestamp, seq, key, key group, namespace key)
        self._stale = 0
        for key_group, key, timers in backend.iter_entries(state_name):
            for timestamp, ns_key in timers:
                self._heap.append(self._index(timestamp, key, key_group, ns_key))
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._live)

    def _index(self, timestamp: int, key: Any, key_group: int, ns_key: Any) -> tuple:
        seq = next(self._seq)
        self._live[(key, ns_key, timestamp)] = seq
        return (timestamp, seq, key, key_group, ns_key)   # the caller puts it on the heap

    def register(self, timestamp: int, namespace: Any) -> None:
        backend = self._backend
        key, ns_key = backend.current_key, self._codec.encode(namespace)
        if (key, ns_key, timestamp) in self._live:
            return
        self._state.put((timestamp, ns_key), True)    # fails clearly without a current key
        heapq.heappush(self._heap, self._index(timestamp, key, backend.current_key_group, ns_key))

    def register_many(self, keys, timestamps: list[int], namespace: Any) -> None:
        """`register` for the distinct keys of a batch (`BatchKeys`), one time each: the new
        timers are stored with one bulk write (`put_all_many`), no current key set per timer."""
        ns_key = self._codec.encode(namespace)
        live = self._live
        fresh = [i for i, (key, timestamp) in enumerate(zip(keys.unique, timestamps))
                 if (key, ns_key, timestamp) not in live]
        if not fresh:
            return
        self._state.put_all_many(keys.subset(fresh), [{(timestamps[i], ns_key): True} for i in fresh])
        heap, unique, groups = self._heap, keys.unique, keys.key_groups
        for i in fresh:
            heapq.heappush(heap, self._index(timestamps[i], unique[i], groups[i], ns_key))

    def delete(self, timestamp: int, namespace: Any) -> None:
        ns_key = self._codec.encode(namespace)
        if self._live.pop((self._backend.current_key, ns_key, timestamp), None) is None:
            return
        self._state.remove((timestamp, ns_key))
        self._stale += 1
        if self._stale > _COMPACT_MIN_STALE and self._stale > len(self._live):
            self._heap = [e for e in self._heap if self._live.get((e[2], e[4], e[0])) == e[1]]
            heapq.heapify(self._heap)
            self._stale = 0

    def _drop_stale_top(self) -> None:
        heap, live = self._heap, self._live
        while heap and live.get((heap[0][2], heap[0][4], heap[0][0])) != heap[0][1]:
            heapq.heappop(heap)
            self._stale -= 1

    def peek(self) -> int | None:
        self._drop_stale_top()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, time: int) -> Timer | None:
        """Remove and return the earliest timer at or before `time`, with its key current."""
        self._drop_stale_top()
        if not self._heap or self._heap[0][0] > time:
            return None
        timestamp, _, key, key_group, ns_key = heapq.heappop(self._heap)
        del self._live[(key, ns_key, timestamp)]
        self._backend.set_current_key(key, key_group)
        self._state.remove((timestamp, ns_key))
        return Timer(timestamp, key, self._codec.decode(ns_key), self._domain)


def _check_time(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise UsageError(f"{what}: timer timestamps are int epoch milliseconds, got "
                        f"{type(value).__name__} {value!r}")
    return int(value)


class InternalTimerService:
    """The timers of one keyed operator, stored in its keyed state backend.

    Create it after the backend was restored (it indexes the restored timers). Registration
    and deletion act on the backend's current key. The task calls `advance_watermark` when the
    input valve emits a watermark and `advance_processing_time` when its wake-up
    (`next_processing_time`) is due, and runs the operator's `on_timer` for each yielded timer
    before taking the next (timers registered meanwhile are considered).
    """

    def __init__(self, backend: Any, name: str = "user-timers",
                 namespace_codec: NamespaceCodec = PLAIN_NAMESPACE):
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"timer service name must be a non-empty str, got {name!r}")
        self.name = name
        self._backend = backend
        self._event = _TimerQueue(backend, f"_timers.{name}.event_time", TimeDomain.EVENT_TIME,
                                  namespace_codec)
        self._processing = _TimerQueue(backend, f"_timers.{name}.processing_time",
                                       TimeDomain.PROCESSING_TIME, namespace_codec)
        self._watermark = MIN_WATERMARK
        self._processing_time = MIN_WATERMARK

    @property
    def current_watermark(self) -> int:
        return self._watermark

    @property
    def current_processing_time(self) -> int:
        """The latest time passed to `advance_processing_time` (ms)."""
        return self._processing_time

    def register_event_time_timer(self, timestamp: int, namespace: Any = None) -> None:
        """Fire at the first watermark >= `timestamp` (registering twice keeps one timer)."""
        self._event.register(_check_time(timestamp, "register_event_time_timer"), namespace)

    def register_processing_time_timer(self, timestamp: int, namespace: Any = None) -> None:
        self._processing.register(_check_time(timestamp, "register_processing_time_timer"),
                                  namespace)

    def register_event_time_timers(self, keys, timestamps: list, namespace: Any = None) -> None:
        """One event-time timer per distinct key of `keys` (a BatchKeys), in bulk."""
        self._event.register_many(keys, [_check_time(t, "register_event_time_timers") for t in timestamps],
                                  namespace)

    def register_processing_time_timers(self, keys, timestamps: list, namespace: Any = None) -> None:
        """One processing-time timer per distinct key of `keys` (a BatchKeys), in bulk."""
        self._processing.register_many(
            keys, [_check_time(t, "register_processing_time_timers") for t in timestamps], namespace)

    def delete_event_time_timer(self, timestamp: int, namespace: Any = None) -> None:
        self._event.delete(_check_time(timestamp, "delete_event_time_timer"), namespace)

    def delete_processing_time_timer(self, timestamp: int, namespace: Any = None) -> None:
        self._processing.delete(_check_time(timestamp, "delete_processing_time_timer"),
                                namespace)

    def advance_watermark(self, watermark: int) -> Iterator[Timer]:
        """Set event time to `watermark`; yields the timers now due, in timestamp order."""
        self._watermark = max(self._watermark, watermark)
        return self._fire(self._event, self._watermark)

    def advance_processing_time(self, now: int) -> Iterator[Timer]:
        """Processing time reached `now` (ms); yields the timers now due, in order."""
        self._processing_time = max(self._processing_time, now)
        return self._fire(self._processing, self._processing_time)

    @staticmethod
    def _fire(queue: _TimerQueue, time: int) -> Iterator[Timer]:
        while (timer := queue.pop_due(time)) is not None:
            yield timer

    def next_processing_time(self) -> int | None:
        """When the shell should wake up for processing-time timers (None: no timer)."""
        return self._processing.peek()

    def next_event_time(self) -> int | None:
        return self._event.peek()

    def num_event_time_timers(self) -> int:
        return len(self._event)

    def num_processing_time_timers(self) -> int:
        return len(self._processing)
