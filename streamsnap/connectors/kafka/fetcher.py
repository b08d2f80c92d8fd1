"""The socket shell of the Kafka source's columnar fetcher: leaders, offsets, pipelined Fetches.

Why it exists: `fetch.py` encodes requests and decodes responses without I/O; this module
only moves the bytes. One connection per partition leader, one Fetch in flight per connection
(sent again as soon as its response arrived, so the broker gathers the next response while the
reader parses this one), responses read into a writable buffer the decoder works in. Failed
connections and leader changes are retried after a metadata refresh for `retry_for` seconds,
then a `FetcherError` names the broker and what failed.
"""

from __future__ import annotations

import select
import socket
import time

from streamsnap.connectors.kafka import fetch as kf
from streamsnap.connectors.kafka.protocol import _call, _ConnectionClosed, parse_bootstrap, read_frame
from streamsnap.errors import StreamsnapError


class FetcherError(StreamsnapError):
    """A broker could not be reached, or kept failing, for longer than the fetcher retries."""


class _Connection:
    def __init__(self, address: tuple[str, int], timeout: float):
        self.address = address
        # A short connect timeout: a broker that does not answer must not hold the task (and
        # the barriers queued behind it) for the whole read timeout before the retry.
        self.sock = socket.create_connection(address, timeout=min(timeout, 5.0))
        self.sock.settimeout(timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.in_flight: tuple[int, dict] | None = None             # (correlation id, requested positions)

    def readable(self) -> bool:
        return bool(select.select([self.sock], [], [], 0)[0])

    def receive(self) -> bytearray:
        return read_frame(self.sock, self.address)

    def close(self) -> None:
        self.sock.close()


class Fetcher:
    """Fetches partitions from their leaders. `poll(positions)` returns the Fetch responses that
    arrived, as (frame, [PartitionData]) with the requested offset of each partition."""

    def __init__(self, bootstrap: str, *, read_committed: bool, max_wait_ms: int = 20,
                 max_bytes: int = 64 << 20, partition_max_bytes: int = 16 << 20, timeout: float = 30.0,
                 retry_for: float = 30.0):
        self.bootstrap = bootstrap
        self.isolation = kf.READ_COMMITTED if read_committed else kf.READ_UNCOMMITTED
        self.max_wait_ms, self.max_bytes, self.partition_max_bytes = max_wait_ms, max_bytes, partition_max_bytes
        self.timeout, self.retry_for = timeout, retry_for
        self._correlation = 0
        self._brokers: dict[int, tuple[str, int]] = {}
        self._leaders: dict[tuple[str, int], int] = {}
        self._connections: dict[int, _Connection] = {}
        self._stale = True
        self._failing_since: float | None = None
        self._last_failure = ""

    def _next_id(self) -> int:
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        return self._correlation

    # ------------------------------------------------------------- metadata
    def refresh(self, topics: list[str]) -> None:
        """Look up the brokers and the leaders of `topics` (via any bootstrap server)."""
        errors = []
        for address in parse_bootstrap(self.bootstrap):
            correlation = self._next_id()
            try:
                metadata = kf.decode_metadata(_call(address, kf.encode_metadata(sorted(topics), correlation),
                                                    self.timeout), correlation)
            except (OSError, ConnectionError, _ConnectionClosed) as exc:
                errors.append(f"{address[0]}:{address[1]}: {type(exc).__name__}: {exc}")
                continue
            self._brokers = metadata.brokers
            self._leaders.update(metadata.leaders)
            self._stale = False
            return
        raise ConnectionError("no bootstrap server answered a Metadata request: " + "; ".join(errors))

    def _connection(self, node: int) -> _Connection:
        conn = self._connections.get(node)
        if conn is None:
            conn = self._connections[node] = _Connection(self._brokers[node], self.timeout)
        return conn

    def _drop(self, node: int) -> None:
        conn = self._connections.pop(node, None)
        if conn is not None:
            conn.close()

    def failed(self, what: str) -> None:
        """Note a retriable failure (refresh the metadata next time); past `retry_for` seconds of
        failures without a good response in between, raise FetcherError."""
        now = time.monotonic()
        self._stale = True
        self._last_failure = what
        if self._failing_since is None:
            self._failing_since = now
        elif now - self._failing_since > self.retry_for:
            raise FetcherError(f"{what} (failing for {now - self._failing_since:.0f} s, retried after refreshing "
                               f"the leaders via {self.bootstrap!r})")

    def succeeded(self) -> None:
        """A partition was fetched without error: failures so far are over."""
        self._failing_since = None

    def leader_address(self, key: tuple[str, int]) -> str:
        address = self._brokers.get(self._leaders.get(key, -1))
        return f"{address[0]}:{address[1]}" if address else self.bootstrap

    # ------------------------------------------------------------- offsets
    def list_offsets(self, keys: list[tuple[str, int]], timestamp: int) -> dict[tuple[str, int], int]:
        """Each partition's earliest (-2) or latest (-1) offset, asked of its leader."""
        out: dict[tuple[str, int], int] = {}
        while True:
            todo = [k for k in keys if k not in out]
            if not todo:
                self.succeeded()
                return out
            if len(todo) < len(keys) or self._failing_since is not None:
                time.sleep(0.1)                                        # a retry: give the cluster a moment
            try:
                if self._stale or any(self._leaders.get(k, -1) < 0 for k in todo):
                    self.refresh(sorted({t for t, _ in todo}))
                by_leader: dict[int, dict[str, list[int]]] = {}
                for topic, partition in todo:
                    by_leader.setdefault(self._leaders.get((topic, partition), -1), {}).setdefault(
                        topic, []).append(partition)
                for node, partitions in by_leader.items():
                    if node < 0:
                        self.failed(f"no leader for {partitions}")
                        continue
                    correlation = self._next_id()
                    request = kf.encode_list_offsets(partitions, timestamp, correlation)
                    answer = kf.decode_list_offsets(_call(self._brokers[node], request, self.timeout), correlation)
                    for key, (error, offset) in answer.items():
                        if error == 0:
                            out[key] = offset
                        elif error in kf.REFRESH:
                            self.failed(f"ListOffsets of {key[0]}[{key[1]}]: {kf.ERROR_NAMES[error]}")
                        else:
                            raise FetcherError(f"ListOffsets of {key[0]}[{key[1]}] from {self.leader_address(key)} "
                                               f"failed with Kafka error {kf.ERROR_NAMES.get(error, error)}")
            except (OSError, ConnectionError, _ConnectionClosed) as exc:
                self.failed(f"ListOffsets via {self.bootstrap!r}: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------- fetching
    def poll(self, positions: dict[tuple[str, int], int]) -> list[tuple[bytearray, list[kf.PartitionData], dict]]:
        """Send a Fetch to every leader of `positions` without one in flight; return the
        responses that have arrived (frame, partitions, the offsets their request asked for)."""
        try:
            if self._stale or any(self._leaders.get(k, -1) < 0 for k in positions):
                self.refresh(sorted({t for t, _ in positions}))
        except (OSError, ConnectionError) as exc:
            self.failed(f"Metadata via {self.bootstrap!r}: {type(exc).__name__}: {exc}")
            return []
        by_leader: dict[int, dict] = {}
        for key, offset in positions.items():
            by_leader.setdefault(self._leaders.get(key, -1), {})[key] = offset
        if -1 in by_leader:
            self.failed(f"no leader known for {sorted(by_leader.pop(-1))}")
        out = []
        for node, wanted in by_leader.items():
            address = self._brokers.get(node)
            try:
                conn = self._connection(node)
                if conn.in_flight is None:
                    correlation = self._next_id()
                    conn.sock.sendall(kf.encode_fetch(wanted, correlation, isolation=self.isolation,
                                                      max_wait_ms=self.max_wait_ms, max_bytes=self.max_bytes,
                                                      partition_max_bytes=self.partition_max_bytes))
                    conn.in_flight = (correlation, wanted)
                if conn.readable():
                    correlation, asked = conn.in_flight
                    frame = conn.receive()
                    conn.in_flight = None
                    out.append((frame, kf.decode_fetch(frame, correlation), asked))
            except (OSError, ConnectionError) as exc:
                self._drop(node)
                self.failed(f"Fetch from broker {node} at {address}: {type(exc).__name__}: {exc}")
        return out

    def close(self) -> None:
        for node in list(self._connections):
            self._drop(node)


__all__ = ["Fetcher", "FetcherError"]
