"""The task's idle / backpressured / busy account and the shares between two readings."""

from streamsnap.runtime.task_time import TaskTimeAccount, backpressure_level, time_shares


def test_waits_are_idle_or_backpressured_and_the_rest_is_busy():
    account = TaskTimeAccount(now=10.0)
    account.begin_wait(10.0, backpressured=False)
    account.end_wait(10.2)                        # 0.2 s waiting for input
    account.begin_wait(10.5, backpressured=True)
    account.end_wait(11.1)                        # 0.6 s waiting for output room
    reading = account.reading(12.0)
    assert reading["elapsed"] == 2.0 and abs(reading["idle"] - 0.2) < 1e-9 and abs(reading["backpressured"] - 0.6) < 1e-9
    shares = time_shares(None, account.reading(12.0))
    assert round(shares["idle"]) == 100 and round(shares["backpressured"]) == 300 and round(shares["busy"]) == 600


def test_a_wait_in_progress_counts_up_to_the_reading():
    account = TaskTimeAccount(now=0.0)
    account.begin_wait(1.0, backpressured=True)
    first = account.reading(2.0)
    assert first["backpressured"] == 1.0
    second = account.reading(3.0)
    assert time_shares(first, second) == {"idle": 0.0, "backpressured": 1000.0, "busy": 0.0}
    account.end_wait(3.0)
    assert account.reading(3.0)["backpressured"] == 2.0
    account.end_wait(4.0)                          # no wait in progress: nothing to add
    assert account.reading(4.0)["backpressured"] == 2.0


def test_shares_need_time_to_pass_and_restart_with_a_new_attempt():
    reading = {"elapsed": 5.0, "idle": 1.0, "backpressured": 1.0, "attempt": 0}
    assert time_shares(reading, reading) is None
    new_attempt = {"elapsed": 7.0, "idle": 7.0, "backpressured": 0.0, "attempt": 1}
    assert time_shares(reading, new_attempt) == {"idle": 1000.0, "backpressured": 0.0, "busy": 0.0}


def test_flinks_backpressure_levels():
    assert [backpressure_level(r) for r in (0.0, 0.1, 0.11, 0.5, 0.51, 1.0)] == ["ok", "ok", "low", "low", "high", "high"]
