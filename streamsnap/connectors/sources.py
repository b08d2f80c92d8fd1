"""Built-in sources: a deterministic generator, and collections on top of it.

`Generator` produces row i from a function of i, so a replay from a checkpointed position
reproduces exactly the same rows — the property exactly-once recovery needs from a source.
Its index space is cut into `splits` residue classes (split j holds j, j+S, j+2S, ...); each
split's position is checkpointed, and splits are dealt to subtasks, so a restore with another
parallelism resumes every split where it stopped.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import pyarrow as pa

from streamsnap.connectors.base import Source, SourceReader
from streamsnap.errors import ConfigurationError
from streamsnap.runtime.batches import as_record_batch
from streamsnap.runtime.operators.base import OperatorContext
from streamsnap.runtime.schemas import StreamSchema, infer_collection_schema


class Generator(Source):
    """Rows `fn(i)` for i = 0, 1, ... (`count` of them, or unbounded), split over subtasks.

    fn: a function of the index returning a dict (a row); with `vectorized=True` a function of
      a numpy array of indices returning a RecordBatch / Table / dict of columns.
    count: number of rows, or None for an unbounded stream.
    rate: rows per second over all subtasks (None = as fast as possible). A rate-limited
      subtask emits in steps of about `PACE` seconds of its rows (at most batch_size), not in
      whatever trickle its budget allows at each wake-up: a batch carries a fixed cost, and a
      stream of tiny batches would spend a core on it at rates far below the maximum. A subtask
      held back (backpressure, a slow start) catches up by at most `MAX_BURST` seconds of its
      rows, as a token bucket does, instead of emitting its whole arrears at once.
    splits: number of splits (default: the source's parallelism at first start).
    batch_size: rows per emitted batch.
    schema: the output pyarrow.Schema (declared: rows are checked against it); "widen" or None
      (default): inferred at run time from the first batch, "widen" letting it grow (docs: Concepts ›
      Streams and operators › Schemas). Row 0 is also sampled at build time, to check key_by column names.
    """

    def __init__(self, fn: Callable, *, count: int | None = None, rate: float | None = None,
                 splits: int | None = None, batch_size: int = 1024, schema: pa.Schema | None = None,
                 vectorized: bool = False):
        if not callable(fn):
            raise ConfigurationError(f"Generator needs a function of the row index, got {fn!r}")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise ConfigurationError(f"Generator.count must be an integer >= 0 or None (unbounded), got {count!r}")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0):
            raise ConfigurationError(f"Generator.rate must be a number of rows per second > 0 or None, got {rate!r}")
        if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
            raise ConfigurationError(f"Generator.splits must be an integer >= 1, got {splits!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigurationError(f"Generator.batch_size must be an integer >= 1, got {batch_size!r}")
        spec = StreamSchema.of(schema, "Generator")
        self.fn = fn
        self.count = count
        self.rate = float(rate) if rate is not None else None
        self.num_splits = splits
        self.batch_size = batch_size
        self.vectorized = vectorized
        self._schema = spec.schema
        self._schema_mode = spec.mode
        self.bounded = count is not None

    @property
    def schema(self) -> pa.Schema | None:
        if self._schema is None:
            # A generator function may declare its schema (e.g. the Nexmark ones), so it is not
            # inferred from row 0 alone.
            self._schema = getattr(self.fn, "schema", None)
        if self._schema is None and self.count != 0:
            try:
                if self.vectorized:
                    sample = as_record_batch(self.fn(np.arange(1, dtype=np.int64)), "Generator function")
                else:
                    row = self.fn(0)
                    if not isinstance(row, dict):
                        raise TypeError(f"it returned {type(row).__name__}, not a dict")
                    sample = pa.RecordBatch.from_pylist([row])
            except Exception as exc:
                raise ConfigurationError(f"Generator function failed on index 0: {exc}") from exc
            self._schema = sample.schema
        return self._schema

    @property
    def schema_mode(self) -> str:
        if self._schema_mode == "inferred" and getattr(self.fn, "schema", None) is not None:
            return "declared"  # the function declares its rows' schema (e.g. the Nexmark ones)
        return self._schema_mode

    def validate(self) -> None:
        _ = self.schema

    def splits(self, parallelism: int) -> list:
        total = self.num_splits or parallelism
        return [[j, total, 0] for j in range(total)]  # [split, number of splits, rows emitted]

    def create_reader(self, ctx: OperatorContext) -> SourceReader:
        return GeneratorReader(self, ctx)


PACE = 0.001
MAX_BURST = 1.0


class GeneratorReader(SourceReader):
    def __init__(self, source: Generator, ctx: OperatorContext):
        self._source = source
        self._splits: list[list[int]] = []
        self._turn = 0
        self._rate: float | None = None
        self._started = 0.0
        self._emitted_since_start = 0
        self._current: int | None = None
        self._batch_start: list[int] | None = None   # [split, number of splits, offset] of the last batch

    def assign_splits(self, splits: list) -> None:
        self._splits = [[int(j), int(total), int(pos)] for j, total, pos in splits]
        if self._source.rate is not None and self._splits:
            total = self._splits[0][1]
            self._rate = self._source.rate * len(self._splits) / total

    def open(self) -> None:
        self._started = time.monotonic()

    def _remaining(self, split: list[int]) -> int | None:
        count = self._source.count
        if count is None:
            return None
        j, total, pos = split
        in_split = (count - j + total - 1) // total if j < count else 0
        return in_split - pos

    def _step_rows(self) -> int:
        """Rows a rate-limited subtask waits for before it emits: PACE seconds of its rate, at
        most a batch, and no more than what is left to read."""
        rate = self._rate
        assert rate is not None                  # only a rate-limited reader paces
        step = max(1, min(self._source.batch_size, int(rate * PACE)))
        if self._source.count is not None:
            step = min(step, max(1, sum(self._remaining(s) or 0 for s in self._splits)))
        return step

    def _behind(self) -> float:
        """Rows the subtask is behind its rate, at most MAX_BURST seconds of them: arrears beyond
        that are forgiven (the pacing clock moves forward)."""
        rate = self._rate
        assert rate is not None                  # only a rate-limited reader paces
        behind = (time.monotonic() - self._started) * rate - self._emitted_since_start
        burst = max(rate * MAX_BURST, self._step_rows())
        if behind > burst:
            self._started += (behind - burst) / rate
            behind = burst
        return behind

    def _allowed(self) -> int:
        if self._rate is None:
            return self._source.batch_size
        budget = int(self._behind())
        if budget < self._step_rows():
            return 0
        return min(self._source.batch_size, budget)

    def next_available_in(self) -> float:
        if self._rate is None:
            return 0.0
        return max(0.0005, (self._step_rows() - self._behind()) / self._rate)

    def is_finished(self) -> bool:
        return self._source.count is not None and all((self._remaining(s) or 0) <= 0 for s in self._splits)

    def active_splits(self) -> list:
        """All unfinished splits: they are read round robin, so each holds the watermark back."""
        if self._source.count is None:
            return [s[0] for s in self._splits]
        return [s[0] for s in self._splits if (self._remaining(s) or 0) > 0]

    def current_split(self) -> int | None:
        return self._current

    def poll(self):
        if not self._splits:
            return None
        allowed = self._allowed()
        if allowed <= 0:
            return None
        for _ in range(len(self._splits)):
            split = self._splits[self._turn % len(self._splits)]
            self._turn += 1
            remaining = self._remaining(split)
            if remaining is not None and remaining <= 0:
                continue
            n = allowed if remaining is None else min(allowed, remaining)
            j, total, pos = split
            indices = j + total * np.arange(pos, pos + n, dtype=np.int64)
            batch = self._generate(indices)
            split[2] = pos + n
            self._emitted_since_start += n
            self._current = j
            self._batch_start = [j, total, pos]
            return batch
        return None

    def position_of(self, index: int) -> str | None:
        if self._batch_start is None:
            return None
        j, total, pos = self._batch_start
        offset = pos + index
        return f"split {j} of {total}, offset {offset} (index {j + total * offset} of the Generator)"

    def _generate(self, indices: np.ndarray):
        fn = self._source.fn
        if self._source.vectorized:
            return as_record_batch(fn(indices), "Generator function")
        return list(map(fn, indices.tolist()))

    def snapshot_splits(self, checkpoint_id: int) -> list:
        return [list(s) for s in self._splits]


class CollectionSource(Generator):
    """A fixed list of rows (Flink's fromCollection): one split, so order is preserved.

    All rows are known up front, so the schema rule (runtime/schemas.py) is applied to the whole
    collection when the pipeline is built: without `schema=` it is inferred over every row (all
    rows must have the same fields; types are unified, e.g. 1 and 2.5 make a float64 field),
    with it every row is checked — a mismatch fails at build time, naming the row.
    """

    def __init__(self, rows: list, schema: pa.Schema | None = None):
        if not isinstance(rows, (list, tuple)):
            raise ConfigurationError(f"from_collection takes a list of dicts, got {type(rows).__name__}")
        bad = next((r for r in rows if not isinstance(r, dict)), None)
        if bad is not None:
            raise ConfigurationError(f"from_collection: every element must be a dict (a row), got {bad!r}")
        self.rows = list(rows)
        if schema is not None and not isinstance(schema, pa.Schema):
            raise ConfigurationError(f"from_collection: schema must be a pyarrow.Schema, got {type(schema).__name__}")
        if self.rows:
            checked = infer_collection_schema(self.rows, "from_collection", schema)
            schema = schema or checked
        super().__init__(self.rows.__getitem__, count=len(self.rows), splits=1, schema=schema)


from streamsnap.connectors.files import FileSource  # noqa: E402, F401  (re-export: ss.sources.FileSource)
from streamsnap.connectors.kafka import KafkaSource as Kafka  # noqa: E402, F401  (ss.sources.Kafka)
from streamsnap.connectors.lakehouse.delta_source import DeltaSource as Delta  # noqa: E402, F401
from streamsnap.connectors.lakehouse.iceberg_source import IcebergSource as Iceberg  # noqa: E402, F401

# `ss.sources`: what a job reads from. Custom sources subclass streamsnap.connectors.base.Source.
__all__ = ["Generator", "FileSource", "Kafka", "Delta", "Iceberg"]


def __dir__() -> list[str]:
    """`dir()` lists the public names (`__all__`), not the module's imports and submodules."""
    return sorted(__all__)
