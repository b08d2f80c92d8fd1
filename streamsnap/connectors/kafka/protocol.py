"""Committing a Kafka transaction a dead producer left open (the Kafka sink's commit-on-restore).

Why it exists: a restored exactly-once Kafka sink must commit the transactions its restored
checkpoint pre-committed — their producers died with the failed attempt. The Java client can be
made to resume such a transaction (producer id and epoch set into a fresh producer); librdkafka,
under confluent-kafka, has no API for that: `init_transactions` on the same transactional id
*aborts* it. The Kafka protocol itself needs no producer state to finish a transaction: an
`EndTxn(transactional_id, producer_id, producer_epoch, committed=true)` sent to the transaction
coordinator commits it — exactly the request the resumed Java producer sends. This module
speaks those two requests (FindCoordinator, EndTxn) with no client library: encoding and
decoding are pure functions (`encode_*`, `decode_*`); `end_transaction` is the thin socket shell.

Outcomes of an EndTxn commit, as the sink interprets them:
* error NONE — committed now, or it had been committed before (a retry of a completed commit);
* a fencing error (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE,
  INVALID_PRODUCER_ID_MAPPING) — the id moved on: this transaction was committed before and its
  id reused by a newer producer (or the broker aborted it on its transaction timeout, which
  only a timeout shorter than the outage causes). Nothing to do, as in Flink's recovery.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass
from enum import Enum

from streamsnap.errors import StreamsnapError

FIND_COORDINATOR = 10
END_TXN = 26
COORDINATOR_TRANSACTION = 1

NONE = 0
RETRIABLE = {7: "REQUEST_TIMED_OUT", 14: "COORDINATOR_LOAD_IN_PROGRESS", 15: "COORDINATOR_NOT_AVAILABLE",
             16: "NOT_COORDINATOR", 51: "CONCURRENT_TRANSACTIONS"}
FENCED = {47: "INVALID_PRODUCER_EPOCH", 48: "INVALID_TXN_STATE", 49: "INVALID_PRODUCER_ID_MAPPING",
          90: "PRODUCER_FENCED"}


class KafkaProtocolError(StreamsnapError):
    """A Kafka request failed with an error that is neither retriable nor a fence."""


class EndTxnOutcome(Enum):
    COMMITTED = "committed"      # error NONE: committed now or before
    ABORTED = "aborted"          # error NONE on an abort request
    FENCED = "fenced"            # the id moved on: committed before, and the id reused


@dataclass(frozen=True)
class Coordinator:
    node_id: int
    host: str
    port: int


# ===================================================================== pure encoding
def _string(value: str) -> bytes:
    raw = value.encode("utf-8")
    return struct.pack(">h", len(raw)) + raw


def encode_request(api_key: int, api_version: int, correlation_id: int, body: bytes,
                   client_id: str = "streamsnap") -> bytes:
    """A size-prefixed request with a v1 header (api key, version, correlation id, client id)."""
    payload = struct.pack(">hhi", api_key, api_version, correlation_id) + _string(client_id) + body
    return struct.pack(">i", len(payload)) + payload


def encode_find_coordinator(transactional_id: str, correlation_id: int) -> bytes:
    """FindCoordinator v1 for a transactional id."""
    return encode_request(FIND_COORDINATOR, 1, correlation_id,
                          _string(transactional_id) + struct.pack(">b", COORDINATOR_TRANSACTION))


def encode_end_txn(transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                   correlation_id: int) -> bytes:
    """EndTxn v1: commit (or abort) the ongoing transaction of (producer id, epoch)."""
    body = _string(transactional_id) + struct.pack(">qhb", producer_id, producer_epoch, 1 if commit else 0)
    return encode_request(END_TXN, 1, correlation_id, body)


def _split_response(frame: bytes, correlation_id: int) -> bytes:
    """The body of a response frame (without its size prefix), checking the correlation id."""
    (got,) = struct.unpack_from(">i", frame, 0)
    if got != correlation_id:
        raise KafkaProtocolError(f"response correlation id {got} does not match the request's {correlation_id}")
    return frame[4:]


def decode_find_coordinator(frame: bytes, correlation_id: int) -> tuple[int, Coordinator | None]:
    """(error code, coordinator or None) of a FindCoordinator v1 response frame."""
    body = _split_response(frame, correlation_id)
    _throttle, error = struct.unpack_from(">ih", body, 0)
    offset = 6
    (message_length,) = struct.unpack_from(">h", body, offset)
    offset += 2 + max(message_length, 0)
    (node_id,) = struct.unpack_from(">i", body, offset)
    offset += 4
    (host_length,) = struct.unpack_from(">h", body, offset)
    host = body[offset + 2:offset + 2 + host_length].decode("utf-8")
    offset += 2 + host_length
    (port,) = struct.unpack_from(">i", body, offset)
    return error, (Coordinator(node_id, host, port) if error == NONE else None)


def decode_end_txn(frame: bytes, correlation_id: int) -> int:
    """The error code of an EndTxn v1 response frame."""
    body = _split_response(frame, correlation_id)
    _throttle, error = struct.unpack_from(">ih", body, 0)
    return error


def end_txn_outcome(error: int, commit: bool, transactional_id: str) -> EndTxnOutcome | None:
    """What an EndTxn error code means; None: retriable (ask the coordinator again)."""
    if error == NONE:
        return EndTxnOutcome.COMMITTED if commit else EndTxnOutcome.ABORTED
    if error in FENCED:
        return EndTxnOutcome.FENCED
    if error in RETRIABLE:
        return None
    raise KafkaProtocolError(f"EndTxn for transactional id {transactional_id!r} failed with Kafka error {error}")


def parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    """'host:port,host:port' → [(host, port)]; a missing port means 9092."""
    servers = []
    for entry in bootstrap.split(","):
        entry = entry.strip().removeprefix("PLAINTEXT://").removeprefix("tcp://")
        if not entry:
            continue
        host, _, port = entry.rpartition(":") if ":" in entry else (entry, "", "9092")
        servers.append((host.strip("[]"), int(port)))
    return servers


# ===================================================================== socket shell
class _ConnectionClosed(ConnectionError):
    """The broker closed the connection before the whole response arrived."""


def _call(address: tuple[str, int], request: bytes, timeout: float) -> bytearray:
    with socket.create_connection(address, timeout=timeout) as conn:
        conn.sendall(request)
        return read_frame(conn, address)


def read_frame(conn: socket.socket, address: tuple[str, int]) -> bytearray:
    """One response frame (size prefix off) read from `conn`, received in place."""
    (size,) = struct.unpack(">i", _read(conn, 4, address))
    return _read(conn, size, address)


def _read(conn: socket.socket, n: int, address: tuple[str, int]) -> bytearray:
    data = bytearray(n)
    view, got = memoryview(data), 0
    while got < n:
        k = conn.recv_into(view[got:])
        if not k:
            raise _ConnectionClosed(f"{address[0]}:{address[1]} closed the connection")
        got += k
    return data


def find_coordinator(bootstrap: str, transactional_id: str, timeout: float = 10.0) -> Coordinator:
    """The transaction coordinator of `transactional_id` (asks each bootstrap server in turn)."""
    errors = []
    for address in parse_bootstrap(bootstrap):
        try:
            frame = _call(address, encode_find_coordinator(transactional_id, 1), timeout)
            error, coordinator = decode_find_coordinator(frame, 1)
        except (OSError, _ConnectionClosed) as exc:
            errors.append(f"{address[0]}:{address[1]}: {type(exc).__name__}: {exc}")
            continue
        if coordinator is not None:
            return coordinator
        errors.append(f"{address[0]}:{address[1]}: Kafka error {error}")
    raise KafkaProtocolError(f"no transaction coordinator found for {transactional_id!r} via {bootstrap!r}: "
                             + "; ".join(errors))


def end_transaction(bootstrap: str, transactional_id: str, producer_id: int, producer_epoch: int,
                    commit: bool = True, timeout: float = 30.0) -> EndTxnOutcome:
    """Commit (or abort) the open transaction of (producer id, epoch) under `transactional_id`.

    Retries while the coordinator is loading or moving, until `timeout`. Some brokers (tansu)
    close the connection instead of answering with a fencing error: a close right after the
    request, twice in a row with the coordinator reachable, counts as fenced."""
    deadline = time.monotonic() + timeout
    closed = 0
    correlation = 2
    while True:
        coordinator = find_coordinator(bootstrap, transactional_id, min(10.0, timeout))
        correlation += 1
        request = encode_end_txn(transactional_id, producer_id, producer_epoch, commit, correlation)
        try:
            outcome = end_txn_outcome(decode_end_txn(_call((coordinator.host, coordinator.port), request,
                                                           min(10.0, timeout)), correlation),
                                      commit, transactional_id)
        except _ConnectionClosed:
            closed += 1
            if closed >= 2:
                return EndTxnOutcome.FENCED
            outcome = None
        if outcome is not None:
            return outcome
        if time.monotonic() > deadline:
            raise KafkaProtocolError(f"EndTxn for transactional id {transactional_id!r} did not complete within "
                                     f"{timeout} s (coordinator {coordinator.host}:{coordinator.port} kept "
                                     f"answering with retriable errors)")
        time.sleep(0.1)


__all__ = ["EndTxnOutcome", "KafkaProtocolError", "Coordinator", "encode_find_coordinator", "encode_end_txn",
           "decode_find_coordinator", "decode_end_txn", "end_txn_outcome", "parse_bootstrap",
           "find_coordinator", "end_transaction"]
