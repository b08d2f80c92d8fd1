import pytest

import streamsnap as ss
from streamsnap.api.config import RestartStrategy
from streamsnap.cluster.restart import RestartBackoff


def test_no_restarts():
    backoff = RestartBackoff(ss.RestartStrategy.none())
    backoff.notify_failure(0.0)
    assert not backoff.can_restart()


def test_fixed_delay_counts_attempts():
    backoff = RestartBackoff(ss.RestartStrategy.fixed_delay(attempts=2, delay=1.5))
    for _ in range(2):
        backoff.notify_failure(0.0)
        assert backoff.can_restart() and backoff.backoff_time == 1.5
        backoff.notify_restart()
    backoff.notify_failure(0.0)
    assert not backoff.can_restart()
    assert "2 restarts" in backoff.describe()


def test_exponential_delay_grows_caps_and_resets_after_a_quiet_period():
    backoff = RestartBackoff(ss.RestartStrategy.exponential_delay(initial=1, max=5, multiplier=2, reset_after=60))
    delays = []
    for t in (0, 1, 2, 3, 4):
        backoff.notify_failure(float(t))
        assert backoff.can_restart()
        delays.append(backoff.backoff_time)
        backoff.notify_restart()
    assert delays == [1, 2, 4, 5, 5]
    backoff.notify_failure(100.0)  # 96 s without failure > reset_after
    assert backoff.backoff_time == 1 and backoff.restarts == 0


def test_exponential_delay_with_an_attempt_limit():
    backoff = RestartBackoff(ss.RestartStrategy.exponential_delay(initial=0.1, max=1, attempts=1))
    backoff.notify_failure(0.0)
    assert backoff.can_restart()
    backoff.notify_restart()
    backoff.notify_failure(1.0)
    assert not backoff.can_restart()


@pytest.mark.parametrize("strategy", [ss.RestartStrategy.none(), ss.RestartStrategy.fixed_delay(1, 0),
                                      ss.RestartStrategy.failure_rate(3, 60, 1)])
def test_describe_names_the_strategy(strategy):
    assert strategy.kind.split("_")[0] in RestartBackoff(strategy).describe()


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self):
        self.now = 1000.0

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def test_failure_rate_restarts_n_failures_per_interval_and_fails_the_next():
    clock = FakeClock()
    backoff = RestartBackoff(ss.RestartStrategy.failure_rate(max_failures=2, interval=10, delay=0.5))
    for step in (0.0, 3.0):     # two failures within 10 s: both restarted, 0.5 s after each
        backoff.notify_failure(clock.advance(step))
        assert backoff.can_restart() and backoff.backoff_time == 0.5
        backoff.notify_restart()
    backoff.notify_failure(clock.advance(3.0))   # the third within 10 s of the first
    assert not backoff.can_restart()
    assert backoff.restarts == 2 and "at most 2 failure(s) restarted per 10 s" in backoff.describe()


def test_failure_rate_forgets_failures_older_than_the_interval():
    clock = FakeClock()
    backoff = RestartBackoff(ss.RestartStrategy.failure_rate(max_failures=2, interval=10, delay=0))
    for step in (0.0, 6.0, 6.0, 6.0, 6.0, 6.0):   # never more than 2 failures within any 10 s
        backoff.notify_failure(clock.advance(step))
        assert backoff.can_restart()
        backoff.notify_restart()
    assert backoff.restarts == 6 and len(backoff.failure_times) == 2   # the history stays short
    backoff.notify_failure(clock.advance(9.0))   # 6 + 9 > 10 from the one before last: restarted
    assert backoff.can_restart()
    backoff.notify_restart()
    backoff.notify_failure(clock.advance(0.5))   # 3 within 10 s now
    assert not backoff.can_restart()


def test_failure_rate_at_the_interval_boundary_counts_the_old_failure_out():
    backoff = RestartBackoff(ss.RestartStrategy.failure_rate(max_failures=1, interval=5, delay=1))
    backoff.notify_failure(0.0)
    assert backoff.can_restart()
    backoff.notify_restart()
    backoff.notify_failure(5.0)       # exactly one interval later: the first is outside it
    assert backoff.can_restart() and backoff.failure_times == [5.0]
    backoff.notify_restart()
    backoff.notify_failure(9.9)
    assert not backoff.can_restart()


@pytest.mark.parametrize("kwargs, names", [
    (dict(max_failures=0), "max_failures must be an integer >= 1.*RestartStrategy.none()"),
    (dict(max_failures=True), "max_failures must be an integer >= 1"),
    (dict(max_failures=2.0), "max_failures must be an integer >= 1"),
    (dict(interval=0), "interval must be > 0"),
    (dict(interval=float("inf")), "interval must be a finite number.*fixed_delay"),
    (dict(interval="1m"), "interval must be a number of seconds"),
    (dict(delay=-1), "delay must be >= 0"),
    (dict(interval=5, delay=5), r"delay \(5 s\) must be shorter than interval \(5 s\).*lengthen interval"),
])
def test_failure_rate_rejects_bad_parameters_naming_them(kwargs, names):
    with pytest.raises(ss.ConfigurationError, match=f"RestartStrategy.failure_rate.{names}"):
        ss.RestartStrategy.failure_rate(**kwargs)


@pytest.mark.parametrize("strategy", [RestartStrategy.fixed_delay(2, 0.5),
                                      RestartStrategy.exponential_delay(initial=1, max=8, attempts=5),
                                      RestartStrategy.failure_rate(max_failures=2, interval=60, delay=0.5)])
def test_the_history_carries_over_to_the_next_job_master_as_if_it_had_never_stopped(strategy):
    """A JobMaster in the cluster leads one attempt; the next one continues its restart budget
    from the history it left (in another process, with another monotonic clock)."""
    one, history, wall = RestartBackoff(strategy), None, 100.0
    for k in range(4):
        offset = 1000.0 * (k + 1)                     # JobMaster k: monotonic = wall - offset
        carried = RestartBackoff(strategy)
        if history is not None:
            carried.load_history(history, to_wall=offset)
        for backoff, now in ((one, wall), (carried, wall - offset)):
            backoff.notify_failure(now)
            if backoff.can_restart():
                backoff.notify_restart()
        assert (carried.restarts, carried.can_restart(), carried.backoff_time) == \
            (one.restarts, one.can_restart(), one.backoff_time)
        history = carried.history(to_wall=offset)
        wall += 1.0
