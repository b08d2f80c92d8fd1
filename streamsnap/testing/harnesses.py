"""Operator test harnesses: a user's function run by the real operators, without Spark.

Flink tests its users' functions with operator test harnesses; this is the same idea for
streamsnap. `harness(...)` records the function into a stream graph through the public
DataStream API (so a misuse fails with the same build-time error a job would give), builds the
graph's operators from their factories exactly as a task does (`runtime/task.py`), and drives
them by hand: rows go into the operators' `process` / `process_input`, a watermark the test
advances goes through `process_watermark` (firing event-time timers), and processing time is a
manual clock (`testing/clock.py`) whose advance fires the processing-time timers the operators
scheduled. State lives in the real keyed and operator state backends, so `snapshot()` writes a
real checkpoint of the subtask and a restore goes through the same key-group assignment a job
uses — also into another parallelism, where a subtask takes only its key groups.

    import streamsnap as ss
    from streamsnap.testing import harness

    class RunningSum(ss.KeyedProcessFunction):
        def open(self, ctx):
            self.total = ctx.get_state(ss.ValueStateDescriptor("total", default=0))

        def process_element(self, row, ctx):
            self.total.update(self.total.value() + row["value"])
            yield {"key": ctx.current_key, "total": self.total.value()}

    h = harness(RunningSum(), key_by="key")
    h.process({"key": "a", "value": 2}, timestamp=100)
    h.process({"key": "a", "value": 3}, timestamp=200)
    assert h.output == [{"key": "a", "total": 2}, {"key": "a", "total": 5}]
    assert h.state("total", key="a") == 5
    h2 = harness(RunningSum(), key_by="key", restore=h.snapshot(), subtask=(0, 2))

What it runs: a (Keyed)ProcessFunction, a KeyedBatchFunction, windows (`window=assigner` with
a reduce function, AggregateFunction or ProcessWindowFunction), a (Keyed)CoProcessFunction or
KeyedCoBatchFunction (`process1`/`process2`, or `process_batch(rows, input="input2")`), a
(Keyed)BroadcastProcessFunction (`broadcast=descriptor`), or a small pipeline: a function of
input streams returning the stream to observe (`harness(lambda s: s.key_by("k")...)`). The
harness is one subtask of every operator (`subtask=(index, parallelism)`): an edge that
partitions by key hands it only its own key groups, other edges hand it everything.

Timestamps stay in the row as in a job: `timestamps="ts"` (or a function of the row) is the
input stream's assigner. Without one, `process(row, timestamp=ms)` gives a row its timestamp
for as long as that same dict travels through the operators (a function that builds a new row
makes one without a timestamp, as a job's rows without the field have none).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from streamsnap.api.functions import (Function, KeyedBroadcastProcessFunction, KeyedCoProcessFunction,
                                      KeyedProcessFunction, OutputTag)
from streamsnap.api.windowing import ProcessWindowFunction
from streamsnap.checkpoint.handles import OperatorSubtaskState
from streamsnap.graph.partitioners import KeyGroupPartitioner
from streamsnap.graph.stream_graph import NodeKind, StreamGraph, StreamNode
from streamsnap.runtime.operators.base import OperatorContext, Output, StreamOperator
from streamsnap.state.assignment import assign_operator_state
from streamsnap.state.key_groups import key_group_range_for_subtask, subtask_for_key_group
from streamsnap.state.descriptors import MapStateDescriptor
from streamsnap.testing.clock import ManualClock
from streamsnap.time.durations import to_millis
from streamsnap.time.timers import PLAIN_NAMESPACE
from streamsnap.time.timestamps import assign_timestamp
from streamsnap.time.watermarks import MAX_WATERMARK, MIN_WATERMARK, WatermarkStrategy


class HarnessError(ValueError):
    """The harness was used in a way that cannot work; the message names the fix."""


_NO_KEY = object()
_TIMERS = "_timers."


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class RegisteredTimer:
    """A timer waiting in an operator's timer service (`h.timers()`)."""

    domain: str          # "event_time" or "processing_time"
    timestamp: int
    key: Any
    namespace: Any = None   # the window, for a window operator's timers


@dataclass(frozen=True, eq=False)
class Snapshot:
    """What `h.snapshot()` took: every operator's subtask state by uid, and the bytes of the
    files it wrote — self-contained, so a restore needs nothing left on disk."""

    checkpoint_id: int
    max_parallelism: int
    subtask: tuple[int, int]
    states: Mapping[str, OperatorSubtaskState]
    files: Mapping[str, bytes] = field(repr=False)


# ---------------------------------------------------------------------------- plumbing
class _Timestamps:
    """The inputs' timestamp assigner when the test gives none: the `timestamp=` a row was
    pushed with, for as long as that very dict is being processed."""

    def __init__(self):
        self._by_id: dict[int, tuple[dict, int]] = {}

    def add(self, row: dict, timestamp: int) -> None:
        self._by_id[id(row)] = (row, timestamp)

    def clear(self) -> None:
        self._by_id.clear()

    def __call__(self, row: dict) -> int | None:
        hit = self._by_id.get(id(row))
        return hit[1] if hit is not None and hit[0] is row else None

    def __repr__(self) -> str:
        return ("<the test harness's timestamps: this row has none; push it with "
                "process(row, timestamp=ms) or give harness(..., timestamps='field')>")


class _Collector:
    """The end of the observed stream: its rows and watermarks, in order."""

    def __init__(self):
        self.rows: list[dict] = []
        self.watermarks: list[int] = []
        self.statuses: list = []

    def process(self, batch) -> None:
        self.rows.extend(batch if isinstance(batch, list) else batch.to_pylist())

    def process_watermark(self, timestamp: int) -> None:
        self.watermarks.append(timestamp)

    def process_watermark_status(self, status) -> None:
        self.statuses.append(status)


class _HarnessOutput(Output):
    """An operator's Output that keeps the side outputs no edge consumes (a job drops them) for
    `h.side_output(tag)`."""

    def __init__(self, targets: list, side: dict[str, list], unclaimed: dict[str, list]):
        super().__init__(targets, side)
        self._unclaimed = unclaimed

    def emit_side(self, tag: str, rows: list) -> None:
        if tag in self._side:
            super().emit_side(tag, rows)
        elif rows:
            self.records_out += len(rows)
            self._unclaimed.setdefault(tag, []).extend(rows)


class _OperatorInputs:
    """One operator's input side as its task drives it: batches to `process` or, for a
    two-input operator, `process_input(index, ...)`; its watermark is the minimum over its
    incoming edges, handed on only when it advances (the task's input valve)."""

    def __init__(self, operator: StreamOperator, num_edges: int):
        self.operator = operator
        self.two_inputs = bool(getattr(operator, "two_inputs", False))
        self.edge_watermarks = [MIN_WATERMARK] * num_edges
        self.watermark = MIN_WATERMARK

    def process(self, input_index: int, batch) -> None:
        if self.two_inputs:
            self.operator.process_input(input_index, batch)
        else:
            self.operator.process(batch)

    def edge_watermark(self, edge: int, timestamp: int) -> None:
        self.edge_watermarks[edge] = max(self.edge_watermarks[edge], timestamp)
        combined = min(self.edge_watermarks)
        if combined > self.watermark:
            self.watermark = combined
            self.operator.process_watermark(combined)

    def status(self, status) -> None:
        self.operator.process_watermark_status(status)


class _Edge:
    """One stream edge into an operator. A key-partitioned edge hands the subtask only the rows
    of its key groups: upstream operators' other rows would go to other subtasks (dropped), a
    row the test pushes straight into a subtask that does not own its key is a mistake
    (`strict`, raises)."""

    def __init__(self, inputs: _OperatorInputs, edge: int, input_index: int, partitioner,
                 subtask: tuple[int, int], strict: bool, input_name: str):
        self.inputs = inputs
        self.edge = edge
        self.input_index = input_index
        self.strict = strict
        self.input_name = input_name
        self.subtask = subtask
        self.key = partitioner.key if isinstance(partitioner, KeyGroupPartitioner) else None
        self.max_parallelism = partitioner.max_parallelism if self.key is not None else 0

    def _own_rows(self, batch):
        index, parallelism = self.subtask
        rows = batch if isinstance(batch, list) else batch.to_pylist()
        groups = self.key.key_groups(rows, self.max_parallelism).tolist()
        owned = key_group_range_for_subtask(self.max_parallelism, parallelism, index)
        if self.strict:
            for row, group in zip(rows, groups):
                if group not in owned:
                    raise HarnessError(
                        f"row {row!r} has key {self.key.key_of_row(row)!r} in key group {group}, "
                        f"which subtask {index} of {parallelism} does not own (key groups "
                        f"{owned.start}-{owned.end}): a job sends it to subtask "
                        f"{subtask_for_key_group(self.max_parallelism, parallelism, group)}; push "
                        f"only rows of this subtask's keys into input '{self.input_name}' "
                        f"(h.owns_key(key) tells)")
            return batch
        return [row for row, group in zip(rows, groups) if group in owned]

    def process(self, batch) -> None:
        if self.key is not None and self.subtask[1] > 1:
            batch = self._own_rows(batch)
            if not batch:
                return
        self.inputs.process(self.input_index, batch)

    def process_watermark(self, timestamp: int) -> None:
        self.inputs.edge_watermark(self.edge, timestamp)

    def process_watermark_status(self, status) -> None:
        self.inputs.status(status)


@dataclass
class _Input:
    """A harness input: the stream the test pushes rows and watermarks into."""

    name: str
    node: StreamNode
    assigner: Any
    targets: list = field(default_factory=list)
    watermark: int = MIN_WATERMARK


def _check_time(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HarnessError(f"{what} must be an int of epoch milliseconds, got {value!r} "
                           f"({type(value).__name__})")
    return value


def _check_subtask(subtask, max_parallelism: int) -> tuple[int, int]:
    ok = (isinstance(subtask, tuple) and len(subtask) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in subtask)
          and 0 <= subtask[0] < subtask[1] <= max_parallelism)
    if not ok:
        raise HarnessError(f"subtask must be (index, parallelism) with 0 <= index < parallelism "
                           f"<= max_parallelism ({max_parallelism}), got {subtask!r}")
    return subtask


# ---------------------------------------------------------------------------- the harness
class Harness:
    """One subtask of the operators a function or pipeline turns into, driven by the test.

    Build it with `harness(...)`. Rows: `process`, `process_batch`, `process1` / `process2`
    (two inputs), `process_broadcast`. Time: `advance_watermark(ms)`,
    `advance_processing_time(seconds)`, `end_input()`. Results: `output`, `watermarks`,
    `side_output(tag)`, `take_output()`. Inside: `state(name, key=)`, `timers()`, `operator`.
    Checkpoints: `snapshot()`, `notify_checkpoint_complete(id)`, and `restore=` of `harness`.
    """

    def __init__(self, build: Callable, input_names: Sequence[str], *, timestamps=None,
                 max_parallelism: int = 128, subtask: tuple[int, int] = (0, 1),
                 restore: Snapshot | Sequence[Snapshot] | None = None, state_backend: str = "hashmap",
                 processing_time: int = 0, what: str = "pipeline"):
        from streamsnap.api.datastream import DataStream, DataStreamSink
        from streamsnap.api.environment import StreamEnvironment
        from streamsnap.connectors.sources import CollectionSource

        self._subtask = _check_subtask(subtask, max_parallelism)
        self._max_parallelism = max_parallelism
        self.clock = ManualClock(_check_time(processing_time, "processing_time"))
        self._explicit = _Timestamps()
        self._collector = _Collector()
        self._unclaimed: dict[str, list] = {}
        self._checkpoint_id = max((s.checkpoint_id for s in _snapshots(restore)), default=0)
        self._closed = False
        self._what = what

        env = StreamEnvironment(parallelism=1, max_parallelism=max_parallelism,
                                state_backend=state_backend)
        self._state_backend = env.state_backend
        streams, self._inputs = [], []
        for name in input_names:
            assigner = timestamps.get(name) if isinstance(timestamps, dict) else timestamps
            installed = self._explicit if assigner is None else assigner
            strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(installed)
            stream = env.from_source(CollectionSource([]), name=name, watermark_strategy=strategy)
            streams.append(stream)
            self._inputs.append(_Input(name, stream._upstreams[0], assigner))
        result = build(*streams)
        if isinstance(result, DataStreamSink):
            raise HarnessError(f"the {what} ended its stream with sink_to(...); return the stream "
                               f"itself and read it with h.output")
        if not isinstance(result, DataStream):
            raise HarnessError(f"the {what} must return the DataStream to observe (h.output), "
                               f"got {type(result).__name__} {result!r}")
        self._graph: StreamGraph = env._graph
        self._build_operators(result, restore)

    # ------------------------------------------------------------------ building
    def _build_operators(self, result, restore) -> None:
        graph = self._graph
        index, parallelism = self._subtask
        nodes = [n for n in sorted(graph.nodes.values(), key=lambda n: n.id) if n.kind is not NodeKind.SOURCE]
        sinks = [n.name for n in nodes if n.kind is NodeKind.SINK]
        if sinks:
            raise HarnessError(f"the {self._what} has sinks {sinks}; the harness reads the stream "
                               f"the pipeline returns, so return it instead of sink_to(...)")
        restores, files = self._assign_restore(restore, {n.uid for n in nodes})
        with tempfile.TemporaryDirectory(prefix="streamsnap-harness-restore-") as base:
            for relative, data in files.items():
                path = Path(base, relative)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            self.operators: dict[str, StreamOperator] = {}
            for node in nodes:
                ctx = OperatorContext(
                    name=node.name, uid=node.uid, subtask_index=index, parallelism=parallelism,
                    max_parallelism=node.max_parallelism, attempt=0, job_id="test-harness",
                    task_name=f"{node.name} ({index + 1}/{parallelism})",
                    state_backend=self._state_backend, restore=restores.get(node.uid),
                    restore_base=base if node.uid in restores else None,
                    restored_operator=node.uid in restores,
                    restored_checkpoint_id=self._checkpoint_id if node.uid in restores else None,
                    timers=self.clock, clock=self.clock)
                self.operators[node.uid] = node.operator.create(ctx)
            self._wire(nodes, result)
            # As a task: every operator restores its state (reading the files now), then they
            # open from the end of the chain back.
            for node in nodes:
                self.operators[node.uid].initialize_state()
        for node in reversed(nodes):
            self.operators[node.uid].open()
        self._nodes = nodes

    def _wire(self, nodes: list[StreamNode], result) -> None:
        inputs = {n.uid: _OperatorInputs(self.operators[n.uid], len(n.in_edges)) for n in nodes}
        by_id = {inp.node.id: inp for inp in self._inputs}
        targets: dict[tuple[int, str | None], list] = {}
        for node in nodes:
            for position, edge in enumerate(node.in_edges):
                source = by_id.get(edge.source)
                target = _Edge(inputs[node.uid], position, edge.input_index, edge.partitioner,
                               self._subtask, strict=source is not None,
                               input_name=source.name if source is not None else "")
                if source is not None:
                    if edge.tag is not None:
                        raise HarnessError(f"input '{source.name}' is the harness's, and has no side "
                                           f"outputs; take side outputs of an operator's stream")
                    source.targets.append(target)
                else:
                    targets.setdefault((edge.source, edge.tag), []).append(target)
        for upstream in result._upstreams:
            if upstream.id in by_id:
                by_id[upstream.id].targets.append(self._collector)
            else:
                targets.setdefault((upstream.id, result._tag), []).append(self._collector)
        for node in nodes:
            side = {tag: ts for (source, tag), ts in targets.items() if source == node.id and tag is not None}
            self.operators[node.uid].output = _HarnessOutput(targets.get((node.id, None), []), side,
                                                             self._unclaimed)

    def _assign_restore(self, restore, uids: set[str]) -> tuple[dict, dict]:
        """Per uid, what this subtask restores from the snapshot(s) — the key groups it owns and
        its share of operator state, as `assign_operator_state` deals them in a job."""
        snapshots = _snapshots(restore)
        if not snapshots:
            return {}, {}
        if len({s.max_parallelism for s in snapshots} | {self._max_parallelism}) > 1:
            raise HarnessError(
                f"the snapshot was taken with max_parallelism "
                f"{sorted({s.max_parallelism for s in snapshots})}, this harness has "
                f"{self._max_parallelism}: the number of key groups cannot change for a job's "
                f"state; pass max_parallelism= as before")
        if len({s.subtask for s in snapshots}) != len(snapshots) or \
                len({s.subtask[1] for s in snapshots}) > 1:
            raise HarnessError(
                f"restore= takes the snapshots of distinct subtasks of one parallelism, got "
                f"subtasks {[s.subtask for s in snapshots]}")
        per_uid: dict[str, list[OperatorSubtaskState]] = {}
        files: dict[str, bytes] = {}
        for snap in snapshots:
            files.update(snap.files)
            for uid, state in snap.states.items():
                per_uid.setdefault(uid, []).append(state)
        unknown = sorted(set(per_uid) - uids)
        if unknown:
            raise HarnessError(
                f"the snapshot holds state of operators {unknown}, which this harness does not have "
                f"(its operators: {sorted(uids)}); restore into a harness of the same function or "
                f"pipeline")
        index, parallelism = self._subtask
        restores = {uid: assign_operator_state(dict(enumerate(states)), self._max_parallelism,
                                               parallelism)[index]
                    for uid, states in per_uid.items()}
        return restores, files

    # ------------------------------------------------------------------ input
    def _input(self, which) -> _Input:
        if which is None:
            # One input, or a broadcast harness's keyed / non-broadcast one.
            if len(self._inputs) == 1 or [i.name for i in self._inputs] == ["input", "broadcast"]:
                return self._inputs[0]
            raise HarnessError(f"this harness has inputs {[i.name for i in self._inputs]}; say "
                               f"which with input=... (or process1 / process2 / process_broadcast)")
        if isinstance(which, int) and not isinstance(which, bool) and 0 <= which < len(self._inputs):
            return self._inputs[which]
        for inp in self._inputs:
            if inp.name == which:
                return inp
        raise HarnessError(f"this harness has no input {which!r}; its inputs are "
                           f"{[i.name for i in self._inputs]} (or their indices 0..{len(self._inputs) - 1})")

    def _check_open(self) -> None:
        if self._closed:
            raise HarnessError("the harness was closed; build a new one (harness(...)) to go on")

    def process(self, row: dict, timestamp: int | None = None, *, input=None) -> None:
        """Push one row (a dict) into an input, with its event timestamp (epoch ms) if any."""
        self.process_batch([row], None if timestamp is None else [timestamp], input=input)

    def process1(self, row: dict, timestamp: int | None = None) -> None:
        """A row for the first input of a two-input function (`process_element1`)."""
        self.process_batch([row], None if timestamp is None else [timestamp], input=0)

    def process2(self, row: dict, timestamp: int | None = None) -> None:
        """A row for the second input (`process_element2`)."""
        self.process_batch([row], None if timestamp is None else [timestamp], input=1)

    def process_broadcast(self, row: dict, timestamp: int | None = None) -> None:
        """A row of the broadcast input (`process_broadcast_element`)."""
        if "broadcast" not in [i.name for i in self._inputs]:
            raise HarnessError("this harness has no broadcast input; build it for a broadcast "
                               "process function with harness(fn, broadcast=ss.MapStateDescriptor(...))")
        self.process_batch([row], None if timestamp is None else [timestamp], input="broadcast")

    def process_batch(self, rows: Iterable[dict], timestamps: Sequence[int] | None = None, *,
                      input=None) -> None:
        """Push rows as one batch (what a task hands its operators), timestamps matching them."""
        self._check_open()
        inp = self._input(input)
        rows = list(rows)
        bad = next((r for r in rows if not isinstance(r, dict)), None)
        if bad is not None:
            raise HarnessError(f"rows are dicts; input '{inp.name}' got {type(bad).__name__} {bad!r}")
        if timestamps is not None:
            timestamps = list(timestamps)
            if len(timestamps) != len(rows):
                raise HarnessError(f"{len(rows)} rows but {len(timestamps)} timestamps")
            for row, ts in zip(rows, timestamps):
                self._give_timestamp(inp, row, _check_time(ts, "timestamp"))
        try:
            for target in inp.targets:
                batch = rows if target is inp.targets[-1] else [dict(r) for r in rows]
                if batch is not rows and timestamps is not None:
                    for row, ts in zip(batch, timestamps):
                        self._explicit.add(row, ts)
                target.process(batch)
        finally:
            self._explicit.clear()

    def _give_timestamp(self, inp: _Input, row: dict, ts: int) -> None:
        if inp.assigner is None:
            self._explicit.add(row, ts)
            return
        own = assign_timestamp(inp.assigner, row, f"harness input '{inp.name}'")
        if own != ts:
            raise HarnessError(
                f"row {row!r} has timestamp {own} by input '{inp.name}''s assigner "
                f"{inp.assigner!r}, but was pushed with timestamp={ts}; a timestamp lives in the "
                f"row — drop timestamp= or make them agree")

    # ------------------------------------------------------------------ time
    def advance_watermark(self, timestamp: int, *, input=None) -> None:
        """Event time of every input (or of `input`) reaches `timestamp`: operators fire the
        event-time timers it passes and hand the watermark on. It never goes back."""
        self._check_open()
        timestamp = _check_time(timestamp, "advance_watermark's timestamp")
        chosen = self._inputs if input is None else [self._input(input)]
        for inp in chosen:
            if timestamp < inp.watermark:
                raise HarnessError(
                    f"advance_watermark({timestamp}): input '{inp.name}' is already at watermark "
                    f"{inp.watermark}, and watermarks only move forward; to test late rows, process "
                    f"rows whose timestamps are behind the watermark")
        for inp in chosen:
            if timestamp > inp.watermark:
                inp.watermark = timestamp
                for target in inp.targets:
                    target.process_watermark(timestamp)

    def advance_processing_time(self, seconds) -> None:
        """Move processing time forward (seconds or a timedelta), firing processing-time timers
        in time order, each with the clock at its own time."""
        self._check_open()
        self.set_processing_time(self.clock.now_ms + to_millis(seconds, "advance_processing_time"))

    def set_processing_time(self, millis: int) -> None:
        """Processing time becomes `millis` (epoch ms, never earlier than now)."""
        self._check_open()
        millis = _check_time(millis, "set_processing_time")
        if millis < self.clock.now_ms:
            raise HarnessError(f"set_processing_time({millis}): processing time is already "
                               f"{self.clock.now_ms} ms and does not go back")
        self.clock.advance_to(millis)

    def end_input(self) -> None:
        """The inputs end, as a bounded source does: event time jumps to the end (every
        event-time timer fires), then every operator's `end_input`."""
        self.advance_watermark(MAX_WATERMARK)
        for node in self._nodes:
            self.operators[node.uid].end_input()

    @property
    def watermark(self) -> int:
        """The inputs' watermark (the minimum over inputs)."""
        return min(inp.watermark for inp in self._inputs)

    @property
    def processing_time(self) -> int:
        """Processing time now, epoch milliseconds (what `ctx.timer_service()` reports)."""
        return self.clock.now_ms

    # ------------------------------------------------------------------ results
    @property
    def output(self) -> list[dict]:
        """Rows of the observed stream so far, in emission order."""
        return self._collector.rows

    @property
    def watermarks(self) -> list[int]:
        """Watermarks the observed stream carried, in order."""
        return self._collector.watermarks

    def take_output(self) -> list[dict]:
        """The rows so far, emptying `output` (for tests that check step by step)."""
        rows, self._collector.rows = self._collector.rows, []
        return rows

    def side_output(self, tag: OutputTag | str) -> list[dict]:
        """Rows any operator emitted to side output `tag` that no edge consumes."""
        name = tag.name if isinstance(tag, OutputTag) else tag
        if not isinstance(name, str):
            raise HarnessError(f"side_output takes an ss.OutputTag or its name, got {tag!r}")
        return self._unclaimed.get(name, [])

    # ------------------------------------------------------------------ inside
    @property
    def operator(self) -> StreamOperator:
        """The one operator of a single-function harness (for what the harness does not wrap,
        e.g. a window operator's `num_late_records_dropped`)."""
        if len(self.operators) != 1:
            raise HarnessError(f"this harness runs {len(self.operators)} operators "
                               f"{self._names()}; pick one from h.operators by uid")
        return next(iter(self.operators.values()))

    def _names(self) -> list[str]:
        return [f"{op.ctx.name} (uid {uid})" for uid, op in self.operators.items()]

    def _keyed_operator(self, which, what: str) -> StreamOperator:
        if which is not None:
            for uid, op in self.operators.items():
                if which in (uid, op.ctx.name):
                    if op.keyed_backend is None:
                        raise HarnessError(f"operator '{op.ctx.name}' is not keyed, so it has no {what}")
                    return op
            raise HarnessError(f"no operator named {which!r}; the operators are {self._names()}")
        keyed = [op for op in self.operators.values() if op.keyed_backend is not None]
        if len(keyed) == 1:
            return keyed[0]
        if not keyed:
            raise HarnessError(f"no operator of this harness is keyed, so there is no {what} to "
                               f"read; build it with key_by=... for keyed state and timers")
        raise HarnessError(f"{len(keyed)} operators are keyed ({[op.ctx.name for op in keyed]}); "
                           f"say which with operator=name or uid")

    def state(self, name: str, key: Any = _NO_KEY, *, operator: str | None = None):
        """The keyed state `name` of `key` (None when the key has none), or without `key` a
        dict of every key's value: a Value or Reducing state's value, a List state's list, a
        Map state's dict."""
        self._check_open()
        op = self._keyed_operator(operator, "keyed state")
        backend = op.keyed_backend
        names = backend.state_names()
        if name not in names:
            declared = [n for n in names if not n.startswith(("_timers.", "_window."))]
            raise HarnessError(
                f"operator '{op.ctx.name}' has no keyed state named {name!r}; the states it "
                f"declared are {declared} (a state exists once the function called "
                f"ctx.get_state(descriptor) with that name, in open() or on first use)")
        if name in getattr(backend, "_restored", {}):
            raise HarnessError(
                f"keyed state {name!r} of operator '{op.ctx.name}' was restored but the function "
                f"has not asked for it yet (ctx.get_state); its kind is known only then")
        values = {k: v for _, k, v in backend.iter_entries(name)}
        if key is _NO_KEY:
            return values
        return values.get(key)

    def timers(self, *, operator: str | None = None) -> list[RegisteredTimer]:
        """The timers waiting in a keyed operator, by time (event time first on a tie)."""
        self._check_open()
        op = self._keyed_operator(operator, "timers")
        decode = getattr(op, "codec", PLAIN_NAMESPACE).decode
        found = []
        for state_name in op.keyed_backend.state_names():
            if not state_name.startswith(_TIMERS):
                continue
            domain = state_name.rsplit(".", 1)[1]
            for _, key, entries in op.keyed_backend.iter_entries(state_name):
                for timestamp, namespace in entries:
                    found.append(RegisteredTimer(domain, timestamp, key, decode(namespace)))
        return sorted(found, key=lambda t: (t.timestamp, t.domain, repr(t.key), repr(t.namespace)))

    def owns_key(self, key: Any) -> bool:
        """Whether this subtask owns `key`'s key group (a job routes the key's rows here)."""
        from streamsnap.state.key_groups import assign_to_key_group

        index, parallelism = self._subtask
        group = assign_to_key_group(key, self._max_parallelism)
        return group in key_group_range_for_subtask(self._max_parallelism, parallelism, index)

    # ------------------------------------------------------------------ checkpoints
    def snapshot(self) -> Snapshot:
        """A checkpoint of this subtask: every operator's keyed and operator state, written by
        the real backends (to a temporary directory, read back into the Snapshot)."""
        self._check_open()
        self._checkpoint_id += 1
        checkpoint_id = self._checkpoint_id
        for node in self._nodes:
            self.operators[node.uid].prepare_snapshot_pre_barrier(checkpoint_id)
        with tempfile.TemporaryDirectory(prefix="streamsnap-harness-snapshot-") as location:
            # As a task: the synchronous part of every operator, then the asynchronous parts.
            pending = [(node.uid, self.operators[node.uid].snapshot_state(
                checkpoint_id, self.clock.wall(), location)) for node in self._nodes]
            states = {uid: part.run() for uid, part in pending}
            files = {p.relative_to(location).as_posix(): p.read_bytes()
                     for p in Path(location).rglob("*") if p.is_file()}
        return Snapshot(checkpoint_id, self._max_parallelism, self._subtask, states, files)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Tell every operator (and its function) that checkpoint `checkpoint_id` completed."""
        self._check_open()
        for node in self._nodes:
            self.operators[node.uid].notify_checkpoint_complete(checkpoint_id)

    def close(self) -> None:
        """Close the operators (the functions' `close`) and drop their state."""
        if self._closed:
            return
        self._closed = True
        for node in self._nodes:
            self.operators[node.uid].close()

    def __enter__(self) -> "Harness":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _snapshots(restore) -> list[Snapshot]:
    if restore is None:
        return []
    snapshots = [restore] if isinstance(restore, Snapshot) else restore
    if not isinstance(snapshots, (list, tuple)) or not all(isinstance(s, Snapshot) for s in snapshots):
        raise HarnessError(f"restore= takes what h.snapshot() returned, or a list of them (one per "
                           f"old subtask), got {restore!r}")
    return list(snapshots)


# ---------------------------------------------------------------------------- the entry point
_ACCEPTS = ("a KeyedProcessFunction or ProcessFunction, a KeyedBatchFunction, a (Keyed)CoProcessFunction, "
            "a KeyedCoBatchFunction, "
            "a (Keyed)BroadcastProcessFunction with broadcast=descriptor, a reduce function, "
            "AggregateFunction or ProcessWindowFunction with window=assigner, or a pipeline: a "
            "function of the input streams returning the stream to observe")


def _key_pair(key_by) -> tuple:
    if isinstance(key_by, tuple) and len(key_by) == 2:
        return key_by
    return key_by, key_by


def _window_build(target, key_by, window, trigger, allowed_lateness, late_data, window_function):
    if key_by is None:
        raise HarnessError(f"windows are per key; pass key_by=... with window="
                           f"{type(window).__name__}")

    def build(stream):
        windowed = stream.key_by(key_by).window(window)
        if trigger is not None:
            windowed = windowed.trigger(trigger)
        if allowed_lateness is not None:
            windowed = windowed.allowed_lateness(allowed_lateness)
        if late_data is not None:
            windowed = windowed.side_output_late_data(late_data)
        if callable(getattr(target, "create_accumulator", None)):
            return windowed.aggregate(target, window_function)
        if isinstance(target, ProcessWindowFunction) or (
                not isinstance(target, Function) and callable(getattr(target, "process", None))):
            if window_function is not None:
                raise HarnessError("window_function= follows a reduce function or an "
                                   "AggregateFunction; a ProcessWindowFunction is the window's "
                                   "function itself")
            return windowed.process(target)
        if callable(target) and not isinstance(target, Function):
            return windowed.reduce(target, window_function)
        raise TypeError(f"harness(..., window=...) runs a reduce function (a, b) -> row, an "
                        f"AggregateFunction or a ProcessWindowFunction; got "
                        f"{type(target).__name__} {target!r}")
    return build


def harness(target, *, key_by=None, inputs: Sequence[str] | None = None, broadcast=None,
            window=None, trigger=None, allowed_lateness=None, late_data: OutputTag | None = None,
            window_function=None, timestamps=None, max_parallelism: int = 128,
            subtask: tuple[int, int] = (0, 1), restore=None, state_backend: str = "hashmap",
            processing_time: int = 0) -> Harness:
    """A test harness running `target` on the real operators, without Spark.

    target: a function object (see the module docstring) or a pipeline function of the input
      streams (named by `inputs`, default ("input",)) returning the DataStream to observe.
    key_by: the key (column, list of columns or function) of a keyed function or of windows;
      for a keyed co-process function one key for both inputs or a (first, second) pair.
    broadcast: the MapStateDescriptor(s) a broadcast process function's broadcast input declares.
    window, trigger, allowed_lateness, late_data, window_function: a window operator as
      `key_by(k).window(window).trigger(...).allowed_lateness(...).side_output_late_data(...)`
      finished with `target` (reduce function, AggregateFunction or ProcessWindowFunction),
      `window_function` the ProcessWindowFunction after a reduce or aggregate.
    timestamps: the inputs' timestamp assigner (column name or function of the row; a dict per
      input name); without one, rows get their timestamp from `process(row, timestamp=)`.
    subtask: (index, parallelism) of the subtask this harness is; restore: a Snapshot (or one
      per old subtask) this subtask restores its share of.
    processing_time: processing time at the start, epoch ms (the clock moves only by hand).
    """
    if isinstance(target, type):
        raise TypeError(f"harness() takes a function object, not a class: harness({target.__name__}()) "
                        f"rather than harness({target.__name__})")
    options = dict(timestamps=timestamps, max_parallelism=max_parallelism, subtask=subtask,
                   restore=restore, state_backend=state_backend, processing_time=processing_time)
    name = type(target).__name__
    if window is not None:
        build = _window_build(target, key_by, window, trigger, allowed_lateness, late_data,
                              window_function)
        return Harness(build, ("input",), what=f"window harness of {name}", **options)
    window_options = {"trigger": trigger, "allowed_lateness": allowed_lateness,
                      "late_data": late_data, "window_function": window_function}
    given = [k for k, v in window_options.items() if v is not None]
    if given:
        raise HarnessError(f"{', '.join(given)} configure windows; pass window=assigner too")
    if callable(getattr(target, "process_broadcast_element", None)):
        return Harness(_broadcast_build(target, key_by, broadcast), ("input", "broadcast"),
                       what=f"harness of {name}", **options)
    if broadcast is not None:
        raise HarnessError(f"broadcast= is for a BroadcastProcessFunction; {name} has no "
                           f"process_broadcast_element(row, ctx)")
    if callable(getattr(target, "process_batch1", None)):
        if key_by is None:
            raise HarnessError(f"{name} is a KeyedCoBatchFunction: pass key_by='field' (both inputs) "
                               f"or key_by=(first, second) (its batches are keyed)")

        def co_batch_build(first, second):
            return first.connect(second).key_by(*_key_pair(key_by)).process_batches(target)
        return Harness(co_batch_build, ("input1", "input2"), what=f"harness of {name}", **options)
    if callable(getattr(target, "process_element1", None)):
        keyed = isinstance(target, KeyedCoProcessFunction) or callable(getattr(target, "on_timer", None))
        if keyed and key_by is None:
            raise HarnessError(f"{name} keeps keyed state and timers, so both inputs are keyed: "
                               f"pass key_by='field' (both inputs) or key_by=(first, second)")

        def co_build(first, second):
            connected = first.connect(second)
            if key_by is not None:
                connected = connected.key_by(*_key_pair(key_by))
            return connected.process(target)
        return Harness(co_build, ("input1", "input2"), what=f"harness of {name}", **options)
    if callable(getattr(target, "process_batch", None)):
        if key_by is None:
            raise HarnessError(f"{name} is a KeyedBatchFunction: pass key_by=... (its batches "
                               f"are keyed)")
        return Harness(lambda s: s.key_by(key_by).process_batches(target), ("input",),
                       what=f"harness of {name}", **options)
    if callable(getattr(target, "process_element", None)):
        if key_by is None and (isinstance(target, KeyedProcessFunction)
                               or callable(getattr(target, "on_timer", None))):
            raise HarnessError(f"{name} keeps keyed state and timers, so it runs on a keyed "
                               f"stream: pass key_by='field' (or a list of fields, or a function "
                               f"of the row)")
        if key_by is None:
            return Harness(lambda s: s.process(target), ("input",), what=f"harness of {name}",
                           **options)
        return Harness(lambda s: s.key_by(key_by).process(target), ("input",),
                       what=f"harness of {name}", **options)
    if isinstance(target, Function) or not callable(target):
        raise TypeError(f"harness() runs {_ACCEPTS}; got {name} {target!r}")
    if key_by is not None:
        raise HarnessError("key_by= is for a function harness; a pipeline calls .key_by itself")
    names = ("input",) if inputs is None else tuple(inputs)
    if not names or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise HarnessError(f"inputs= names the pipeline's inputs: distinct non-empty strings, got {inputs!r}")
    return Harness(target, names, what=f"pipeline {getattr(target, '__name__', name)}", **options)


def _broadcast_build(target, key_by, broadcast):
    descriptors = broadcast if isinstance(broadcast, (tuple, list)) else (broadcast,)
    if broadcast is None or not all(isinstance(d, MapStateDescriptor) for d in descriptors):
        raise HarnessError(
            f"{type(target).__name__} reads broadcast state: pass broadcast=ss.MapStateDescriptor"
            f"('name') (or a tuple of them), the descriptors its broadcast input declares; got "
            f"{broadcast!r}")
    if key_by is None and (isinstance(target, KeyedBroadcastProcessFunction)
                           or callable(getattr(target, "on_timer", None))):
        raise HarnessError(f"{type(target).__name__} keeps keyed state and timers: pass key_by=... "
                           f"for its non-broadcast input")

    def build(stream, rules):
        first = stream if key_by is None else stream.key_by(key_by)
        return first.connect(rules.broadcast(*descriptors)).process(target)
    return build


__all__ = ["harness", "Harness", "HarnessError", "RegisteredTimer", "Snapshot"]
