"""One root cause, not 350 lines (issue 30): a job whose user function raises shows the user's
exception once — in the job's error, the user's traceback first, then where it happened — and
the failures of neighbouring subtasks that followed from it (a lost input, a lost output) as a
one-line count, at the default log level and at DEBUG. The error and the result carry the
job's exception history."""

from __future__ import annotations

import logging

import pytest

import streamsnap as ss

pytestmark = pytest.mark.spark

MESSAGE = "row 3001 is not a number we can take"


def fussy(row):
    if row["i"] == 3001:
        raise ValueError(MESSAGE)
    return row


@pytest.mark.parametrize("level", ["WARNING", "DEBUG"])
def test_a_failing_job_shows_its_root_cause_once_and_counts_the_follow_on_failures(spark, capfd, caplog, level):
    caplog.set_level(getattr(logging, level))
    env = ss.StreamEnvironment(parallelism=3, spark=spark, log_level=level)
    (env.from_source(ss.sources.Generator(lambda i: {"i": i, "k": i % 11}, count=200_000), name="rows")
        .key_by("k").map(fussy, name="fussy").key_by("k").map(lambda r: r, name="after")
        .sink_to(ss.sinks.Collect(), name="out"))
    with pytest.raises(ss.JobExecutionError) as raised:
        env.execute("root cause")
    error = raised.value
    text = str(error)
    # What a user sees: stderr, the log records, and the error (printed when uncaught).
    seen = capfd.readouterr().err + "\n" + caplog.text + "\n" + text
    assert seen.count(MESSAGE) == 1, seen[-6000:]
    assert seen.count("Traceback (most recent call last)") == 1, seen[-6000:]
    for noise in ("UpstreamLostError", "ConnectionLost", "could not tell the driver"):
        assert noise not in caplog.text and noise not in capfd.readouterr().err

    # The user's traceback first (their file and line), then where it happened.
    lines = text.splitlines()
    assert lines[0] == "job 'root cause' failed in your code:" and lines[1].startswith("Traceback")
    user_frame = next(i for i, line in enumerate(lines) if __file__ in line and "fussy" in line)
    where = next(i for i, line in enumerate(lines) if line.startswith("where:"))
    assert user_frame < lines.index(f"ValueError: {MESSAGE}") < where
    assert "operator 'fussy'" in lines[where] and "'i': 3001" in lines[where]

    # The exception history: one entry, the root cause with its follow-on failures folded in.
    (entry,) = error.history
    assert entry.exception == f"ValueError: {MESSAGE}" and entry.reason == "USER_FUNCTION"
    assert entry.task.startswith("fussy (") and entry.attempt == 0 and entry.timestamp > 0
    assert entry.root_cause == error.cause and MESSAGE in entry.root_cause
    assert all(f.exception.split(":")[0] in ("UpstreamLostError", "ConnectionLost") for f in entry.concurrent), \
        entry.concurrent
    assert all(not f.task.startswith("fussy") or f.task != entry.task for f in entry.concurrent)
    # The count is in the error as one line, exactly when there were follow-on failures.
    follow = [line for line in lines if "other subtask failure(s) followed from it" in line]
    assert follow == ([entry.follow_on_line()] if entry.concurrent else []), (follow, entry.concurrent)


class FailsOnce(ss.KeyedProcessFunction):
    """A running count that raises on row 500 in the first deployment attempt only."""

    def open(self, ctx):
        self.first_attempt = ctx.attempt == 0
        self.count = ctx.get_state(ss.ValueStateDescriptor("count", default=0))

    def process_element(self, row, ctx):
        if self.first_attempt and row["i"] == 500:
            raise RuntimeError("first attempt trips on row 500")
        self.count.update(self.count.value() + 1)
        yield {"k": ctx.current_key, "count": self.count.value()}


def test_a_job_that_recovered_keeps_the_failure_in_its_results_exception_history(spark, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    env = ss.StreamEnvironment(parallelism=2, spark=spark, restart=ss.RestartStrategy.fixed_delay(2, 0.1),
                               checkpointing=ss.CheckpointConfig(interval=0.3, directory=str(tmp_path)))
    (env.from_source(ss.sources.Generator(lambda i: {"i": i, "k": i % 5}, count=2_000), name="rows")
        .key_by("k").process(FailsOnce(), name="counting", uid="counting").sink_to(ss.sinks.Collect(), name="out"))
    result = env.execute("recovers")
    assert result.status == "FINISHED" and result.restarts == 1
    (entry,) = result.exceptions
    assert entry.exception == "RuntimeError: first attempt trips on row 500" and entry.attempt == 0
    assert entry.task.startswith("counting -> out (") and entry.reason == "USER_FUNCTION"
    # The restart's warning names the cause in one line, without its traceback.
    (restart,) = [r for r in caplog.records if "restarting" in r.getMessage()]
    assert "after RuntimeError: first attempt trips on row 500 in counting -> out (" in restart.getMessage()
    assert "Traceback" not in caplog.text
    totals = {}
    for row in result.rows("out"):
        totals[row["k"]] = max(totals.get(row["k"], 0), row["count"])
    assert totals == {k: 400 for k in range(5)}
