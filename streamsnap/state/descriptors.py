"""State descriptors: the name, kind and serializer of a keyed state.

A descriptor is what a user function asks the backend for; the name identifies the state in
checkpoints, so it must stay the same across job versions to restore the state. Descriptors
are validated when built, so a typo fails at definition time rather than at the first record.

Every descriptor takes an optional keyword `ttl=StateTtlConfig(...)` (or, as in Flink,
`descriptor.enable_time_to_live(config)` before the descriptor is first used): its entries then
expire, see `streamsnap.state.ttl`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from streamsnap.errors import ConfigurationError
from streamsnap.state.serialization import DEFAULT_SERIALIZER, Serializer
from streamsnap.state.ttl import StateTtlConfig

VALUE = "value"
LIST = "list"
MAP = "map"
REDUCING = "reducing"
STATE_KINDS = (VALUE, LIST, MAP, REDUCING)


@dataclass(frozen=True)
class StateDescriptor:
    """Base of all keyed state descriptors; use one of the concrete subclasses."""

    name: str
    # Keyword-only so the subclasses' positional fields (reduce_function) keep their place.
    ttl: StateTtlConfig | None = field(default=None, kw_only=True)

    kind: ClassVar[str] = ""

    def _validate(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigurationError(
                f"{type(self).__name__}: the state name must be a str, got "
                f"{type(self.name).__name__} {self.name!r}")
        if not self.name.strip():
            raise ConfigurationError(f"{type(self).__name__}: the state name must not be empty")
        serializer = getattr(self, "serializer", None)
        if serializer is not None and not isinstance(serializer, Serializer):
            raise ConfigurationError(
                f"{type(self).__name__} '{self.name}': serializer must be a "
                f"streamsnap.state.Serializer (e.g. PickleSerializer()), got "
                f"{type(serializer).__name__}")
        self._check_ttl(self.ttl)

    def _check_ttl(self, ttl: Any) -> None:
        if ttl is not None and not isinstance(ttl, StateTtlConfig):
            raise ConfigurationError(
                f"{type(self).__name__} '{self.name}': ttl must be a StateTtlConfig (e.g. "
                f"ss.StateTtlConfig(3600)) or None, got {type(ttl).__name__} {ttl!r}")

    def enable_time_to_live(self, config: StateTtlConfig) -> "StateDescriptor":
        """Give this descriptor's entries a time-to-live (Flink's `enableTimeToLive`); returns
        the descriptor. Only before its first `get_state`: a registered state's entries are
        already stored with or without timestamps."""
        if config is None:
            raise ConfigurationError(
                f"{type(self).__name__} '{self.name}': enable_time_to_live needs a "
                f"StateTtlConfig, got None")
        self._check_ttl(config)
        if self.__dict__.get("_registered"):
            raise ConfigurationError(
                f"{type(self).__name__} '{self.name}': enable_time_to_live was called after the "
                f"descriptor was used in get_state; enable it before (in open(), before "
                f"get_state) or build the descriptor with ttl=StateTtlConfig(...)")
        object.__setattr__(self, "ttl", config)
        return self

    def _mark_registered(self) -> None:
        """Called by the backends at get_state: the TTL can no longer change."""
        if not self.__dict__.get("_registered"):
            object.__setattr__(self, "_registered", True)

    def __post_init__(self) -> None:
        self._validate()

    def get_serializer(self) -> Serializer:
        """The serializer in effect: the descriptor's own or msgpack."""
        serializer = getattr(self, "serializer", None)
        return serializer if serializer is not None else DEFAULT_SERIALIZER


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor):
    """A single value per key; `default` is returned while no value is set."""

    default: Any = None
    serializer: Serializer | None = None

    kind: ClassVar[str] = VALUE


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor):
    """A list of elements per key; `serializer` encodes each element."""

    serializer: Serializer | None = None

    kind: ClassVar[str] = LIST


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor):
    """A dict per key. Its keys are msgpack-encoded; `serializer` encodes its values."""

    serializer: Serializer | None = None

    kind: ClassVar[str] = MAP


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor):
    """One value per key, combined with each added value by `reduce_function(old, new)`."""

    reduce_function: Callable[[Any, Any], Any]
    serializer: Serializer | None = None

    kind: ClassVar[str] = REDUCING

    def _validate(self) -> None:
        super()._validate()
        if not callable(self.reduce_function):
            raise ConfigurationError(
                f"ReducingStateDescriptor '{self.name}': reduce_function must be callable "
                f"(old, new) -> combined, got {self.reduce_function!r}")
