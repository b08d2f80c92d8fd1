"""The socket shell of the Kafka sink's columnar producer: one transactional producer, no client library.

Why it exists: `produce.py` encodes record batches and requests without I/O; this module
sends them. A `ColumnarProducer` owns one transactional id: InitProducerId at the transaction
coordinator (which fences older producers of the id and aborts what they left open), then per
transaction AddPartitionsToTxn before a partition's first batch, Produce requests with acks=all
to the partition leaders (each write waits for its acknowledgements, so `flush` has nothing
left to wait for), and EndTxn to commit (`protocol.end_transaction`). Sequence numbers
count per partition within the producer's epoch, as an idempotent producer's must.
"""

from __future__ import annotations

import time

from streamsnap.connectors.kafka import fetch as kf
from streamsnap.connectors.kafka import produce as kp
from streamsnap.connectors.kafka.protocol import (EndTxnOutcome, _call, _ConnectionClosed, end_transaction,
                                                  find_coordinator, parse_bootstrap)
from streamsnap.errors import StreamsnapError


class ProducerError(StreamsnapError):
    """A request of the columnar producer failed (the message names the id, topic and broker)."""


class ColumnarProducer:
    def __init__(self, bootstrap: str, topic: str, transactional_id: str, transaction_timeout: float,
                 request_timeout: float = 30.0):
        self.bootstrap, self.topic, self.transactional_id = bootstrap, topic, transactional_id
        self.transaction_timeout, self.request_timeout = transaction_timeout, request_timeout
        self._correlation = 0
        self._sequences: dict[int, int] = {}
        self._in_transaction: set[int] = set()
        self._next_keyless = 0
        self._leaders: dict[int, tuple[str, int]] = {}
        self._connections: dict[tuple[str, int], object] = {}     # leader address -> fetcher._Connection
        self._refresh()
        self.producer_id, self.epoch = self._init_producer_id()

    def _next_id(self) -> int:
        self._correlation += 1
        return self._correlation

    def _fail(self, what: str) -> ProducerError:
        return ProducerError(f"Kafka sink producer {self.transactional_id!r} writing to topic {self.topic!r} on "
                             f"{self.bootstrap!r}: {what}")

    def _retrying(self, what: str, attempt):
        """attempt() -> (done, result); retried on retriable errors and lost connections until
        the request timeout."""
        deadline = time.monotonic() + self.request_timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                done, result = attempt()
            except (OSError, _ConnectionClosed) as exc:
                done, result, last = False, None, f"{type(exc).__name__}: {exc}"
            if done:
                return result
            last = last or str(result)
            time.sleep(0.05)
        raise self._fail(f"{what} did not succeed within {self.request_timeout:g} s ({last})")

    def _refresh(self) -> None:
        address = parse_bootstrap(self.bootstrap)[0]
        correlation = self._next_id()
        metadata = kf.decode_metadata(_call(address, kf.encode_metadata([self.topic], correlation),
                                            self.request_timeout), correlation)
        if self.topic in metadata.errors:
            raise self._fail(f"the topic's metadata: {kp.error_name(metadata.errors[self.topic])}")
        self._leaders = {p: metadata.brokers.get(node) for (t, p), node in metadata.leaders.items()
                         if t == self.topic}
        self.partition_count = len(self._leaders)

    def _coordinator_call(self, request_of, decode):
        coordinator = find_coordinator(self.bootstrap, self.transactional_id, self.request_timeout)
        correlation = self._next_id()
        return decode(_call((coordinator.host, coordinator.port), request_of(correlation), self.request_timeout),
                      correlation)

    def _init_producer_id(self) -> tuple[int, int]:
        timeout_ms = int(self.transaction_timeout * 1000)

        def attempt():
            error, pid, epoch = self._coordinator_call(
                lambda c: kp.encode_init_producer_id(self.transactional_id, timeout_ms, c), kp.decode_init_producer_id)
            if error in kp.RETRIABLE:
                return False, kp.error_name(error)
            if error:
                raise self._fail(f"InitProducerId failed with {kp.error_name(error)}. Fix: make sure the broker "
                                 f"supports transactions and transaction_timeout <= its transaction.max.timeout.ms")
            return True, (pid, epoch)
        return self._retrying("InitProducerId", attempt)

    def begin_transaction(self) -> None:
        self._in_transaction = set()

    def _add_partitions(self, partitions: list[int]) -> None:
        def attempt():
            errors = self._coordinator_call(
                lambda c: kp.encode_add_partitions(self.transactional_id, self.producer_id, self.epoch, self.topic,
                                                   partitions, c), kp.decode_add_partitions)
            bad = {p: e for p, e in errors.items() if e}
            if any(e not in kp.RETRIABLE for e in bad.values()):
                raise self._fail("AddPartitionsToTxn failed: " + ", ".join(
                    f"[{p}] {kp.error_name(e)}" for p, e in sorted(bad.items())))
            return not bad, ", ".join(kp.error_name(e) for e in bad.values())
        self._retrying("AddPartitionsToTxn", attempt)
        self._in_transaction.update(partitions)

    def produce(self, values, keys, n_rows: int) -> None:
        """Write rows (produce.binary_columns of values and keys, keys None: no key) in the
        open transaction, one record batch per partition; returns once all are acknowledged."""
        import numpy as np

        partitions = kp.partitions_of(keys, n_rows, self.partition_count, self._next_keyless)
        self._next_keyless += n_rows
        order = np.argsort(partitions, kind="stable")
        bounds = np.searchsorted(partitions[order], np.arange(self.partition_count + 1))
        rows_of = {p: order[bounds[p]:bounds[p + 1]] for p in range(self.partition_count) if bounds[p + 1] > bounds[p]}
        new = sorted(p for p in rows_of if p not in self._in_transaction)
        if new:
            self._add_partitions(new)
        now = int(time.time() * 1000)
        batches = {}
        for p, rows in rows_of.items():
            batches[p] = kp.record_batch(values, keys, rows, producer_id=self.producer_id, epoch=self.epoch,
                                         base_sequence=self._sequences.get(p, 0), transactional=True,
                                         timestamp_ms=now)
        self._send(batches)
        for p, rows in rows_of.items():
            self._sequences[p] = self._sequences.get(p, 0) + len(rows)

    def _send(self, batches: dict[int, bytes]) -> None:
        """Produce every partition's batch to its leader; partitions answered with a retriable
        error are sent again (same sequence numbers) after looking the leaders up again."""
        pending = dict(batches)

        def attempt():
            by_leader: dict[tuple[str, int], dict[int, bytes]] = {}
            for p, batch in pending.items():
                by_leader.setdefault(self._leaders[p], {})[p] = batch
            failed = {}
            for address, mine in by_leader.items():
                correlation = self._next_id()
                request = kp.encode_produce(self.transactional_id, self.topic, mine,
                                            int(self.request_timeout * 1000), correlation)
                errors = kp.decode_produce(self._call_leader(address, request), correlation)
                for p in mine:
                    error = errors.get(p, 0)
                    if error and error != 46:                  # 46: a retry's duplicate, written before
                        if error not in kp.RETRIABLE:
                            raise self._fail(f"Produce of partition {p} to {address[0]}:{address[1]} failed with "
                                             f"{kp.error_name(error)}")
                        failed[p] = error
                    else:
                        del pending[p]
            if failed:
                self._refresh()
            return not pending, ", ".join(f"[{p}] {kp.error_name(e)}" for p, e in sorted(failed.items()))
        self._retrying("Produce", attempt)

    def _call_leader(self, address: tuple[str, int], request: bytes) -> bytearray:
        """A request over the kept connection to a leader (a broken one is dropped and the error
        raised, for the retry to connect anew)."""
        from streamsnap.connectors.kafka.fetcher import _Connection

        conn = self._connections.get(address)
        try:
            if conn is None:
                conn = self._connections[address] = _Connection(address, self.request_timeout)
            conn.sock.sendall(request)
            return conn.receive()
        except OSError:
            self._connections.pop(address, None)
            if conn is not None:
                conn.close()
            raise

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()

    def flush(self, timeout: float = 0) -> int:
        return 0                                               # every write waited for its acknowledgements

    def commit_transaction(self, timeout: float) -> None:
        if not self._in_transaction:
            return
        outcome = end_transaction(self.bootstrap, self.transactional_id, self.producer_id, self.epoch,
                                  commit=True, timeout=timeout)
        if outcome is not EndTxnOutcome.COMMITTED:
            raise self._fail(f"EndTxn commit answered {outcome.value} (the id was fenced by a newer producer)")


__all__ = ["ColumnarProducer", "ProducerError"]
