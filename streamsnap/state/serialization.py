"""How state values and keys become bytes in checkpoint files.

msgpack is the default: compact, fast, language-neutral, and decoding it cannot run code, so a
checkpoint directory that someone else can write to cannot take over the job on restore.
Values msgpack cannot encode (sets, datetimes, user classes, ints beyond 64 bits) fail with
an error naming the state and the type. `PickleSerializer` handles any picklable value but
unpickling runs arbitrary code: opt into it per state, and only with checkpoint storage that
only trusted parties can write.

Values keep their Python types through a checkpoint as far as msgpack allows: tuples are
packed as a msgpack extension type so they come back as tuples (a value that was a tuple
before a failure must not be a list after recovery), subclasses (IntEnum, OrderedDict,
namedtuple) come back as their base type, numpy scalars as Python numbers. Keys are packed as
plain msgpack arrays in bulk (fast) and decoded with arrays as tuples, so composite keys come
back hashable.

A serializer is *native* when its encoded form is a msgpack object: the backends then embed
values in their msgpack files directly instead of nesting one byte string per value, which
keeps snapshots of many small values fast.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any, ClassVar

import msgpack
import numpy as np

from streamsnap.state.errors import StateSerializationError

_MSGPACK_TYPES_HINT = "None, bool, int (64-bit), float, str, bytes, list, tuple, dict"


class Serializer(ABC):
    """Turns state values into bytes and back. Subclass it for a custom encoding.

    `tag` is written into checkpoint files and must match on restore, so a state cannot be
    silently decoded with another serializer than the one that wrote it.
    """

    native: ClassVar[bool] = False

    @property
    def tag(self) -> str:
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
        return "pickle"

    def dumps(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=self.protocol)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)


DEFAULT_SERIALIZER = MsgpackSerializer()


# ---------------------------------------------------------------------------------------------
# msgpack helpers shared by the backends

TUPLE_EXT = 1   # msgpack extension type code of a tuple (its elements packed as an array)


def value_default(obj: Any) -> Any:
    """msgpack `default` for values: tuples as an extension type, subclasses as their base."""
    if isinstance(obj, tuple):
        return msgpack.ExtType(TUPLE_EXT, pack_value(list(obj)))
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
    raise TypeError(f"can not serialize {type(obj).__qualname__!r} object")


def pack_value(obj: Any, default: Callable[[Any], Any] = value_default) -> bytes:
    """msgpack of a state value, keeping tuples tuples (an extension type) on the way back."""
    return msgpack.packb(obj, use_bin_type=True, strict_types=True, default=default)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == TUPLE_EXT:
        return tuple(unpack_value(data))
    return msgpack.ExtType(code, data)


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
    """Name of the first part of `value` msgpack cannot encode, or None if it can.

    With `keys`, checks a key: only None, bool, int, float, str, bytes and tuples of those.
    """
    if _depth > 500:
        return "a value nested deeper than msgpack allows"
    if value is None or isinstance(value, (bool, float, str, bytes)):
        return None
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return None
    if keys:
        if isinstance(value, int):
            return None if -(1 << 63) <= value < (1 << 64) else "an int outside the 64-bit range"
        if isinstance(value, tuple):
            for item in value:
                found = find_unencodable(item, _depth + 1, keys=True)
                if found:
                    return found
            return None
        cls = type(value)
        return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    if isinstance(value, (bytearray, memoryview)):
        return None
    if isinstance(value, int):
        return None if -(1 << 63) <= value < (1 << 64) else "an int outside the 64-bit range"
    if isinstance(value, (list, tuple)):
        for item in value:
            found = find_unencodable(item, _depth + 1)
            if found:
                return found
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            found = find_unencodable(k, _depth + 1) or find_unencodable(v, _depth + 1)
            if found:
                return found
        return None
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def describe(culprit: str, what: str = "value") -> str:
    """'a value of type 'set'' for a type name; descriptions with spaces are kept as they are."""
    return culprit if " " in culprit else f"a {what} of type '{culprit}'"


def value_error(state_name: str, value: Any, serializer: Serializer) -> StateSerializationError:
    culprit = find_unencodable(value) or type(value).__qualname__
    return StateSerializationError(
        f"state '{state_name}': cannot serialize {describe(culprit)} with "
        f"{type(serializer).__name__}; store msgpack-compatible values ({_MSGPACK_TYPES_HINT}) "
        f"or pass serializer=PickleSerializer() to the state's descriptor (pickle is only "
        f"safe with checkpoint storage that only trusted parties can write)")


def key_error(state_name: str, key: Any) -> StateSerializationError:
    culprit = find_unencodable(key, keys=True) or type(key).__qualname__
    return StateSerializationError(
        f"state '{state_name}': cannot serialize {describe(culprit, 'key')} as a key; keys "
        f"must be "
        f"None, bool, int (64-bit), float, str, bytes or tuples of those")
