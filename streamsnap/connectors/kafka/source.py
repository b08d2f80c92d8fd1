"""Kafka source: topic partitions are splits, their offsets the split state of every checkpoint.

Why it exists: users' streams live in Kafka. A partition is a split (`connectors.base.Source`): the
partitions are dealt to the subtasks, each subtask assigns its partitions to one consumer at
the offsets its splits hold, and the offset after the last emitted message of each partition is
what a checkpoint stores — so a restore (at any parallelism) resumes every partition exactly
after the last row the checkpoint covers. Offsets are committed back to the consumer group when
a checkpoint completes, only so that lag monitoring sees progress (Kafka's own committed offsets
are never used for recovery).

* Starting offsets: "earliest", "latest", "committed" (the group's, else earliest) or
  {partition: offset} / {(topic, partition): offset}; resolved when a split is first read.
* Bounded mode: `stop_at="latest"` captures each partition's end offset (the high watermark of
  its first fetch) when its split is first read — kept in the split, so a restore stops at the
  same place — and the source ends there.
* New partitions (new topics matching `pattern`, or partitions added to a topic) are discovered
  every `discovery_interval` seconds; each goes to one subtask by a fixed rule and is read from
  its beginning. The set of known partitions is union state, so a restored job does not read a
  partition twice.
* Event time: each partition is its own split to the watermark machinery (`active_splits`,
  `current_split`), so a lagging partition holds the watermark back.
* Fetchers: "columnar" (default, `ColumnarKafkaReader`) sends its own Fetch requests to the
  partition leaders (`fetcher.py`) and decodes the record batches into columns
  (`fetch.py`), no Python object per message; "librdkafka" (`KafkaReader`) consumes with
  confluent-kafka. Both keep the same split state; group offsets go through confluent-kafka.
* Batches: with format="json" the values of one poll (columnar: of one partition's fetch
  response, joined in place in the response buffer) are joined with newlines and parsed by
  `pyarrow.json` in one call (librdkafka: no per-row Python beyond taking each message's bytes); "avro"
  decodes them with the user's writer schema (`avro.py`: flat records column by column with
  numpy, others with fastavro, one C call per message, then one Arrow conversion); "raw" gives key, value, topic, partition, offset and timestamp columns.
* Poison messages: a message that does not decode is a `KafkaDecodeError`, a DataError naming
  topic, partition and offset (a restore would meet it again, so restarting cannot help).
"""

from __future__ import annotations

import time
import zlib
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from streamsnap.connectors.kafka import admin as kafka_admin
from streamsnap.connectors.kafka.avro import AvroCodec, AvroDecodeError
from streamsnap.connectors.base import Source, SourceReader
from streamsnap.errors import ConfigurationError, DataError, StreamsnapError
from streamsnap.runtime.operators.base import OperatorContext
from streamsnap.runtime.schemas import StreamSchema

EARLIEST = -2       # librdkafka's OFFSET_BEGINNING
LATEST = -1         # OFFSET_END
COMMITTED = -1000   # OFFSET_STORED
_NAMED_OFFSETS = {"earliest": EARLIEST, "latest": LATEST, "committed": COMMITTED}
_STOP_LATEST = -1   # a split's stop offset before it was resolved

RAW_SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                        ("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", pa.int64())])


class KafkaSourceError(StreamsnapError):
    """Reading a Kafka partition failed (the message names the topic, partition and broker)."""


class KafkaDecodeError(KafkaSourceError, DataError):
    """A message is not one record of the source's format (a poison message).

    A DataError: a restore resumes the partition at the same offset and meets the same message
    again, so the job fails at once instead of spending its restart budget. Names the topic,
    partition and offset (`offset` None: no single message is at fault, e.g. JSON values whose
    types disagree across messages, and the message gives the range)."""

    def __init__(self, message: str, *, topic: str, partition: int, offset: int | None,
                 operator: str | None = None, subtask: str | None = None):
        super().__init__(message, operator=operator, subtask=subtask)
        self.topic = topic
        self.partition = partition
        self.offset = offset

    def __reduce__(self):
        return _rebuild_decode_error, (str(self), self.topic, self.partition, self.offset, self.operator,
                                       self.subtask)


def _rebuild_decode_error(message, topic, partition, offset, operator, subtask):
    return KafkaDecodeError(message, topic=topic, partition=partition, offset=offset, operator=operator,
                            subtask=subtask)


_SKIP_FIX = ("; or, to skip it, start the job anew (not from its checkpoint) with starting_offsets="
             "{{({topic!r}, {partition}): {after}}}")


def split_id(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def owner_of(topic: str, partition: int, parallelism: int) -> int:
    """The subtask that reads a partition discovered while the job runs (same on every subtask)."""
    return (zlib.crc32(topic.encode("utf-8")) + partition) % parallelism


def initial_offset(starting_offsets, topic: str, partition: int) -> int:
    """The first offset (or a named position) of a partition, from the source's starting_offsets."""
    if isinstance(starting_offsets, str):
        return _NAMED_OFFSETS[starting_offsets]
    for key in ((topic, partition), partition, split_id(topic, partition)):
        if key in starting_offsets:
            return int(starting_offsets[key])
    return EARLIEST


class Kafka(Source):
    """Reads Kafka topics (`topics=[...]` or `pattern=`) as a stream of Arrow batches.

    bootstrap: "host:port[,host:port]". group_id: the consumer group offsets are committed to on
    checkpoint completion (monitoring only; default: derived from the job and the source's uid).
    starting_offsets: "earliest" (default), "latest", "committed" or {partition: offset}.
    format: "json" (one JSON object per message value), "avro" or "raw". schema: a pyarrow.Schema
    the JSON values are parsed with (declared); None: inferred. avro_schema: format="avro"'s
    writer schema (an Avro record, as a dict or JSON text; its fields are the columns);
    avro_framing: "none" (bare Avro records) or "confluent" (Schema Registry wire header first). stop_at: None (unbounded) or
    "latest" (bounded: up to each partition's end offset when it is first read).
    isolation: "read_committed" (default) or "read_uncommitted". config: extra librdkafka
    consumer settings. batch_size: messages per poll at most (one batch per partition run; larger
    is faster, smaller keeps the data an aligned barrier waits behind short under backpressure).
    fetcher: "columnar" (our own Fetch requests, records decoded into columns: several times less
    CPU per message; plaintext connections only), "librdkafka" (confluent-kafka's consumer), or
    None: columnar, unless config= has security settings (security.protocol other than plaintext,
    sasl.*, ssl.*), which pick librdkafka; fetcher="columnar" with them is a ConfigurationError.
    With the columnar fetcher config= still configures the consumer that commits the group's
    offsets and reads them for starting_offsets="committed".
    """

    def __init__(self, bootstrap: str, topics: list[str] | str | None = None, *, pattern: str | None = None,
                 group_id: str | None = None, starting_offsets="earliest", format: str = "json",
                 schema: pa.Schema | None = None, avro_schema=None, avro_framing: str = "none", stop_at: str | None = None, isolation: str = "read_committed",
                 discovery_interval: float | None = 30.0, batch_size: int = 4096, config: dict | None = None,
                 preflight_timeout: float = 10.0, fetcher: str | None = None):
        if not isinstance(bootstrap, str) or not bootstrap.strip():
            raise ConfigurationError(f"Kafka source: bootstrap must be 'host:port[,host:port]', got {bootstrap!r}")
        if isinstance(topics, str):
            topics = [topics]
        if (topics is None) == (pattern is None):
            raise ConfigurationError("Kafka source: give exactly one of topics=[...] or pattern='regex'")
        if topics is not None and (not topics or not all(isinstance(t, str) and t for t in topics)):
            raise ConfigurationError(f"Kafka source: topics must be a non-empty list of topic names, got {topics!r}")
        if isinstance(starting_offsets, str):
            if starting_offsets not in _NAMED_OFFSETS:
                raise ConfigurationError(f"Kafka source: starting_offsets must be one of {sorted(_NAMED_OFFSETS)} or "
                                         f"a dict {{partition: offset}}, got {starting_offsets!r}")
        elif not isinstance(starting_offsets, dict):
            raise ConfigurationError(f"Kafka source: starting_offsets must be 'earliest', 'latest', 'committed' or "
                                     f"a dict {{partition: offset}}, got {starting_offsets!r}")
        elif any(isinstance(k, int) for k in starting_offsets) and (topics is None or len(topics) != 1):
            raise ConfigurationError("Kafka source: starting_offsets keyed by partition number need exactly one "
                                     "topic; key by (topic, partition) otherwise")
        if format not in ("json", "avro", "raw"):
            raise ConfigurationError(f"Kafka source: format must be 'json', 'avro' or 'raw', got {format!r}")
        if (format == "avro") != (avro_schema is not None):
            raise ConfigurationError("Kafka source: format='avro' needs avro_schema= (the writer's Avro record "
                                     "schema), and avro_schema= applies only to format='avro'")
        if format != "avro" and avro_framing != "none":
            raise ConfigurationError(f"Kafka source: avro_framing= applies only to format='avro', got "
                                     f"avro_framing={avro_framing!r} with format={format!r}")
        if stop_at not in (None, "latest"):
            raise ConfigurationError(f"Kafka source: stop_at must be None (unbounded) or 'latest', got {stop_at!r}")
        if isolation not in ("read_committed", "read_uncommitted"):
            raise ConfigurationError(f"Kafka source: isolation must be 'read_committed' or 'read_uncommitted', "
                                     f"got {isolation!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigurationError(f"Kafka source: batch_size must be an integer >= 1, got {batch_size!r}")
        if fetcher not in (None, "columnar", "librdkafka"):
            raise ConfigurationError(f"Kafka source: fetcher must be 'columnar', 'librdkafka' or None (columnar "
                                     f"unless config= has security settings), got {fetcher!r}")
        security = kafka_admin.security_settings(config)
        if fetcher == "columnar" and security:
            raise ConfigurationError(f"Kafka source: fetcher='columnar' speaks plaintext Kafka only and cannot honour "
                                     f"config= {security}. Fix: fetcher='librdkafka' (or leave fetcher= unset, which "
                                     f"picks librdkafka for such settings)")
        self.fetcher = fetcher or ("librdkafka" if security else "columnar")
        spec = StreamSchema.of(schema, "Kafka source")
        if format != "json" and spec.schema is not None:
            raise ConfigurationError("Kafka source: schema= applies to format='json'; format='raw' has fixed "
                                     "columns key, value, topic, partition, offset, timestamp, and format='avro' "
                                     "takes its columns from avro_schema=")
        self._avro = (AvroCodec(avro_schema, framing=avro_framing, what="Kafka source") if format == "avro"
                      else None)
        self.bootstrap = bootstrap
        self.topics = list(topics) if topics is not None else None
        self.pattern = pattern
        self.group_id = group_id
        self.starting_offsets = starting_offsets
        self.format = format
        self.stop_at = stop_at
        self.isolation = isolation
        self.discovery_interval = discovery_interval
        self.batch_size = batch_size
        self.config = dict(config or {})
        self.preflight_timeout = preflight_timeout
        self._schema = RAW_SCHEMA if format == "raw" else self._avro.arrow_schema if self._avro else spec.schema
        self._schema_mode = "declared" if format != "json" else spec.mode
        self.bounded = stop_at is not None
        self._listing: list[tuple[str, int]] | None = None

    @property
    def schema(self) -> pa.Schema | None:
        return self._schema

    @property
    def schema_mode(self) -> str:
        return self._schema_mode

    def describe_topics(self) -> str:
        """The topics read, for messages: their names, or the pattern."""
        return ", ".join(self.topics) if self.topics is not None else f"pattern {self.pattern!r}"

    def preflight(self, label: str) -> None:
        """Before the job: the servers answer and the topics exist (PreflightError naming them)."""
        if self.topics is not None:
            kafka_admin.require_topics(self.bootstrap, self.topics, self.preflight_timeout, self.config, label)
        else:
            known = kafka_admin.cluster_topics(self.bootstrap, self.preflight_timeout, self.config, label)
            if self.bounded and not kafka_admin.matching_topics(known, None, self.pattern):
                from streamsnap.errors import PreflightError
                raise PreflightError(f"{label}: no topic on {self.bootstrap!r} matches pattern {self.pattern!r}, and "
                                     f"the source is bounded (stop_at='latest'): it would read nothing. Fix: "
                                     f"correct the pattern or create the topics")

    def splits(self, parallelism: int) -> list:
        if self._listing is None:
            self._listing = kafka_admin.partitions(self.bootstrap, self.topics, self.pattern, self.preflight_timeout,
                                                   self.config)
        stop = _STOP_LATEST if self.bounded else None
        return [[t, p, initial_offset(self.starting_offsets, t, p), stop] for t, p in self._listing]

    def create_reader(self, ctx: OperatorContext) -> SourceReader:
        return ColumnarKafkaReader(self, ctx) if self.fetcher == "columnar" else KafkaReader(self, ctx)


class KafkaReader(SourceReader):
    """One consumer per subtask, assigned (not subscribed) the subtask's partitions."""

    def __init__(self, source: Kafka, ctx: OperatorContext):
        self._source = source
        self._ctx = ctx
        self._splits: dict[tuple[str, int], list] = {}    # (topic, partition) -> [next offset, stop offset]
        self._known: set[tuple[str, int]] = set()
        self._restored_known = False
        self._consumer = None
        self._ready: list[tuple[tuple[str, int], pa.RecordBatch | None, int]] = []   # (split, batch, next offset)
        self._current: str | None = None
        self._idle = False
        self._next_discovery = 0.0
        self._by_checkpoint: OrderedDict[int, dict] = OrderedDict()
        self._group_id = source.group_id or f"streamsnap-{ctx.job_id[:16]}-{ctx.uid}"
        self._multi_topic = source.pattern is not None or len(source.topics) > 1

    # ---------------------------------------------------------------- state
    def restore_global_state(self, elements: list) -> None:
        self._known = {(str(t), int(p)) for t, p in elements}
        self._restored_known = True

    def assign_splits(self, splits: list) -> None:
        for topic, partition, next_offset, stop in splits:
            self._splits[(str(topic), int(partition))] = [int(next_offset), None if stop is None else int(stop)]
        if not self._restored_known:
            listing = self._source._listing or []
            self._known = set(listing) | set(self._splits)

    def snapshot_splits(self, checkpoint_id: int) -> list:
        positions = [[t, p, nxt, stop] for (t, p), (nxt, stop) in sorted(self._splits.items())]
        self._by_checkpoint[checkpoint_id] = {(t, p): nxt for t, p, nxt, _ in positions if nxt >= 0}
        while len(self._by_checkpoint) > 16:
            self._by_checkpoint.popitem(last=False)
        return positions

    def snapshot_global_state(self, checkpoint_id: int) -> list:
        # Every subtask knows every partition; subtask 0 alone keeps the list (the union would
        # only repeat it), unless a subtask discovered partitions subtask 0 has not yet seen.
        if self._ctx.subtask_index == 0:
            return [[t, p] for t, p in sorted(self._known)]
        return [[t, p] for t, p in sorted(self._splits)]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        from confluent_kafka import TopicPartition

        offsets = self._by_checkpoint.pop(checkpoint_id, None)
        for older in [c for c in self._by_checkpoint if c < checkpoint_id]:
            del self._by_checkpoint[older]
        if offsets and self._consumer is not None:
            # Monitoring only (lag tools read the group's offsets); recovery uses the checkpoint.
            self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                  asynchronous=True)

    # ---------------------------------------------------------------- reading
    def open(self) -> None:
        from confluent_kafka import Consumer

        settings = {"bootstrap.servers": self._source.bootstrap, "group.id": self._group_id,
                    "enable.auto.commit": False, "enable.auto.offset.store": False,
                    "isolation.level": self._source.isolation, "enable.partition.eof": False,
                    "auto.offset.reset": "earliest", "fetch.wait.max.ms": 20,
                    # librdkafka pauses fetching for fetch.queue.backoff.ms (default 1 s) whenever
                    # its local queue holds queued.min.messages; a broker that answers a fetch with
                    # more than that (tansu sends ~100 k messages) then stalls a fast reader for a
                    # second per fetch: 0.15 M messages/s instead of 0.65 M in a bare consumer.
                    "fetch.queue.backoff.ms": 5,
                    "client.id": f"streamsnap-{self._ctx.task_name}"}
        settings.update(self._source.config)
        self._consumer = Consumer(settings)
        self._resolve(list(self._splits))
        self._assign(list(self._splits))
        self._next_discovery = time.monotonic() + (self._source.discovery_interval or 0.0)
        if self._source.bounded:
            self._await_stops()

    def _await_stops(self, timeout: float = 60.0) -> None:
        """Fetch until every split knows its end offset, so 'latest' means latest at start."""
        deadline = time.monotonic() + timeout
        while True:
            unresolved = [split_id(*k) for k, (_, stop) in self._splits.items() if stop == _STOP_LATEST]
            if not unresolved:
                return
            if time.monotonic() > deadline:
                raise KafkaSourceError(f"Kafka source: no fetch response from {self._source.bootstrap!r} for "
                                       f"{', '.join(unresolved)} within {timeout:g} s, so their end offsets "
                                       f"(stop_at='latest') are unknown")
            self._fill()
            if self._idle:
                time.sleep(0.01)

    def _resolve(self, keys: list[tuple[str, int]]) -> None:
        """Turn named starting offsets and stop_at='latest' into offsets (once per split)."""
        from confluent_kafka import TopicPartition

        consumer = self._consumer
        committed = self._committed(keys)
        for key in keys:
            split = self._splits[key]
            if split[0] >= 0:
                continue
            low, high = consumer.get_watermark_offsets(TopicPartition(*key), timeout=30, cached=False)
            if split[0] == COMMITTED:
                split[0] = committed.get(key, -1) if committed.get(key, -1) >= 0 else low
            elif split[0] == EARLIEST:
                split[0] = low
            elif split[0] == LATEST:
                split[0] = high

    def _committed(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The group's committed offsets of the splits starting at "committed" (-1001: none)."""
        from confluent_kafka import TopicPartition

        wanted = [TopicPartition(t, p) for t, p in keys if self._splits[(t, p)][0] == COMMITTED]
        if not wanted:
            return {}
        return {(tp.topic, tp.partition): tp.offset for tp in self._consumer.committed(wanted, timeout=30)}

    def _resolve_stops(self) -> None:
        """stop_at='latest': a split's end is the high watermark of the first fetch response of its
        partition (earlier messages all lie below it). Taken from the fetch, not from a ListOffsets
        request, which some Kafka-compatible brokers (tansu 0.6) answer with a batch's base offset."""
        from confluent_kafka import TopicPartition

        for key, split in self._splits.items():
            if split[1] == _STOP_LATEST:
                _, high = self._consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
                if high >= 0:
                    split[1] = high

    def _finished(self, key) -> bool:
        nxt, stop = self._splits[key]
        return stop is not None and stop >= 0 and nxt >= stop

    def _assign(self, keys) -> None:
        from confluent_kafka import TopicPartition

        todo = [TopicPartition(t, p, self._splits[(t, p)][0]) for t, p in keys if not self._finished((t, p))]
        if todo:
            self._consumer.incremental_assign(todo)

    def _discover_when_due(self) -> None:
        source = self._source
        if (not source.bounded and source.discovery_interval is not None
                and time.monotonic() >= self._next_discovery):
            self._next_discovery = time.monotonic() + source.discovery_interval
            self._discover()

    def _discover(self) -> None:
        listing = kafka_admin.partitions(self._source.bootstrap, self._source.topics, self._source.pattern,
                                         self._source.preflight_timeout, self._source.config)
        new = [key for key in listing if key not in self._known]
        self._known.update(new)
        mine = [key for key in new if owner_of(*key, self._ctx.parallelism) == self._ctx.subtask_index]
        for key in mine:
            self._splits[key] = [EARLIEST, None]
        if mine:
            self._resolve(mine)
            self._assign(mine)

    def poll(self):
        # A queued batch None only moves its split on (columnar: a response of markers only).
        while True:
            if not self._ready:
                self._fill()
            if not self._ready:
                return None
            key, batch, next_offset = self._ready.pop(0)
            self._splits[key][0] = next_offset
            if batch is not None:
                self._current = split_id(*key)
                return batch

    def _fill(self) -> None:
        from confluent_kafka import Message

        source = self._source
        self._discover_when_due()
        messages = self._consumer.consume(num_messages=source.batch_size, timeout=0)
        if source.bounded:
            self._resolve_stops()
        self._idle = not messages
        if not messages:
            if source.bounded:
                self._check_positions()
            return
        if any(map(Message.error, messages)):
            m = next(m for m in messages if m.error() is not None)
            raise KafkaSourceError(f"Kafka source reading {m.topic()}[{m.partition()}] from "
                                   f"{source.bootstrap!r} failed: {m.error().str()}")
        # One C-level map per field (no per-message Python bytecode or branching): runs of one
        # partition are found with numpy on the partition numbers (and topics, when there are several).
        partitions = np.fromiter(map(Message.partition, messages), dtype=np.int64, count=len(messages))
        change = np.flatnonzero(partitions[1:] != partitions[:-1]) + 1
        if self._multi_topic:
            topics = list(map(Message.topic, messages))
            change = np.union1d(change, np.array([i for i in range(1, len(topics)) if topics[i] != topics[i - 1]],
                                                 dtype=np.int64))
        else:
            topic = messages[0].topic()
        values = list(map(Message.value, messages))
        for start, end in zip([0, *change.tolist()], [*change.tolist(), len(messages)]):
            key = (topics[start] if self._multi_topic else topic, int(partitions[start]))
            stop = self._splits[key][1]
            last = messages[end - 1].offset()
            if stop is not None and 0 <= stop <= last:
                kept = [i for i in range(start, end) if messages[i].offset() < stop]
                if not kept:
                    continue
                end, last = kept[-1] + 1, messages[kept[-1]].offset()
            run = messages[start:end]
            self._ready.append((key, self._to_batch(key, run, values[start:end], lambda i, run=run: run[i].offset()),
                                last + 1))
        if source.bounded:
            self._check_positions()

    def _check_positions(self) -> None:
        """A bounded split whose consumer passed its stop offset (gaps: transaction markers)
        with nothing left to emit is finished; stop fetching it."""
        from confluent_kafka import TopicPartition

        pending = {k for k, _, _ in self._ready}
        open_keys = [k for k in self._splits if not self._finished(k) and k not in pending]
        if not open_keys:
            return
        done = []
        for tp in self._consumer.position([TopicPartition(t, p) for t, p in open_keys]):
            key = (tp.topic, tp.partition)
            stop = self._splits[key][1]
            if tp.offset >= 0 and stop is not None and 0 <= stop <= tp.offset:
                self._splits[key][0] = max(self._splits[key][0], stop)
                done.append(tp)
        if done:
            self._consumer.incremental_unassign(done)

    def _to_batch(self, key, messages: list, values: list, offset_of) -> pa.RecordBatch:
        """offset_of(i): the offset of message i (read only on the error paths)."""
        source = self._source
        if source.format == "raw":
            return pa.RecordBatch.from_arrays([
                pa.array([m.key() for m in messages], pa.binary()),
                pa.array(values, pa.binary()),
                pa.array([key[0]] * len(messages), pa.string()),
                pa.array([key[1]] * len(messages), pa.int32()),
                pa.array([m.offset() for m in messages], pa.int64()),
                pa.array([m.timestamp()[1] for m in messages], pa.int64())], schema=RAW_SCHEMA)
        if None in values:
            raise self._tombstone(key, offset_of(values.index(None)))
        if source.format == "avro":
            try:
                return source._avro.decode(values)
            except AvroDecodeError as exc:
                raise self._poison(key, offset_of(exc.index), exc.reason,
                                   "give the schema the messages were written with as avro_schema=, and "
                                   "avro_framing='confluent' if they carry the Schema Registry header") from exc
        return self._parse_json(key, values, offset_of)

    def _tombstone(self, key, offset: int) -> KafkaDecodeError:
        return self._poison(key, offset, f"has no value (a tombstone); format={self._source.format!r} needs one "
                            f"record per message", "use format='raw' for topics with tombstones")

    def _poison(self, key, offset: int, what: str, fix: str) -> KafkaDecodeError:
        """The DataError for message `offset` of split `key`: what is wrong with it and the fix."""
        topic, partition = key
        skip = _SKIP_FIX.format(topic=topic, partition=partition, after=offset + 1)
        return KafkaDecodeError(
            f"Kafka source '{self._ctx.name}' ({self._ctx.task_name}): message {topic}[{partition}]@{offset} "
            f"(from {self._source.bootstrap!r}) {what}. Fix: {fix}{skip}",
            topic=topic, partition=partition, offset=offset, operator=self._ctx.name, subtask=self._ctx.task_name)

    def _read_json(self, values: list[bytes]) -> pa.Table:
        """The values as one table, one row per message; ValueError says why not."""
        return self._read_json_lines(b"\n".join(values), len(values))

    def _read_json_lines(self, data, n: int) -> pa.Table:
        """Newline-delimited JSON `data` (bytes-like) of n messages as a table; ValueError if not n rows."""
        schema = self._source.schema
        parse = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error") if schema else None
        table = pajson.read_json(pa.BufferReader(pa.py_buffer(data)),
                                 read_options=pajson.ReadOptions(block_size=max(1 << 20, len(data) + 1)),
                                 parse_options=parse)
        if table.num_rows != n:
            raise ValueError(f"{n} messages parsed into {table.num_rows} rows (an empty value, or a JSON "
                             f"object spread over several lines)")
        return table

    def _first_unreadable(self, values: list[bytes], start: int, end: int) -> tuple[int, str] | None:
        """(index, reason) of the first message in values[start:end] that fails on its own (found by
        halving: the error path only), or None when every message reads alone."""
        try:
            self._read_json(values[start:end])
            return None
        except (pa.ArrowInvalid, ValueError) as exc:
            if end - start == 1:
                return start, str(exc)
        middle = (start + end) // 2
        return self._first_unreadable(values, start, middle) or self._first_unreadable(values, middle, end)

    def _parse_json(self, key, values: list[bytes], offset_of) -> pa.RecordBatch:
        """values parsed as JSON, or the KafkaDecodeError naming the message at fault (offset_of(i):
        the offset of message i)."""
        try:
            table = self._read_json(values)
        except (pa.ArrowInvalid, ValueError) as exc:
            fix = ("declare schema= to match them, or use format='raw' and parse them in a map" if
                   self._source.schema is None else "make schema= match the messages (or the producer match "
                   "schema=), or use format='raw' and parse them in a map")
            found = self._first_unreadable(values, 0, len(values))
            if found is not None:
                index, reason = found
                raise self._poison(key, offset_of(index), f"is not the JSON object format='json' "
                                   f"expects ({reason}; value {values[index][:200]!r})", fix) from exc
            first, last = offset_of(0), offset_of(len(values) - 1)
            raise KafkaDecodeError(
                f"Kafka source '{self._ctx.name}' ({self._ctx.task_name}): messages {key[0]}[{key[1]}]@{first}..{last} "
                f"(from {self._source.bootstrap!r}) each read alone but not together: {exc}. Fix: {fix}",
                topic=key[0], partition=key[1], offset=None, operator=self._ctx.name,
                subtask=self._ctx.task_name) from exc
        batches = table.combine_chunks().to_batches()
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)

    def next_available_in(self) -> float:
        return 0.005 if self._idle and not self._ready else 0.0

    def is_finished(self) -> bool:
        return self._source.bounded and not self._ready and all(self._finished(k) for k in self._splits)

    def active_splits(self) -> list:
        return [split_id(*k) for k in sorted(self._splits) if not self._finished(k)]

    def current_split(self):
        return self._current

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


class ColumnarKafkaReader(KafkaReader):
    """The columnar fetcher (`fetch`, `fetcher`): Fetch responses from the partition
    leaders decoded into columns, values parsed per partition response and cut into batch_size
    batches. A confluent-kafka consumer, never assigned, only commits the group's offsets and
    reads them for starting_offsets="committed"."""

    def __init__(self, source: Kafka, ctx: OperatorContext):
        super().__init__(source, ctx)
        self._fetcher = None
        self._positions: dict[tuple[str, int], int] = {}       # next offset to fetch, per split being fetched

    def open(self) -> None:
        from confluent_kafka import Consumer

        from streamsnap.connectors.kafka.fetcher import Fetcher

        settings = {"bootstrap.servers": self._source.bootstrap, "group.id": self._group_id,
                    "enable.auto.commit": False, "client.id": f"streamsnap-{self._ctx.task_name}"}
        settings.update(self._source.config)
        self._consumer = Consumer(settings)
        self._fetcher = Fetcher(self._source.bootstrap, read_committed=self._source.isolation == "read_committed")
        self._resolve(list(self._splits))
        self._assign(list(self._splits))
        self._next_discovery = time.monotonic() + (self._source.discovery_interval or 0.0)
        if self._source.bounded:
            self._await_stops()

    def _resolve(self, keys: list[tuple[str, int]]) -> None:
        from streamsnap.connectors.kafka.fetcher import FetcherError

        committed = self._committed(keys)
        named = {key: self._splits[key][0] for key in keys if self._splits[key][0] < 0}
        missing = [k for k, o in named.items() if o == EARLIEST or (o == COMMITTED and committed.get(k, -1) < 0)]
        latest = [k for k, o in named.items() if o == LATEST]
        found = {}
        try:
            if missing:
                found.update(self._fetcher.list_offsets(missing, -2))
            if latest:
                found.update(self._fetcher.list_offsets(latest, -1))
        except FetcherError as exc:
            raise self._failure(missing + latest, f"looking up starting offsets failed: {exc}") from exc
        for key, offset in named.items():
            self._splits[key][0] = committed[key] if committed.get(key, -1) >= 0 else found[key]

    def _failure(self, keys, what: str) -> KafkaSourceError:
        where = ", ".join(f"{t}[{p}]" for t, p in sorted(keys)) or self._source.describe_topics()
        return KafkaSourceError(f"Kafka source '{self._ctx.name}' ({self._ctx.task_name}) reading {where} from "
                                f"{self._source.bootstrap!r}: {what}. Fix: check that the brokers run and are "
                                f"reachable from the workers, and that the topics exist")

    def _assign(self, keys) -> None:
        for key in keys:
            if not self._finished(key):
                self._positions[key] = self._splits[key][0]

    def _fill(self) -> None:
        from streamsnap.connectors.kafka.fetcher import FetcherError

        self._discover_when_due()
        before = len(self._ready)
        try:
            for frame, partitions, asked in self._fetcher.poll(self._positions):
                for part in partitions:
                    key = (part.topic, part.partition)
                    if key in asked and self._positions.get(key) == asked[key]:   # else moved on since the request
                        self._take(key, frame, part)
        except FetcherError as exc:
            raise self._failure(self._positions, str(exc)) from exc
        self._idle = len(self._ready) == before

    def _take(self, key, frame, part) -> None:
        from streamsnap.connectors.kafka import fetch as kf

        topic, partition = key
        position = self._positions[key]
        where = f"{topic}[{partition}]@{position} from {self._fetcher.leader_address(key)}"
        if part.error == kf.OFFSET_OUT_OF_RANGE:
            raise KafkaSourceError(
                f"Kafka source '{self._ctx.name}' ({self._ctx.task_name}): offset {position} of {topic}[{partition}] "
                f"is out of range on {self._fetcher.leader_address(key)} (deleted by retention, or the topic was "
                f"recreated). Fix: start the job anew with starting_offsets='earliest' or an offset in range")
        if part.error in kf.REFRESH:
            self._fetcher.failed(f"Fetch of {where}: {kf.ERROR_NAMES[part.error]}")
            return
        if part.error:
            raise KafkaSourceError(f"Kafka source '{self._ctx.name}' ({self._ctx.task_name}): Fetch of {where} failed "
                                   f"with Kafka error {kf.ERROR_NAMES.get(part.error, part.error)}")
        self._fetcher.succeeded()
        split = self._splits[key]
        if split[1] == _STOP_LATEST:
            split[1] = part.high_watermark
        try:
            records = kf.decode_records(frame, part.start, part.end, fetch_offset=position,
                                        read_committed=self._source.isolation == "read_committed",
                                        last_stable_offset=part.last_stable_offset, aborted=part.aborted, where=where)
        except kf.KafkaFetchError as exc:
            raise KafkaSourceError(f"Kafka source '{self._ctx.name}' ({self._ctx.task_name}): {exc}") from exc
        stop = split[1]
        following = records.next_offset
        if stop is not None and stop >= 0:
            if len(records) and records.offsets[-1] >= stop:
                records = records.slice(records.offsets < stop)
            following = min(following, max(stop, position))
        self._positions[key] = following
        if stop is not None and 0 <= stop <= following:
            del self._positions[key]
        if len(records):
            batch = self._columns(key, records)
            size = self._source.batch_size
            for start in range(0, len(records), size):
                end = min(start + size, len(records))
                nxt = following if end == len(records) else int(records.offsets[end - 1]) + 1
                self._ready.append((key, batch.slice(start, end - start), nxt))
        elif following != position:
            self._ready.append((key, None, following))              # only markers or aborted rows: move on

    def _columns(self, key, records) -> pa.RecordBatch:
        """All of a partition response's records as one batch of the source's format."""
        from streamsnap.connectors.kafka import fetch as kf

        source = self._source
        n = len(records)

        def offset_of(i):
            return int(records.offsets[i])
        if source.format == "raw":
            return pa.RecordBatch.from_arrays([
                kf.binary_array(records, "key"), kf.binary_array(records, "value"),
                pa.repeat(pa.scalar(key[0], pa.string()), n),
                pa.array(np.full(n, key[1], np.int32)), pa.array(records.offsets),
                pa.array(records.timestamps)], schema=RAW_SCHEMA)
        if records.value_length.min() < 0:
            raise self._tombstone(key, offset_of(int(np.argmax(records.value_length < 0))))
        if source.format == "avro":
            values = kf.binary_array(records, "value").to_pylist()
            return self._to_batch(key, values, values, offset_of)
        try:
            table = self._read_json_lines(kf.json_lines(records), n)
        except (pa.ArrowInvalid, ValueError):
            values = kf.binary_array(records, "value").to_pylist()
            return self._parse_json(key, values, offset_of)          # raises the error naming the message
        batches = table.combine_chunks().to_batches()
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)

    def close(self) -> None:
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None
        super().close()


__all__ = ["Kafka", "KafkaReader", "ColumnarKafkaReader", "KafkaSourceError", "KafkaDecodeError", "owner_of", "initial_offset", "split_id", "RAW_SCHEMA"]
