"""FileSink rolling policy: the pure decisions, then the writer on real files (no Spark) —
a part open across checkpoints, its segments in the checkpoint, resumed after a failure."""

from __future__ import annotations

import json
import os
import pickle
from datetime import timedelta

import pyarrow.parquet as pq
import pytest

import streamsnap as ss
from streamsnap.connectors.filesink.rolling import PartStats, RollingPolicy
from streamsnap.connectors.sinks import FileSinkWriter
from streamsnap.runtime.operators.base import OperatorContext

MIB = 1024 * 1024


# ===================================================================== decisions
def test_flink_defaults_and_units():
    p = RollingPolicy()
    assert (p.max_part_size, p.rollover_ms, p.inactivity_ms) == (128 * MIB, 60_000, 60_000)
    q = RollingPolicy(max_part_size=None, rollover_interval=timedelta(minutes=2), inactivity_interval=0.5)
    assert (q.rollover_ms, q.inactivity_ms) == (120_000, 500)
    assert repr(q) == "RollingPolicy(max_part_size=None, rollover_interval=120, inactivity_interval=0.5)"
    assert pickle.loads(pickle.dumps(q)) == q
    assert pickle.loads(pickle.dumps(RollingPolicy.on_checkpoint())) == RollingPolicy.on_checkpoint()
    assert ss.sinks.FileSink("/tmp/x").rolling == RollingPolicy.on_checkpoint()  # the default, as before


def test_size_rolls_after_the_write_that_reaches_it():
    p = RollingPolicy(max_part_size=100, rollover_interval=None, inactivity_interval=None)
    assert not p.roll_after_write(PartStats(99, 0, 0))
    assert p.roll_after_write(PartStats(100, 0, 0))
    assert not p.roll_before_write(PartStats(10**9, 0, 0), now_ms=10**12)  # size is not time
    assert p.roll_at_checkpoint(PartStats(100, 0, 0), now_ms=0)
    assert not p.roll_at_checkpoint(PartStats(99, 0, 0), now_ms=10**12)


def test_rollover_counts_from_creation_and_inactivity_from_the_last_write():
    p = RollingPolicy(max_part_size=None, rollover_interval=10, inactivity_interval=3)
    busy = PartStats(size=1, created_ms=0, last_write_ms=9_000)
    assert not p.roll_at_checkpoint(busy, now_ms=9_999)
    assert p.roll_at_checkpoint(busy, now_ms=10_000)        # 10 s old
    idle = PartStats(size=1, created_ms=0, last_write_ms=1_000)
    assert not p.roll_before_write(idle, now_ms=3_999)
    assert p.roll_before_write(idle, now_ms=4_000)          # 3 s without a row
    assert not RollingPolicy(rollover_interval=10, inactivity_interval=None).roll_at_checkpoint(idle, 4_000)


def test_on_checkpoint_rolls_at_every_checkpoint_and_never_between():
    p = RollingPolicy.on_checkpoint()
    assert p.roll_at_checkpoint(PartStats(1, 0, 0), now_ms=0)
    assert not p.roll_after_write(PartStats(10**12, 0, 0))
    assert not p.roll_before_write(PartStats(1, 0, 0), now_ms=10**12)


@pytest.mark.parametrize("kwargs, match", [
    ({"max_part_size": -1}, r"max_part_size must be at least 1 byte"),
    ({"max_part_size": "128MB"}, r"max_part_size is a number of bytes as an int .*128 \* 1024 \* 1024.*got str"),
    ({"max_part_size": 1.5}, r"max_part_size is a number of bytes"),
    ({"rollover_interval": -5}, r"rollover_interval must be at least 1 ms"),
    ({"rollover_interval": "60s"}, r"rollover_interval must be a duration: seconds as an int or float, or a datetime.timedelta"),
    ({"inactivity_interval": 0}, r"inactivity_interval must be at least 1 ms"),
    ({"max_part_size": None, "rollover_interval": None, "inactivity_interval": None},
     r"needs at least one of .*never becomes visible.*on_checkpoint"),
])
def test_bad_policies_fail_when_built_naming_the_setting_and_the_fix(kwargs, match):
    with pytest.raises(ss.ConfigurationError, match=match):
        ss.sinks.RollingPolicy(**kwargs)


def test_a_policy_that_is_not_a_rolling_policy_names_the_fix():
    with pytest.raises(ss.ConfigurationError, match=r"FileSink.rolling must be a RollingPolicy, e.g. rolling="):
        ss.sinks.FileSink("/tmp/x", rolling={"rollover_interval": 60})
    with pytest.raises(AttributeError, match="immutable"):
        RollingPolicy().max_part_size = 1


# ===================================================================== the writer, on real files
class Clock:
    def __init__(self):
        self.now = 1_700_000_000.0

    def wall(self):
        return self.now

    def monotonic(self):
        return self.now


def writer(path, clock, rolling, attempt=0, fmt="parquet", subtask=0, parallelism=1, compact=False, **options):
    ctx = OperatorContext(name="files", uid="files", subtask_index=subtask, parallelism=parallelism,
                          max_parallelism=128, attempt=attempt, job_id="job-a", task_name="files (1/1)",
                          extra={"checkpointing": True})
    ctx.clock = clock
    w = FileSinkWriter(ss.sinks.FileSink(str(path), format=fmt, rolling=rolling, compact=compact, **options), ctx)
    w.open()
    return w


def visible(path):
    return sorted(f for f in os.listdir(path) if not f.startswith("."))


def rows_of(path, fmt="parquet"):
    out = []
    for f in visible(path):
        full = os.path.join(path, f)
        if fmt == "parquet":
            out += [r["v"] for r in pq.read_table(full).to_pylist()]
        else:
            out += [json.loads(line)["v"] for line in open(full)]
    return sorted(out)


def checkpoint(w, n):
    state = w.prepare_commit(n)
    w.commit(n)
    return state


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_part_stays_open_across_checkpoints_and_rolls_by_time_into_one_file(tmp_path, fmt):
    clock = Clock()
    w = writer(tmp_path, clock, RollingPolicy(rollover_interval=10, inactivity_interval=None), fmt=fmt)
    for n in range(1, 10):          # 9 checkpoints, 1 s apart, rows before each
        w.write([{"v": n}])
        clock.now += 1
        state = checkpoint(w, n)
        assert visible(tmp_path) == []        # not rolled: nothing visible
        assert [len(s["part"]) for s in state] == [n]   # the open part's segments are in the checkpoint
    w.write([{"v": 10}])
    clock.now += 1
    checkpoint(w, 10)                # 10 s old: rolls, combined, committed
    assert len(visible(tmp_path)) == 1 and rows_of(tmp_path, fmt) == list(range(1, 11))
    assert [f for f in os.listdir(tmp_path) if f.startswith(".")] == []  # segments deleted at the commit
    if fmt == "parquet":
        (name,) = visible(tmp_path)
        assert pq.ParquetFile(os.path.join(tmp_path, name)).metadata.num_row_groups == 1


def test_size_rolls_mid_interval_and_the_end_of_input_rolls_the_rest(tmp_path):
    clock = Clock()
    w = writer(tmp_path, clock, RollingPolicy(max_part_size=2000, rollover_interval=None,
                                              inactivity_interval=None), fmt="jsonl")
    for i in range(300):                         # ~12 bytes a row: a roll every ~170 rows
        w.write([{"v": i}])
    checkpoint(w, 1)
    assert len(visible(tmp_path)) == 1
    w.end_input()
    checkpoint(w, 2)
    assert len(visible(tmp_path)) == 2 and rows_of(tmp_path, "jsonl") == list(range(300))


def test_a_failure_mid_part_resumes_the_part_from_the_checkpoint_exactly(tmp_path):
    clock = Clock()
    policy = RollingPolicy(rollover_interval=5, inactivity_interval=None)
    w = writer(tmp_path, clock, policy)
    w.write([{"v": 1}, {"v": 2}])
    checkpoint(w, 1)
    w.write([{"v": 3}])
    state = checkpoint(w, 2)                      # the last completed checkpoint: rows 1..3, part open
    w.write([{"v": 4}])                           # after the barrier: to be replayed
    clock.now += 6
    w.prepare_commit(3)                           # rolls (combined file written), never completes
    w.write([{"v": 5}])
    w.close()                                     # the task dies
    assert visible(tmp_path) == []
    restored = writer(tmp_path, clock, policy, attempt=1)
    restored.recover(state)
    # Only the checkpoint's two segments are left; the failed attempt's files are gone.
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(u) for u in state[0]["part"])
    restored.write([{"v": 4}])                    # the replay: the part kept its age (6 s), so it
    restored.write([{"v": 5}])                    # rolls first and the replayed rows start a new one
    checkpoint(restored, 3)
    assert rows_of(tmp_path) == [1, 2, 3] and len(visible(tmp_path)) == 1
    restored.end_input()
    checkpoint(restored, 4)
    assert rows_of(tmp_path) == [1, 2, 3, 4, 5] and len(visible(tmp_path)) == 2
    assert [f for f in os.listdir(tmp_path) if f.startswith(".")] == []


def test_restoring_a_part_whose_segments_are_gone_says_why(tmp_path):
    clock = Clock()
    w = writer(tmp_path, clock, RollingPolicy(rollover_interval=5))
    w.write([{"v": 1}])
    state = checkpoint(w, 1)
    os.unlink(state[0]["part"][0][len("file://"):])
    with pytest.raises(ss.StreamsnapError, match="older than the output's latest commit"):
        writer(tmp_path, clock, RollingPolicy(rollover_interval=5), attempt=1).recover(state)


def test_scale_in_resumes_one_part_and_rolls_the_other(tmp_path):
    clock = Clock()
    policy = RollingPolicy(rollover_interval=60)
    a, b = (writer(tmp_path, clock, policy, subtask=s, parallelism=2) for s in (0, 1))
    a.write([{"v": 1}])
    b.write([{"v": 2}])
    state = a.prepare_commit(1) + b.prepare_commit(1)
    a.close(), b.close()
    only = writer(tmp_path, clock, policy, attempt=1)
    only.recover(state)
    only.write([{"v": 3}])
    only.end_input()
    checkpoint(only, 2)
    assert rows_of(tmp_path) == [1, 2, 3] and len(visible(tmp_path)) == 2


# ===================================================================== compaction
def compacting(path, clock, subtask, attempt=0, fmt="parquet"):
    """Subtask `subtask` of 2, compacting, rolling at every checkpoint."""
    return writer(path, clock, None, attempt=attempt, fmt=fmt, subtask=subtask, parallelism=2, compact=True)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_compaction_merges_a_checkpoints_parts_of_all_subtasks_into_one_file(tmp_path, fmt):
    clock = Clock()
    a, b = compacting(tmp_path, clock, 0, fmt=fmt), compacting(tmp_path, clock, 1, fmt=fmt)
    for n in (1, 2, 3):
        a.write([{"v": 10 * n}])
        b.write([{"v": 10 * n + 1}])
        a.prepare_commit(n), b.prepare_commit(n)
        b.commit(n)                   # subtask 1 commits first: nothing visible until subtask 0 merges
        assert len(visible(tmp_path)) == n - 1
        a.commit(n)
        assert len(visible(tmp_path)) == n
    assert rows_of(tmp_path, fmt) == [10, 11, 20, 21, 30, 31]
    assert [f for f in os.listdir(tmp_path) if f.startswith(".")] == []   # sources and manifests gone


def test_compaction_is_redone_after_a_failure_and_never_twice(tmp_path):
    clock = Clock()
    a, b = compacting(tmp_path, clock, 0), compacting(tmp_path, clock, 1)
    a.write([{"v": 1}])
    b.write([{"v": 2}])
    state = a.prepare_commit(1) + b.prepare_commit(1)   # checkpoint 1 completes ...
    b.commit(1)                                          # ... subtask 0 dies before its merge
    a.close(), b.close()
    sources = {c["inprogress"][len("file://"):]: None for c in state}
    for path in sources:
        sources[path] = open(path, "rb").read()
    r0, r1 = compacting(tmp_path, clock, 0, attempt=1), compacting(tmp_path, clock, 1, attempt=1)
    r0.recover(state), r1.recover(state)
    assert rows_of(tmp_path) == [1, 2] and len(visible(tmp_path)) == 1
    # A second failure right after the merge was put in place, before its sources were deleted:
    # restoring the same checkpoint again finds the merged file and only cleans up.
    for path, data in sources.items():
        open(path, "wb").write(data)
    compacting(tmp_path, clock, 0, attempt=2).recover(state)
    assert rows_of(tmp_path) == [1, 2] and [f for f in os.listdir(tmp_path) if f.startswith(".")] == []


def test_a_stop_with_savepoint_rolls_the_open_part_and_only_that_checkpoint(tmp_path):
    clock = Clock()
    w = writer(tmp_path, clock, RollingPolicy(rollover_interval=60))
    w.write([{"v": 1}])
    checkpoint(w, 1)
    assert visible(tmp_path) == []
    w.prepare_stop(2)                 # the stop's savepoint ...
    w.write([{"v": 2}])
    checkpoint(w, 2)                  # ... rolls the part: visible when the job stops
    assert rows_of(tmp_path) == [1, 2]
    w.write([{"v": 3}])               # a stop whose savepoint failed: the job runs on, parts roll by policy
    checkpoint(w, 3)
    assert rows_of(tmp_path) == [1, 2]
