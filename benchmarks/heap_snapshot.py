"""The heap backend's checkpoint and restore in one process, no job: where a subtask's time goes.

`python -m benchmarks.heap_snapshot [KEYS] [small|big] [CHANGED]`: one subtask's half of
2 x KEYS keys (key groups 0-63 of 128, as a subtask of a parallelism-2 job holds them) in one
ValueState, inserted in random order so the key and value objects lie scattered over the heap
as in a running job. Then six snapshots; between taking one (the synchronous part) and running
its asynchronous part, a CHANGED share of the keys is written (1 % by default: issue 13's
steady state), as the mailbox thread does while the asynchronous part runs. Values are small
ints (`small`, cached by CPython: a count) or large ones (`big`: each a separate object, W1's
running sums). Last, the final snapshot is restored three times into fresh backends.

Printed, as medians over snapshots 2-6 (the first has no earlier encoding to reuse) in CPU
seconds of the thread doing the work (`time.thread_time`: the machine is shared, wall time is
not), with the task processes' allocator settings:
* sync: the synchronous part;
* writes during snapshot: the mailbox thread's extra cost for the writes made while the
  snapshot runs (the copy-on-write), against the same number of writes with none running;
* async: the asynchronous part (freeze what no write froze, encode, write the file);
* restore: a fresh backend restoring the last snapshot and asking for the state.
Compare two versions by running this under each one's PYTHONPATH, alternately, in one sitting.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time

import numpy as np

from streamsnap.runtime.allocator import tune_allocator
from streamsnap.state import (HashMapKeyedStateBackend, KeyGroupRange, ValueStateDescriptor,
                              assign_key_groups)

DESCRIPTOR = ValueStateDescriptor("total", default=0)


def _write(backend, state, pairs, step: int) -> float:
    """CPU seconds of one read-modify-write of each (key, key group) in `pairs`."""
    start = time.thread_time()
    for key, kg in pairs:
        backend.set_current_key(key, kg)
        state.update(state.value() + step)
    return time.thread_time() - start


def measure(keys: int, big: bool, changed: float = 0.01, snapshots: int = 6) -> dict:
    """Median CPU seconds of each part (see the module docstring)."""
    tune_allocator()
    backend = HashMapKeyedStateBackend("op", 128, KeyGroupRange(0, 63))
    state = backend.get_state(DESCRIPTOR)
    candidates = np.arange(2 * keys)
    groups = assign_key_groups(candidates, 128)
    mine = groups < 64
    pairs = list(zip(candidates[mine][:keys].tolist(), groups[mine][:keys].tolist()))
    rng = random.Random(1)
    rng.shuffle(pairs)
    step = 1_000_003 if big else 1
    for key, kg in pairs:
        backend.set_current_key(key, kg)
        state.update(key * step + 7 if big else 1)
    location = "file://" + tempfile.mkdtemp(prefix="ss-heap-snapshot-")
    count = max(1, int(changed * keys))
    plain = [_write(backend, state, rng.sample(pairs, count), step) for _ in range(3)]
    sync, during, async_, handle = [], [], [], None
    for checkpoint_id in range(1, snapshots + 1):
        written = rng.sample(pairs, count)
        start = time.thread_time()
        snapshot = backend.snapshot(checkpoint_id, location)
        sync.append(time.thread_time() - start)
        during.append(_write(backend, state, written, step) - statistics.median(plain))
        start = time.thread_time()
        handle = snapshot.run()
        async_.append(time.thread_time() - start)
    backend.dispose()
    restores = []
    for _ in range(3):
        fresh = HashMapKeyedStateBackend("op", 128, KeyGroupRange(0, 63))
        start = time.thread_time()
        fresh.restore([handle], location)
        fresh.get_state(DESCRIPTOR)
        restores.append(time.thread_time() - start)
        fresh.dispose()
    return {"sync": statistics.median(sync[1:]), "writes_during_snapshot": statistics.median(during[1:]),
            "async": statistics.median(async_[1:]), "first_async": async_[0],
            "restore": statistics.median(restores), "written_keys": count}


def main(argv: list[str]) -> None:
    keys = int(argv[0]) if argv else 5_000_000
    big = (argv[1] if len(argv) > 1 else "small") == "big"
    changed = float(argv[2]) if len(argv) > 2 else 0.01
    r = measure(keys, big, changed)
    print(f"{keys:,} keys, {'large' if big else 'small'}-int values, {r['written_keys']:,} written per "
          f"snapshot; CPU s, median: sync {r['sync']:.4f}, writes during snapshot +{r['writes_during_snapshot']:.3f}, "
          f"async {r['async']:.3f} (first {r['first_async']:.3f}), restore {r['restore']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
