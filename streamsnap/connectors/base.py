"""What a source or a sink implements, and the operators that run them in a task.

Sources are split-based (Flink's FLIP-27 shape): the source lists its splits, each subtask
reads the splits dealt to it, and the reader's per-split positions are the source's operator
state — split-distributed, so restoring with another parallelism deals the same splits out
again and every split resumes where the checkpoint left it.

Event time (FLIP-27's per-split watermarks): a reader says which splits it is reading now
(`active_splits`) and which split the batch `poll` just returned came from (`current_split`);
the source operator then runs one watermark generator per split, so a slow split holds the
source's watermark back and a finished one stops doing so. A reader that says nothing counts
as a single split. A bounded source emits the maximum watermark when it ends.

Sinks follow the two-phase-commit shape: `write` records, `prepare_commit(n)` at the
checkpoint's synchronous phase returns the committables of everything written before barrier
n (kept in operator state), `commit(n)` makes them visible once checkpoint n completed, and
`recover` on restore commits what the restored checkpoint had pre-committed and cleans up the
rest. A non-transactional sink simply makes `prepare_commit` return [] .

Every sink receives Arrow batches checked by the schema rule (`runtime/schemas.py`): rows are
converted, batches conformed, before `write` — so all sinks see the same rows, and a row that
does not fit fails the job, naming the sink, the field and the row, instead of being dropped
by one sink and kept by another.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any

import pyarrow as pa

from streamsnap.errors import DataError
from streamsnap.runtime.batches import Batch, num_rows, to_record_batch
from streamsnap.runtime.operators.base import OperatorContext, OperatorFactory, StreamOperator
from streamsnap.runtime.schemas import RowSchema, StreamSchema
from streamsnap.time.watermarks import WatermarkStrategy

SOURCE_SPLITS_STATE = "source-splits"
SOURCE_GLOBAL_STATE = "source-global"
SINK_COMMITTABLES_STATE = "sink-committables"


class SourceReader(ABC):
    @abstractmethod
    def assign_splits(self, splits: list) -> None:
        """Splits (as returned by `Source.splits` or `snapshot_splits`) this reader owns."""

    @abstractmethod
    def poll(self) -> Batch | None:
        """Next batch, or None when nothing is available right now (or the input ended)."""

    @abstractmethod
    def is_finished(self) -> bool:
        """True once a bounded reader has emitted everything."""

    @abstractmethod
    def snapshot_splits(self, checkpoint_id: int) -> list:
        """Current position of every owned split (msgpack-able), for the checkpoint."""

    def next_available_in(self) -> float:
        """Seconds until `poll` may return data again (rate limits, idle inputs)."""
        return 0.0

    def active_splits(self) -> list | None:
        """Ids (hashable) of the splits being read now — each holds the source's watermark
        back until it finishes; None: the reader does not tell (one watermark for all)."""
        return None

    def current_split(self) -> Any:
        """Id of the split the batch last returned by `poll` came from (None: not told)."""
        return None

    def position_of(self, index: int) -> str | None:
        """Where row `index` of the batch `poll` last returned sits in the source, e.g.
        "split 1, offset 523": what an error about the row names, since a position inside a
        batch means nothing to a user (batches are cut anew on every run). None: not told."""
        return None

    def open(self) -> None:
        """Called once before the first poll."""

    def close(self) -> None:
        """Called once when the subtask ends."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """A checkpoint this reader took part in completed (e.g. commit offsets upstream)."""

    def snapshot_global_state(self, checkpoint_id: int) -> list:
        """Source-wide facts every subtask needs after a restore, e.g. files already read.

        Union-distributed: on restore every subtask receives the elements of all subtasks
        (Flink keeps such facts in the source's split enumerator on the JobManager).
        """
        return []

    def restore_global_state(self, elements: list) -> None:
        """Receives the union of all subtasks' `snapshot_global_state` before `assign_splits`."""


class Source(ABC):
    #: False for unbounded sources; bounded ones end, and so does the job.
    bounded: bool = True

    @property
    def schema(self) -> pa.Schema | None:
        """Output schema when known at build time (lets key_by validate column names)."""
        return None

    @property
    def schema_mode(self) -> str:
        """How `schema` holds at run time: "declared" (rows are checked against it), "inferred"
        (from the first batch; `schema` is a build-time sample) or "widen" (runtime/schemas.py)."""
        return "inferred"

    @abstractmethod
    def splits(self, parallelism: int) -> list:
        """All splits of this source (msgpack-able), dealt round robin to the subtasks."""

    @abstractmethod
    def create_reader(self, ctx: OperatorContext) -> SourceReader:
        """The reader of one subtask (the runtime calls it in the task; `ctx` names the operator and subtask)."""

    def validate(self) -> None:
        """Raise ConfigurationError for settings that cannot work (called at build time)."""

    def default_watermark_strategy(self) -> WatermarkStrategy | None:
        """The strategy `from_source` uses when given none (e.g. a table source's `event_time`
        column); None: no event time unless the pipeline asks for it."""
        return None

    def prepare(self, job_directory: str | None, restored: bool) -> None:
        """Called on the driver by every execute(), before anything is pickled for Spark: write
        what the readers need to storage they all reach (`job_directory`: the job's directory in
        checkpoint storage, None without checkpointing). `restored`: the run restores this
        source's state (its splits come from the checkpoint, `splits()` is not asked).
        DataFrame sources materialize here."""


class SinkWriter(ABC):
    @abstractmethod
    def write(self, batch: Batch) -> None: ...

    def open(self) -> None:
        """Called once before the first write."""

    def end_input(self) -> None:
        """No more records will come (bounded input finished)."""

    def prepare_commit(self, checkpoint_id: int) -> list:
        """Pre-commit what was written before barrier `checkpoint_id`.

        Returns every committable not yet committed (older ones too: an aborted checkpoint's
        pre-commit is committed by the next completed one), to be kept in the checkpoint.
        """
        return []

    def commit(self, checkpoint_id: int) -> None:
        """Checkpoint `checkpoint_id` completed: make its (and older) committables visible."""

    def prepare_stop(self, checkpoint_id: int) -> None:
        """Checkpoint `checkpoint_id` is a stop-with-savepoint's, drained or not: its pre-commit
        should cover everything written, as the job ends after it (e.g. roll open files)."""

    def recover(self, committables: list) -> None:
        """After a restore: commit these pre-committed leftovers, discard anything else."""

    def close(self) -> None:
        """Called once when the subtask ends (or fails)."""


class Sink(ABC):
    #: Whether input rows are checked against the stream's schema before `write` (only a sink
    #: that looks at no row, like Discard, may skip it).
    checks_schema: bool = True

    @abstractmethod
    def create_writer(self, ctx: OperatorContext) -> SinkWriter:
        """The writer of one subtask (the runtime calls it in the task; `ctx` names the operator and subtask)."""

    def create_driver_component(self) -> Any:
        """An object on the driver receiving this sink's messages (collect, print), or None."""
        return None

    def validate(self, schema: pa.Schema | None) -> None:
        """Raise ConfigurationError for settings that cannot work (called at build time)."""


_WHOLE_READER = "reader"    # the watermark part of a reader that does not report splits


class SourceOperator(StreamOperator):
    """Runs a SourceReader; its split positions are the operator's split-distributed state.

    With a watermark strategy, the timestamps of each batch feed that batch's split's
    generator (see `runtime/operators/watermark_emitter.py`); the watermarks follow the batch.
    """

    def __init__(self, ctx: OperatorContext, source: Source,
                 watermark_strategy: WatermarkStrategy | None = None,
                 watermark_interval: float = 0.2):
        super().__init__(ctx)
        self.source = source
        self.reader = source.create_reader(ctx)
        self._splits_state = None
        self._global_state = None
        self._strategy = watermark_strategy
        self._interval = watermark_interval
        self.watermarks = None      # WatermarkEmitter, created in open()

    def initialize_state(self) -> None:
        super().initialize_state()
        self._splits_state = self.operator_backend.get_list_state(SOURCE_SPLITS_STATE)
        self._global_state = self.operator_backend.get_union_list_state(SOURCE_GLOBAL_STATE)
        if self.ctx.restored_operator:
            # Restored, even if empty: no splits left means nothing left to read.
            self.reader.restore_global_state(list(self._global_state.get()))
            splits = self._splits_state.get()
        else:
            splits = self.source.splits(self.ctx.parallelism)[self.ctx.subtask_index::self.ctx.parallelism]
        self.reader.assign_splits(list(splits))

    def open(self) -> None:
        from streamsnap.runtime.operators.watermark_emitter import WatermarkEmitter

        self.reader.open()
        self.watermarks = WatermarkEmitter(self._strategy, self.ctx.name, self.output,
                                           self.ctx.timers, self.ctx.clock, self._interval,
                                           splits=self._active_splits)
        self.watermarks.start()

    def _active_splits(self) -> list:
        active = self.reader.active_splits()
        if active is None:
            return [] if self.source.bounded and self.reader.is_finished() else [_WHOLE_READER]
        return active

    def emit_next(self) -> bool:
        """Emit one batch if the reader has one; returns whether it did."""
        batch = self.reader.poll()
        if batch is None or not num_rows(batch):
            return False
        self.records_in += num_rows(batch)
        watermarks = self.watermarks
        try:
            timestamps = watermarks.timestamps(batch)
            self.output.emit(batch)   # chained operators process the batch right here
        except DataError as exc:
            raise self._locate(exc, batch) from None
        if timestamps is not None:
            split = self.reader.current_split()
            watermarks.on_timestamps(_WHOLE_READER if split is None else split, timestamps)
        return True

    def _locate(self, exc: DataError, batch: Batch) -> DataError:
        """`exc` with the source position of its row: exact when the source itself raised it
        knowing the row's index in this batch, or the row is one of its rows unchanged (a filter
        passed it on, a map read it), else the range of the batch the row came from (a chained
        operator's own batch index says nothing about the source's batch)."""
        index = exc.batch_index if exc.operator == self.ctx.name else None
        if index is None and isinstance(batch, list) and exc.row is not None:
            index = next((i for i, row in enumerate(batch) if row is exc.row), None)
        position = self.reader.position_of(index) if index is not None else None
        if position is None:
            first, last = self.reader.position_of(0), self.reader.position_of(num_rows(batch) - 1)
            if first is not None:
                position = f"in the source batch from {first} to {last}"
        return exc.located(operator=self.ctx.name, subtask=self.ctx.task_name, source_position=position)

    def advance_to_end_of_time(self) -> None:
        """The input ended (or a draining stop): every event-time timer downstream may fire."""
        self.watermarks.end_of_time()

    def snapshot_state(self, checkpoint_id: int, timestamp: float, location: str):
        self._splits_state.update(self.reader.snapshot_splits(checkpoint_id))
        self._global_state.update(self.reader.snapshot_global_state(checkpoint_id))
        return super().snapshot_state(checkpoint_id, timestamp, location)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.reader.notify_checkpoint_complete(checkpoint_id)
        super().notify_checkpoint_complete(checkpoint_id)

    def close(self) -> None:
        self.reader.close()
        super().close()


class SinkOperator(StreamOperator):
    """Runs a SinkWriter; pre-committed committables are the operator's state."""

    def __init__(self, ctx: OperatorContext, sink: Sink, input_schema: StreamSchema | None = None,
                 producer: str | None = None):
        super().__init__(ctx)
        self.writer = sink.create_writer(ctx)
        self._rows = (RowSchema(input_schema, ctx.name, ctx.task_name, producer=producer, role="input")
                      if sink.checks_schema else None)
        self._committables = None
        self._reported_first_output = ctx.attempt == 0  # only restarts are timed

    def initialize_state(self) -> None:
        super().initialize_state()
        # Union: after a restore every subtask sees all committables (a rescaled sink must
        # still commit, and clean up after, what any old subtask had pre-committed).
        self._committables = self.operator_backend.get_union_list_state(SINK_COMMITTABLES_STATE)
        if self.ctx.restored_operator:
            # Also with nothing pre-committed: recovery cleans up the failed attempt's leftovers.
            self.writer.recover(list(self._committables.get()))
            self._committables.clear()

    def open(self) -> None:
        self.writer.open()

    def process(self, batch: Batch) -> None:
        self.records_in += num_rows(batch)
        rows = self._rows
        if rows is not None:
            batch = rows.conform(batch) if isinstance(batch, pa.RecordBatch) else to_record_batch(batch, rows)
        self.writer.write(batch)
        if not self._reported_first_output:
            # Recovery time ends here: the first row reaches a sink after the restore.
            self._reported_first_output = True
            self.ctx.driver.send({"type": "first_output", "at": time.time()})

    def end_input(self) -> None:
        self.writer.end_input()

    def prepare_stop(self, checkpoint_id: int) -> None:
        self.writer.prepare_stop(checkpoint_id)

    def snapshot_state(self, checkpoint_id: int, timestamp: float, location: str):
        self._committables.update(self.writer.prepare_commit(checkpoint_id))
        return super().snapshot_state(checkpoint_id, timestamp, location)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.writer.commit(checkpoint_id)
        super().notify_checkpoint_complete(checkpoint_id)

    def close(self) -> None:
        self.writer.close()
        super().close()


class SourceOperatorFactory(OperatorFactory):
    def __init__(self, source: Source, watermark_strategy: WatermarkStrategy | None = None,
                 watermark_interval: float = 0.2):
        self.source = source
        self.watermark_strategy = watermark_strategy
        self.watermark_interval = watermark_interval

    def create(self, ctx: OperatorContext) -> StreamOperator:
        return SourceOperator(ctx, self.source, self.watermark_strategy, self.watermark_interval)

    def describe(self) -> str:
        return f"Source: {type(self.source).__name__}"


class SinkOperatorFactory(OperatorFactory):
    """input_schema: the schema of the stream the sink consumes; producer: its operator(s), named
    in schema errors as the place to fix them."""

    def __init__(self, sink: Sink, input_schema: StreamSchema | None = None, producer: str | None = None):
        self.sink = sink
        self.input_schema = input_schema
        self.producer = producer

    def create(self, ctx: OperatorContext) -> StreamOperator:
        return SinkOperator(ctx, self.sink, self.input_schema, self.producer)

    def describe(self) -> str:
        return f"Sink: {type(self.sink).__name__}"
