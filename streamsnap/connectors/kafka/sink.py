"""Kafka sink: rows as JSON messages; exactly-once through one Kafka transaction per checkpoint.

Why it exists: the exactly-once path out of streamsnap into Kafka, as a two-phase-commit sink
(`connectors.base`). With semantic="exactly_once" each subtask writes the rows of one
checkpoint interval in one Kafka transaction, under a transactional id drawn from its pool
(`transactions.py`):

* write — rows go into the interval's open transaction (a fresh producer per interval; the
  next interval's producer is made ready — init_transactions, producer id, begin — on a
  background thread while this one writes, so the switch at a checkpoint does not stall);
* pre-commit (the checkpoint's synchronous phase) — flush, and keep (transactional id,
  producer id, epoch) in the checkpoint; the next row opens the next interval's transaction;
* commit (notify-checkpoint-complete) — commit the transaction(s) the checkpoint covers;
* restore — commit what the restored checkpoint pre-committed, with the Kafka protocol's
  EndTxn (`protocol.py`: librdkafka cannot resume another producer's transaction), then
  fence every transactional id the failed attempt may have used, which aborts its open
  transactions. Consumers with isolation.level=read_committed then see each row once.

The transaction timeout (`transaction.timeout.ms`, default here 15 minutes, capped by the
broker's transaction.max.timeout.ms) must exceed the longest outage you want to survive: a
pre-committed transaction the broker aborted on timeout cannot be committed on restore.

semantic="at_least_once": one idempotent producer per subtask, flushed at every checkpoint, so
every row a checkpoint covers is in Kafka before the checkpoint completes (rows after it may be
written twice after a failure).

Messages: with format="json" the value is the row as one JSON object (encoded column-wise with
Arrow compute for flat rows of numbers, booleans and strings; other types go through
json.dumps); with format="avro" one Avro record of the user's schema (`avro.py`, optionally with
the Schema Registry header). The key is the `key` column's value as text (None: no key,
librdkafka spreads rows over partitions).

Producers: for exactly_once by default "columnar" (`producer.ColumnarProducer`: record
batches encoded from the columns and sent with streamsnap's own transactional requests; the same
pool, phases and recovery), else "librdkafka" (one `produce` call per message).
"""

from __future__ import annotations

import json
import logging
import time
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc

from streamsnap.connectors.kafka import admin as kafka_admin, transactions as txns
from streamsnap.connectors.kafka.avro import AvroCodec
from streamsnap.connectors.base import Sink, SinkWriter
from streamsnap.connectors.kafka.protocol import EndTxnOutcome, end_transaction
from streamsnap.errors import ConfigurationError, StreamsnapError
from streamsnap.runtime.batches import Batch, num_rows, to_record_batch
from streamsnap.runtime.operators.base import OperatorContext

log = logging.getLogger(__name__)

SEMANTICS = ("exactly_once", "at_least_once")
_PRODUCER_DEFAULTS = {"linger.ms": 5, "batch.num.messages": 10_000, "queue.buffering.max.messages": 1_000_000,
                      "queue.buffering.max.kbytes": 1_048_576, "compression.type": "none",
                      "delivery.report.only.error": True}


class KafkaSinkError(StreamsnapError):
    """Writing to Kafka failed (the message names the topic, the broker and the transactional id)."""


# ===================================================================== rows → JSON messages
def _json_text(column: pa.Array) -> pa.Array | None:
    """The column as JSON text (string array, no nulls), or None when Arrow compute cannot do it."""
    t = column.type
    if pa.types.is_integer(t):
        text = pc.cast(column, pa.string())
    elif pa.types.is_boolean(t):
        text = pc.if_else(column, "true", "false")
    elif pa.types.is_floating(t):
        if pc.any(pc.is_nan(column)).as_py() or pc.any(pc.is_inf(column)).as_py():
            return None
        text = pc.cast(column, pa.string())
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        if pc.any(pc.match_substring_regex(column, r"[\x00-\x1f]")).as_py():
            return None
        escaped = pc.replace_substring(pc.replace_substring(column, "\\", "\\\\"), '"', '\\"')
        text = pc.binary_join_element_wise('"', escaped, '"', "")
    elif pa.types.is_null(t):
        return pa.array(["null"] * len(column), pa.string())
    else:
        return None
    return pc.fill_null(text, "null")


def encode_json(batch: pa.RecordBatch) -> list[bytes]:
    """One JSON object per row, as bytes: column-wise when every column allows it."""
    return encode_json_array(batch).to_pylist()


def encode_json_array(batch: pa.RecordBatch) -> pa.Array:
    """encode_json's messages as a binary array (no Python object per row on the column-wise path)."""
    parts: list = []
    for i, field in enumerate(batch.schema):
        text = _json_text(batch.column(i))
        if text is None:
            rows = batch.to_pylist()
            return pa.array([json.dumps(r, default=str, separators=(",", ":")).encode() for r in rows], pa.binary())
        parts += [("{" if i == 0 else ",") + json.dumps(field.name) + ":", text]
    if not parts:
        return pa.array([b"{}"] * batch.num_rows, pa.binary())
    parts.append("}")
    joined = pc.binary_join_element_wise(*parts, "")
    return pc.cast(joined, pa.binary())


def encode_keys(batch: pa.RecordBatch, key: str | None) -> list | None:
    array = encode_keys_array(batch, key)
    return None if array is None else array.to_pylist()


def encode_keys_array(batch: pa.RecordBatch, key: str | None) -> pa.Array | None:
    """The message keys (the key column's values as text) as a binary array; None: no key."""
    if key is None:
        return None
    column = batch.column(key)
    if pa.types.is_binary(column.type):
        return column
    return pc.cast(pc.cast(column, pa.string()), pa.binary())


# ===================================================================== the sink
class Kafka(Sink):
    """Writes rows to a Kafka topic as JSON (default) or Avro messages.

    bootstrap: "host:port[,...]"; topic: an existing topic; key: the column whose value keys
    each message (None: no key). semantic: "exactly_once" (default: Kafka transactions, commit
    on checkpoint completion; needs checkpointing) or "at_least_once". transactional_id_prefix:
    default derived from the job name and the sink's uid — two jobs writing with the same prefix
    fence each other. transaction_pool_size: transactional ids per subtask (>= 2; a checkpoint
    that fails keeps its transaction waiting until the next one completes). config: extra
    librdkafka producer settings. format: "json" or "avro"; avro_schema: the Avro record schema
    (dict or JSON text) rows are written with (its fields must be columns of the rows);
    avro_schema_id: the Schema Registry id to write in the Confluent wire header (None: bare records).
    producer: "columnar" (exactly_once only: record batches encoded from the columns and sent with
    our own InitProducerId / AddPartitionsToTxn / Produce requests, `producer.py`; plaintext
    only), "librdkafka" (confluent-kafka's producer, one call per message), or None: columnar for
    exactly_once unless config= has security settings (security.protocol other than plaintext,
    sasl.*, ssl.*), librdkafka otherwise; producer="columnar" with such settings is a
    ConfigurationError. Both put a key in the same partition (CRC-32 of the key, librdkafka's
    default; rows with a null or no key spread over the partitions).
    """

    def __init__(self, bootstrap: str, topic: str, *, key: str | None = None, semantic: str = "exactly_once",
                 transactional_id_prefix: str | None = None, transaction_pool_size: int = 5,
                 transaction_timeout: float = 900.0, config: dict | None = None, preflight_timeout: float = 10.0,
                 format: str = "json", avro_schema=None, avro_schema_id: int | None = None,
                 producer: str | None = None):
        if not isinstance(bootstrap, str) or not bootstrap.strip():
            raise ConfigurationError(f"Kafka sink: bootstrap must be 'host:port[,host:port]', got {bootstrap!r}")
        if not isinstance(topic, str) or not topic:
            raise ConfigurationError(f"Kafka sink: topic must be a topic name, got {topic!r}")
        if semantic not in SEMANTICS:
            raise ConfigurationError(f"Kafka sink: semantic must be one of {SEMANTICS}, got {semantic!r}")
        if isinstance(transaction_pool_size, bool) or not isinstance(transaction_pool_size, int) \
                or transaction_pool_size < 2:
            raise ConfigurationError(f"Kafka sink: transaction_pool_size must be an integer >= 2, "
                                     f"got {transaction_pool_size!r}")
        if key is not None and not isinstance(key, str):
            raise ConfigurationError(f"Kafka sink: key must be a column name or None, got {key!r}")
        if format not in ("json", "avro"):
            raise ConfigurationError(f"Kafka sink: format must be 'json' or 'avro', got {format!r}")
        if (format == "avro") != (avro_schema is not None):
            raise ConfigurationError("Kafka sink: format='avro' needs avro_schema= (the Avro record schema to "
                                     "write), and avro_schema= applies only to format='avro'")
        if format != "avro" and avro_schema_id is not None:
            raise ConfigurationError(f"Kafka sink: avro_schema_id= applies only to format='avro' (the Schema "
                                     f"Registry header of Avro messages), got {avro_schema_id!r} with "
                                     f"format={format!r}")
        if avro_schema_id is not None and (isinstance(avro_schema_id, bool) or not isinstance(avro_schema_id, int)
                                           or not 0 <= avro_schema_id < 2 ** 31):
            raise ConfigurationError(f"Kafka sink: avro_schema_id must be a Schema Registry id (an int >= 0), "
                                     f"got {avro_schema_id!r}")
        if producer not in (None, "librdkafka", "columnar"):
            raise ConfigurationError(f"Kafka sink: producer must be 'librdkafka', 'columnar' or None (columnar for "
                                     f"exactly_once unless config= has security settings), got {producer!r}")
        if producer == "columnar" and semantic != "exactly_once":
            raise ConfigurationError("Kafka sink: producer='columnar' writes Kafka transactions only; use it with "
                                     "semantic='exactly_once', or producer='librdkafka'")
        security = kafka_admin.security_settings(config)
        if producer == "columnar" and security:
            raise ConfigurationError(f"Kafka sink: producer='columnar' speaks plaintext Kafka only and cannot "
                                     f"honour config= {security}. Fix: producer='librdkafka' (or leave producer= "
                                     f"unset, which picks librdkafka for such settings)")
        self.producer = producer or ("columnar" if semantic == "exactly_once" and not security else "librdkafka")
        self.format = format
        self._avro = (AvroCodec(avro_schema, schema_id=avro_schema_id, what="Kafka sink") if format == "avro"
                      else None)
        self.bootstrap = bootstrap
        self.topic = topic
        self.key = key
        self.semantic = semantic
        self.transactional_id_prefix = transactional_id_prefix
        self.transaction_pool_size = transaction_pool_size
        self.transaction_timeout = float(transaction_timeout)
        self.config = dict(config or {})
        self.preflight_timeout = preflight_timeout

    def validate(self, schema: pa.Schema | None) -> None:
        if self.key is not None and schema is not None and self.key not in schema.names:
            raise ConfigurationError(f"Kafka sink: key column {self.key!r} is not in the stream's columns "
                                     f"{schema.names}")
        if self._avro is not None and schema is not None:
            missing = [n for n in self._avro.arrow_schema.names if n not in schema.names]
            if missing:
                raise ConfigurationError(f"Kafka sink: avro_schema's fields {missing} are not in the stream's "
                                         f"columns {schema.names}. Fix: add them before the sink, or change "
                                         f"avro_schema")

    def encode(self, batch: pa.RecordBatch) -> list[bytes]:
        """The message values of a batch's rows."""
        return self._avro.encode(batch) if self._avro is not None else encode_json(batch)

    def encode_array(self, batch: pa.RecordBatch) -> pa.Array:
        """The message values as a binary array (the columnar producer's input)."""
        if self._avro is not None:
            return pa.array(self._avro.encode(batch), pa.binary())
        return encode_json_array(batch)

    def preflight(self, label: str) -> None:
        """Before the job: the servers answer and the topic exists (PreflightError naming it, labelled `label`)."""
        kafka_admin.require_topics(self.bootstrap, [self.topic], self.preflight_timeout, self.config, label)

    def create_writer(self, ctx: OperatorContext) -> SinkWriter:
        if self.semantic == "exactly_once":
            return TransactionalKafkaWriter(self, ctx)
        return KafkaWriter(self, ctx)


class _PidLog(logging.Logger):
    """Receives librdkafka's `eos` debug log and keeps the producer id line it states."""

    def __init__(self):
        super().__init__("streamsnap.kafka.librdkafka", logging.DEBUG)
        self.producer_id: tuple[int, int] | None = None

    def log(self, level, msg, *args, **kwargs):   # confluent-kafka calls log(level, message)
        text = msg % args if args else str(msg)
        found = txns.parse_producer_id(text)
        if found is not None:
            self.producer_id = found


class KafkaWriter(SinkWriter):
    """At-least-once: one idempotent producer, flushed at every checkpoint."""

    def __init__(self, sink: Kafka, ctx: OperatorContext):
        self._sink = sink
        self._ctx = ctx
        self._errors: list[str] = []
        self._producer = None
        self._since_poll = 0

    def _settings(self, **extra) -> dict:
        settings = {"bootstrap.servers": self._sink.bootstrap, "client.id": f"streamsnap-{self._ctx.task_name}",
                    "enable.idempotence": True, "on_delivery": self._on_delivery, **_PRODUCER_DEFAULTS}
        settings.update(self._sink.config)
        settings.update(extra)
        return settings

    def _on_delivery(self, error, message) -> None:
        if error is not None and len(self._errors) < 5:
            self._errors.append(error.str())

    def _raise_errors(self, what: str) -> None:
        if self._errors:
            raise KafkaSinkError(f"Kafka sink writing to topic {self._sink.topic!r} on {self._sink.bootstrap!r}: "
                                 f"{what}: {'; '.join(self._errors)}")

    def open(self) -> None:
        from confluent_kafka import Producer

        self._producer = Producer(self._settings())

    def _produce(self, producer, batch: Batch) -> int:
        record_batch = to_record_batch(batch)
        if self._sink.producer == "columnar":
            return self._produce_columns(producer, record_batch)
        values = self._sink.encode(record_batch)
        keys = encode_keys(record_batch, self._sink.key)
        topic = self._sink.topic
        produce = producer.produce
        if keys is None:
            for value in values:
                try:
                    produce(topic, value)
                except BufferError:
                    producer.poll(0.05)
                    produce(topic, value)
        else:
            for value, key in zip(values, keys):
                try:
                    produce(topic, value, key)
                except BufferError:
                    producer.poll(0.05)
                    produce(topic, value, key)
        self._since_poll += len(values)
        if self._since_poll >= 50_000:
            producer.poll(0)
            self._since_poll = 0
            self._raise_errors("delivery failed")
        return len(values)

    def _produce_columns(self, producer, record_batch: pa.RecordBatch) -> int:
        from streamsnap.connectors.kafka import produce as kp
        from streamsnap.connectors.kafka.producer import ProducerError

        keys = encode_keys_array(record_batch, self._sink.key)
        try:
            producer.produce(kp.binary_columns(self._sink.encode_array(record_batch)),
                             None if keys is None else kp.binary_columns(keys), record_batch.num_rows)
        except ProducerError as exc:
            raise KafkaSinkError(str(exc)) from exc
        return record_batch.num_rows

    def _flush(self, producer, what: str) -> None:
        remaining = producer.flush(self._sink.transaction_timeout)
        self._raise_errors("delivery failed")
        if remaining:
            raise KafkaSinkError(f"Kafka sink: {remaining} messages to topic {self._sink.topic!r} on "
                                 f"{self._sink.bootstrap!r} were not delivered within "
                                 f"{self._sink.transaction_timeout:g} s ({what})")

    def write(self, batch: Batch) -> None:
        if num_rows(batch):
            self._produce(self._producer, batch)

    def prepare_commit(self, checkpoint_id: int) -> list:
        self._flush(self._producer, f"checkpoint {checkpoint_id}")
        return []

    def end_input(self) -> None:
        self._flush(self._producer, "end of input")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None


class TransactionalKafkaWriter(KafkaWriter):
    """Exactly-once: a Kafka transaction per checkpoint interval (see the module docstring)."""

    def __init__(self, sink: Kafka, ctx: OperatorContext):
        super().__init__(sink, ctx)
        prefix = sink.transactional_id_prefix or txns.default_prefix(ctx.job_id, ctx.uid)
        self._pool = txns.TransactionPool(prefix, ctx.subtask_index, sink.transaction_pool_size)
        self._recovered = False
        self._txn: dict | None = None                 # the open transaction: slot, id, producer, ids, rows
        self._committing: dict[int, object] = {}      # slot -> producer of a pre-committed transaction
        self._next: Future | None = None              # the next interval's transaction, being made ready

    # ---------------------------------------------------------------- producers
    def _transactional_producer(self, tid: str, producer_id: bool = True):
        """A producer that owns `tid` (fencing and aborting whatever was open under it), with its
        (producer id, epoch) when `producer_id` (else None: fencing needs no id)."""
        from confluent_kafka import KafkaException, Producer

        if self._sink.producer == "columnar":
            return self._columnar_producer(tid, producer_id)
        pid_log = _PidLog()
        settings = {"transactional.id": tid, "transaction.timeout.ms": int(self._sink.transaction_timeout * 1000)}
        if producer_id:
            settings.update({"debug": "eos", "logger": pid_log})
        producer = Producer(self._settings(**settings))
        try:
            producer.init_transactions(self._sink.transaction_timeout)
        except KafkaException as exc:
            raise KafkaSinkError(f"Kafka sink: could not initialize transactional id {tid!r} on "
                                 f"{self._sink.bootstrap!r}: {exc}. Fix: make sure the broker supports "
                                 f"transactions and transaction.timeout.ms <= its transaction.max.timeout.ms") from exc
        if not producer_id:
            return producer, None
        deadline = time.monotonic() + 10
        while pid_log.producer_id is None and time.monotonic() < deadline:
            producer.poll(0.01)
        if pid_log.producer_id is None:
            raise KafkaSinkError(f"Kafka sink: librdkafka did not report the producer id of {tid!r}; it is "
                                 f"needed to commit the transaction after a restore")
        return producer, pid_log.producer_id

    def _columnar_producer(self, tid: str, producer_id: bool):
        from streamsnap.connectors.kafka.producer import ColumnarProducer, ProducerError

        try:
            producer = ColumnarProducer(self._sink.bootstrap, self._sink.topic, tid, self._sink.transaction_timeout)
        except ProducerError as exc:
            raise KafkaSinkError(str(exc)) from exc
        return producer, ((producer.producer_id, producer.epoch) if producer_id else None)

    def _release(self, producer) -> None:
        """Close a columnar producer's connections once its transaction is over (a librdkafka
        producer closes when it is collected)."""
        if self._sink.producer == "columnar":
            producer.close()

    def _fence(self, tids: list[str]) -> None:
        """Abort whatever the given transactional ids left open (a new producer epoch fences them).

        The ids are fenced in parallel (one round trip to the transaction coordinator each, which
        a restore would otherwise pay one after another); the first failure is raised."""
        def fence(tid: str) -> None:
            producer, _ = self._transactional_producer(tid, producer_id=False)
            producer.flush(0)
            self._release(producer)

        if tids:
            with ThreadPoolExecutor(len(tids), thread_name_prefix="kafka-fence") as pool:
                list(pool.map(fence, tids))       # waits for all; raises the first failure

    def _ready_transaction(self, slot: int, tid: str) -> dict:
        """A producer owning `tid` with its transaction begun (runs on the preparing thread too)."""
        producer, (pid, epoch) = self._transactional_producer(tid)
        producer.begin_transaction()
        return {"slot": slot, "id": tid, "producer": producer, "pid": pid, "epoch": epoch, "rows": 0}

    def _prepare_next(self) -> None:
        """Make the next slot's transaction ready in the background, if that slot is free now.

        Taking the slot fences its id (init_transactions), which is safe only because a free
        slot's last transaction was committed; a slot still waiting for its commit is left alone
        and taken later by `_begin` (which then says the pool is exhausted, if it still is)."""
        if self._next is not None or not self._pool.next_is_free():
            return
        slot, tid = self._pool.take()
        future: Future = Future()

        def prepare() -> None:
            try:
                future.set_result(self._ready_transaction(slot, tid))
            except BaseException as exc:      # handed to the mailbox thread by _begin's result()
                future.set_exception(exc)

        # A daemon thread (not an executor, whose threads are joined at exit): a broker that does
        # not answer must not keep a finished subtask's process alive.
        threading.Thread(target=prepare, name=f"kafka-txn-{tid}", daemon=True).start()
        self._next = future

    def _begin(self) -> None:
        if self._next is not None:
            prepared, self._next = self._next, None
            self._txn = prepared.result()
        else:
            self._txn = self._ready_transaction(*self._pool.take())
        self._prepare_next()

    # ---------------------------------------------------------------- the two phases
    def open(self) -> None:
        if not self._recovered:
            # A fresh start: a previous run of this job (same prefix) may have left transactions open.
            self._fence(txns.pool_ids(self._pool.prefix, self._ctx.subtask_index, self._pool.pool_size))
        self._prepare_next()

    def write(self, batch: Batch) -> None:
        if not num_rows(batch):
            return
        if self._txn is None:
            self._begin()
        self._txn["rows"] += self._produce(self._txn["producer"], batch)

    def prepare_commit(self, checkpoint_id: int) -> list:
        txn = self._txn
        if txn is not None and txn["rows"]:
            self._flush(txn["producer"], f"pre-commit of checkpoint {checkpoint_id}")
            self._pool.pre_committed(txn["slot"], txns.txn_committable(
                txn["id"], txn["pid"], txn["epoch"], checkpoint_id, self._ctx.subtask_index))
            self._committing[txn["slot"]] = txn["producer"]
            self._txn = None
        # An open transaction without rows stays open for the next interval.
        return self._pool.committables(self._ctx.parallelism)

    def commit(self, checkpoint_id: int) -> None:
        for slot, committable in self._pool.due(checkpoint_id):
            producer = self._committing.pop(slot, None)
            if producer is not None:
                producer.commit_transaction(self._sink.transaction_timeout)
                self._release(producer)
            else:
                self._commit_restored(committable)
            self._pool.committed(slot)

    def _commit_restored(self, committable: dict) -> None:
        outcome = end_transaction(self._sink.bootstrap, committable["id"], committable["pid"],
                                  committable["epoch"], commit=True, timeout=self._sink.transaction_timeout)
        if outcome is EndTxnOutcome.FENCED:
            log.info("Kafka sink: transaction %s of checkpoint %s was already committed (its id moved on)",
                     committable["id"], committable["checkpoint"])

    def recover(self, committables: list) -> None:
        plan = txns.recovery_plan(committables, self._ctx.subtask_index, self._ctx.parallelism,
                                  self._pool.prefix, self._pool.pool_size)
        # An explicit prefix wins for new transactions (e.g. a second job forked from the same
        # savepoint); the old ids are committed and fenced either way.
        prefix = self._sink.transactional_id_prefix or plan.prefix
        self._pool = txns.TransactionPool(prefix, self._ctx.subtask_index, self._pool.pool_size)
        if prefix != plan.prefix:
            plan = txns.RecoveryPlan(prefix, plan.commit,
                                     plan.abort + txns.pool_ids(prefix, self._ctx.subtask_index, self._pool.pool_size))
        for committable in plan.commit:
            self._commit_restored(committable)
        self._fence(plan.abort)
        self._recovered = True

    def end_input(self) -> None:
        if self._ctx.extra.get("checkpointing"):
            return  # the final checkpoint pre-commits and commits what is left
        if self._txn is not None:
            self._flush(self._txn["producer"], "end of input")
            self._txn["producer"].commit_transaction(self._sink.transaction_timeout)
            self._txn = None

    def close(self) -> None:
        # Open and pre-committed transactions stay as they are: a restore commits or aborts them
        # (a transaction being made ready is one of the pool's ids, fenced by a restore too).
        self._txn = None
        self._next = None
        self._committing.clear()


__all__ = ["Kafka", "KafkaWriter", "TransactionalKafkaWriter", "KafkaSinkError", "encode_json", "encode_keys"]
