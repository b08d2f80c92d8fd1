"""What the integration tests share: a keyed running sum, waiting on a job, reading results."""

from __future__ import annotations

import contextlib
import glob
import io
import logging
import os
import signal
import sys
import textwrap
import threading
import time

import pytest

import streamsnap as ss
from streamsnap.checkpoint.job_end import JOB_END_FILE
from streamsnap.web.job_summary import SUMMARY_FILE
from streamsnap.checkpoint.storage import checkpoint_id_of
from streamsnap.connectors.sources import Generator, GeneratorReader


# A test of keyed state, checkpoints, failover, savepoints or rescaling runs on both keyed state
# backends (RocksDB with its default incremental checkpoints).
both_backends = pytest.mark.parametrize("state_backend", ["hashmap", "rocksdb"])


# For driver scripts run as their own process (the driver-failure and cluster tests): the
# failover tests' input and running sum, defined in the script so Spark pickles them by value.
SCRIPT_EVENT_AND_SUM = textwrap.dedent('''
    def event(i):  # as tests/integration/test_failover.py: a key's rows come from one split
        return {"key": (i % 2) * 100 + (i // 2) % 50, "value": i + 1, "i": i}

    class RunningSum(ss.KeyedProcessFunction):
        def open(self, ctx):
            self.total = ctx.get_state(ss.ValueStateDescriptor("total", default=0))

        def process_element(self, row, ctx):
            total = self.total.value() + row["value"]
            self.total.update(total)
            yield {"key": ctx.current_key, "total": total, "i": row["i"]}
''')


class RunningSum(ss.KeyedProcessFunction):
    """Per-key running sum of `value`; `carry` names input columns copied to every output row."""

    def __init__(self, carry: tuple[str, ...] = ()):
        self.carry = carry

    def open(self, ctx):
        self.total = ctx.get_state(ss.ValueStateDescriptor("total", default=0))

    def process_element(self, row, ctx):
        total = self.total.value() + row["value"]
        self.total.update(total)
        out = {"key": ctx.current_key, "total": total}
        for column in self.carry:
            out[column] = row[column]
        yield out


class SlowRunningSum(RunningSum):
    """A running sum carrying `i` that takes ~2 s per 18 000 rows: a replayable source's readers
    are still mid-input when one of them is killed."""

    def __init__(self):
        super().__init__(carry=("i",))

    def process_element(self, row, ctx):
        if row["i"] % 10 == 0:
            time.sleep(0.002)
        yield from super().process_element(row, ctx)


def kill_a_reader_mid_input(spark, tmp_path, add_source, n: int) -> None:
    """A bounded source of rows {key, value=1, i} for i in 0..n-1 (built by `add_source(env)`, its
    uid "reader") feeds SlowRunningSum; after the first completed checkpoint a reader subtask is
    SIGKILLed. The job must restore once and emit every row exactly once."""
    config = ss.CheckpointConfig(interval=0.3, directory=str(tmp_path / "ckpt"))
    # Small network batches bound the data in flight ahead of a barrier under backpressure,
    # so checkpoints complete while the readers are still mid-file.
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config,
                               restart=ss.RestartStrategy.fixed_delay(3, 0.0),
                               network=ss.NetworkConfig(batch_size=256, credits=2, output_queue_frames=2))
    add_source(env).key_by("key").process(SlowRunningSum(), name="sum", uid="sum").sink_to(ss.sinks.Collect())
    client = env.execute_async("replayable source with a failure")
    wait_status(client, "RUNNING")
    wait_completed(client, 1, timeout=30)
    reader = [s for s in client.subtasks() if s.vertex == "reader"][0]
    assert reader.state == "RUNNING"
    os.kill(reader.pid, signal.SIGKILL)
    result = client.wait(120)
    assert result.restarts == 1
    rows = result.rows()
    assert sorted(r["i"] for r in rows) == list(range(n))
    assert sum(final_by_key(rows, "key", "total").values()) == n


class HeldGenerator(Generator):
    """A Generator whose every split stops before its row `hold_at` until the file
    `<gate>/release` exists, and says so with a file `<gate>/held-<split>`. A test that stops,
    kills or takes a savepoint "mid-input" waits for the hold (`wait_held`) instead of sleeping:
    the input has neither ended nor barely begun, however slow the machine. A restored run may
    read the rest with a plain Generator of the same `fn`, `count` and `splits`."""

    def __init__(self, fn, *, gate, hold_at: int, **kwargs):
        super().__init__(fn, **kwargs)
        self.gate, self.hold_at = str(gate), hold_at
        os.makedirs(self.gate, exist_ok=True)

    def create_reader(self, ctx):
        return _HeldReader(self, ctx)


class _HeldReader(GeneratorReader):
    def __init__(self, source, ctx):
        super().__init__(source, ctx)
        self._holding = False
        self._marked: set[int] = set()

    def _released(self) -> bool:
        return os.path.exists(os.path.join(self._source.gate, "release"))

    def _remaining(self, split):
        remaining = super()._remaining(split)
        if not self._holding:
            return remaining
        before_hold = max(0, self._source.hold_at - split[2])
        return before_hold if remaining is None else min(remaining, before_hold)

    def poll(self):
        self._holding = not self._released()
        try:
            batch = super().poll()
        finally:
            holding, self._holding = self._holding, False
        if holding:
            for j, _, position in self._splits:
                if position >= self._source.hold_at and j not in self._marked:
                    open(os.path.join(self._source.gate, f"held-{j}"), "w").close()
                    self._marked.add(j)
        return batch

    def next_available_in(self) -> float:
        if all(s[2] >= self._source.hold_at for s in self._splits) and not self._released():
            return 0.01   # held: look for the release file now and then
        return super().next_available_in()


def wait_held(gate, splits: int, client=None, timeout: float = 120) -> None:
    """Until all `splits` splits of a HeldGenerator stopped at its hold (the job keeps running)."""
    deadline = time.monotonic() + timeout
    while len([p for p in os.listdir(gate) if p.startswith("held-")]) < splits:
        if client is not None:
            assert client.status() in ("CREATED", "RUNNING"), f"job {client.status()} before the hold"
        assert time.monotonic() < deadline, f"the source did not reach its hold within {timeout} s"
        time.sleep(0.02)


def release(gate) -> None:
    """Let a HeldGenerator's splits read on past their hold."""
    open(os.path.join(str(gate), "release"), "w").close()


def kill_in_phase(client, phase_dir, phase: str, vertex_prefix: str = "", timeout: float = 60) -> int:
    """SIGKILL a running subtask whose vertex starts with `vertex_prefix` while it is in `phase`
    ("async": its checkpoint's asynchronous part; "commit": between the checkpoint's completion
    and its commit), as the phase markers of the test hooks (TEST_HOOKS_ENV) say; returns its pid.
    Only the job's current processes are candidates: the marker of a process killed earlier
    stays behind, and its pid may name another process by now (pids wrap around)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = {s.pid for s in client.subtasks()
                if s.state == "RUNNING" and s.vertex.replace("/", "_").startswith(vertex_prefix)}
        for path in glob.glob(os.path.join(str(phase_dir), f"{phase}-{vertex_prefix}*")):
            pid = int(path.rsplit("-", 1)[1])
            if pid in pids:
                os.kill(pid, signal.SIGKILL)
                return pid
        assert client.status() == "RUNNING", f"job {client.status()} before a {phase} phase of {vertex_prefix!r}"
        time.sleep(0.005)
    raise AssertionError(f"no {vertex_prefix!r} task entered the {phase} phase within {timeout} s")


def stop_in_background(client, directory, drain: bool = False):
    """Call `stop_with_savepoint` on a thread (it returns only once the job finished); returns
    the thread and a dict that gets "path" or "error"."""
    outcome: dict = {}

    def stop():
        try:
            outcome["path"] = client.stop_with_savepoint(str(directory), drain=drain)
        except BaseException as exc:  # the test asserts what it was
            outcome["error"] = exc
    thread = threading.Thread(target=stop)
    thread.start()
    return thread, outcome


def pid_committing_savepoint(client, phase_dir, timeout: float = 60):
    """Once the stop's savepoint completed, a pid of a task notified of it (in its "commit"
    phase, TEST_HOOKS_ENV's phase markers): (savepoint stats, pid)."""
    deadline = time.monotonic() + timeout
    while (savepoint := client.checkpoint_stats().latest_savepoint) is None:
        assert time.monotonic() < deadline, "the savepoint did not complete"
        time.sleep(0.002)
    while not (markers := glob.glob(os.path.join(str(phase_dir), f"commit-*-{savepoint.checkpoint_id}-*"))):
        assert time.monotonic() < deadline, f"no task committed savepoint {savepoint.checkpoint_id}"
        time.sleep(0.002)
    return savepoint, int(markers[0].rsplit("-", 1)[1])


def final_by_key(rows, key, value):
    """The largest `value` seen per `key` (a running sum's final total)."""
    out = {}
    for r in rows:
        out[r[key]] = max(out.get(r[key], 0), r[value])
    return out


def wait_status(client, status="RUNNING", timeout=60):
    deadline = time.monotonic() + timeout
    while client.status() != status:
        assert client.status() not in ("FAILED", "CANCELED", "FINISHED") or status in ("FAILED", "FINISHED"), \
            f"job is {client.status()}, wanted {status}"
        assert time.monotonic() < deadline, f"status {client.status()}, wanted {status}"
        time.sleep(0.02)


def wait_completed(client, n, timeout=60):
    """Until `n` checkpoints completed; returns the stats snapshot."""
    deadline = time.monotonic() + timeout
    while True:
        stats = client.checkpoint_stats()
        if stats.counts.completed >= n:
            return stats
        assert time.monotonic() < deadline, f"only {stats.counts.completed} checkpoints completed: {stats.describe()}"
        time.sleep(0.05)


def checkpoint_dirs(job_dir):
    """The `chk-<n>` directories of a job directory (a pathlib.Path), by checkpoint id."""
    found = [(checkpoint_id_of(p.name), p) for p in job_dir.iterdir()]
    return [p for i, p in sorted((i, p) for i, p in found if i is not None)]


def _referenced_shared_files(job_dir) -> set[str]:
    """Paths of the shared (incremental) files the retained checkpoints of a job reference."""
    from streamsnap.checkpoint import filesystem
    from streamsnap.checkpoint.metadata import read_metadata, state_file_urls

    referenced = set()
    for metadata_file in job_dir.glob("chk-*/_metadata"):
        base = filesystem.normalize(str(metadata_file.parent))
        for op in read_metadata(filesystem.normalize(str(metadata_file))).operators.values():
            for state in op.subtask_states.values():
                referenced.update(u.removeprefix("file://") for u in state_file_urls(state, base)[1])
    return referenced


def stray_checkpoint_files(checkpoint_root) -> list[str]:
    """Everything under a checkpoint directory (a pathlib.Path) that no retained checkpoint
    owns: files outside a `chk-<n>` holding `_metadata`, `chk-<n>` directories without one, and
    files in `shared/` no retained checkpoint references. Only the id counter and the records of
    how the job ended (`_job_end`, and `_job_summary.json` for `streamsnap ui`) may stand beside them."""
    stray = []
    for job_dir in checkpoint_root.iterdir():
        shared = _referenced_shared_files(job_dir)
        for entry in job_dir.rglob("*"):
            relative = entry.relative_to(job_dir)
            top = relative.parts[0]
            if entry.is_dir():
                if checkpoint_id_of(top) is not None and not (job_dir / top / "_metadata").exists():
                    stray.append(str(entry))
                continue
            if relative.as_posix() in ("_checkpoint_id", JOB_END_FILE, SUMMARY_FILE):
                continue
            if top == "shared" and str(entry) in shared:
                continue
            if checkpoint_id_of(top) is None or not (job_dir / top / "_metadata").exists():
                stray.append(str(entry))
    return sorted(set(stray))


def run_driver_script_here(source: str, argv: list[str]) -> str:
    """Run a driver script (as a killed driver's rerun would run it) in this process, on the
    suite's SparkSession — the active one, which StreamEnvironment picks up — instead of in a new
    process with a Spark of its own (~15 s of start-up each). Returns what it printed and what
    streamsnap logged; raises what the script raised. Its functions live in a module that cannot
    be imported, so Spark ships them by value, as it does a script's `__main__`."""
    output = io.StringIO()
    handler = logging.StreamHandler(output)
    logger = logging.getLogger("streamsnap")
    logger.addHandler(handler)
    argv_before = sys.argv
    sys.argv = ["driver.py", *argv]
    try:
        with contextlib.redirect_stdout(output):
            exec(compile(source, "driver.py", "exec"), {"__name__": "streamsnap_test_driver_rerun"})
    finally:
        sys.argv = argv_before
        logger.removeHandler(handler)
    return output.getvalue()
