"""The ceiling benchmark: bare processes + loopback TCP + Arrow IPC + numpy running W1."""

from __future__ import annotations

import socket
import threading

import numpy as np
import psutil
import pyarrow as pa
import pytest

from benchmarks import ceiling
from benchmarks.ceiling import CeilingError, measure_ceiling, measure_ceiling_median, reference_totals

EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"      # Arrow IPC end-of-stream marker


def _live_children() -> list[psutil.Process]:
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture
def no_leftover_processes():
    before = {p.pid for p in _live_children()}
    yield
    left = [p for p in _live_children() if p.pid not in before]
    assert not left, f"processes left running: {[(p.pid, p.cmdline()) for p in left]}"


# ---------------------------------------------------------------------------------------------
# whole runs (each spawns 2 × parallelism Python processes)


def test_small_run_is_correct_and_reports_the_rate(no_leftover_processes):
    result = measure_ceiling_median(200_000, 1000, runs=2)
    assert len(result["runs"]) == 2
    for run in result["runs"]:
        assert run["n"] == 200_000 and run["k"] == 1000
        assert run["batch_size"] == 65536 and run["parallelism"] == 2
        assert run["seconds"] > 0
        assert run["events_per_second"] == pytest.approx(200_000 / run["seconds"])
        assert run["cpu_seconds"]["producers"] > 0 and run["cpu_seconds"]["consumers"] > 0
    rates = sorted(run["events_per_second"] for run in result["runs"])
    assert result["events_per_second"] == pytest.approx(sum(rates) / 2)


@pytest.mark.parametrize("kw", [
    dict(reader="threads", partitioner="mod"),
    dict(parallelism=3, batch_size=1000, k=7, n=200_001),   # uneven shares, small batches
    dict(parallelism=1, batch_size=4096, n=50_000),
], ids=["threads-mod", "p3-small-batches", "p1"])
def test_other_settings_are_correct(kw, no_leftover_processes):
    kw = {"n": 200_000, "k": 1000, **kw}
    result = measure_ceiling(**kw)    # raises CeilingError if the per-key totals were wrong
    assert result["n"] == kw["n"] and result["k"] == kw["k"]


def test_a_failed_run_raises_and_ends_every_worker(no_leftover_processes):
    with pytest.raises(CeilingError, match="timed out"):
        measure_ceiling(200_000_000, 1000, timeout=0.05)


@pytest.mark.parametrize("kw, name", [
    (dict(n=0), "n"), (dict(n=-5), "n"), (dict(n=2.5), "n"), (dict(n=True), "n"),
    (dict(parallelism=0), "parallelism"), (dict(parallelism=-1), "parallelism"),
    (dict(k=0), "k"), (dict(batch_size=0), "batch_size"),
    (dict(partitioner="crc"), "partitioner"), (dict(reader="poll"), "reader"),
])
def test_bad_arguments_raise_value_error_naming_them(kw, name, no_leftover_processes):
    kw = {"n": 1000, "k": 10, **kw}
    with pytest.raises(ValueError, match=rf"^{name} must"):
        measure_ceiling(**kw)


def test_median_rejects_bad_runs():
    with pytest.raises(ValueError, match="^runs must"):
        measure_ceiling_median(1000, 10, runs=0)


# ---------------------------------------------------------------------------------------------
# the pieces, in process


@pytest.mark.parametrize("n, k", [(1, 1), (10, 1000), (12_345, 7), (100_000, 1000)])
def test_reference_totals(n, k):
    i = np.arange(n, dtype=np.int64)
    assert np.array_equal(reference_totals(n, k), np.bincount(i % k, weights=i, minlength=k).astype(np.int64))


@pytest.mark.parametrize("k", [5, 70_000])      # uint16 radix sort path and int64 path
def test_keyed_sum_running_totals_match_a_python_loop(k):
    rng = np.random.default_rng(7)
    keyed = ceiling._KeyedSum(k)
    totals: dict[int, int] = {}
    for size in (0, 1, 17, 500, 3):
        keys = rng.integers(0, min(k, 50) if k < 100 else k, size=size, dtype=np.int64)
        values = rng.integers(-1000, 1000, size=size, dtype=np.int64)
        expected = []
        for key, value in zip(keys.tolist(), values.tolist()):
            totals[key] = totals.get(key, 0) + value
            expected.append(totals[key])
        assert keyed.process(keys, values).tolist() == expected
    state = np.zeros(k, dtype=np.int64)
    for key, total in totals.items():
        state[key] = total
    assert np.array_equal(keyed.state, state)
    assert keyed.rows == 521


def test_ipc_body_length_matches_pyarrow():
    for rows in (0, 1, 3, 1000):
        batch = pa.RecordBatch.from_arrays([pa.array(np.arange(rows)), pa.array(np.arange(rows))],
                                           schema=ceiling.SCHEMA)
        data = batch.serialize().to_pybytes()
        message = pa.ipc.read_message(data)
        assert ceiling._ipc_body_length(data, 8) == message.body.size
    assert ceiling._ipc_body_length(ceiling.SCHEMA.serialize().to_pybytes(), 8) == 0


class _Collect:
    def __init__(self):
        self.keys, self.values = [], []

    def process(self, keys, values):
        self.keys.extend(keys.tolist())
        self.values.extend(values.tolist())


@pytest.mark.parametrize("buffer_size", [16, 1000, 1 << 20])
def test_stream_frames_messages_across_arbitrary_chunks(buffer_size):
    """Messages split at every possible place, buffers that must grow or compact."""
    sizes = [1, 700, 0, 3, 2000, 5]
    payload = bytearray(ceiling.SCHEMA.serialize().to_pybytes())
    start = 0
    for size in sizes:
        idx = np.arange(start, start + size, dtype=np.int64)
        payload += pa.RecordBatch.from_arrays([pa.array(idx % 9), pa.array(idx)],
                                              schema=ceiling.SCHEMA).serialize().to_pybytes()
        start += size
    payload += EOS
    reader_sock, writer_sock = socket.socketpair()

    def write():
        with writer_sock:
            chunk, offset = 1, 0
            while offset < len(payload):
                writer_sock.sendall(payload[offset:offset + chunk])
                offset += chunk
                chunk = chunk * 3 % 1531 + 1

    writer = threading.Thread(target=write)
    writer.start()
    collect = _Collect()
    stream = ceiling._Stream(reader_sock, collect, buffer_size=buffer_size)
    while stream.receive():
        pass
    writer.join()
    reader_sock.close()
    assert collect.values == list(range(sum(sizes)))
    assert collect.keys == [i % 9 for i in range(sum(sizes))]


def test_stream_rejects_a_connection_closed_early():
    reader_sock, writer_sock = socket.socketpair()
    with writer_sock:
        writer_sock.sendall(ceiling.SCHEMA.serialize().to_pybytes())
    stream = ceiling._Stream(reader_sock, _Collect())
    with pytest.raises(CeilingError, match="closed before"):
        while stream.receive():
            pass
    reader_sock.close()


def test_output_writes_a_standard_ipc_stream():
    """What a producer writes is an Arrow IPC stream pyarrow itself reads back."""
    writer_sock, reader_sock = socket.socketpair()
    writer_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    received = bytearray()

    def read():
        while chunk := reader_sock.recv(1 << 16):
            received.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    output = ceiling._Output(writer_sock, flush_bytes=50_000)
    output.flush()                                  # the schema message, as at set-up
    sizes = [i * 997 % 3000 for i in range(60)]
    start = 0
    for size in sizes:
        idx = np.arange(start, start + size, dtype=np.int64)
        output.write_batch(pa.RecordBatch.from_arrays([ceiling._to_arrow(idx % 9), ceiling._to_arrow(idx)],
                                                      schema=ceiling.SCHEMA))
        start += size
    output.close()
    reader.join()
    reader_sock.close()
    assert received.endswith(EOS)
    table = pa.ipc.open_stream(pa.py_buffer(received)).read_all()
    assert table.schema == ceiling.SCHEMA
    assert table.column("value").to_pylist() == list(range(start))
    assert table.column("key").to_pylist() == [i % 9 for i in range(start)]


class _StingySocket:
    """Takes at most `limit` bytes per sendmsg, as a real socket may."""

    def __init__(self, limit: int):
        self.limit, self.data, self.calls = limit, bytearray(), 0

    def sendmsg(self, views):
        assert len(views) <= 1024
        self.calls += 1
        room = self.limit
        for view in views:
            take = bytes(view[:room])
            self.data += take
            room -= len(take)
            if not room:
                break
        return self.limit - room

    def close(self):
        pass


def test_output_resumes_partial_sends_where_they_stopped():
    sock = _StingySocket(limit=777)
    output = ceiling._Output(sock, flush_bytes=1 << 30)
    expected = bytearray()
    for i in range(1500):                           # > 1024 pieces pending at once
        output.write(bytes([i % 251]) * (i % 5 + 1))
        expected += bytes([i % 251]) * (i % 5 + 1)
    output.flush()
    assert sock.data[-len(expected):] == expected   # after the schema message
    assert output.pending == [] and output.size == 0
