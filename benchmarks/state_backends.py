"""Large keyed state on each backend: checkpoint duration and size with few keys changing, and
recovery of the whole state after a SIGKILL (issue 13's targets).

The job (parallelism 2, vectorized W1: `process_batches` with one `ValueState` per key, a
discarding sink, checkpoints every second) runs in two phases over one vectorized `Generator`:

1. **load**: rows 0 .. K-1 carry keys 0 .. K-1 at full speed, so every key is in state;
2. **steady**: then `changed` x K rows per checkpoint interval (the source's own rate limit,
   switched on when the load ends), keys spread by a prime stride, so each interval touches
   about that share of the keys (1 % by default) — what an incremental checkpoint should pay
   for, and nothing else.

Figures, per backend:
* checkpoint duration p50/p99 (end to end: trigger → `_metadata` written) and the size each
  checkpoint wrote itself (`incremental_size`: new SST files plus private bundles on RocksDB,
  everything on the heap) against the state's full size, as the median per checkpoint and as
  the total over the measured ones (RocksDB's compactions rewrite files every few flushes, so
  its uploads alternate between small and large) — steady-phase checkpoints only: those
  triggered after the keyed operator consumed the whole load (`LoadCountingRunningSum` counts
  it; up to (credits + queued frames) x batch size rows per channel are still queued when the
  source finishes, seconds of work on RocksDB — `load_drained_after` says how long; the steady
  rows queued meanwhile are not, so on a busy keyed subtask the first measured barriers still
  wait behind them: see `timeline`), the first of them (it uploads the load's last writes)
  excluded; where the duration goes, as medians
  over those checkpoints of the slowest keyed (`sum`) subtask's parts: trigger → its barrier
  (`start_delay_p50`: the records queued ahead of the barrier, i.e. backpressure), alignment,
  synchronous and asynchronous part; `timeline` lists them per checkpoint;
* changelog mode (`RocksDBConfig(changelog=...)`, `settle=True`): the load ends up in log
  segments and materializations; the measured window starts after the first checkpoint that
  references a materialization taken after the load (the load's own upload, as the first
  checkpoint after the load is for the other backends). A longer window then holds the
  periodic materializations too, so the mean written share is the amortized one (log segments
  + materializations); `materialized` counts the checkpoints in the window that referenced a
  new materialization;
* plain incremental RocksDB: the load reaches RocksDB as many flushes (sorted runs); the first
  compaction after it — picked once the steady phase's flushes reach the trigger, a few
  checkpoints into the window; RocksDB's native metrics show nothing pending before — merges
  them, and the checkpoint after it uploads about the whole state once (a one-off, like changelog
  mode's first materialization; `largest_written_bytes`). The window of 30 checkpoints includes
  it and the steady compactions (universal: runs of the 1 % changes merged every few flushes),
  all in the mean;
* recovery: one `sum` subtask SIGKILLed in the steady phase; the full restart restores all K
  keys; seconds from the kill to the first row at the sink after the restore (the JobMaster's
  recovery log), and from the kill to RUNNING. With `local_recovery=True` (passed through to
  the StreamEnvironment) also what the restore read from task-local copies and from checkpoint
  storage (`restore`).
"""

from __future__ import annotations

import os
import signal
import tempfile
import time

import numpy as np

import streamsnap as ss
from benchmarks import workloads
from streamsnap.checkpoint.handles import ChangelogStateHandle
from streamsnap.checkpoint.listing import list_checkpoints
from streamsnap.checkpoint.metadata import read_metadata
from streamsnap.connectors.sources import Generator, GeneratorReader
from streamsnap.errors import RestoreError

PARALLELISM = 2
_STRIDE = 7919  # prime: consecutive steady-phase rows hit keys far apart (distinct key groups)


def _rows(keys: int):
    """Row i: key i for the first K rows (the load), then keys spread by a prime stride; `ts`
    is 0 on load rows and 1 on steady ones (how the keyed function tells them apart)."""
    def rows(indices: np.ndarray):
        steady = indices >= keys
        key = np.where(steady, ((indices - keys) * _STRIDE) % keys, indices)
        return {"key": key, "value": np.ones(len(indices), dtype=np.int64), "ts": steady.astype(np.float64)}
    return rows


class LoadCountingRunningSum(workloads.BatchRunningSum):
    """W1 (vectorized) that also counts the load rows it consumed and writes the count to a file
    of its own in `marker_dir` (at most every 0.2 s, and at once when a batch without load rows
    follows): all subtasks' counts reach K once the keyed operator has worked through the load,
    including what queued in the network buffers after the source finished it."""

    def __init__(self, marker_dir: str):
        self.marker_dir = marker_dir

    def open(self, ctx):
        super().open(ctx)
        self._path = os.path.join(self.marker_dir, f"consumed-{os.getpid()}-{id(self)}")
        self._loaded, self._written, self._written_at = 0, 0, 0.0

    def process_batch(self, batch, keys):
        loads = int(np.count_nonzero(batch.column("ts").to_numpy() == 0))
        self._loaded += loads
        now = time.monotonic()
        if self._loaded != self._written and (not loads or now - self._written_at > 0.2):
            with open(self._path + ".tmp", "w") as f:
                f.write(f"{self._loaded} {time.time()}")
            os.replace(self._path + ".tmp", self._path)
            self._written, self._written_at = self._loaded, now
        return super().process_batch(batch, keys)


class _TwoPhaseReader(GeneratorReader):
    """Reads at full speed while any of its splits is still below row K, then at the
    Generator's rate (the budget restarting there); stamps the switch in a marker file."""

    def __init__(self, source, ctx):
        super().__init__(source, ctx)
        self._steady = False

    def _loading(self) -> bool:
        return any(j + total * pos < self._source.keys for j, total, pos in self._splits)

    def _allowed(self) -> int:
        if self._loading():
            return self._source.batch_size
        if not self._steady:
            self._steady = True
            self._started, self._emitted_since_start = time.monotonic(), 0
            with open(os.path.join(self._source.marker_dir, f"steady-{os.getpid()}-{id(self)}"), "w") as f:
                f.write(str(time.time()))
        return super()._allowed()

    def next_available_in(self) -> float:
        return 0.0 if self._loading() else super().next_available_in()


class TwoPhaseGenerator(Generator):
    """The benchmark's source: `_rows(keys)`, the load at full speed, then `rate` rows/s."""

    def __init__(self, keys: int, rate: float, marker_dir: str, **kwargs):
        super().__init__(_rows(keys), rate=rate, vectorized=True, **kwargs)
        self.keys, self.marker_dir = keys, marker_dir

    def create_reader(self, ctx):
        return _TwoPhaseReader(self, ctx)


def _steady_since(marker_dir: str) -> float | None:
    """When every source subtask had entered the steady phase (None: not yet)."""
    stamps = []
    for name in os.listdir(marker_dir):
        if name.startswith("steady-"):
            with open(os.path.join(marker_dir, name)) as f:
                stamps.append(float(f.read() or 0))
    return max(stamps) if len(stamps) >= PARALLELISM else None


def _consumed_since(marker_dir: str, keys: int) -> float | None:
    """When the keyed operator had consumed all K load rows (None: not yet)."""
    total, last = 0, 0.0
    for name in os.listdir(marker_dir):
        if name.startswith("consumed-") and not name.endswith(".tmp"):
            with open(os.path.join(marker_dir, name)) as f:
                count, at = f.read().split()
            total, last = total + int(count), max(last, float(at))
    return last if total >= keys else None


def _new_materializations(summary) -> set[int]:
    """Ids of the materializations a changelog checkpoint references for the first time (read
    as soon as it completed: with num_retained=1 the next completion deletes it)."""
    metadata = read_metadata(summary.path.rstrip("/") + "/_metadata")
    return {h.materialization_id for op in metadata.operators.values() for s in op.subtask_states.values()
            for h in s.keyed if isinstance(h, ChangelogStateHandle) and h.materialization_new
            and h.materialization is not None}


def large_state(spark, keys: int, state_backend, steady_checkpoints: int = 5, changed: float = 0.01,
                interval: float = 1.0, timeout: float = 900.0, unaligned: bool = False, label: str | None = None,
                settle: bool = False, **env_options) -> dict:
    """Run the two-phase job on `state_backend`; see the module docstring for the figures."""
    directory = workloads._checkpoint_dir("state-")
    markers = tempfile.mkdtemp(prefix="markers-", dir=directory)
    env = ss.StreamEnvironment(parallelism=PARALLELISM, spark=spark, state_backend=state_backend,
                               checkpointing=ss.CheckpointConfig(interval=interval, directory=os.path.join(directory, "ckpt"),
                                                                 unaligned=unaligned),
                               restart=ss.RestartStrategy.fixed_delay(attempts=1, delay=0.0),
                               network=ss.NetworkConfig(batch_size=65536), **env_options)
    (env.from_source(TwoPhaseGenerator(keys, changed * keys / interval, markers, batch_size=65536),
                     name="events", uid="events")
        .key_by("key").process_batches(LoadCountingRunningSum(markers), name="sum", uid="sum")
        .sink_to(ss.sinks.Discard(), name="sink", uid="sink"))
    client = env.execute_async(f"large state K={keys} on {state_backend}")
    seen: dict[int, object] = {}
    materializing: dict[int, set[int]] = {}   # checkpoint -> new materializations it references
    deadline = time.monotonic() + timeout
    loaded_at = None        # the sources finished the load
    consumed_at = None      # the keyed operator had consumed it (network buffers drained of it)

    def collect():
        for summary in list_checkpoints(os.path.join(directory, "ckpt")):
            if summary.is_completed and summary.checkpoint_id not in seen:
                seen[summary.checkpoint_id] = summary
                if settle:
                    try:
                        materializing[summary.checkpoint_id] = _new_materializations(summary)
                    except RestoreError:        # subsumed meanwhile: nothing to learn from it
                        materializing[summary.checkpoint_id] = set()

    def steady():
        # Checkpoints triggered after the keyed operator consumed the load, except the first
        # (it uploads the load's last writes).
        after = [s for i, s in sorted(seen.items()) if consumed_at is not None and s.triggered_at > consumed_at]
        if not settle or not after:
            return after[1:]
        first = after[0].checkpoint_id
        settled = next((i for i, s in enumerate(after)
                        if any(m >= first for m in materializing.get(s.checkpoint_id, ()))),
                       None)
        return [] if settled is None else after[settled + 1:]

    try:
        while len(steady()) < steady_checkpoints:
            if time.monotonic() > deadline:
                raise RuntimeError(f"large state K={keys}: {len(steady())} steady checkpoints within {timeout:.0f} s")
            status = client.status()
            if status in ("FAILED", "CANCELED", "FINISHED"):
                client.wait(10)         # raises the failure's cause if it FAILED
                raise RuntimeError(f"large state K={keys}: the job ended ({status}) before "
                                   f"{steady_checkpoints} steady checkpoints")
            loaded_at = loaded_at or _steady_since(markers)
            consumed_at = consumed_at or (loaded_at and _consumed_since(markers, keys))
            collect()
            time.sleep(0.1)
        stats = {c.checkpoint_id: c for c in client.checkpoint_stats().history}
        measured = steady()
        durations = [s.completed_at - s.triggered_at for s in measured]
        # Recovery of the whole state: kill one subtask of the keyed operator.
        victim = next(s for s in client.subtasks() if s.vertex.startswith("sum"))
        killed = time.time()
        os.kill(victim.pid, signal.SIGKILL)
        while True:
            recoveries = client.recoveries()
            if recoveries and {"first_output_at", "running_at"} <= recoveries[0].keys():
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"large state K={keys}: no output after the kill within {timeout:.0f} s")
            time.sleep(0.01)
        recovery = recoveries[0]
    finally:
        client.cancel()
    full = [s.state_size for s in measured]
    written = [s.incremental_size if s.incremental_size is not None else s.state_size for s in measured]
    return {
        "keys": keys, "backend": label or str(state_backend), "changed_per_interval": changed,
        "checkpoints": len(measured),
        # Seconds from the sources finishing the load to the keyed operator having consumed it:
        # the load rows queued in the network buffers, which the measured window leaves out.
        "load_drained_after": consumed_at - loaded_at,
        "materialized": sum(1 for s in measured if materializing.get(s.checkpoint_id)),
        # The largest single upload in the window and its share of that checkpoint's full size
        # (plain incremental RocksDB: the one-off compaction of the load's files, see above).
        "largest_written_bytes": max(written),
        "largest_written_share": max(w / f for w, f in zip(written, full) if f),
        "p50": float(np.percentile(durations, 50)), "p99": float(np.percentile(durations, 99)),
        # Where a checkpoint's time goes, per checkpoint the slowest subtask's part (median
        # over the measured checkpoints): trigger → barrier, alignment, sync, async.
        **{f"{part}_p50": float(np.median([max((getattr(sub, part) for sub in stats[s.checkpoint_id].subtasks
                                                 if sub.vertex_id.startswith("sum")), default=0.0)
                                            for s in measured if s.checkpoint_id in stats] or [float("nan")]))
           for part in ("start_delay", "alignment_duration", "sync_duration", "async_duration")},
        # Per measured checkpoint: id, duration, and the slowest keyed subtask's start delay,
        # alignment, sync and async parts (s), then written and full bytes.
        # (The parts only for the checkpoints the JobMaster's history still holds: None before.)
        "timeline": [[s.checkpoint_id, round(s.completed_at - s.triggered_at, 3),
                      *(round(max((getattr(sub, part) for sub in stats[s.checkpoint_id].subtasks
                                   if sub.vertex_id.startswith("sum")), default=0.0), 3)
                        if s.checkpoint_id in stats else None
                        for part in ("start_delay", "alignment_duration", "sync_duration", "async_duration")),
                      w, s.state_size] for s, w in zip(measured, written)],
        "sync_max": max((sub.sync_duration for s in measured if s.checkpoint_id in stats
                         for sub in stats[s.checkpoint_id].subtasks), default=float("nan")),
        "full_bytes": int(np.median(full)), "written_bytes": int(np.median(written)),
        # In-flight data (unaligned checkpoints only), part of what each checkpoint wrote.
        "in_flight_bytes": int(np.median([s.in_flight_size or 0 for s in measured])),
        "unaligned": unaligned,
        "written_share": float(np.median([w / f for w, f in zip(written, full) if f])),
        # Over all measured checkpoints: RocksDB's compactions rewrite files every few flushes,
        # so single checkpoints alternate between small and large uploads; this is the average.
        "written_share_mean": float(sum(written) / sum(full)) if sum(full) else float("nan"),
        "recovery_first_output": recovery["first_output_at"] - killed,
        "recovery_running": recovery["running_at"] - killed,
        "local_recovery": bool(env_options.get("local_recovery", False)),
        "restore": recovery.get("restore"),
    }
