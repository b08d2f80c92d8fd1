"""The local-restore benchmark runs on both backends and restores from where it says (tiny sizes:
that it works, never how fast)."""

import pytest

from benchmarks.local_restore import restore_times


@pytest.mark.parametrize("kind", ["hashmap", "rocksdb"])
def test_it_restores_from_local_copies_then_from_storage(kind):
    r = restore_times(kind, 2_000, runs=1)
    local, remote = r["read"]["local"], r["read"]["remote"]
    assert local["local_files"] >= 1 and local["remote_files"] == 0
    assert remote["remote_files"] == local["local_files"] and remote["local_files"] == 0
    assert remote["remote_bytes"] == local["local_bytes"] > 0
    assert r["local_s"] > 0 and r["remote_s"] > 0
