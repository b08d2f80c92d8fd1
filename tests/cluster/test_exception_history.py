"""The job's exception history (cluster/exception_history.py): a root cause per failed attempt,
the failures that followed it folded in, a truer cause replacing a follow-on one."""

from __future__ import annotations

from streamsnap.cluster.exception_history import ExceptionHistory, one_line

USER = ('Traceback (most recent call last):\n  File "job.py", line 3, in f\n    raise ValueError("bad: x")\n'
        "ValueError: bad: x\nwhere: the user function of operator 'f', subtask f (1/2), on record {'a': 1}")


def test_one_line_is_the_exception_of_a_traceback_else_the_first_line():
    assert one_line(USER) == "ValueError: bad: x"
    assert one_line("\nlost subtask v#1 (pid 3 on h): its connection dropped\nmore") == \
        "lost subtask v#1 (pid 3 on h): its connection dropped"
    assert one_line("") == ""


def test_follow_on_failures_fold_into_the_root_cause_of_their_attempt():
    clock = iter([10.0, 20.0])
    history = ExceptionHistory(clock=lambda: next(clock))
    history.follow_on(0, "x (1/2)", "ConnectionLost: early")          # no root yet: nothing to fold into
    assert history.entries() == ()
    history.root(0, "UpstreamLostError: lost upstream f-1#0", "FOLLOW_ON", "g (1/2)")
    history.follow_on(0, "g (2/2)", "UpstreamLostError: lost upstream f-1#0")
    history.replace_root(0, USER, "USER_FUNCTION", "f (1/2)", "ValueError: bad: x")
    history.follow_on(0, "src (1/2)", "ConnectionLost: downstream closed")
    history.follow_on(1, "src (2/2)", "ConnectionLost: a later attempt's, without a root")
    (entry,) = history.entries()
    assert (entry.exception, entry.task, entry.reason, entry.attempt, entry.timestamp) == \
        ("ValueError: bad: x", "f (1/2)", "USER_FUNCTION", 0, 10.0)
    assert entry.root_cause == USER
    assert [(f.task, f.exception.split(":")[0]) for f in entry.concurrent] == [
        ("g (1/2)", "UpstreamLostError"), ("g (2/2)", "UpstreamLostError"), ("src (1/2)", "ConnectionLost")]
    assert entry.follow_on_line().startswith(
        "3 other subtask failure(s) followed from it (UpstreamLostError ×2, ConnectionLost)")
    history.root(1, "lost subtask v#0: its connection dropped", "TASK_LOST")
    assert [e.attempt for e in history.entries()] == [0, 1] and history.latest().follow_on_line() is None
    assert history.latest().exception == "lost subtask v#0: its connection dropped"
