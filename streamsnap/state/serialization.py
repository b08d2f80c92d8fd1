"""How state values and keys become bytes in checkpoint files.

msgpack is the default: compact, fast, language-neutral, and decoding it cannot run code, so a
checkpoint directory that someone else can write to cannot take over the job on restore.
`PickleSerializer` handles any picklable value but unpickling runs arbitrary code: opt into it
per state, and only with checkpoint storage that only trusted parties can write.

Values keep their Python types through a checkpoint: a value that was a tuple before a failure
must not be a list after recovery, nor a datetime a string. What msgpack lacks is packed as
msgpack extension types whose payload is itself packed the same way (so they nest):

* tuple, set, frozenset: their elements (a bytearray is packed as bytes and comes back as bytes);
* datetime, date, time: their fields, and the time zone when there is one — a fixed offset
  (`datetime.timezone`, with its name if it has its own) or a `zoneinfo.ZoneInfo` by key, so
  naive stays naive and aware stays in its zone; timedelta: days, seconds, microseconds;
* Decimal: its string, which restores it exactly (precision, exponent, sign of zero, NaN);
* dataclass instances: the class's import path and every field; restoring imports that module
  and fills a new instance field by field without calling `__init__` (as unpickling does), so
  decoding still runs no code but the module's import. The class must be importable where
  the job runs: a class of `__main__` or one defined inside a function is not.

Subclasses of the msgpack types (IntEnum, OrderedDict, namedtuple) come back as their base
type, numpy scalars as Python numbers. Anything else — a plain class, a datetime subclass such
as pandas.Timestamp, a pytz time zone, an int beyond 64 bits — has no faithful encoding and
fails with an error naming the state, the type and the fix. Keys are packed as plain msgpack
arrays in bulk (fast) and decoded with arrays as tuples, so composite keys come back hashable.

A serializer is *native* when its encoded form is a msgpack object: the backends then embed
values in their msgpack files directly instead of nesting one byte string per value, which
keeps snapshots of many small values fast.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import pickle
import threading
import zoneinfo
from abc import ABC, abstractmethod
from decimal import Decimal
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any, ClassVar

import msgpack
import numpy as np

from streamsnap.state.errors import StateSerializationError

_MSGPACK_TYPES_HINT = ("None, bool, int (64-bit), float, str, bytes, list, tuple, dict, set, frozenset, "
                       "datetime, date, time, timedelta, Decimal, or dataclasses of those")


class Serializer(ABC):
    """Turns state values into bytes and back. Subclass it for a custom encoding.

    `tag` is written into checkpoint files and must match on restore, so a state cannot be
    silently decoded with another serializer than the one that wrote it.
    """

    native: ClassVar[bool] = False

    @property
    def tag(self) -> str:
        """The serializer's identity in checkpoints (the class's import path unless overridden); a restore checks it."""
        cls = type(self)
        return f"{cls.__module__}.{cls.__qualname__}"

    @abstractmethod
    def dumps(self, value: Any) -> bytes:
        """Encode one value."""

    @abstractmethod
    def loads(self, data: bytes) -> Any:
        """Decode one value written by `dumps`."""

    def check(self, value: Any, state_name: str) -> None:
        """Raise `StateSerializationError` early if `value` cannot be encoded (default: no check)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Serializer) and type(other) is type(self) and other.tag == self.tag

    def __hash__(self) -> int:
        return hash((type(self), self.tag))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class MsgpackSerializer(Serializer):
    """The default serializer: msgpack, safe to decode from untrusted storage."""

    native = True

    @property
    def tag(self) -> str:
        """"msgpack": what checkpoints record for this serializer."""
        return "msgpack"

    def dumps(self, value: Any) -> bytes:
        return pack_value(value)

    def loads(self, data: bytes) -> Any:
        return unpack_value(data)

    def check(self, value: Any, state_name: str) -> None:
        try:
            pack_value(value)
        except (TypeError, ValueError, OverflowError) as e:
            raise value_error(state_name, value, self) from e


class PickleSerializer(Serializer):
    """Any picklable value. Restoring unpickles: use only with trusted checkpoint storage."""

    def __init__(self, protocol: int = pickle.HIGHEST_PROTOCOL):
        self.protocol = protocol

    @property
    def tag(self) -> str:
        """"pickle": what checkpoints record for this serializer."""
        return "pickle"

    def dumps(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=self.protocol)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)


DEFAULT_SERIALIZER = MsgpackSerializer()


# ---------------------------------------------------------------------------------------------
# msgpack helpers shared by the backends

# msgpack extension type codes of the values msgpack lacks (the payload: a packed array).
TUPLE_EXT = 1
SET_EXT = 2
FROZENSET_EXT = 3
DATETIME_EXT = 4
DATE_EXT = 5
TIME_EXT = 6
TIMEDELTA_EXT = 7
DECIMAL_EXT = 8
DATACLASS_EXT = 9


def _ext(code: int, fields: list) -> msgpack.ExtType:
    return msgpack.ExtType(code, pack_value(fields))


def _zone(tz: dt.tzinfo | None) -> list | None:
    """A time zone as data: None, ["offset", seconds, microseconds, name or None], ["key", key]."""
    if tz is None:
        return None
    if type(tz) is dt.timezone:
        offset = tz.utcoffset(None)
        own_name = tz.tzname(None)
        name = None if own_name == dt.timezone(offset).tzname(None) else own_name
        return ["offset", offset.days * 86400 + offset.seconds, offset.microseconds, name]
    if type(tz) is zoneinfo.ZoneInfo and tz.key is not None:
        return ["key", tz.key]
    raise TypeError(f"the time zone {tz!r} ({_type_name(tz)}) has no faithful encoding: use "
                    f"datetime.timezone or zoneinfo.ZoneInfo (e.g. ZoneInfo('Europe/Berlin'))")


def _unzone(data: list | None) -> dt.tzinfo | None:
    if data is None:
        return None
    if data[0] == "offset":
        offset = dt.timedelta(seconds=data[1], microseconds=data[2])
        return dt.timezone(offset) if data[3] is None else dt.timezone(offset, data[3])
    return zoneinfo.ZoneInfo(data[1])


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _dataclass_path(cls: type) -> str:
    """`module:qualname` of a dataclass, if a restore elsewhere can import it (TypeError if not)."""
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        where = "the main script" if cls.__module__ == "__main__" else "a function"
        raise TypeError(f"the dataclass '{cls.__module__}.{cls.__qualname__}' is defined in {where}, so a "
                        f"restore cannot import it: define it at the top level of a module the job imports")
    return f"{cls.__module__}:{cls.__qualname__}"


def value_default(obj: Any) -> Any:
    """msgpack `default` for values: what msgpack lacks as extension types, subclasses as their base."""
    cls = type(obj)
    if isinstance(obj, tuple):
        return _ext(TUPLE_EXT, list(obj))
    if cls is dt.datetime:
        return _ext(DATETIME_EXT, [obj.year, obj.month, obj.day, obj.hour, obj.minute, obj.second,
                                   obj.microsecond, obj.fold, _zone(obj.tzinfo)])
    if cls is dt.date:
        return _ext(DATE_EXT, [obj.toordinal()])
    if cls is dt.time:
        return _ext(TIME_EXT, [obj.hour, obj.minute, obj.second, obj.microsecond, obj.fold, _zone(obj.tzinfo)])
    if cls is dt.timedelta:
        return _ext(TIMEDELTA_EXT, [obj.days, obj.seconds, obj.microseconds])
    if cls is Decimal:
        return _ext(DECIMAL_EXT, [str(obj)])
    if cls is set:
        return _ext(SET_EXT, list(obj))
    if cls is frozenset:
        return _ext(FROZENSET_EXT, list(obj))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        return _ext(DATACLASS_EXT, [_dataclass_path(cls), fields])
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, (bytes, memoryview)):
        return bytes(obj)
    if isinstance(obj, dict):
        return dict(obj)
    if isinstance(obj, list):
        return list(obj)
    if isinstance(obj, np.generic) and obj.dtype.kind in "biuf":
        return obj.item()
    raise TypeError(f"can not serialize {cls.__qualname__!r} object")


_pools = threading.local()     # per thread: idle value Packers (`pack_value`)


def pack_value(obj: Any, default: Callable[[Any], Any] = value_default) -> bytes:
    """msgpack of a state value, keeping tuples tuples (an extension type) on the way back.

    With the default hook it packs with one of this thread's idle Packers: making a Packer
    costs several times what packing a small value does, and an extension type's payload (a
    tuple's elements, a datetime's fields) is packed by a nested call, once per such value.
    A Packer is busy while it packs, so a nested call takes another one from the pool."""
    if default is not value_default:
        return msgpack.packb(obj, use_bin_type=True, strict_types=True, default=default)
    try:
        idle = _pools.idle
    except AttributeError:
        idle = _pools.idle = []
    packer = idle.pop() if idle else msgpack.Packer(use_bin_type=True, strict_types=True, default=value_default)
    data = packer.pack(obj)      # (a failed pack drops the packer: it is not put back)
    idle.append(packer)
    return data


def _restore_dataclass(path: str, fields: dict) -> Any:
    module, _, qualname = path.partition(":")
    try:
        cls = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError) as exc:
        raise StateSerializationError(
            f"state holds an instance of the dataclass '{module}.{qualname}', which cannot be imported here "
            f"({exc}): make that module importable where the job runs (ship it with the job's code)") from None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise StateSerializationError(f"state names '{module}.{qualname}' as a dataclass, but it is "
                                      f"{'a class' if isinstance(cls, type) else 'not a class'} without "
                                      f"@dataclass: was the class changed? Restore with the code that wrote it")
    instance = cls.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(instance, name, value)   # frozen dataclasses too; __init__ is not run
    return instance


def _unpack_datetime(fields: list) -> dt.datetime:
    *parts, fold, zone = fields
    return dt.datetime(*parts, tzinfo=_unzone(zone), fold=fold)


def _unpack_time(fields: list) -> dt.time:
    *parts, fold, zone = fields
    return dt.time(*parts, tzinfo=_unzone(zone), fold=fold)


_DECODERS: dict[int, Callable[[list], Any]] = {
    TUPLE_EXT: tuple,
    SET_EXT: set,
    FROZENSET_EXT: frozenset,
    DATETIME_EXT: _unpack_datetime,
    DATE_EXT: lambda fields: dt.date.fromordinal(fields[0]),
    TIME_EXT: _unpack_time,
    TIMEDELTA_EXT: lambda fields: dt.timedelta(*fields),
    DECIMAL_EXT: lambda fields: Decimal(fields[0]),
    DATACLASS_EXT: lambda fields: _restore_dataclass(*fields),
}


def _ext_hook(code: int, data: bytes) -> Any:
    decode = _DECODERS.get(code)
    return msgpack.ExtType(code, data) if decode is None else decode(unpack_value(data))


def unpack_value(data: bytes | memoryview) -> Any:
    """Decode `pack_value` output."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)


def _key_default(obj: Any) -> Any:
    if isinstance(obj, np.generic) and obj.dtype.kind in "biuf":
        return obj.item()     # equal and equally hashed, so lookups still find the key
    raise TypeError(f"can not serialize {type(obj).__qualname__!r} object")


def pack_keys(keys: list) -> bytes:
    """msgpack of a list of keys: composite keys become arrays (fast, no Python callback)."""
    return msgpack.packb(keys, use_bin_type=True, default=_key_default)


def array_header(length: int) -> bytes:
    """The msgpack header of an array of `length` elements (its elements follow it packed)."""
    if length < 16:
        return bytes((0x90 | length,))
    if length < 1 << 16:
        return b"\xdc" + length.to_bytes(2, "big")
    return b"\xdd" + length.to_bytes(4, "big")


def array_length(packed: bytes) -> int:
    """The element count of a msgpack array from its header (what `array_header` writes)."""
    first = packed[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F
    if first == 0xDC:
        return int.from_bytes(packed[1:3], "big")
    if first == 0xDD:
        return int.from_bytes(packed[1:5], "big")
    raise ValueError(f"not a msgpack array (first byte 0x{first:02x})")


PACK_CHUNK = 512


def pack_array_body(items: Iterable, pack: Callable[[list], bytes] = pack_keys,
                    header: bytes = b"") -> bytes:
    """`header` then the packed elements of `items` (no array header of their own), packed
    `PACK_CHUNK` at a time by `pack` (`pack_keys`, or `pack_value` with its default).

    Why chunks: in a large state, keys and values are objects scattered over the heap, and
    reading each costs a cache miss. `pack(list(items))` reads every object twice (the list
    takes a reference, the packer reads it), far apart in time; a short list is packed while
    its objects are still in the CPU cache. 5 M scattered int values: 0.72-1.1 s in chunks of
    512 against 1.1-1.9 s at once, in the same runs."""
    parts: list = [header]
    it = iter(items)
    while chunk := list(islice(it, PACK_CHUNK)):
        packed = pack(chunk)
        parts.append(memoryview(packed)[len(array_header(len(chunk))):])
    return b"".join(parts)


def unpack_keys(data: bytes | memoryview) -> tuple:
    """Decode `pack_keys` output; arrays come back as tuples, so keys are hashable."""
    return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=False)


def find_unencodable(value: Any, _depth: int = 0, keys: bool = False) -> str | None:
    """Name of the first part of `value` the state encoding cannot keep faithfully, or None if
    it can: a type name, or a sentence saying what is wrong and what to do.

    With `keys`, checks a key: only None, bool, int, float, str, bytes and tuples of those.
    """
    if _depth > 500:
        return "a value nested deeper than msgpack allows"
    if value is None or isinstance(value, (bool, float, str, bytes)):
        return None
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return None
    if isinstance(value, int):
        return None if -(1 << 63) <= value < (1 << 64) else "an int outside the 64-bit range"
    if keys:
        if isinstance(value, tuple):
            return _first_unencodable(value, _depth, keys=True)
        return _type_name(value)
    cls = type(value)
    if isinstance(value, (bytearray, memoryview)) or cls in (dt.date, dt.timedelta, Decimal):
        return None
    if isinstance(value, (list, tuple)) or cls in (set, frozenset):
        return _first_unencodable(value, _depth)
    if isinstance(value, dict):
        return _first_unencodable((part for item in value.items() for part in item), _depth)
    try:
        if cls in (dt.datetime, dt.time):
            _zone(value.tzinfo)
            return None
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _dataclass_path(cls)
            return _first_unencodable((getattr(value, f.name) for f in dataclasses.fields(value)), _depth)
    except TypeError as exc:
        return str(exc)
    if isinstance(value, (dt.date, dt.time, dt.timedelta)):
        base = next(b for b in (dt.datetime, dt.date, dt.time, dt.timedelta) if isinstance(value, b))
        return (f"a {_type_name(value)} (a subclass of {base.__name__}, which would come back as a plain "
                f"{base.__name__} and lose what the subclass adds): convert it, e.g. with .to_pydatetime()")
    return _type_name(value)


def _first_unencodable(items: Iterable, depth: int, keys: bool = False) -> str | None:
    for item in items:
        found = find_unencodable(item, depth + 1, keys=keys)
        if found:
            return found
    return None


def describe(culprit: str, what: str = "value") -> str:
    """'a value of type 'set'' for a type name; descriptions with spaces are kept as they are."""
    return culprit if " " in culprit else f"a {what} of type '{culprit}'"


def value_error(state_name: str, value: Any, serializer: Serializer) -> StateSerializationError:
    culprit = find_unencodable(value) or type(value).__qualname__
    return StateSerializationError(
        f"state '{state_name}': cannot serialize {describe(culprit)} with "
        f"{type(serializer).__name__}; store values it keeps faithfully ({_MSGPACK_TYPES_HINT}; "
        f"e.g. make your class a @dataclass in an importable module, or convert it to a dict) "
        f"or pass serializer=PickleSerializer() to the state's descriptor (pickle is only "
        f"safe with checkpoint storage that only trusted parties can write)", field=state_name)


def key_error(state_name: str, key: Any) -> StateSerializationError:
    culprit = find_unencodable(key, keys=True) or type(key).__qualname__
    return StateSerializationError(
        f"state '{state_name}': cannot serialize {describe(culprit, 'key')} as a key; keys "
        f"must be "
        f"None, bool, int (64-bit), float, str, bytes or tuples of those", field=state_name)
