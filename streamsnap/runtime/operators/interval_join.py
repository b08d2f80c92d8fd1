"""The interval join operator: `a.key_by(k).interval_join(b.key_by(k)).between(lower, upper)`.

A left row at time t matches every right row of the same key with a time in
[t + lower, t + upper] (each bound inclusive unless made exclusive). Each side's rows wait in
keyed map state (timestamp -> rows), so they are checkpointed and rescaled with their key group.
A row whose time is below the current watermark is late: every row it could still match has
already been cleaned up, so it is dropped, or sent to its side's late-data output tag. A row is cleaned up by an event-time timer once the
watermark has passed the last time a matching row of the other side could carry; the timer's
namespace says which side's bucket to drop.

Finding the partners of a row does not scan the other side's whole buffer (as Flink's operator
does): a per-key sorted list of the buffered timestamps (`_SortedTimes`, memory only, built
from the map state the first time a key is touched after a start or restore) gives the buckets
in [t + lower, t + upper] by bisection, so the cost follows the matches, not the buffer.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any

from streamsnap.api.functions import Context
from streamsnap.runtime.batches import Batch, rows_of
from streamsnap.runtime.operators.base import OperatorFactory, StreamOperator, _extend_results, user_error
from streamsnap.runtime.operators.keyed import keys_of
from streamsnap.runtime.operators.process import KeyedProcessOperator
from streamsnap.state.descriptors import MapStateDescriptor
from streamsnap.time.timers import MIN_WATERMARK

_SIDES = ("left", "right")


class JoinContext(Context):
    """`ctx` of a ProcessJoinFunction: the pair's timestamps and side outputs."""

    __slots__ = ("_left_ts", "_right_ts")

    def timestamp(self) -> int:
        return max(self._left_ts, self._right_ts)

    def left_timestamp(self) -> int:
        return self._left_ts

    def right_timestamp(self) -> int:
        return self._right_ts


class _SortedTimes:
    """Per key, the sorted timestamps one side's map state holds: an index kept beside the state
    (never checkpointed), rebuilt from the state for a key it does not know yet."""

    __slots__ = ("_buffer", "_times")

    def __init__(self, buffer):
        self._buffer = buffer
        self._times: dict = {}

    def of(self, key) -> list:
        """The current key's sorted times (`key` must be the backend's current key)."""
        times = self._times.get(key)
        if times is None:
            times = self._times[key] = sorted(self._buffer.keys())
        return times

    def add(self, key, ts: int) -> None:
        times = self.of(key)
        i = bisect_left(times, ts)
        if i == len(times) or times[i] != ts:
            times.insert(i, ts)

    def remove(self, key, ts: int) -> None:
        times = self._times.get(key)
        if times is None:
            return
        i = bisect_left(times, ts)
        if i < len(times) and times[i] == ts:
            del times[i]
        if not times:
            del self._times[key]

    def between(self, key, low: int, high: int) -> list:
        times = self.of(key)
        return times[bisect_left(times, low):bisect_right(times, high)]


class IntervalJoinOperator(KeyedProcessOperator):
    """Bounds are int milliseconds, already made inclusive by the factory (an exclusive bound b
    is the inclusive b ± 1 on integer times)."""

    two_inputs = True

    def __init__(self, ctx, function, keys: tuple, timestamps: tuple, lower: int, upper: int,
                 late_tags: tuple = (None, None)):
        super().__init__(ctx, function, keys[0], None)
        self.late_tags = late_tags
        self.keys = keys
        self._timestamps = timestamps
        self.lower = lower
        self.upper = upper
        self.context = JoinContext(self.runtime_context, None)
        self._buffers = None

    def initialize_state(self) -> None:
        super().initialize_state()
        self._buffers = tuple(self.keyed_backend.get_state(MapStateDescriptor(f"_interval_join.{side}"))
                              for side in _SIDES)
        self._times = tuple(_SortedTimes(buffer) for buffer in self._buffers)

    def _timestamp_of(self, index: int, row: dict) -> int:
        context = self.context
        context._assigner, context._row = self._timestamps[index], row
        try:
            ts = Context.timestamp(context)
        finally:
            context._assigner, context._row = None, None
        if ts is None:
            raise ValueError(f"the {_SIDES[index]} row has no event timestamp; an interval join "
                             f"needs both inputs to have timestamps (a watermark strategy)")
        return ts

    def process_input(self, index: int, batch: Batch) -> None:
        rows, columns = rows_of(batch)
        if not rows:
            return
        self.records_in += len(rows)
        keys, groups = keys_of(self, batch, rows, self.keys[index], columns)
        set_key = self.keyed_backend.set_current_key
        own, other = self._buffers[index], self._buffers[1 - index]
        own_times, other_times = self._times[index], self._times[1 - index]
        timers = self.timer_service
        # Relative range of the other side's times that match a row at time t.
        low, high = (self.lower, self.upper) if index == 0 else (-self.upper, -self.lower)
        context = self.context
        join = self.function.process_element
        out: list = []
        late: list = []
        for row, key, group in zip(rows, keys, groups):
            try:
                ts = self._timestamp_of(index, row)
            except Exception as exc:
                raise user_error(self, row, exc) from None
            watermark = timers.current_watermark
            if watermark != MIN_WATERMARK and ts < watermark:
                late.append(row)   # its partners are gone
                continue
            set_key(key, group)
            context.current_key = key
            bucket = own.get(ts)
            own.put(ts, [row] if bucket is None else bucket + [row])
            if bucket is None:
                own_times.add(key, ts)
            for other_ts in other_times.between(key, ts + low, ts + high):
                for partner in other.get(other_ts):
                    left, right = (row, partner) if index == 0 else (partner, row)
                    context._left_ts, context._right_ts = (ts, other_ts) if index == 0 else (other_ts, ts)
                    try:
                        _extend_results(out, join(left, right, context))
                    except Exception as exc:
                        raise user_error(self, {"left": left, "right": right}, exc) from None
            # The last watermark at which a row of the other side can still match this one;
            # the bucket goes once the watermark is past it (+1: a row at the watermark is on time).
            timers.register_event_time_timer(ts + max(high, 0) + 1, _SIDES[index])
        self.output.emit(out)
        if late and self.late_tags[index] is not None:
            self.output.emit_side(self.late_tags[index], late)
        self._flush_side()

    def _fire_timers(self, timers) -> None:
        for timer in timers:
            index = _SIDES.index(timer.namespace)
            high = self.upper if index == 0 else -self.lower
            ts = timer.timestamp - 1 - max(high, 0)
            self._buffers[index].remove(ts)
            self._times[index].remove(timer.key, ts)


@dataclass(frozen=True)
class IntervalJoinOperatorFactory(OperatorFactory):
    function: Any
    keys: tuple
    timestamps: tuple
    lower: int        # inclusive, ms
    upper: int        # inclusive, ms
    late_tags: tuple = (None, None)   # side output tag names for late left / right rows
    keyed = True

    def create(self, ctx) -> StreamOperator:
        return IntervalJoinOperator(ctx, self.function, self.keys, self.timestamps, self.lower, self.upper,
                                    self.late_tags)

    def describe(self) -> str:
        return "interval_join"
