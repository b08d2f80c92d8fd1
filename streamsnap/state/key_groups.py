"""Keys → key groups → subtasks (Flink's KeyGroupRangeAssignment).

Keyed state is partitioned into `max_parallelism` key groups, the unit of rescaling: a key's
group never changes for the life of a job, and each subtask owns a contiguous range of groups,
so a rescaled job restores by reading whole key groups from the old subtasks' files.

That only works if every process computes the same group for the same key: the data plane
routes a record on one machine and the state for it lives on another, and a restored job may
run on another Python version. Python's built-in `hash` is salted per process, so keys are
hashed here with fixed functions:

* integers (bool, any Python int, any Arrow/numpy integer column): murmur3's fmix64 finalizer
  of the value's 64-bit two's-complement pattern (integers beyond 64 bits: xxh64 of their
  bytes) — cheap and vectorizable with numpy uint64 arithmetic;
* floats: integral values hash as the equal int (``1.0 == 1 == True`` must hash alike), the
  others as fmix64 of their IEEE-754 bits XOR a tag;
* str: xxh64 of the UTF-8 bytes; bytes: xxh64 with another seed, so ``b"a"`` and ``"a"`` differ;
* None (and nulls in Arrow arrays): a fixed constant;
* tuples / Arrow structs / several key columns: an order-sensitive combination of the
  element hashes.

`hash_key` (one value) and `hash_keys` (a column) agree element by element; tests pin a few
values so an accidental change of the function (which would orphan all existing state) fails.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from streamsnap.errors import ConfigurationError

UPPER_BOUND_MAX_PARALLELISM = 32768
DEFAULT_LOWER_BOUND_MAX_PARALLELISM = 128

_M64 = (1 << 64) - 1
_FMIX_C1 = 0xFF51AFD7ED558CCD
_FMIX_C2 = 0xC4CEB9FE1A85EC53
_U_C1 = np.uint64(_FMIX_C1)
_U_C2 = np.uint64(_FMIX_C2)
_U_33 = np.uint64(33)

# Fixed tags and seeds. Changing any of them changes every key's group: never do that.
NONE_HASH = 0x9E3779B97F4A7C15
_STR_SEED = 0x5354_5253            # "STRS"
_BYTES_SEED = 0x4259_5445          # "BYTE"
_BIGINT_SEED = 0x4249_4749         # "BIGI"
_FLOAT_TAG = 0x464C_4F41_5453_5321
_TUPLE_SEED = 0x5455_504C_4553_4544
_TUPLE_MUL = 0x100000001B3         # FNV-1a 64-bit prime

_xxh64 = xxhash.xxh64_intdigest
_pack_double = struct.Struct("<d").pack
_unpack_u64 = struct.Struct("<Q").unpack


# ---------------------------------------------------------------------------------------------
# scalar hashing


def _fmix64(k: int) -> int:
    k ^= k >> 33
    k = (k * _FMIX_C1) & _M64
    k ^= k >> 33
    k = (k * _FMIX_C2) & _M64
    return k ^ (k >> 33)


def _hash_int(v: int) -> int:
    if -(1 << 63) <= v < (1 << 64):
        return _fmix64(v & _M64)
    length = (v.bit_length() + 8) // 8
    return _xxh64(v.to_bytes(length, "little", signed=True), _BIGINT_SEED)


def _hash_float(f: float) -> int:
    if f.is_integer():          # False for nan and inf
        return _hash_int(int(f))
    return _fmix64(_unpack_u64(_pack_double(f))[0] ^ _FLOAT_TAG)


def _combine(hashes: Sequence[int]) -> int:
    acc = _fmix64((_TUPLE_SEED + len(hashes)) & _M64)
    for h in hashes:
        acc = _fmix64(((acc * _TUPLE_MUL) & _M64) ^ h)
    return acc


def hash_key(key: Any) -> int:
    """Deterministic unsigned 64-bit hash of one key, equal across processes and machines.

    Supported: None, bool, int, float, str, bytes/bytearray/memoryview, numpy scalars of those,
    and tuples of supported values (composite keys). Equal values hash equally.
    """
    t = key.__class__
    if t is int or t is bool:
        return _hash_int(key)
    if t is str:
        return _xxh64(key.encode("utf-8", "surrogatepass"), _STR_SEED)
    if key is None:
        return NONE_HASH
    if t is float:
        return _hash_float(key)
    if t is tuple:
        return _combine([hash_key(k) for k in key])
    if t is bytes:
        return _xxh64(key, _BYTES_SEED)
    # Subclasses and foreign scalar types (slower path).
    if isinstance(key, (bool, np.bool_)):
        return _hash_int(int(key))
    if isinstance(key, (int, np.integer)):
        return _hash_int(int(key))
    if isinstance(key, (float, np.floating)):
        return _hash_float(float(key))
    if isinstance(key, str):
        return _xxh64(str(key).encode("utf-8", "surrogatepass"), _STR_SEED)
    if isinstance(key, (bytes, bytearray, memoryview, np.bytes_)):
        return _xxh64(bytes(key), _BYTES_SEED)
    if isinstance(key, tuple):
        return _combine([hash_key(k) for k in key])
    if isinstance(key, pa.Scalar):
        return hash_key(_struct_as_tuple(key.as_py()) if pa.types.is_struct(key.type) else key.as_py())
    raise TypeError(
        f"cannot hash a key of type {type(key).__name__!r}: keys must be None, bool, int, float, "
        f"str, bytes or tuples of those (use a tuple, not a list, for composite keys)")


def _struct_as_tuple(value: dict | None) -> tuple | None:
    return None if value is None else tuple(value.values())


# ---------------------------------------------------------------------------------------------
# vectorized hashing


def _fmix64_array(x: np.ndarray) -> np.ndarray:
    """fmix64 over a uint64 array (returns a new array; the input is not modified)."""
    h = x ^ (x >> _U_33)
    h *= _U_C1
    h ^= h >> _U_33
    h *= _U_C2
    h ^= h >> _U_33
    return h


def _hash_int_array(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind == "u":
        return _fmix64_array(values.astype(np.uint64, copy=False))
    return _fmix64_array(values.astype(np.int64, copy=False).view(np.uint64))


def _hash_float_array(values: np.ndarray) -> np.ndarray:
    x = values.astype(np.float64, copy=False)
    out = np.empty(len(x), dtype=np.uint64)
    with np.errstate(invalid="ignore"):
        integral = np.isfinite(x) & (np.floor(x) == x)
    fractional = ~integral
    if fractional.any():
        bits = x[fractional].view(np.uint64) ^ np.uint64(_FLOAT_TAG)
        out[fractional] = _fmix64_array(bits)
    if integral.any():
        signed = integral & (x >= -(2.0 ** 63)) & (x < 2.0 ** 63)
        unsigned = integral & (x >= 2.0 ** 63) & (x < 2.0 ** 64)
        huge = integral & ~(signed | unsigned)
        if signed.any():
            out[signed] = _fmix64_array(x[signed].astype(np.int64).view(np.uint64))
        if unsigned.any():
            out[unsigned] = _fmix64_array(x[unsigned].astype(np.uint64))
        if huge.any():
            out[huge] = [_hash_int(int(v)) for v in x[huge].tolist()]
    return out


def _hash_objects(values: Sequence[Any]) -> np.ndarray:
    return np.fromiter((hash_key(v) for v in values), dtype=np.uint64, count=len(values))


def _hash_strings(values: Sequence[str | None]) -> np.ndarray:
    seed, h = _STR_SEED, _xxh64
    return np.fromiter(
        (NONE_HASH if v is None else h(v.encode("utf-8", "surrogatepass"), seed) for v in values),
        dtype=np.uint64, count=len(values))


def _hash_binaries(values: Sequence[bytes | None]) -> np.ndarray:
    seed, h = _BYTES_SEED, _xxh64
    return np.fromiter((NONE_HASH if v is None else h(v, seed) for v in values),
                       dtype=np.uint64, count=len(values))


def _combine_arrays(columns: Sequence[np.ndarray], n: int) -> np.ndarray:
    acc = np.full(n, _fmix64((_TUPLE_SEED + len(columns)) & _M64), dtype=np.uint64)
    mul = np.uint64(_TUPLE_MUL)
    for col in columns:
        acc *= mul
        acc ^= col
        acc = _fmix64_array(acc)
    return acc


def key_kind(t: pa.DataType) -> str | None:
    """How a key column of Arrow type `t` hashes: "null", "dictionary", "integer" (booleans
    too), "floating", "string", "binary" or "struct"; None for a type keys cannot be."""
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_dictionary(t):
        return "dictionary"
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return "integer"
    if pa.types.is_floating(t):
        return "floating"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or _is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) \
            or _is_binary_view(t):
        return "binary"
    if pa.types.is_struct(t):
        return "struct"
    return None


def hashable_type(t: pa.DataType) -> bool:
    """Whether a key column of Arrow type `t` can be hashed, its dictionary values and struct
    fields included."""
    kind = key_kind(t)
    if kind == "dictionary":
        return hashable_type(t.value_type)
    if kind == "struct":
        return all(hashable_type(t.field(i).type) for i in range(t.num_fields))
    return kind is not None


def _hash_arrow(arr: pa.Array) -> np.ndarray:
    t = arr.type
    n = len(arr)
    kind = key_kind(t)
    if kind == "null":
        return np.full(n, NONE_HASH, dtype=np.uint64)
    if kind == "dictionary":
        dictionary_hashes = _hash_arrow(arr.dictionary)
        indices = arr.indices
        out = dictionary_hashes[pc.fill_null(indices, 0).to_numpy(zero_copy_only=False)] \
            if len(dictionary_hashes) else np.full(n, NONE_HASH, dtype=np.uint64)
        return _apply_nulls(out, indices)
    if kind == "integer":
        filled = arr if arr.null_count == 0 else pc.fill_null(arr, False if pa.types.is_boolean(t) else 0)
        values = filled.to_numpy(zero_copy_only=False)
        if values.dtype == np.bool_:
            values = values.astype(np.int64)
        return _apply_nulls(_hash_int_array(values), arr)
    if kind == "floating":
        values = pc.fill_null(arr, 0.0).to_numpy(zero_copy_only=False)
        return _apply_nulls(_hash_float_array(values), arr)
    if kind == "string":
        return _hash_distinct(arr, _hash_strings)
    if kind == "binary":
        return _hash_distinct(arr, _hash_binaries)
    if kind == "struct":
        fields = arr.flatten()
        out = _combine_arrays([_hash_arrow(f) for f in fields], n)
        return _apply_nulls(out, arr)
    raise TypeError(
        f"cannot hash a key column of Arrow type {t}: supported are integer, boolean, floating, "
        f"string, binary, dictionary, null and struct columns; cast the column (for instance "
        f"timestamps to int64) before keying by it")


def _hash_distinct(arr: pa.Array, hash_values) -> np.ndarray:
    """Strings and bytes hash in Python, one value at a time: hash each distinct value once
    (a key column repeats its keys: words, user ids) when the column is long enough to pay for
    the dictionary encoding."""
    if len(arr) < 64 or pc.count_distinct(arr.slice(0, 256)).as_py() * 2 > min(len(arr), 256):
        return hash_values(arr.to_pylist())     # short, or mostly distinct: nothing to share
    encoded = pc.dictionary_encode(arr)
    if len(encoded.dictionary) * 2 > len(arr):
        return hash_values(arr.to_pylist())
    hashes = hash_values(encoded.dictionary.to_pylist())
    indices = encoded.indices
    out = hashes[pc.fill_null(indices, 0).to_numpy(zero_copy_only=False)] if len(hashes) \
        else np.full(len(arr), NONE_HASH, dtype=np.uint64)
    return _apply_nulls(out, indices)


def _is_string_view(t: pa.DataType) -> bool:
    check = getattr(pa.types, "is_string_view", None)
    return bool(check and check(t))


def _is_binary_view(t: pa.DataType) -> bool:
    check = getattr(pa.types, "is_binary_view", None)
    return bool(check and check(t))


def _apply_nulls(out: np.ndarray, arr: pa.Array) -> np.ndarray:
    if arr.null_count:
        out[arr.is_null().to_numpy(zero_copy_only=False)] = NONE_HASH
    return out


def _hash_numpy(values: np.ndarray) -> np.ndarray:
    if values.ndim != 1:
        raise ValueError(
            f"hash_keys expects a one-dimensional array, got shape {values.shape}; "
            f"use hash_keys_columns for composite keys")
    kind = values.dtype.kind
    if kind in "iu":
        return _hash_int_array(values)
    if kind == "b":
        return _hash_int_array(values.astype(np.int64))
    if kind == "f":
        return _hash_float_array(values)
    if kind in "USO":
        return _hash_objects(values.tolist())
    raise TypeError(f"cannot hash a key array of numpy dtype {values.dtype}")


def _hash_list(values: Sequence[Any]) -> np.ndarray:
    types = set(map(type, values))
    if types and types <= {int, bool}:
        try:
            return _hash_int_array(np.array(values, dtype=np.int64))
        except OverflowError:
            return _hash_objects(values)      # some ints exceed int64: exact scalar path
    if types == {float}:
        return _hash_float_array(np.array(values, dtype=np.float64))
    if types == {str}:
        return _hash_strings(values)
    return _hash_objects(values)


def hash_keys(values: pa.Array | pa.ChunkedArray | np.ndarray | Sequence[Any]) -> np.ndarray:
    """Vectorized `hash_key`: a uint64 array with ``out[i] == hash_key(values[i])``.

    Accepts a pyarrow Array/ChunkedArray (struct elements hash like tuples of their fields,
    nulls like None), a one-dimensional numpy array or a Python sequence.
    """
    if isinstance(values, pa.ChunkedArray):
        if values.num_chunks == 0:
            return np.empty(0, dtype=np.uint64)
        return np.concatenate([_hash_arrow(c) for c in values.chunks])
    if isinstance(values, pa.Array):
        return _hash_arrow(values)
    if isinstance(values, np.ndarray):
        return _hash_numpy(values)
    if not isinstance(values, list):
        values = list(values)
    return _hash_list(values)


def hash_keys_columns(columns: Sequence[pa.Array | pa.ChunkedArray | np.ndarray | Sequence[Any]]
                      ) -> np.ndarray:
    """Hashes of composite keys given as columns: ``out[i] == hash_key(tuple(c[i] for c in columns))``."""
    if not columns:
        raise ValueError("hash_keys_columns needs at least one key column")
    hashed = [hash_keys(c) for c in columns]
    n = len(hashed[0])
    if any(len(h) != n for h in hashed):
        raise ValueError(f"key columns have different lengths: {[len(h) for h in hashed]}")
    return _combine_arrays(hashed, n)


# ---------------------------------------------------------------------------------------------
# key groups


def check_max_parallelism(max_parallelism: int) -> None:
    if isinstance(max_parallelism, bool) or not isinstance(max_parallelism, int) \
            or not 1 <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise ConfigurationError(
            f"max_parallelism must be an int in [1, {UPPER_BOUND_MAX_PARALLELISM}], "
            f"got {max_parallelism!r}")


def check_parallelism(max_parallelism: int, parallelism: int) -> None:
    check_max_parallelism(max_parallelism)
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) \
            or not 1 <= parallelism <= max_parallelism:
        raise ConfigurationError(
            f"parallelism must be an int in [1, max_parallelism={max_parallelism}], got "
            f"{parallelism!r}; raise max_parallelism (fixed for the life of the job's state) "
            f"or lower the parallelism")


def default_max_parallelism(parallelism: int) -> int:
    """Flink's default: 1.5 × parallelism rounded up to a power of two, within [128, 32768]."""
    target = parallelism + parallelism // 2
    power = 1 << max(0, (target - 1).bit_length())
    return min(max(power, DEFAULT_LOWER_BOUND_MAX_PARALLELISM), UPPER_BOUND_MAX_PARALLELISM)


def assign_to_key_group(key: Any, max_parallelism: int) -> int:
    """The key group of one key."""
    check_max_parallelism(max_parallelism)
    return hash_key(key) % max_parallelism


def assign_key_groups(values: pa.Array | pa.ChunkedArray | np.ndarray | Sequence[Any],
                      max_parallelism: int) -> np.ndarray:
    """Key groups (int32 array) of a column of keys."""
    check_max_parallelism(max_parallelism)
    hashes = hash_keys(values)
    if max_parallelism & (max_parallelism - 1) == 0:  # a power of two (the default): mask, no division
        hashes &= np.uint64(max_parallelism - 1)
    else:
        hashes %= np.uint64(max_parallelism)
    return hashes.astype(np.int32)


@dataclass(frozen=True)
class KeyGroupRange:
    """The key groups ``start..end`` (both inclusive) a subtask owns; ``EMPTY`` is (0, -1)."""

    start: int
    end: int

    EMPTY: ClassVar["KeyGroupRange"]

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start - 1:
            raise ValueError(f"invalid key group range [{self.start}, {self.end}]")

    def __len__(self) -> int:
        return self.end - self.start + 1

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, (int, np.integer)) and self.start <= key_group <= self.end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    @property
    def is_empty(self) -> bool:
        return self.end < self.start

    def intersection(self, other: "KeyGroupRange") -> "KeyGroupRange":
        start, end = max(self.start, other.start), min(self.end, other.end)
        return KeyGroupRange(start, end) if start <= end else KeyGroupRange.EMPTY

    def overlaps(self, other: "KeyGroupRange") -> bool:
        return max(self.start, other.start) <= min(self.end, other.end)


KeyGroupRange.EMPTY = KeyGroupRange(0, -1)


def key_group_range_for_subtask(max_parallelism: int, parallelism: int, index: int) -> KeyGroupRange:
    """The contiguous key groups subtask `index` of `parallelism` owns."""
    check_parallelism(max_parallelism, parallelism)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < parallelism:
        raise ValueError(f"subtask index must be in [0, {parallelism}), got {index!r}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def subtask_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The subtask index that owns `key_group` (inverse of `key_group_range_for_subtask`)."""
    check_parallelism(max_parallelism, parallelism)
    if not 0 <= key_group < max_parallelism:
        raise ValueError(f"key group must be in [0, {max_parallelism}), got {key_group!r}")
    return key_group * parallelism // max_parallelism


def subtasks_for_key_groups(key_groups: np.ndarray, max_parallelism: int,
                            parallelism: int) -> np.ndarray:
    """Vectorized `subtask_for_key_group` (int32 array)."""
    check_parallelism(max_parallelism, parallelism)
    kg = np.asarray(key_groups).astype(np.int64, copy=False)
    if len(kg) and (kg.min() < 0 or kg.max() >= max_parallelism):
        raise ValueError(f"key groups must be in [0, {max_parallelism})")
    return (kg * parallelism // max_parallelism).astype(np.int32)
