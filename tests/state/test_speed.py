"""Speed sanity checks: printed (run with -s to see them), not asserted beyond gross bounds."""

import time

from streamsnap.state import (HashMapKeyedStateBackend, KeyGroupRange, ValueStateDescriptor,
                              assign_key_groups)


def test_value_state_hot_path_and_snapshot_sync_time(location):
    backend = HashMapKeyedStateBackend("op", 128, KeyGroupRange(0, 127))
    state = backend.get_state(ValueStateDescriptor("count", default=0))
    backend.set_current_key("k", 3)
    calls = 200_000
    start = time.perf_counter()
    for _ in range(calls):
        state.update(state.value() + 1)
    per_call = (time.perf_counter() - start) / calls
    assert state.value() == calls

    n = 1_000_000
    keys = list(range(n))
    groups = assign_key_groups(keys, 128).tolist()
    set_key = backend.set_current_key
    for key, kg in zip(keys, groups):
        set_key(key, kg)
        state.update(key)
    start = time.perf_counter()
    snapshot = backend.snapshot(1, location)
    sync = time.perf_counter() - start
    start = time.perf_counter()
    handle = snapshot.run()
    asynchronous = time.perf_counter() - start
    print(f"\nValueState value()+update(): {per_call * 1e9:.0f} ns per call; "
          f"snapshot of {backend.num_keys():,} keys: sync {sync * 1e3:.3f} ms, "
          f"async {asynchronous:.2f} s, {handle.file.size / 1e6:.1f} MB")
    assert sync < 0.5
