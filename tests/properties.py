"""Hypothesis profiles: reproducible in CI, exploring when asked.

`ci` (the default, what the README's test command runs) is derandomized: every run tries the
same examples, so a red CI is a regression, never an unlucky draw. `explore`
(`STREAMSNAP_HYPOTHESIS=explore python -m pytest ...`, for local and benchmark runs) draws new
examples each run, ten times as many, and keeps failing ones in `.hypothesis/` to retry first.
Tests size their search with `examples(n)`, n being the CI count.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILES = ("ci", "explore")
PROFILE = os.environ.get("STREAMSNAP_HYPOTHESIS", "ci")
if PROFILE not in PROFILES:
    raise RuntimeError(f"STREAMSNAP_HYPOTHESIS={PROFILE!r} is not a profile; use one of {', '.join(PROFILES)}")
EXPLORE_FACTOR = 10

# Property tests check behaviour, not speed: on a loaded CI machine one example can take longer
# than hypothesis's default 200 ms deadline (a partitioner test failed CI at 267 ms).
_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", derandomize=True, database=None, print_blob=True, **_COMMON)
settings.register_profile("explore", derandomize=False, print_blob=True, **_COMMON)


def load() -> None:
    settings.load_profile(PROFILE)


def examples(n: int) -> int:
    """How many examples a property test tries: `n` in CI, more when exploring."""
    return n * EXPLORE_FACTOR if PROFILE == "explore" else n
