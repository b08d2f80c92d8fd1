"""How the heap backend's snapshots see a key group as it was at the barrier while the mailbox
thread goes on writing it: each key group is frozen once, on its first write after the snapshot
or earlier by the snapshot's own thread, and only its value column is copied.

Why: a snapshot's synchronous part must not grow with the state, and the mailbox thread must
not pay for the state's size while the asynchronous part runs. Copying a key group's dict on
its first write after a snapshot (what the heap backend did before) touches every key object —
scattered over the heap, a cache miss each — and, once the snapshot is done, frees the copy
again: with 5 M keys and 1 % of them written per second, the mailbox thread spent 0.2-0.6 s
per checkpoint on copies and the asynchronous part 0.14 s on freeing them.

The protocol, per state table and key group (`GroupCapture`):

* the synchronous part registers a capture for every non-empty key group (or joins the one
  still pending from an earlier snapshot: no write happened in between, so its content is the
  same) — O(key groups), no entry is touched;
* a write to a key group first checks whether a capture is pending there (`kg in pending`: a
  lookup in a mostly empty dict) and, if so, freezes it before changing anything;
* the asynchronous part freezes every capture that nobody froze yet, then encodes the frozen
  columns while the dicts live on.

Freezing takes the values in dict order (`list(d.values())`: pointers, no key is read) and only
the keys the previous snapshot's encoding of the key group does not cover
(`encoded_keys.reusable_tail`): normally just the keys added since. Where no encoding covers
them (the first snapshot, or a key was removed since) it copies the dict, as before: the keys
must be read then anyway. A lock orders a freeze by
the snapshot thread against the mailbox thread's check, and a capture leaves `pending` only
after its frozen columns are set: a writer that finds no pending capture writes freely.

Mutable stored values (`_Cell`, `_ListEntry`, `_MapEntry`) are shared with the frozen columns;
their own epochs make writers copy them before an in-place change (see `keyed_state`).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

from streamsnap.state.encoded_keys import EncodedKeys, reusable_tail
from streamsnap.state.serialization import array_header, pack_array_body


@dataclass
class FrozenGroup:
    """One key group's entries as a snapshot saw them. Either `entries`, a dict of its own (a
    shallow copy, or a dict nobody writes), or — when the last encoding of the key group covers
    its first keys — `values` in dict order with the `known` encoding and the `added` keys."""

    entries: dict | None = None
    values: list | None = None
    known: EncodedKeys | None = None
    added: list | None = None
    last: Any = None           # the key object at the end (for the next snapshot's reuse)
    removals: int = -1         # the key group's removal count when frozen (-1: do not cache)

    def __len__(self) -> int:
        return len(self.entries) if self.entries is not None else len(self.values)

    def stored_values(self):
        """The stored values, in key order."""
        return self.entries.values() if self.entries is not None else self.values

    def new_keys(self):
        """The keys no earlier encoding covers (all of them for a dict)."""
        return self.entries if self.entries is not None else self.added or ()

    def encode_keys(self, cache: dict[int, EncodedKeys] | None, key_group: int) -> bytes:
        """msgpack array of the keys, as `pack_keys(keys)` writes it; with `cache` (the table's
        last encodings), records this one there for the next snapshot."""
        count = len(self)
        if self.entries is not None:
            # In chunks straight from the dict: each key object is read while in the CPU cache.
            body = pack_array_body(self.entries)
            last = next(reversed(self.entries)) if count else None
        else:
            body = pack_array_body(self.added, header=self.known.body) if self.added else self.known.body
            last = self.last
        if cache is not None and self.removals >= 0 and count:
            cache[key_group] = EncodedKeys(count, last, self.removals, body)
        return array_header(count) + body

    def pack_values(self, pack: Callable[[list], bytes]) -> bytes:
        """msgpack array of the stored values, each packed by `pack` (a list packer)."""
        if self.entries is not None:
            return pack_array_body(self.entries.values(), pack, array_header(len(self.entries)))
        return pack(self.values)   # one call: the values are in a list already

    def as_dict(self) -> dict:
        """The entries as a dict (TTL filtering); only whole key groups are frozen as dicts."""
        if self.entries is None:
            raise ValueError("a key group frozen as a value column has no key objects to pair")
        return self.entries


class GroupCapture:
    """A key group captured by one or more running snapshots, frozen at most once."""

    __slots__ = ("entries", "frozen", "holders")

    def __init__(self, entries: dict):
        self.entries = entries               # the live dict (unchanged while pending)
        self.frozen: FrozenGroup | None = None
        self.holders = 0                     # running snapshots that still need it


def freeze(entries: dict, cache: dict[int, EncodedKeys] | None, key_group: int,
           removals: int) -> FrozenGroup:
    """`entries` frozen (nobody may write it meanwhile): its value column when `cache` (the
    table's last encodings) covers its keys — no key is read but those added since — else a
    shallow copy (the first snapshot, or after a removal)."""
    if cache is not None:
        known = cache.get(key_group)
        if known is not None:
            tail = reusable_tail(known, removals, entries)
            if tail is not None:
                added, last = tail
                return FrozenGroup(values=list(entries.values()), known=known, added=added,
                                   last=last, removals=removals)
    return FrozenGroup(entries.copy(), removals=removals if cache is not None else -1)
