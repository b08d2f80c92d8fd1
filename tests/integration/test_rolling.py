"""Rolling aggregations of a keyed stream on Spark: reduce, sum, min, max, min_by, max_by."""

from __future__ import annotations

import pytest

import streamsnap as ss

pytestmark = pytest.mark.spark

N = 2000


def reading(i: int) -> dict:
    return {"sensor": i % 7, "temp": (i * 37) % 101 - 50, "i": i}


def test_rolling_aggregations_equal_a_plain_python_reference(spark):
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    keyed = env.from_source(ss.sources.Generator(reading, count=N), name="readings").key_by("sensor")
    keyed.reduce(lambda a, b: {"sensor": a["sensor"], "temp": a["temp"] + b["temp"], "i": b["i"]},
                 name="reduce").sink_to(ss.sinks.Collect(), name="reduced")
    for kind in ("sum", "min", "max", "min_by", "max_by"):
        getattr(keyed, kind)("temp", uid=kind).sink_to(ss.sinks.Collect(), name=kind)
    result = env.execute("rolling aggregations")

    rows = {k: [reading(i) for i in range(N) if i % 7 == k] for k in range(7)}
    last = {name: {} for name in ("reduced", "sum", "min", "max", "min_by", "max_by")}
    for name in last:
        out = result.rows(name)
        assert len(out) == N, name                          # one running result per input row
        for row in out:
            last[name].setdefault(row["sensor"], []).append(row)
    for k, mine in rows.items():
        temps = [r["temp"] for r in mine]
        # A key's results reach the sink in the order its operator made them: the last is final.
        assert last["sum"][k][-1]["temp"] == sum(temps)
        assert last["reduced"][k][-1]["temp"] == sum(temps)
        assert sorted(r["i"] for r in last["reduced"][k]) == [r["i"] for r in mine]
        assert last["min"][k][-1]["temp"] == min(temps) and last["max"][k][-1]["temp"] == max(temps)
        # sum/min/max keep the key's first row's other fields; min_by/max_by emit the extreme row
        for name in ("sum", "min", "max"):
            assert len({r["i"] for r in last[name][k]}) == 1, name
        assert last["min_by"][k][-1]["temp"] == min(temps) and last["max_by"][k][-1]["temp"] == max(temps)
        assert all(reading(r["i"]) == r for r in last["min_by"][k] + last["max_by"][k])
        assert all(a["temp"] >= b["temp"] for a, b in zip(last["min_by"][k], last["min_by"][k][1:]))
