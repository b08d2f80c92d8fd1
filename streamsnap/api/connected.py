"""Two-input streams: `a.connect(b)` and `a.key_by(k).interval_join(b.key_by(k))`.

A two-input node gets one StreamEdge per upstream of each side, marked with the logical input
it feeds (`input_index` 0 or 1); that mark travels to the job edges and the channels, so the
task knows which input every batch came from (runtime/input.py, runtime/task.py). Keyed
variants partition each side by its own key selector into the same key groups, which is what
lets both sides share the state of a key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from streamsnap.errors import ConfigurationError
from streamsnap.graph.partitioners import KeyGroupPartitioner
from streamsnap.graph.stream_graph import NodeKind, StreamNode
from streamsnap.runtime.schemas import StreamSchema
from streamsnap.time.durations import to_millis

if TYPE_CHECKING:
    from streamsnap.api.datastream import DataStream, KeyedStream


def _check_pair(first: "DataStream", second, what: str) -> None:
    from streamsnap.api.datastream import DataStream

    if not isinstance(second, DataStream):
        raise ConfigurationError(f"{what} takes a DataStream, got {type(second).__name__}")
    if second._env is not first._env:
        raise ConfigurationError(f"{what} of streams from different StreamEnvironments; build both "
                                 f"streams from the same env")


def add_two_input_node(first: "DataStream", second: "DataStream", name: str, uid: str | None, factory,
                       parallelism: int | None, schema, partitioners=(None, None),
                       timestamps=None) -> StreamNode:
    """A node reading `first` as input 0 and `second` as input 1."""
    env = first._env
    if parallelism is None:
        parallelism = env.parallelism
    env._check_parallelism(parallelism, f"parallelism of '{name}'")
    spec = schema if isinstance(schema, StreamSchema) else StreamSchema.of(schema, name)
    node = env._graph.add_node(NodeKind.OPERATOR, name, uid, factory, parallelism, env.max_parallelism,
                               spec.schema)
    node.schema_mode = spec.mode
    node.timestamps = timestamps
    for index, (stream, partitioner) in enumerate(zip((first, second), partitioners)):
        for upstream in stream._upstreams:
            env._graph.add_edge(upstream, node, partitioner if partitioner is not None else stream._partitioner,
                                stream._tag, input_index=index)
    return node


def _same_assigner(a, b):
    """The output's timestamp assigner: the inputs' one when they agree, else none."""
    return a if (a is b or a == b) else None


def _check_function(function, methods: tuple[str, ...], what: str) -> None:
    missing = [m for m in methods if not callable(getattr(function, m, None))]
    if missing:
        raise ConfigurationError(f"{what} needs an object with {', '.join(m + '(...)' for m in methods)}; "
                                 f"{function!r} lacks {', '.join(missing)}")


class ConnectedStreams:
    """Two streams processed together by one CoProcessFunction (rows keep their own types)."""

    def __init__(self, first: "DataStream", second: "DataStream"):
        self.first = first
        self.second = second

    @property
    def keyed(self) -> bool:
        """Whether both inputs are keyed streams (then `process` takes a KeyedCoProcessFunction)."""
        from streamsnap.api.datastream import KeyedStream

        return isinstance(self.first, KeyedStream) and isinstance(self.second, KeyedStream)

    def key_by(self, key1, key2) -> "ConnectedStreams":
        """Key both inputs (`key1` for the first, `key2` for the second); their keys must match."""
        return ConnectedStreams(self.first.key_by(key1), self.second.key_by(key2))

    def process(self, function, *, name: str | None = None, uid: str | None = None,
                parallelism: int | None = None, schema=None):
        """Run a CoProcessFunction, or a KeyedCoProcessFunction when both inputs are keyed."""
        from streamsnap.api.datastream import DataStream, _row_schema
        from streamsnap.api.functions import KeyedCoProcessFunction
        from streamsnap.runtime.operators.co_process import CoProcessOperatorFactory, KeyedCoProcessOperatorFactory

        if callable(getattr(function, "process_broadcast_element", None)):
            raise ConfigurationError(
                f"connect(...).process({type(function).__name__}): a broadcast process function needs "
                f"a broadcast stream that declares its state; connect to "
                f"other.broadcast(ss.MapStateDescriptor('name')) instead of a plain stream")
        _check_function(function, ("process_element1", "process_element2"), "connect(...).process")
        name = name or type(function).__name__
        first, second = self.first, self.second
        ts = (first.timestamp_assigner, second.timestamp_assigner)
        wants_keys = isinstance(function, KeyedCoProcessFunction) or callable(getattr(function, "on_timer", None))
        if not self.keyed:
            if wants_keys:
                raise ConfigurationError(
                    f"connect(...).process({type(function).__name__}) on non-keyed inputs "
                    f"{first._describe()} and {second._describe()}: keyed state and timers are per "
                    f"key, so both inputs must be keyed; use a.key_by(k1).connect(b.key_by(k2)) or "
                    f"connected.key_by(k1, k2)")
            factory = CoProcessOperatorFactory(function, ts)
            node = add_two_input_node(first, second, name, uid, factory, parallelism,
                                      _row_schema(schema, None, "process"), timestamps=_same_assigner(*ts))
            return DataStream(first._env, (node,))
        keyed_first, keyed_second = cast("KeyedStream", first), cast("KeyedStream", second)   # self.keyed
        keys = (keyed_first.key.for_operator(name), keyed_second.key.for_operator(name))
        max_parallelism = first._env.max_parallelism
        keyed_factory = KeyedCoProcessOperatorFactory(function, keys, ts)
        node = add_two_input_node(first, second, name, uid, keyed_factory, parallelism,
                                  _row_schema(schema, None, "process"),
                                  tuple(KeyGroupPartitioner(k, max_parallelism) for k in keys),
                                  timestamps=_same_assigner(*ts))
        return DataStream(first._env, (node,))


    def process_batches(self, function, *, name: str | None = None, uid: str | None = None,
                        parallelism: int | None = None, output_schema=None):
        """Run a KeyedCoBatchFunction: both inputs keyed, a whole Arrow batch of either input per
        call (`process_batch1` / `process_batch2`), keyed state and batch timers shared by both
        (runtime/operators/co_batch_process.py) — the vectorized `process`."""
        from streamsnap.api.datastream import DataStream, _check_schema
        from streamsnap.runtime.operators.co_batch_process import KeyedCoBatchProcessOperatorFactory

        has = [m for m in ("process_element1", "process_element", "process_batch", "process_batch1")
               if callable(getattr(function, m, None))]
        kind = ("a per-row function: run a (Keyed)CoProcessFunction with .process(...) instead"
                if "process_element1" in has or "process_element" in has
                else "a one-input KeyedBatchFunction: two inputs need one batch method each"
                if has == ["process_batch"] else None)
        if kind is not None:
            raise ConfigurationError(
                f"connect(...).process_batches({type(function).__name__}): {kind}; process_batches "
                f"takes an ss.KeyedCoBatchFunction with process_batch1(batch, keys) for the first "
                f"input and process_batch2(batch, keys) for the second")
        _check_function(function, ("process_batch1", "process_batch2"), "connect(...).process_batches")
        name = name or type(function).__name__
        if not self.keyed:
            unkeyed = [f"{which} input {s._describe()}" for which, s in (("first", self.first), ("second", self.second))
                       if not hasattr(s, "key")]
            raise ConfigurationError(
                f"connect(...).process_batches '{name}': the {' and the '.join(unkeyed)} is not keyed; "
                f"a KeyedCoBatchFunction shares keyed state between the inputs, so key both: "
                f"a.key_by(k1).connect(b.key_by(k2)), or connected.key_by(k1, k2)")
        first, second = cast("KeyedStream", self.first), cast("KeyedStream", self.second)
        check_matching_keys(first, second, f"connect(...).process_batches '{name}'")
        keys = (first.key.for_operator(name), second.key.for_operator(name))
        max_parallelism = first._env.max_parallelism
        node = add_two_input_node(first, second, name, uid, KeyedCoBatchProcessOperatorFactory(function, keys),
                                  parallelism, _check_schema(output_schema, "process_batches"),
                                  tuple(KeyGroupPartitioner(k, max_parallelism) for k in keys),
                                  timestamps=_same_assigner(first.timestamp_assigner, second.timestamp_assigner))
        return DataStream(first._env, (node,))


def _key_kind(t: pa.DataType) -> str:
    """Which keys can ever be equal: a key's hash (so its key group) follows its value, not
    its width, so integers of any width meet, as do the string types."""
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_dictionary(t):
        return _key_kind(t.value_type)
    return str(t)


def check_matching_keys(first: "KeyedStream", second: "KeyedStream", where: str) -> None:
    """Build-time check that the two inputs' keys can be equal: as many key columns, of
    comparable types, whenever both keys are columns of known schemas (a key function's type is
    known only when it runs)."""
    a, b = first.key, second.key
    if a.function is not None or b.function is not None:
        return
    if len(a.columns) != len(b.columns):
        raise ConfigurationError(
            f"{where}: the first input is keyed by {len(a.columns)} column(s) {list(a.columns)}, the "
            f"second by {len(b.columns)} {list(b.columns)}; rows of the two meet only on equal keys, "
            f"so key both by the same number of columns, in the same order")
    schemas = (first.schema, second.schema)
    if schemas[0] is None or schemas[1] is None:
        return
    for c1, c2 in zip(a.columns, b.columns):
        t1, t2 = schemas[0].field(c1).type, schemas[1].field(c2).type
        if _key_kind(t1) != _key_kind(t2):
            raise ConfigurationError(
                f"{where}: key column '{c1}' of the first input is {t1} but '{c2}' of the second is "
                f"{t2}; such keys are never equal, so no key would see both inputs; convert one "
                f"(e.g. map_batches with pc.cast) before key_by")


class IntervalJoin:
    """`left.interval_join(right)`: call `.between(lower, upper)` next."""

    def __init__(self, left: "KeyedStream", right: "KeyedStream"):
        self.left = left
        self.right = right

    def between(self, lower, upper) -> "IntervalJoined":
        """Right rows whose time lies in [left time + lower, left time + upper] match (seconds or
        timedelta; negative bounds reach into the past)."""
        low = to_millis(lower, "interval_join lower bound", minimum=None)
        high = to_millis(upper, "interval_join upper bound", minimum=None)
        if low > high:
            raise ConfigurationError(
                f"interval_join.between({lower!r}, {upper!r}): the lower bound is above the upper "
                f"bound, so no pair could ever match; swap them (lower <= upper)")
        return IntervalJoined(self.left, self.right, low, high)


class IntervalJoined:
    def __init__(self, left, right, lower: int, upper: int, lower_inclusive: bool = True,
                 upper_inclusive: bool = True, late_tags: tuple = (None, None)):
        self.left, self.right = left, right
        self.lower, self.upper = lower, upper
        self._lower_inclusive, self._upper_inclusive = lower_inclusive, upper_inclusive
        self._late_tags = late_tags

    def _with(self, **changes) -> "IntervalJoined":
        settings: dict[str, Any] = dict(lower_inclusive=self._lower_inclusive,
                                        upper_inclusive=self._upper_inclusive, late_tags=self._late_tags)
        settings.update(changes)
        return IntervalJoined(self.left, self.right, self.lower, self.upper, **settings)

    def lower_bound_exclusive(self) -> "IntervalJoined":
        return self._with(lower_inclusive=False)

    def upper_bound_exclusive(self) -> "IntervalJoined":
        return self._with(upper_inclusive=False)

    def _late(self, side: int, tag) -> "IntervalJoined":
        from streamsnap.api.functions import OutputTag

        what = ("side_output_left_late_data", "side_output_right_late_data")[side]
        if not isinstance(tag, OutputTag):
            raise ConfigurationError(f"{what} takes an ss.OutputTag, got {tag!r}")
        tags = list(self._late_tags)
        tags[side] = tag
        if tags[0] is not None and tags[1] is not None and tags[0].name == tags[1].name:
            raise ConfigurationError(
                f"{what}({tag.name!r}): the other side's late rows already go to that tag; give each side its own")
        return self._with(late_tags=tuple(tags))

    def side_output_left_late_data(self, tag) -> "IntervalJoined":
        """Left rows behind the watermark (too late to join) go to `tag` instead of being dropped."""
        return self._late(0, tag)

    def side_output_right_late_data(self, tag) -> "IntervalJoined":
        """Right rows behind the watermark (too late to join) go to `tag` instead of being dropped."""
        return self._late(1, tag)

    def process(self, function, *, name: str | None = None, uid: str | None = None,
                parallelism: int | None = None, schema=None):
        """Run a ProcessJoinFunction on every matching (left, right) pair of the same key."""
        from streamsnap.api.datastream import DataStream, _row_schema
        from streamsnap.runtime.operators.interval_join import IntervalJoinOperatorFactory

        _check_function(function, ("process_element",), "interval_join(...).process")
        name = name or type(function).__name__
        lower = self.lower + (0 if self._lower_inclusive else 1)
        upper = self.upper - (0 if self._upper_inclusive else 1)
        if lower > upper:
            raise ConfigurationError(
                f"interval_join '{name}': with exclusive bounds the interval [{self.lower} ms, "
                f"{self.upper} ms] is empty; widen it or keep the bounds inclusive")
        ts = (self.left.timestamp_assigner, self.right.timestamp_assigner)
        for side, assigner, stream in zip(("left", "right"), ts, (self.left, self.right)):
            if assigner is None:
                raise ConfigurationError(
                    f"interval_join '{name}': the {side} input {stream._describe()} has no event "
                    f"timestamps, and an interval join matches rows by event time; give it a "
                    f"watermark strategy with a timestamp assigner (env.from_source(..., "
                    f"watermark_strategy=...) or assign_timestamps_and_watermarks)")
        keys = (self.left.key.for_operator(name), self.right.key.for_operator(name))
        max_parallelism = self.left._env.max_parallelism
        late = tuple(tag.name if tag is not None else None for tag in self._late_tags)
        factory = IntervalJoinOperatorFactory(function, keys, ts, lower, upper, late)
        node = add_two_input_node(self.left, self.right, name, uid, factory, parallelism,
                                  _row_schema(schema, None, "process"),
                                  tuple(KeyGroupPartitioner(k, max_parallelism) for k in keys))
        return DataStream(self.left._env, (node,))


def interval_join(left, right) -> IntervalJoin:
    from streamsnap.api.datastream import KeyedStream

    _check_pair(left, right, "interval_join")
    if not isinstance(left, KeyedStream) or not isinstance(right, KeyedStream):
        raise ConfigurationError(
            "interval_join joins rows of the same key, so both streams must be keyed: "
            "a.key_by(k).interval_join(b.key_by(k))")
    return IntervalJoin(left, right)


def connect(first, second):
    if isinstance(second, BroadcastStream):
        if second._env is not first._env:
            raise ConfigurationError("connect of streams from different StreamEnvironments; build both "
                                     "streams from the same env")
        return BroadcastConnectedStreams(first, second)
    _check_pair(first, second, "connect")
    return ConnectedStreams(first, second)




class BroadcastStream:
    """`stream.broadcast(*map_state_descriptors)`: rows for every subtask of the operator it is
    connected to, which keeps the named broadcast states."""

    def __init__(self, stream: "DataStream", descriptors: tuple):
        from streamsnap.state.descriptors import MapStateDescriptor

        for d in descriptors:
            if not isinstance(d, MapStateDescriptor):
                raise ConfigurationError(
                    f"broadcast(...) takes ss.MapStateDescriptor(name) objects naming the broadcast "
                    f"states, got {d!r}")
        names = [d.name for d in descriptors]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"broadcast(...): two descriptors share a name in {names}; "
                                     f"each broadcast state needs its own name")
        if stream._partitioner is not None:
            raise ConfigurationError("broadcast(descriptor) decides the partitioning itself; call it "
                                     "on a stream without key_by()/rebalance()")
        from streamsnap.api.datastream import DataStream
        from streamsnap.graph.partitioners import BroadcastPartitioner

        self.stream = DataStream(stream._env, stream._upstreams, BroadcastPartitioner(), stream._tag)
        self.descriptors = tuple(descriptors)
        self._env = stream._env


class BroadcastConnectedStreams:
    """A stream connected to a BroadcastStream: `.process(BroadcastProcessFunction)`, or with a
    keyed first stream `.process(KeyedBroadcastProcessFunction)`."""

    def __init__(self, first: "DataStream", broadcast: BroadcastStream):
        self.first = first
        self.broadcast = broadcast

    def process(self, function, *, name: str | None = None, uid: str | None = None,
                parallelism: int | None = None, schema=None):
        from streamsnap.api.datastream import DataStream, KeyedStream, _row_schema
        from streamsnap.api.functions import KeyedBroadcastProcessFunction
        from streamsnap.runtime.operators.broadcast import BroadcastProcessOperatorFactory

        _check_function(function, ("process_element", "process_broadcast_element"),
                        "connect(broadcast_stream).process")
        name = name or type(function).__name__
        first, second = self.first, self.broadcast.stream
        keyed = isinstance(first, KeyedStream)
        wants_keys = isinstance(function, KeyedBroadcastProcessFunction) or callable(
            getattr(function, "on_timer", None))
        if wants_keys and not keyed:
            raise ConfigurationError(
                f"connect(broadcast).process({type(function).__name__}) on the non-keyed stream "
                f"{first._describe()}: keyed state and timers need a keyed stream; use "
                f"stream.key_by(k).connect(rules.broadcast(descriptor)), or a BroadcastProcessFunction")
        ts = (first.timestamp_assigner, second.timestamp_assigner)
        key = cast("KeyedStream", first).key.for_operator(name) if keyed else None
        factory = BroadcastProcessOperatorFactory(function, self.broadcast.descriptors, ts, key)
        node = add_two_input_node(first, second, name, uid, factory, parallelism,
                                  _row_schema(schema, None, "process"), timestamps=ts[0])
        return DataStream(first._env, (node,))




class JoinedStreams:
    """`a.join(b)`: a windowed inner join; `.where(k1).equal_to(k2).window(assigner).apply(fn)`."""

    def __init__(self, first: "DataStream", second: "DataStream", key1=None, key2=None):
        self.first, self.second = first, second
        self._key1, self._key2 = key1, key2

    def where(self, key) -> "JoinedStreams":
        """The first stream's key (column name(s) or function of the row)."""
        return JoinedStreams(self.first, self.second, key, self._key2)

    def equal_to(self, key) -> "JoinedStreams":
        """The second stream's key; rows join when the two keys are equal."""
        if self._key1 is None:
            raise ConfigurationError("join(...).equal_to(k2) comes after .where(k1)")
        return JoinedStreams(self.first, self.second, self._key1, key)

    def window(self, assigner) -> "WindowedJoin":
        from streamsnap.time.windows import WindowAssigner

        if self._key1 is None or self._key2 is None:
            raise ConfigurationError("a windowed join needs both keys: a.join(b).where(k1).equal_to(k2)"
                                     ".window(assigner)")
        if not isinstance(assigner, WindowAssigner):
            raise ConfigurationError(f"join(...).window() takes a window assigner such as "
                                     f"ss.windows.TumblingEventTimeWindows.of(60), got {assigner!r}")
        first = self.first.key_by(self._key1)
        second = self.second.key_by(self._key2)
        if assigner.is_event_time:
            for side, stream in (("first", first), ("second", second)):
                if stream.timestamp_assigner is None:
                    raise ConfigurationError(
                        f"join(...).window({type(assigner).__name__}): the {side} stream "
                        f"{stream._describe()} has no event timestamps; give it a watermark strategy "
                        f"with a timestamp assigner, or use a processing-time assigner")
        return WindowedJoin(first, second, assigner)


class WindowedJoin:
    def __init__(self, first: "KeyedStream", second: "KeyedStream", assigner):
        self.first, self.second, self.assigner = first, second, assigner
        self._trigger = assigner.default_trigger()
        self._lateness = 0

    def allowed_lateness(self, lateness) -> "WindowedJoin":
        """Keep windows this long after the watermark passed them (late rows fire them again)."""
        copy = WindowedJoin(self.first, self.second, self.assigner)
        copy._trigger, copy._lateness = self._trigger, to_millis(lateness, "allowed_lateness")
        return copy

    def apply(self, fn, *, name: str | None = None, uid: str | None = None,
              parallelism: int | None = None, schema=None):
        """`fn(left, right)` (or an object with `join(left, right)`) for every pair of rows of one
        key in one window; it returns a row, several rows (iterable) or None."""
        from streamsnap.api.datastream import DataStream, _row_schema
        from streamsnap.runtime.operators.window_join import WindowJoinOperatorFactory

        if not callable(fn) and not callable(getattr(fn, "join", None)):
            raise ConfigurationError(f"join(...).apply takes a function fn(left, right) or an object "
                                     f"with join(left, right), got {fn!r}")
        name = name or f"Join({type(self.assigner).__name__})"
        keys = (self.first.key.for_operator(name), self.second.key.for_operator(name))
        ts = (self.first.timestamp_assigner, self.second.timestamp_assigner)
        max_parallelism = self.first._env.max_parallelism
        factory = WindowJoinOperatorFactory(keys, ts, self.assigner, self._trigger, self._lateness, fn)
        node = add_two_input_node(self.first, self.second, name, uid, factory, parallelism,
                                  _row_schema(schema, None, "join"),
                                  tuple(KeyGroupPartitioner(k, max_parallelism) for k in keys))
        return DataStream(self.first._env, (node,))


def join(first, second) -> JoinedStreams:
    _check_pair(first, second, "join")
    if first._partitioner is not None or second._partitioner is not None:
        raise ConfigurationError("join(...) keys both streams itself (.where/.equal_to); call it on "
                                 "streams without key_by()/rebalance()")
    return JoinedStreams(first, second)


__all__ = ["ConnectedStreams", "IntervalJoin", "IntervalJoined", "BroadcastStream", "BroadcastConnectedStreams",
           "JoinedStreams", "WindowedJoin", "connect", "interval_join", "join"]
