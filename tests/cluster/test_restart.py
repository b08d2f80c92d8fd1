import pytest

import streamsnap as ss
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


@pytest.mark.parametrize("strategy", [ss.RestartStrategy.none(), ss.RestartStrategy.fixed_delay(1, 0)])
def test_describe_names_the_strategy(strategy):
    assert strategy.kind.split("_")[0] in RestartBackoff(strategy).describe()
