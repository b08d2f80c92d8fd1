"""API durations (seconds or `timedelta`) → integer milliseconds of event time.

Event time is int epoch milliseconds (Flink's and Kafka's convention), so window arithmetic is
exact integer arithmetic; users write durations as everywhere else in the API, in seconds or as
a `datetime.timedelta`. Converting once, when a strategy or assigner is built, makes a bad value
fail at definition time with the parameter's name rather than deep inside a running task.
"""

from __future__ import annotations

import math
from datetime import timedelta
from numbers import Real

from streamsnap.errors import ConfigurationError

_ONE_MS = timedelta(milliseconds=1)


def to_millis(value: object, name: str, *, minimum: int | None = 0) -> int:
    """`value` (seconds as int/float, or a timedelta) in whole milliseconds, rounded.

    `minimum` is the smallest allowed result (0: no negatives, 1: strictly positive, None: any
    sign, e.g. window offsets). Raises ConfigurationError naming `name` and the allowed values.
    """
    allowed = ("seconds as an int or float, or a datetime.timedelta (e.g. "
               f"{name}=5 or {name}=timedelta(seconds=5))")
    if isinstance(value, timedelta):
        millis = value / _ONE_MS
    elif isinstance(value, Real) and not isinstance(value, bool):
        millis = value * 1000 if isinstance(value, int) else float(value) * 1000.0
    else:
        raise ConfigurationError(f"{name} must be a duration: {allowed}; got "
                                 f"{type(value).__name__} {value!r}")
    if not math.isfinite(millis):
        raise ConfigurationError(f"{name} must be a finite duration: {allowed}; got {value!r}")
    result = round(millis)
    if minimum is not None and result < minimum:
        what = "must not be negative" if minimum <= 0 else f"must be at least {minimum} ms"
        raise ConfigurationError(f"{name} {what}: give {allowed}; got {value!r} "
                                 f"(= {result} ms)")
    return result
