"""The object-store checkpoint benchmark runs on both sides and measures incremental checkpoints
(tiny sizes: that it works, never how fast)."""

from benchmarks.checkpoint_storage import run


def test_it_times_incremental_checkpoints_on_s3_and_the_local_disk(s3_server):
    r = run(3_000, rounds=2, changed=0.05, server=s3_server)
    for side in ("local", "s3"):
        assert 0 < r[side]["incremental_bytes_p50"] < r[side]["first_bytes"], r
        assert r[side]["p50_s"] > 0 and r[side]["first_s"] > 0
    assert r["ratio_p50"] > 0 and r["ratio_first"] > 0
