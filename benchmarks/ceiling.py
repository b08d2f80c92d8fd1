"""The ceiling: the W1 shape ("keyed running sum") on this machine with no engine at all.

W1 is N rows with ``key = i % K`` and ``value = i`` (int64), parallelism P (2 by default): P
source processes → a keyed shuffle over loopback TCP carrying Arrow IPC record batches → P
keyed-sum processes, results discarded. streamsnap runs exactly that shape; this module runs
the same shape with nothing but the essentials, so its events/s is the physical limit the engine
can be held against:

* producers (one process each) generate their share of the index space in numpy batches —
  producer ``p`` owns the indices ``i ≡ p (mod P)``, like streamsnap's `Generator` splits —
  compute every row's target consumer vectorized, split the batch with one stable argsort and
  slices, and write each part as an Arrow IPC record batch message onto a plain loopback TCP
  socket (one connection per producer → consumer pair; each connection carries one well-formed
  IPC *stream*: schema message, record batch messages, end-of-stream marker);
* consumers (one process each) read those streams and keep per-key running sums vectorized in
  numpy: per batch one stable argsort of the keys, a cumulative sum, the per-row running totals
  (group cumsum continuing from the state) materialized as an array and then dropped, and the
  per-key batch totals added into an int64 state array.

Choices, all made for speed (this is a ceiling) without skipping work the engine cannot skip:

* Routing (``partitioner``): ``"fmix64"`` (default) hashes the key with murmur3's fmix64 finalizer
  over uint64 — the function streamsnap's key groups use — then takes it modulo P. The engine must
  hash arbitrary keys to balance them, so the ceiling pays for a hash too. ``"mod"`` (``key % P``)
  is cheaper but only balanced because W1's keys are consecutive integers, and it degenerates:
  with P = 2 and an even K, ``key % 2 == i % 2``, so every producer sends all its rows to the
  consumer of its own index and nothing crosses over — not the shuffle the engine performs.
  (The engine maps hash → key group → subtask; ``hash % P`` costs the same, one fewer step.)
* Per-key batch totals come out of the group cumsum (last prefix of each group minus the prefix
  before it), exact int64 — the same result as ``np.bincount(keys, weights=values, minlength=k)``
  but without float64 weights (inexact beyond 2**53) and cheaper, since the cumsum is needed for
  the running totals anyway; it is also how streamsnap's `group_cumsum` computes them. The key
  is its own dense index (keys are ``0..K-1``), so no factorization is needed.
* Keys are sorted as uint16 when K <= 65536: numpy's stable sort is a radix sort for 16-bit keys.
* Producer scratch buffers are preallocated and the numpy steps write into them (``out=``);
  the split sizes come from a compare per consumer, cheaper than `np.bincount` for a few.
* Sending is zero-copy: pyarrow's IPC stream writer encodes into a file-like sink that keeps
  the metadata pieces and views of the numpy body buffers, written with ``sendmsg``.
* ``flush_bytes`` (1 MiB): each connection queues messages until that many bytes are pending
  and writes them with one ``sendmsg`` — output buffering as in any engine's network layer:
  two messages per write for 64 Ki-row batches (parts of ~0.5 MB), sixteen for 8 Ki-row ones,
  saving syscalls and consumer wake-ups; ``flush_bytes=1`` writes every message at once.
* ``malloc_tuning`` (default on) raises glibc's mmap and trim thresholds in the worker processes
  (the same `streamsnap.runtime.allocator.tune_allocator` the engine's tasks apply):
  numpy temporaries of a few hundred KB are otherwise mmap'ed and unmapped (or trimmed) on every
  batch, and the page faults on fresh pages cost more than the arithmetic. Off shows that cost.
* ``reader``: ``"selectors"`` (default: one thread, non-blocking sockets, a `selectors` loop) or
  ``"threads"`` (one blocking reader thread per connection, the keyed sum under a lock). Both
  frame IPC messages themselves out of one reusable receive buffer per connection and decode the
  record batches zero-copy from it.

Timing: consumers bind, producers connect and send their schema messages, every worker reports
ready, then the parent notes the time and releases the producers; the clock stops at the latest
consumer's finish (``time.monotonic`` is system-wide on Linux, so the workers' readings compare
with the parent's). Process start-up and connection set-up are excluded. Each consumer returns
its final per-key totals; their sum must equal the closed-form reference or `CeilingError` is
raised.

Workers are plain ``subprocess`` children (python -c, importing this module) with a
`multiprocessing.connection.Connection` over a socketpair for control, so nothing of
multiprocessing's machinery (resource tracker, forkserver) outlives a measurement; every
worker is waited for, or terminated after a failure, before `measure_ceiling` returns.

Run ``python -m benchmarks.ceiling --help`` for the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection, wait as mp_wait
from typing import Any

import numpy as np
import pyarrow as pa

from streamsnap.runtime.allocator import tune_allocator

__all__ = ["measure_ceiling", "measure_ceiling_median", "reference_totals", "CeilingError",
           "PARTITIONERS", "READERS"]

PARTITIONERS = ("fmix64", "mod")
READERS = ("selectors", "threads")

SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.int64())])

_HOST = "127.0.0.1"
_CONTINUATION = 0xFFFFFFFF
_PREFIX = struct.Struct("<Ii")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U16 = struct.Struct("<H")
_I64 = struct.Struct("<q")

_FMIX_C1 = np.uint64(0xFF51AFD7ED558CCD)
_FMIX_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_SHIFT_33 = np.uint64(33)

_SOCKET_BUFFER = 4 << 20        # SO_SNDBUF / SO_RCVBUF asked for (the kernel caps it at *mem_max)
_RECV_BUFFER = 4 << 20          # initial size of a connection's receive buffer (grows if needed)
_SETUP_TIMEOUT = 60.0           # seconds for spawning, binding, connecting


class CeilingError(RuntimeError):
    """A ceiling run failed: a worker raised or died, timed out, or the result was wrong."""


# ---------------------------------------------------------------------------------------------
# arguments and the reference


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _check_args(n, k, batch_size, parallelism, partitioner, reader) -> tuple[int, int, int, int]:
    n = _check_int("n", n, 1)
    k = _check_int("k", k, 1)
    batch_size = _check_int("batch_size", batch_size, 1)
    parallelism = _check_int("parallelism", parallelism, 1)
    if parallelism > 256:
        raise ValueError(f"parallelism must be <= 256, got {parallelism!r}")
    if partitioner not in PARTITIONERS:
        raise ValueError(f"partitioner must be one of {PARTITIONERS}, got {partitioner!r}")
    if reader not in READERS:
        raise ValueError(f"reader must be one of {READERS}, got {reader!r}")
    return n, k, batch_size, parallelism


def reference_totals(n: int, k: int) -> np.ndarray:
    """Final per-key sums of W1 (key = i % k, value = i, i in 0..n-1), in closed form (int64)."""
    n = _check_int("n", n, 0)
    k = _check_int("k", k, 1)
    j = np.arange(k, dtype=object)                  # Python ints: no overflow in the formula
    count = np.maximum((n - j + k - 1) // k, 0)     # how many i < n have i % k == j
    totals = j * count + k * count * (count - 1) // 2
    return np.array(totals.tolist(), dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# worker-side helpers


def _fmix64_mod(keys: np.ndarray, out: np.ndarray, tmp: np.ndarray, parallelism: int) -> np.ndarray:
    """murmur3 fmix64 of int64 keys (as uint64) modulo `parallelism`, into `out` (uint64)."""
    x = keys.view(np.uint64)
    np.right_shift(x, _SHIFT_33, out=out)
    np.bitwise_xor(out, x, out=out)
    np.multiply(out, _FMIX_C1, out=out)
    np.right_shift(out, _SHIFT_33, out=tmp)
    np.bitwise_xor(out, tmp, out=out)
    np.multiply(out, _FMIX_C2, out=out)
    np.right_shift(out, _SHIFT_33, out=tmp)
    np.bitwise_xor(out, tmp, out=out)
    if parallelism & (parallelism - 1) == 0:
        np.bitwise_and(out, np.uint64(parallelism - 1), out=out)
    else:
        np.remainder(out, np.uint64(parallelism), out=out)
    return out


def _to_arrow(values: np.ndarray) -> pa.Array:
    """Zero-copy int64 Arrow array over a contiguous int64 numpy array.

    (`pa.array` and `Array.to_numpy` would do too, but their first call imports pandas and
    `to_numpy` costs tens of µs per call.)"""
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def _to_numpy(array: pa.Array) -> np.ndarray:
    """Zero-copy numpy view of an int64 Arrow array without nulls."""
    if array.null_count:
        raise CeilingError("unexpected nulls")
    return np.frombuffer(array.buffers()[1], dtype=np.int64, count=len(array),
                         offset=array.offset * 8)


def _ipc_body_length(buf, meta_start: int) -> int:
    """`bodyLength` of the Arrow IPC `Message` flatbuffer that starts at `meta_start` in `buf`.

    Message table fields: version, header_type, header, bodyLength (index 3), custom_metadata.
    """
    table = meta_start + _U32.unpack_from(buf, meta_start)[0]
    vtable = table - _I32.unpack_from(buf, table)[0]
    if _U16.unpack_from(buf, vtable)[0] <= 4 + 2 * 3:
        return 0
    field = _U16.unpack_from(buf, vtable + 4 + 2 * 3)[0]
    return _I64.unpack_from(buf, table + field)[0] if field else 0


class _KeyedSum:
    """Per-key running sums over batches of (key, value); keys are their own index 0..k-1."""

    def __init__(self, k: int):
        self.state = np.zeros(k, dtype=np.int64)
        self.rows = 0
        self.sort_dtype = np.uint16 if k <= 1 << 16 else None

    def process(self, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Add one batch; returns the running total after each row (in row order)."""
        b = len(keys)
        if b == 0:
            return np.empty(0, dtype=np.int64)
        sort_keys = keys if self.sort_dtype is None else keys.astype(self.sort_dtype)
        order = np.argsort(sort_keys, kind="stable")
        sorted_keys = keys[order]
        sorted_values = values[order]
        prefix = np.cumsum(sorted_values)
        breaks = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1])
        breaks += 1
        starts = np.empty(len(breaks) + 1, dtype=np.intp)
        starts[0] = 0
        starts[1:] = breaks
        ends = np.empty_like(starts)
        ends[:-1] = breaks
        ends[-1] = b
        group_keys = sorted_keys[starts]
        before = prefix[starts] - sorted_values[starts]       # prefix before each group
        state = self.state
        running_sorted = prefix + np.repeat(state[group_keys] - before, ends - starts)
        running = np.empty_like(running_sorted)
        running[order] = running_sorted
        state[group_keys] += prefix[ends - 1] - before         # group_keys are distinct
        self.rows += b
        return running


class _Stream:
    """Frames one connection's Arrow IPC stream out of a reusable receive buffer."""

    def __init__(self, sock: socket.socket, keyed, buffer_size: int = _RECV_BUFFER):
        self.sock = sock
        self.keyed = keyed              # anything with process(keys, values)
        self.buf = bytearray(buffer_size)
        self.view = memoryview(self.buf)
        self.start = 0      # first unconsumed byte
        self.end = 0        # end of received data
        self.need = 8       # bytes from `start` the next step needs
        self.schema: pa.Schema | None = None
        self.finished = False

    def receive(self) -> bool:
        """One recv; consumes every complete message. Returns False once the stream ended."""
        if len(self.buf) - self.start < self.need:
            self._make_room()
        got = self.sock.recv_into(self.view[self.end:])
        if got == 0:
            raise CeilingError("a producer connection closed before its end-of-stream marker")
        self.end += got
        if self.end - self.start >= self.need:
            self._consume()
        return not self.finished

    def _make_room(self) -> None:
        pending = self.end - self.start
        if self.need > len(self.buf):
            bigger = bytearray(max(self.need, 2 * len(self.buf)))
            bigger[:pending] = self.view[self.start:self.end]
            self.buf, self.view = bigger, memoryview(bigger)
        else:
            self.view[:pending] = self.view[self.start:self.end]
        self.start, self.end = 0, pending

    def _consume(self) -> None:
        buf, view, start, end = self.buf, self.view, self.start, self.end
        while end - start >= 8:
            marker, meta_len = _PREFIX.unpack_from(buf, start)
            if marker != _CONTINUATION:
                raise CeilingError(f"not an Arrow IPC stream: message prefix {marker:#x}")
            if meta_len == 0:
                self.finished = True
                start += 8
                break
            if end - start < 8 + meta_len:
                self.need = 8 + meta_len
                break
            total = 8 + meta_len + _ipc_body_length(buf, start + 8)
            if end - start < total:
                self.need = total
                break
            message = pa.ipc.read_message(pa.py_buffer(view[start:start + total]))
            if self.schema is None:
                self.schema = pa.ipc.read_schema(message)
            else:
                batch = pa.ipc.read_record_batch(message, self.schema)
                self.keyed.process(_to_numpy(batch.column(0)), _to_numpy(batch.column(1)))
                del batch
            del message
            start += total
        else:
            self.need = 8
        if start == end:
            start = end = 0
        self.start, self.end = start, end


def _read_selectors(streams: list[_Stream]) -> None:
    with selectors.DefaultSelector() as selector:
        for stream in streams:
            stream.sock.setblocking(False)
            selector.register(stream.sock, selectors.EVENT_READ, stream)
        open_streams = len(streams)
        while open_streams:
            for key, _ in selector.select():
                stream = key.data
                try:
                    alive = stream.receive()
                except BlockingIOError:
                    continue
                if not alive:
                    selector.unregister(stream.sock)
                    open_streams -= 1


class _LockedKeyedSum:
    """One `_KeyedSum` shared by several reader threads."""

    def __init__(self, keyed: _KeyedSum):
        self._keyed, self._lock = keyed, threading.Lock()

    def process(self, keys, values):
        with self._lock:
            return self._keyed.process(keys, values)


def _read_threads(streams: list[_Stream]) -> None:
    errors: list[BaseException] = []

    def run(stream: _Stream) -> None:
        try:
            while stream.receive():
                pass
        except BaseException as exc:     # reported by the consumer below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(stream,), daemon=True) for stream in streams]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _warm_up(k: int) -> None:
    """Pay one-time costs (lazy initialisation in pyarrow and numpy) before the clock runs."""
    keys = np.arange(16, dtype=np.int64) % k
    batch = pa.RecordBatch.from_arrays([_to_arrow(keys), _to_arrow(keys)], schema=SCHEMA)
    message = pa.ipc.read_message(pa.py_buffer(memoryview(bytearray(batch.serialize()))))
    decoded = pa.ipc.read_record_batch(message, SCHEMA)
    _KeyedSum(k).process(_to_numpy(decoded.column(0)), _to_numpy(decoded.column(1)))
    np.argsort(keys.astype(np.uint8), kind="stable")
    np.bincount(keys.astype(np.uint8), minlength=2)


class _Output:
    """One producer → consumer connection carrying one Arrow IPC stream.

    pyarrow's own stream writer encodes the messages (schema, record batches, end-of-stream
    marker); this object is its file-like sink. The writer hands it the small metadata pieces as
    bytes and the body buffers as zero-copy views of the numpy arrays; they are queued until
    `flush_bytes` are pending and then go out with one `sendmsg` — no copy in user space and
    one syscall for several messages. Arrays given to `write_batch` must not be modified until
    the next `flush` (the producer allocates fresh ones per batch).
    """

    _IOV_MAX = 512                       # iovecs per sendmsg call (Linux allows 1024)

    def __init__(self, sock: socket.socket, flush_bytes: int):
        self.sock = sock
        self.flush_bytes = flush_bytes
        self.pending: list[memoryview] = []
        self.size = 0
        self.closed = False              # file-like protocol, read by pyarrow's PythonFile
        self.writer = pa.ipc.new_stream(pa.PythonFile(self, mode="w"), SCHEMA)

    # file-like sink for pa.PythonFile
    def write(self, data) -> int:
        view = memoryview(data)
        self.pending.append(view)
        self.size += view.nbytes
        return view.nbytes

    def write_batch(self, batch: pa.RecordBatch) -> None:
        self.writer.write_batch(batch)
        if self.size >= self.flush_bytes:
            self.flush()

    def flush(self) -> None:
        views = self.pending
        while views:
            chunk = views[:self._IOV_MAX]
            sent = self.sock.sendmsg(chunk)
            done = 0
            while done < len(chunk) and sent >= chunk[done].nbytes:
                sent -= chunk[done].nbytes
                done += 1
            del views[:done]
            if sent:
                views[0] = views[0][sent:]
        self.size = 0

    def close(self) -> None:
        """End-of-stream marker, flush, close the socket."""
        self.writer.close()
        self.flush()
        self.sock.close()


def _configure(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)


# ---------------------------------------------------------------------------------------------
# worker processes


def _report_error(conn, text: str) -> None:
    try:
        conn.send(("error", text))
    except OSError:                 # the parent is gone: nobody to tell
        pass


def _consumer_main(index: int, producers: int, k: int, reader: str, malloc_tuning: bool,
                   conn) -> None:
    try:
        if malloc_tuning:
            tune_allocator()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((_HOST, 0))
        listener.listen(producers)
        listener.settimeout(_SETUP_TIMEOUT)
        conn.send(("port", listener.getsockname()[1]))
        socks = []
        for _ in range(producers):
            sock, _ = listener.accept()
            sock.settimeout(None)
            _configure(sock)
            socks.append(sock)
        listener.close()
        keyed = _KeyedSum(k)
        if reader == "selectors":
            streams = [_Stream(sock, keyed) for sock in socks]
        else:
            shared = _LockedKeyedSum(keyed)
            streams = [_Stream(sock, shared) for sock in socks]
        _warm_up(k)
        conn.send(("ready",))
        cpu = time.process_time()
        (_read_selectors if reader == "selectors" else _read_threads)(streams)
        finished = time.monotonic()
        for sock in socks:
            sock.close()
        conn.send(("done", finished, keyed.state, keyed.rows, time.process_time() - cpu))
    except BaseException:
        _report_error(conn, f"consumer {index}:\n{traceback.format_exc()}")


def _producer_main(index: int, parallelism: int, n: int, k: int, batch_size: int,
                   partitioner: str, flush_bytes: int, ports: list[int], malloc_tuning: bool,
                   conn) -> None:
    try:
        if malloc_tuning:
            tune_allocator()
        socks = []
        for port in ports:
            sock = socket.create_connection((_HOST, port), timeout=_SETUP_TIMEOUT)
            sock.settimeout(None)
            _configure(sock)
            socks.append(sock)
        rows = max(0, (n - index + parallelism - 1) // parallelism)   # i < n with i % P == index
        size = min(batch_size, max(rows, 1))
        stride = np.arange(size, dtype=np.int64) * parallelism
        indices = np.empty(size, dtype=np.int64)
        keys = np.empty(size, dtype=np.int64)
        hashed = np.empty(size, dtype=np.uint64)
        scratch = np.empty(size, dtype=np.uint64)
        route_dtype = np.uint8        # parallelism <= 256: radix argsort
        outputs = [_Output(sock, flush_bytes) for sock in socks]
        for output in outputs:
            output.flush()          # the schema message
        _warm_up(k)
        conn.send(("ready",))
        try:
            if conn.recv() != "go":
                return
        except EOFError:            # the parent gave up before the start
            return
        cpu = time.process_time()
        for pos in range(0, rows, size):
            b = min(size, rows - pos)
            idx = indices[:b]
            np.add(stride[:b], index + parallelism * pos, out=idx)
            kk = keys[:b]
            np.remainder(idx, k, out=kk)
            if parallelism == 1:
                outputs[0].write_batch(pa.RecordBatch.from_arrays(
                    [_to_arrow(kk.copy()), _to_arrow(idx.copy())], schema=SCHEMA))
                continue
            if partitioner == "fmix64":
                target = _fmix64_mod(kk, hashed[:b], scratch[:b], parallelism).astype(route_dtype)
            else:
                target = np.remainder(kk, parallelism, out=hashed[:b].view(np.int64)).astype(route_dtype)
            order = np.argsort(target, kind="stable")
            if parallelism <= 8:        # a few compares beat bincount's cast to intp
                counts = [int(np.count_nonzero(target == c)) for c in range(parallelism)]
            else:
                counts = np.bincount(target, minlength=parallelism).tolist()
            sk = np.take(kk, order)            # fresh arrays: queued messages point into them
            sv = np.take(idx, order)
            offset = 0
            for consumer, count in enumerate(counts):
                if count:
                    part = pa.RecordBatch.from_arrays(
                        [_to_arrow(sk[offset:offset + count]), _to_arrow(sv[offset:offset + count])],
                        schema=SCHEMA)
                    outputs[consumer].write_batch(part)
                    offset += count
        for output in outputs:
            output.close()
        conn.send(("done", rows, time.process_time() - cpu))
    except BaseException:
        _report_error(conn, f"producer {index}:\n{traceback.format_exc()}")


# ---------------------------------------------------------------------------------------------
# the parent


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BOOTSTRAP = ("import sys; sys.path.insert(0, sys.argv[1]); "
              "from benchmarks.ceiling import _worker_main; _worker_main(int(sys.argv[2]))")


def _worker_main(fd: int) -> None:
    """Entry point of a worker process: its first control message says what to run."""
    conn = Connection(fd)
    role, args = conn.recv()
    (_consumer_main if role == "consumer" else _producer_main)(*args, conn)
    conn.close()


class _Worker:
    """A worker as a plain subprocess (no multiprocessing machinery stays behind) and its
    control connection, one end of a socketpair."""

    def __init__(self, label: str, role: str, args: tuple):
        self.label = label
        parent, child = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, _ROOT, str(child.fileno())],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self.conn = Connection(parent.detach())
        self.conn.send((role, args))

    def stop(self, graceful: bool) -> None:
        if graceful:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.conn.close()


def _receive(workers: list[_Worker], deadline: float) -> dict[str, tuple]:
    """One message from each worker (label → message); a worker that reports an error, exits
    or stays silent past `deadline` fails the run."""
    results: dict[str, tuple] = {}
    pending = {worker.conn: worker for worker in workers}
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CeilingError(f"timed out waiting for {sorted(w.label for w in pending.values())}")
        for conn in mp_wait(list(pending), timeout=remaining):
            worker = pending.pop(conn)
            try:
                message = conn.recv()
            except (EOFError, OSError):
                raise CeilingError(f"{worker.label} exited without reporting "
                                   f"(exit code {worker.proc.wait()})") from None
            if message[0] == "error":
                raise CeilingError(message[1])
            results[worker.label] = message
    return results


def measure_ceiling(n: int, k: int, batch_size: int = 65536, parallelism: int = 2, *,
                    partitioner: str = "fmix64", reader: str = "selectors",
                    flush_bytes: int = 1 << 20, malloc_tuning: bool = True,
                    timeout: float = 600.0) -> dict:
    """Run W1 (n rows, k keys) once as bare processes + loopback TCP + Arrow IPC; see module doc.

    Returns {"events_per_second", "seconds", "n", "k", "batch_size", "parallelism",
    "partitioner", "reader", "malloc_tuning", "cpu_seconds"}; "cpu_seconds" is the CPU time
    {"producers": ..., "consumers": ...} the workers used while the clock ran, summed over the
    processes (on a loaded machine it shows what the run costs regardless of waiting).
    Raises `CeilingError` if a worker fails, the run exceeds `timeout` seconds or the per-key
    totals differ from the reference; ValueError for bad arguments. Every worker process is
    gone when this returns or raises.
    """
    n, k, batch_size, parallelism = _check_args(n, k, batch_size, parallelism, partitioner, reader)
    flush_bytes = _check_int("flush_bytes", flush_bytes, 1)
    consumers: list[_Worker] = []
    producers: list[_Worker] = []
    succeeded = False
    setup_deadline = time.monotonic() + _SETUP_TIMEOUT + 10 * parallelism
    try:
        for c in range(parallelism):
            consumers.append(_Worker(f"consumer {c}", "consumer",
                                     (c, parallelism, k, reader, malloc_tuning)))
        ports = _receive(consumers, setup_deadline)
        for p in range(parallelism):
            producers.append(_Worker(f"producer {p}", "producer",
                                     (p, parallelism, n, k, batch_size, partitioner, flush_bytes,
                                      [ports[c.label][1] for c in consumers], malloc_tuning)))
        _receive(consumers + producers, setup_deadline)            # everyone is ready
        t0 = time.monotonic()
        for producer in producers:
            producer.conn.send("go")
        done = _receive(consumers + producers, time.monotonic() + timeout)
        seconds = max(done[c.label][1] for c in consumers) - t0
        totals = np.zeros(k, dtype=np.int64)
        for c in consumers:
            totals += done[c.label][2]
        rows = sum(done[c.label][3] for c in consumers)
        cpu = {"producers": sum(done[p.label][2] for p in producers),
               "consumers": sum(done[c.label][4] for c in consumers)}
        if rows != n:
            raise CeilingError(f"consumers saw {rows} rows, expected {n}")
        expected = reference_totals(n, k)
        if not np.array_equal(totals, expected):
            wrong = np.flatnonzero(totals != expected)
            raise CeilingError(f"per-key totals wrong for {len(wrong)} of {k} keys, e.g. key "
                               f"{wrong[0]}: {totals[wrong[0]]} != {expected[wrong[0]]}")
        succeeded = True
    finally:
        for worker in consumers + producers:
            worker.stop(graceful=succeeded)
    return {"events_per_second": n / seconds, "seconds": seconds, "n": n, "k": k,
            "batch_size": batch_size, "parallelism": parallelism, "partitioner": partitioner,
            "reader": reader, "flush_bytes": flush_bytes, "malloc_tuning": malloc_tuning,
            "cpu_seconds": cpu}


def measure_ceiling_median(n: int, k: int, runs: int = 3, **kw) -> dict:
    """`measure_ceiling` `runs` times.

    Returns the settings plus the medians of "events_per_second", "seconds" and "cpu_seconds"
    (per role) and "runs", the list of every run's result.
    """
    runs = _check_int("runs", runs, 1)
    results = [measure_ceiling(n, k, **kw) for _ in range(runs)]
    summary = {key: value for key, value in results[0].items()
               if key not in ("events_per_second", "seconds", "cpu_seconds")}
    summary["events_per_second"] = statistics.median(r["events_per_second"] for r in results)
    summary["seconds"] = statistics.median(r["seconds"] for r in results)
    summary["cpu_seconds"] = {role: statistics.median(r["cpu_seconds"][role] for r in results)
                              for role in ("producers", "consumers")}
    summary["runs"] = results
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ceiling", description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20_000_000)
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=65536)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--partitioner", choices=PARTITIONERS, default="fmix64")
    parser.add_argument("--reader", choices=READERS, default="selectors")
    parser.add_argument("--flush-bytes", type=int, default=1 << 20)
    parser.add_argument("--no-malloc-tuning", dest="malloc_tuning", action="store_false")
    args = parser.parse_args(argv)
    result = measure_ceiling_median(args.n, args.k, args.runs, batch_size=args.batch_size,
                                    parallelism=args.parallelism, partitioner=args.partitioner,
                                    reader=args.reader, flush_bytes=args.flush_bytes,
                                    malloc_tuning=args.malloc_tuning)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
