"""The heap backend's snapshots reuse the keys the previous snapshot encoded.

Why: with millions of keys, a full heap snapshot's time goes into reading every key object
(scattered over the heap: a cache miss per key) more than into msgpack itself, and in most
jobs the keys of a key group hardly change between two checkpoints while their values do.
Packing 5 M int keys (64 key groups) took 0.9-1.1 s on the 2-core machine, the small-int
values beside them 0.12-0.26 s; a whole snapshot's asynchronous part 1.7-2.7 s with every key
encoded and 0.14-0.36 s reusing them (a quarter of the values changed in between).

What makes reuse exact: a key group's dict keeps insertion order, an update keeps a key's
place, and new keys go to the end. So as long as no key was removed from the key group
(`StateTable.removals` unchanged), its first `count` keys are the ones encoded last time, in
the same order, and only the keys after them need encoding — found from the end of the dict
(`reversed`), without touching the others (`reusable_tail`, when a snapshot freezes the key
group: `streamsnap.state.copy_on_write`). As a guard, the key at position `count - 1` must
still be the very object encoded last; any doubt re-encodes all keys. The bytes written are
the same as a full encode's: the file format does not change.

Cost: the encoded keys stay in memory between snapshots (about the keys' share of a
snapshot file: 5-9 bytes per int key).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import Any


@dataclass(frozen=True)
class EncodedKeys:
    """One key group's keys as a snapshot encoded them."""

    count: int
    last: Any         # the key object at position count - 1
    removals: int     # the key group's removal count when its dict was captured
    body: bytes       # msgpack of the keys, without the array header


def reusable_tail(known: EncodedKeys, removals: int, entries: dict) -> tuple[list, Any] | None:
    """(keys added after `known`'s, oldest first; the last key) when `known` — the last
    encoding of this key group — still covers the first keys of `entries`, else None. Reads
    only the keys from the end back to `known.last`."""
    count = len(entries)
    if known.removals != removals or known.count > count or not count:
        return None
    newest = list(islice(reversed(entries), count - known.count + 1))
    if newest[-1] is not known.last:
        return None
    return newest[-2::-1], newest[0]   # oldest first, without the last known key
