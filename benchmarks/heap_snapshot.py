"""The heap backend's snapshot in one process, no job: the asynchronous part's seconds.

`python -m benchmarks.heap_snapshot [KEYS] [small|big]`: one subtask's half of 2 x KEYS keys
(key groups 0-63 of 128, as a subtask of a parallelism-2 job holds them) in one ValueState,
inserted in random order so the key and value objects lie scattered over the heap as in a
running job; five snapshots, a quarter of the values changed between two. Values are small ints
(`small`, cached by CPython: a count) or large ones (`big`: each a separate object, W1's running
sums). Prints the median of snapshots 2-5 (the first encodes every key: no earlier snapshot).
Compare two versions by running this under each one's PYTHONPATH, alternately, in one sitting.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time

import numpy as np

from streamsnap.state import (HashMapKeyedStateBackend, KeyGroupRange, ValueStateDescriptor,
                              assign_key_groups)


def measure(keys: int, big: bool, snapshots: int = 5) -> list[float]:
    """Seconds of the asynchronous part of each snapshot."""
    backend = HashMapKeyedStateBackend("op", 128, KeyGroupRange(0, 63))
    state = backend.get_state(ValueStateDescriptor("total", default=0))
    candidates = np.arange(2 * keys)
    groups = assign_key_groups(candidates, 128)
    mine = groups < 64
    pairs = list(zip(candidates[mine][:keys].tolist(), groups[mine][:keys].tolist()))
    random.Random(1).shuffle(pairs)
    step = 1_000_003 if big else 1
    for key, kg in pairs:
        backend.set_current_key(key, kg)
        state.update(key * step + 7 if big else 1)
    location = "file://" + tempfile.mkdtemp(prefix="ss-heap-snapshot-")
    seconds = []
    for checkpoint_id in range(1, snapshots + 1):
        snapshot = backend.snapshot(checkpoint_id, location)
        start = time.perf_counter()
        snapshot.run()
        seconds.append(time.perf_counter() - start)
        for key, kg in pairs[::4]:
            backend.set_current_key(key, kg)
            state.update(state.value() + step)
    return seconds


def main(argv: list[str]) -> None:
    keys = int(argv[0]) if argv else 5_000_000
    big = (argv[1] if len(argv) > 1 else "small") == "big"
    seconds = measure(keys, big)
    print(f"{keys:,} keys, {'large' if big else 'small'}-int values: asynchronous part median "
          f"{statistics.median(seconds[1:]):.3f} s (runs {' '.join(f'{s:.3f}' for s in seconds)})")


if __name__ == "__main__":
    main(sys.argv[1:])
