from datetime import timedelta

import numpy as np
import pytest

from streamsnap.errors import ConfigurationError
from streamsnap.time import to_millis


@pytest.mark.parametrize("value, millis", [
    (5, 5000), (0, 0), (0.1, 100), (1.5, 1500), (0.0004, 0), (0.0006, 1),
    (timedelta(seconds=2), 2000), (timedelta(milliseconds=7), 7),
    (timedelta(microseconds=1500), 2), (np.int64(3), 3000), (np.float64(0.25), 250),
    (10 ** 12, 10 ** 15),
])
def test_converts_seconds_and_timedeltas_to_milliseconds(value, millis):
    assert to_millis(value, "delay") == millis


@pytest.mark.parametrize("value", [True, False, "5", None, [1], float("nan"), float("inf")])
def test_rejects_non_durations_naming_the_parameter(value):
    with pytest.raises(ConfigurationError) as err:
        to_millis(value, "max_out_of_orderness")
    message = str(err.value)
    assert "max_out_of_orderness" in message and "timedelta" in message and "seconds" in message


@pytest.mark.parametrize("value", [-1, -0.5, timedelta(seconds=-1)])
def test_rejects_negative_durations(value):
    with pytest.raises(ConfigurationError, match="idle_timeout must not be negative"):
        to_millis(value, "idle_timeout")


def test_minimum_and_signed_durations():
    with pytest.raises(ConfigurationError, match="size must be at least 1 ms"):
        to_millis(0, "size", minimum=1)
    assert to_millis(-2, "offset", minimum=None) == -2000
    assert to_millis(timedelta(hours=-8), "offset", minimum=None) == -8 * 3600 * 1000
