"""streamsnap's result objects as plain values for the wire, and back.

A JobMaster running in the cluster hands its JobResult, checkpoint statistics and subtask
lists to clients in other processes. Those objects are frozen dataclasses and enums of a few
streamsnap modules; they travel as msgpack/JSON-able values tagged with their class, and only
classes of those modules are ever rebuilt — never pickle, never an arbitrary class.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
from collections.abc import Mapping

# The modules whose dataclasses and enums may be rebuilt from the wire.
ALLOWED_MODULES = frozenset({"streamsnap.api.result", "streamsnap.checkpoint.stats",
                             "streamsnap.checkpoint.reasons", "streamsnap.checkpoint.messages",
                             "streamsnap.graph.ids", "streamsnap.runtime.events", "streamsnap.cluster.exception_history"})


def encode(value):
    """`value` as nested dicts/lists of plain values (dataclasses and enums tagged)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__object__": _name(type(value)),
                "fields": {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, enum.Enum):
        return {"__enum__": _name(type(value)), "name": value.name}
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, Mapping):
        return {"__map__": [[encode(k), encode(v)] for k, v in value.items()]}
    return value


def decode(value):
    """The inverse of `encode`; ValueError for a class outside ALLOWED_MODULES."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "__object__" in value:
        cls = _allowed(value["__object__"])
        if not dataclasses.is_dataclass(cls):
            raise ValueError(f"{value['__object__']} is not a dataclass")
        return cls(**{k: decode(v) for k, v in value["fields"].items()})
    if "__enum__" in value:
        cls = _allowed(value["__enum__"])
        if not issubclass(cls, enum.Enum):
            raise ValueError(f"{value['__enum__']} is not an enum")
        return cls[value["name"]]
    if "__tuple__" in value:
        return tuple(decode(v) for v in value["__tuple__"])
    if "__map__" in value:
        return {_hashable(decode(k)): decode(v) for k, v in value["__map__"]}
    raise ValueError(f"not an encoded value: keys {sorted(value)}")


def _hashable(key):
    return tuple(key) if isinstance(key, list) else key


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _allowed(name: str) -> type:
    module, _, qualname = str(name).partition(":")
    if module not in ALLOWED_MODULES or not qualname or "." in qualname:
        raise ValueError(f"refusing to rebuild {name!r}: only streamsnap result classes travel")
    return getattr(importlib.import_module(module), qualname)


__all__ = ["encode", "decode"]
