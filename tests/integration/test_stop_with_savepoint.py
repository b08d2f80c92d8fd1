"""Stop-with-savepoint on real Spark when something goes wrong around it (issue 28): a drain
whose savepoint fails, a task that dies after a drained savepoint completed, and a driver that
dies after a stop-with-savepoint completed. In each the committed output stays exact."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict

import pytest

import streamsnap as ss
from streamsnap.connectors.sinks import FileSinkWriter
from streamsnap.api.environment import TEST_HOOKS_ENV
from streamsnap.time.watermarks import MAX_WATERMARK
from tests.integration import support
from tests.integration.test_driver_failure import drivers  # noqa: F401  (fixture)
from tests.integration.test_event_time import read_parquet_rows
from tests.integration.test_failover import event, expected_rows, read_output
from tests.integration.test_windows import LATE, SPLITS, event as window_event, reference_windows, tumbling_pipeline

pytestmark = pytest.mark.spark


class _FailsOnceWriter(FileSinkWriter):
    def prepare_commit(self, checkpoint_id: int) -> list:
        sink = self._sink
        if checkpoint_id == sink.fail_at and self._ctx.subtask_index == 0 and not os.path.exists(sink.marker):
            open(sink.marker, "w").close()
            raise OSError(f"pre-commit of checkpoint {checkpoint_id} failed (once, by the test)")
        return super().prepare_commit(checkpoint_id)


class FailsOnceFileSink(ss.sinks.FileSink):
    """A FileSink whose subtask 0 fails its pre-commit of checkpoint `fail_at` once (a marker
    file remembers it across attempts): the checkpoint is declined."""

    def __init__(self, path, marker, fail_at):
        super().__init__(path, format="parquet")
        self.marker, self.fail_at = str(marker), fail_at

    def create_writer(self, ctx):
        return _FailsOnceWriter(self, ctx)


def window_totals(rows) -> dict:
    totals = defaultdict(lambda: [0, 0])
    for r in rows:
        totals[(r["key"], r["start"])][0] += r["count"]
        totals[(r["key"], r["start"])][1] += r["sum"]
    return {k: tuple(v) for k, v in totals.items()}


def test_a_failed_draining_stop_fails_over_and_runs_on_as_if_no_stop_was_asked(spark, tmp_path):
    """Issue 28 (1): the drain ends event time before the savepoint barrier; the savepoint is
    then declined. The job must not go on with event time at its end (windows fired with part
    of their rows, every later row late): it fails over to checkpoint 1 and runs on."""
    n = 4000
    out, gate = tmp_path / "out", tmp_path / "gate"
    config = ss.CheckpointConfig(interval=None, directory=str(tmp_path / "ckpt"))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, auto_watermark_interval=0.05,
                               restart=ss.RestartStrategy.fixed_delay(attempts=2, delay=0.0))
    windows = tumbling_pipeline(env, n, rate=2000, gate=gate,
                                sink=FailsOnceFileSink(str(out), tmp_path / "failed-once", fail_at=2))
    windows.get_side_output(LATE).sink_to(ss.sinks.Collect(), name="late", uid="late")
    client = env.execute_async("a drain that fails")
    support.wait_held(gate, SPLITS, client)
    assert client.trigger_checkpoint().checkpoint_id == 1
    with pytest.raises(ss.StreamsnapError, match="stop-with-savepoint with drain failed") as info:
        client.stop_with_savepoint(str(tmp_path / "sp"), drain=True)
    assert "fails over to checkpoint 1 and runs on" in str(info.value)
    assert (tmp_path / "failed-once").exists()
    support.wait_status(client, "RUNNING")
    support.release(gate)
    result = client.wait(120)
    assert result.restarts == 1
    assert result.checkpoints.latest_restored.checkpoint_id == 1
    assert result.rows("late") == []                  # event time did not end early
    rows = read_parquet_rows(out)
    fired = [(r["key"], r["start"]) for r in rows]
    assert len(fired) == len(set(fired)), "a window fired twice"
    assert window_totals(rows) == reference_windows(window_event(i) for i in range(n))


def test_a_task_failure_after_a_completed_drain_ends_the_job_without_running_past_it(spark, tmp_path, monkeypatch):
    """Issue 28 (3): the drained savepoint completed (every window fired into it) and its commit
    is being notified when a task dies. The job restores the savepoint only to commit what it
    covers and finishes: no window is emitted again, no row after the stop is read."""
    n = 6000
    out, gate, phases = tmp_path / "out", tmp_path / "gate", tmp_path / "phases"
    phases.mkdir()
    monkeypatch.setenv(TEST_HOOKS_ENV, json.dumps({"phase_dir": str(phases), "notify_delay": 0.5}))
    config = ss.CheckpointConfig(interval=None, directory=str(tmp_path / "ckpt"))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, auto_watermark_interval=0.05,
                               restart=ss.RestartStrategy.fixed_delay(attempts=1, delay=0.0))
    tumbling_pipeline(env, n, rate=2000, gate=gate, sink=ss.sinks.FileSink(str(out), format="parquet"))
    client = env.execute_async("a drained stop, then a task dies")
    support.wait_held(gate, SPLITS, client)
    assert client.trigger_checkpoint().checkpoint_id == 1
    stopper, stop = support.stop_in_background(client, tmp_path / "sp", drain=True)
    savepoint, pid = support.pid_committing_savepoint(client, phases)
    os.kill(pid, signal.SIGKILL)
    stopper.join(120)
    result = client.wait(60)
    assert stop.get("path") and "error" not in stop, stop        # the stop resolves when FINISHED
    assert result.status == "FINISHED" and result.restarts == 1
    assert result.checkpoints.latest_restored.checkpoint_id == savepoint.checkpoint_id
    first = read_parquet_rows(out)
    fired = [(r["key"], r["start"]) for r in first]
    assert len(fired) == len(set(fired)), "a drained window was emitted again after the failure"
    assert any(r["watermark"] == MAX_WATERMARK for r in first), "the drain fired no window"
    assert not [f for f in os.listdir(out) if f.startswith(".inprogress")]
    # The savepoint covers exactly what was committed: a run restored from it explicitly (the
    # user's choice) reads the rest, and every row counts once over both.
    env2 = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, auto_watermark_interval=0.05)
    tumbling_pipeline(env2, n, rate=None, sink=ss.sinks.FileSink(str(out), format="parquet"))
    env2.execute("the rest after the drain", restore_from=stop["path"])
    assert window_totals(read_parquet_rows(out)) == reference_windows(window_event(i) for i in range(n))


N = 12_000

DRIVER = textwrap.dedent('''
    import json, os, sys
    import streamsnap as ss

    out, ckpt, sp, n, rate, drain = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]) or None, sys.argv[6] == "drain"
''') + support.SCRIPT_EVENT_AND_SUM + textwrap.dedent('''
    env = ss.StreamEnvironment(parallelism=2, checkpointing=ss.CheckpointConfig(interval=None, directory=ckpt,
                                                                                  num_retained=1),
                               restart=ss.RestartStrategy.none())
    (env.from_source(ss.sources.Generator(event, count=n, rate=rate), name="events", uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.FileSink(out, format="parquet", mode="append"), name="files", uid="files"))
    client = env.execute_async("stopped, driver dies")
    if rate:                              # the first run: a checkpoint, then a stop-with-savepoint
        while client.status() != "RUNNING":
            pass
        client.trigger_checkpoint()
        client.stop_with_savepoint(sp, drain=drain)   # the driver is killed while this waits
    result = client.wait()
    print("RESULT", json.dumps({"restored": result.checkpoints.latest_restored.checkpoint_id
                                if result.checkpoints.latest_restored else None}))
''')


@pytest.mark.parametrize("drain", [False, True])
def test_a_driver_killed_after_a_completed_stop_with_savepoint_resumes_from_it(spark, tmp_path, drivers, drain):  # noqa: F811
    """Issue 28 (2): the stop's savepoint completed and subsumed chk-1 (num_retained=1); the
    driver dies before the job ended. The rerun must resume from that savepoint (recorded in
    the job directory), not from the beginning: nothing committed twice. A drained stop's
    rerun commits what the savepoint covers and finishes."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    out, ckpt, sp = tmp_path / "out", tmp_path / "ckpt", tmp_path / "sp"
    mode = "drain" if drain else "no-drain"
    hooks = json.dumps({"notify_delay": 3.0})   # the tasks commit slowly: the job cannot end meanwhile
    first = subprocess.Popen([sys.executable, str(script), str(out), str(ckpt), str(sp), str(N), "2000", mode],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=dict(os.environ, PYTHONUNBUFFERED="1", **{TEST_HOOKS_ENV: hooks}))
    drivers.append(first)
    deadline = time.monotonic() + 180
    while not (points := glob.glob(str(ckpt / "*" / "_restore_point"))):
        assert first.poll() is None, f"the driver exited early:\n{first.stdout.read()}"
        assert time.monotonic() < deadline, "the stop-with-savepoint did not complete"
        time.sleep(0.02)
    job_dir = os.path.dirname(points[0])
    # The savepoint completed; once the store has subsumed chk-1 (the case: the job
    # directory then holds no checkpoint at all), the driver dies.
    while glob.glob(os.path.join(job_dir, "chk-*", "_metadata")):
        assert first.poll() is None and time.monotonic() < deadline, "chk-1 was not subsumed"
        time.sleep(0.01)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    assert "RESULT" not in first.stdout.read(), "the job ended before its driver was killed"
    savepoint = json.load(open(points[0]))
    # The CLI and ss.state find the recorded savepoint as the job's latest restore point.
    from typer.testing import CliRunner
    from streamsnap.checkpoint.storage import latest_restore_point
    from streamsnap.cli import app
    listing = CliRunner().invoke(app, ["checkpoints", job_dir], env={"COLUMNS": "250"})
    assert "terminating_savepoint" in listing.output and os.path.basename(savepoint["path"]) in listing.output
    assert latest_restore_point(job_dir).rstrip("/").endswith(os.path.basename(savepoint["path"]))

    # The rerun runs here, on the suite's session (what matters is where it resumes from).
    output = support.run_driver_script_here(DRIVER, [str(out), str(ckpt), str(sp), str(N), "0", mode])
    assert json.loads(output.split("RESULT", 1)[1])["restored"] == savepoint["checkpoint_id"], output
    rows = read_output(out)
    assert len(rows) == len(set(rows)), "the rerun committed rows a second time"
    expected = expected_rows(N)
    if not drain:
        assert set(rows) == expected
        return
    # Drained: the rerun ran nothing past the stop. What was committed is, per key, every row up
    # to where the savepoint cut (the key's own sequence of running sums, without gaps).
    assert set(rows) <= expected and 0 < len(rows) < N
    by_key = defaultdict(list)
    for key, total, i in rows:
        by_key[key].append(i)
    for key, seen in by_key.items():
        ours = sorted(i for i in range(N) if event(i)["key"] == key)
        assert sorted(seen) == ours[:len(seen)], f"key {key}: a gap in its committed rows"
    assert "does not run past its drain" in output or "it does not run past its drain" in output, output
