"""When a FileSink part file rolls: Flink's rolling policies, as pure decisions.

A *part* is the file a subtask is writing; *rolling* closes it, so that it becomes visible at the
next completed checkpoint, and the next row starts a new one. Two policies, as in Flink:

* `RollingPolicy.on_checkpoint()` (Flink's `OnCheckpointRollingPolicy`, FileSink's default):
  every checkpoint rolls the part. Rows are visible one checkpoint after they are written, at the
  price of one file per subtask per checkpoint — 1,200 files for 10 minutes at 1 s checkpoints
  with two subtasks.
* `RollingPolicy(max_part_size=..., rollover_interval=..., inactivity_interval=...)` (Flink's
  `DefaultRollingPolicy`): a part stays open across checkpoints and rolls when it holds
  `max_part_size` bytes, is `rollover_interval` old, or received nothing for
  `inactivity_interval`. Fewer, larger files; a row becomes visible only at the first completed
  checkpoint after its part rolled — up to `rollover_interval` (plus a checkpoint interval) later.

Durations are seconds (int/float) or a `timedelta`, sizes bytes (int), as everywhere in the API.
The decisions are functions of a part's numbers and the time, so they are tested without files.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from streamsnap.errors import ConfigurationError
from streamsnap.time.durations import to_millis

MIB = 1024 * 1024


@dataclass(frozen=True)
class PartStats:
    """What a rolling decision looks at: a part's bytes and its times (epoch ms, wall clock, so
    they survive a restore: a restored part keeps its age)."""

    size: int
    created_ms: int
    last_write_ms: int


def _size(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(
            f"RollingPolicy.{name} is a number of bytes as an int (e.g. {name}=128 * 1024 * 1024 for "
            f"128 MiB), or None for no size limit; got {type(value).__name__} {value!r}")
    if value < 1:
        raise ConfigurationError(
            f"RollingPolicy.{name} must be at least 1 byte (e.g. {name}=128 * 1024 * 1024), or None "
            f"for no size limit; got {value!r}")
    return value


def _interval(value: object, name: str) -> int | None:
    if value is None:
        return None
    return to_millis(value, f"RollingPolicy.{name}", minimum=1)


class RollingPolicy:
    """When a FileSink part rolls (Flink's DefaultRollingPolicy / OnCheckpointRollingPolicy).

    max_part_size: bytes; a part that reached it rolls (checked after every written batch, so a
      part may exceed it by one batch). None: no size limit.
    rollover_interval: seconds or timedelta; a part this old rolls. None: no age limit.
    inactivity_interval: seconds or timedelta; a part that received no row for this long rolls.
      None: no inactivity limit.

    `RollingPolicy()` is Flink's default: 128 MiB, 60 s, 60 s. At least one limit must be set
    (a part that never rolls would never become visible). Time limits are checked at every
    written batch and every checkpoint — a rolled part becomes visible at the next completed
    checkpoint anyway, so checking more often would not show rows sooner.
    """

    __slots__ = ("max_part_size", "rollover_ms", "inactivity_ms", "roll_on_checkpoint")

    def __init__(self, max_part_size: int | None = 128 * MIB,
                 rollover_interval: int | float | timedelta | None = 60,
                 inactivity_interval: int | float | timedelta | None = 60):
        size = _size(max_part_size, "max_part_size")
        rollover = _interval(rollover_interval, "rollover_interval")
        inactivity = _interval(inactivity_interval, "inactivity_interval")
        if size is None and rollover is None and inactivity is None:
            raise ConfigurationError(
                "RollingPolicy needs at least one of max_part_size, rollover_interval, "
                "inactivity_interval: a part that never rolls never becomes visible. Set one (e.g. "
                "rollover_interval=60), or use RollingPolicy.on_checkpoint()")
        object.__setattr__(self, "max_part_size", size)
        object.__setattr__(self, "rollover_ms", rollover)
        object.__setattr__(self, "inactivity_ms", inactivity)
        object.__setattr__(self, "roll_on_checkpoint", False)

    @classmethod
    def on_checkpoint(cls) -> RollingPolicy:
        """Roll at every checkpoint (Flink's OnCheckpointRollingPolicy; FileSink's default)."""
        policy = cls.__new__(cls)
        for name, value in (("max_part_size", None), ("rollover_ms", None), ("inactivity_ms", None),
                            ("roll_on_checkpoint", True)):
            object.__setattr__(policy, name, value)
        return policy

    def __setattr__(self, name, value):
        raise AttributeError("RollingPolicy is immutable; build a new one")

    def __eq__(self, other) -> bool:
        return isinstance(other, RollingPolicy) and all(
            getattr(self, s) == getattr(other, s) for s in self.__slots__)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, s) for s in self.__slots__))

    def __reduce__(self):
        if self.roll_on_checkpoint:
            return (RollingPolicy.on_checkpoint, ())
        return (RollingPolicy, (self.max_part_size, _secs(self.rollover_ms), _secs(self.inactivity_ms)))

    def __repr__(self) -> str:
        if self.roll_on_checkpoint:
            return "RollingPolicy.on_checkpoint()"
        return (f"RollingPolicy(max_part_size={self.max_part_size}, rollover_interval="
                f"{_secs(self.rollover_ms)}, inactivity_interval={_secs(self.inactivity_ms)})")

    # ------------------------------------------------------------ decisions
    def roll_before_write(self, part: PartStats, now_ms: int) -> bool:
        """Roll the open part before a new batch goes in: it is too old, or was idle too long
        (the batch then starts a fresh part instead of reviving an idle one)."""
        return self._time_says_roll(part, now_ms)

    def roll_after_write(self, part: PartStats) -> bool:
        """Roll right after a batch went in: the part reached its size."""
        return self.max_part_size is not None and part.size >= self.max_part_size

    def roll_at_checkpoint(self, part: PartStats, now_ms: int) -> bool:
        """Roll at a checkpoint's pre-commit: always for on_checkpoint(), else by size or time."""
        return self.roll_on_checkpoint or self.roll_after_write(part) or self._time_says_roll(part, now_ms)

    def _time_says_roll(self, part: PartStats, now_ms: int) -> bool:
        if self.rollover_ms is not None and now_ms - part.created_ms >= self.rollover_ms:
            return True
        return self.inactivity_ms is not None and now_ms - part.last_write_ms >= self.inactivity_ms


def _secs(millis: int | None) -> int | float | None:
    if millis is None:
        return None
    return millis // 1000 if millis % 1000 == 0 else millis / 1000


def check_policy(value: object) -> RollingPolicy:
    """`FileSink(rolling=...)`: None means on_checkpoint(); anything else must be a RollingPolicy."""
    if value is None:
        return RollingPolicy.on_checkpoint()
    if not isinstance(value, RollingPolicy):
        raise ConfigurationError(
            f"FileSink.rolling must be a RollingPolicy, e.g. rolling=ss.sinks.RollingPolicy("
            f"max_part_size=128 * 1024 * 1024, rollover_interval=60, inactivity_interval=60), or None "
            f"to roll at every checkpoint; got {type(value).__name__} {value!r}")
    return value
