"""State time-to-live (Flink's StateTtlConfig): keyed state entries that expire.

A descriptor with a `StateTtlConfig` gets a TTL state object (chosen once, at `get_state`, so
states without TTL keep their hot path untouched). Every entry carries the processing time
(wall clock, epoch ms, from the backend's injectable clock) of its last write — or of its last
read too, with `ON_READ_AND_WRITE`. An entry is expired once ``timestamp + ttl <= now``.
TTL is per entry: per key for Value and Reducing states, per element for List states, per user
key for Map states.

Expired entries are never returned (unless `RETURN_EXPIRED_IF_NOT_CLEANED_UP`, which returns
one that was not cleaned up yet, once), removed when an access finds them, and left out of
full snapshots (heap checkpoints, savepoints, RocksDB full checkpoints). Timestamps are part of
the checkpointed entry, so after a restore an entry still expires `ttl` after its last write.

Canonical format: a TTL state's serializer tag gets the suffix ``+ttl`` and each wire element
becomes ``[timestamp, element]`` (Value/Reducing: the value; List: each element; Map: each map
value). The tag carries the flag through every place that already carries tags (checkpoint
files, incremental bundles, the RocksDB state table), so restoring a TTL state as a non-TTL one
or the other way round fails with a clear error instead of misreading values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from typing import Any, ClassVar

from streamsnap.errors import ConfigurationError
from streamsnap.state.errors import StateError

TTL_TAG_SUFFIX = "+ttl"


def _coerce(enum: type[Enum], value: Any, field_name: str) -> Enum:
    """An enum member from itself or its name/value spelled any way (OnReadAndWrite,
    on_read_and_write, ON_READ_AND_WRITE)."""
    if isinstance(value, enum):
        return value
    if isinstance(value, str):
        wanted = value.replace("_", "").lower()
        for name, member in enum.__members__.items():
            if name.replace("_", "").lower() == wanted:
                return member
    allowed = ", ".join(f"{enum.__name__}.{m.name}" for m in enum)
    raise ConfigurationError(f"StateTtlConfig.{field_name} must be one of {allowed} (or its "
                             f"name as a str), got {value!r}")


class TtlUpdateType(Enum):
    """When an entry's timestamp is refreshed: on every write (create/update/add/put), or on
    reads too (a state that is only read then stays alive)."""

    ON_CREATE_AND_WRITE = "on_create_and_write"
    ON_READ_AND_WRITE = "on_read_and_write"
    # Flink's spellings, as aliases.
    OnCreateAndWrite = "on_create_and_write"
    OnReadAndWrite = "on_read_and_write"


class TtlStateVisibility(Enum):
    """Whether an expired entry that an access finds before it is cleaned up is returned
    (then removed) or treated as absent."""

    NEVER_RETURN_EXPIRED = "never_return_expired"
    RETURN_EXPIRED_IF_NOT_CLEANED_UP = "return_expired_if_not_cleaned_up"
    NeverReturnExpired = "never_return_expired"
    ReturnExpiredIfNotCleanedUp = "return_expired_if_not_cleaned_up"


@dataclass(frozen=True)
class StateTtlConfig:
    """Time-to-live of a keyed state's entries, in processing time.

    ttl: seconds (int/float) or a timedelta, > 0. update_type / state_visibility: the enums
    above or their names as str.
    """

    ttl: float | timedelta
    update_type: TtlUpdateType = TtlUpdateType.ON_CREATE_AND_WRITE
    state_visibility: TtlStateVisibility = TtlStateVisibility.NEVER_RETURN_EXPIRED
    ttl_ms: int = field(init=False, repr=False)

    UpdateType: ClassVar[type[TtlUpdateType]] = TtlUpdateType
    StateVisibility: ClassVar[type[TtlStateVisibility]] = TtlStateVisibility

    def __post_init__(self) -> None:
        # Imported here: streamsnap.time imports the state descriptors, which import this module.
        from streamsnap.time.durations import to_millis

        object.__setattr__(self, "ttl_ms", to_millis(self.ttl, "StateTtlConfig.ttl", minimum=1))
        object.__setattr__(self, "update_type",
                           _coerce(TtlUpdateType, self.update_type, "update_type"))
        object.__setattr__(self, "state_visibility",
                           _coerce(TtlStateVisibility, self.state_visibility, "state_visibility"))

    @property
    def update_on_read(self) -> bool:
        """Whether reading a value also refreshes its time to live (`update_type` ON_READ_AND_WRITE)."""
        return self.update_type is TtlUpdateType.ON_READ_AND_WRITE

    @property
    def return_expired(self) -> bool:
        """Whether an expired value not yet cleaned up is still returned (RETURN_EXPIRED_IF_NOT_CLEANED_UP)."""
        return self.state_visibility is TtlStateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP


def state_tag(serializer_tag: str, ttl: StateTtlConfig | None) -> str:
    """The tag a state's entries are written under: the serializer's, marked when TTL-wrapped."""
    return serializer_tag + TTL_TAG_SUFFIX if ttl is not None else serializer_tag


def is_ttl_tag(tag: str) -> bool:
    return tag.endswith(TTL_TAG_SUFFIX)


def tag_mismatch(name: str, operator_uid: str, stored: str, wanted: str) -> str:
    """The message for restoring state written under tag `stored` with a descriptor whose
    tag is `wanted`: names the TTL difference when that is what differs."""
    where = f"state '{name}' of operator '{operator_uid}'"
    if is_ttl_tag(stored) and not is_ttl_tag(wanted):
        return (f"{where} was checkpointed with a time-to-live (StateTtlConfig) but its "
                f"descriptor now has none; enable the TTL on the descriptor again, or rename the "
                f"state to start it empty")
    if is_ttl_tag(wanted) and not is_ttl_tag(stored):
        return (f"{where} was checkpointed without a time-to-live but its descriptor now has a "
                f"StateTtlConfig; TTL cannot be added to existing state: remove it, or rename "
                f"the state to start it empty")
    return (f"{where} was checkpointed with the {stored.removesuffix(TTL_TAG_SUFFIX)!r} "
            f"serializer but its descriptor now uses {wanted.removesuffix(TTL_TAG_SUFFIX)!r}")


def check_same_ttl(name: str, operator_uid: str, registered: Any, wanted: Any) -> None:
    """A state asked for again (same name) must have the TTL it was registered with."""
    if registered.ttl != wanted.ttl:
        raise StateError(
            f"state '{name}' of operator '{operator_uid}' is registered with ttl="
            f"{registered.ttl!r}, not {wanted.ttl!r}; use one descriptor (or equal TTL "
            f"configs) for a state name")


def clock_millis(clock: Any) -> int:
    """Processing time now, epoch milliseconds, from a `streamsnap.clock.Clock`."""
    return max(0, int(clock.wall() * 1000))


__all__ = ["StateTtlConfig", "TtlStateVisibility", "TtlUpdateType", "check_same_ttl", "clock_millis",
           "is_ttl_tag", "state_tag", "tag_mismatch"]
