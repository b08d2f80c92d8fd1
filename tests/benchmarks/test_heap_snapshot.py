"""The heap snapshot benchmark measures every part on tiny sizes (that it works, never how fast)."""

from benchmarks.heap_snapshot import measure


def test_it_measures_each_part_of_a_heap_checkpoint_and_restore():
    r = measure(3_000, big=True, changed=0.05, snapshots=3)
    assert r["written_keys"] == 150
    assert r["sync"] >= 0 and r["async"] > 0 and r["first_async"] > 0 and r["restore"] > 0
