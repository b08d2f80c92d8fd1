"""What other engines publish for Nexmark, per query, in events/s per core, with the sources:
the figures the Nexmark table (benchmarks/report.py) sets beside streamsnap's. None of them is
measured here; each is copied from its source as published, and the per-core figure derived
as the source derives it.

Flink: the Nexmark project's own results table, README.md of github.com/nexmark/nexmark
("Nexmark Benchmark Result", read at commit 0c6d9cf08c9c86485b062d6565cdc06024368558): Flink
1.13, 100 M events per query from its datagen source, parallelism 8 on 3 worker machines of 8
cores, exactly-once checkpoints every 3 minutes on RocksDB (incremental), mini-batch and
split-distinct optimizations on. Throughput/Cores = events / (Cores × Time), where Cores is the
CPU the workers actually used (a collector on each node), not the cores allotted. q6 has no row:
Flink's SQL cannot run it (the README links FLINK-19059).

Feldera: its repository's Nexmark results, benchmark/README.md of github.com/feldera/feldera
("Sample results", "16-core Nexmark Streaming Performance", Feldera column, mode stream, read at
commit 1eb7bb0a126737532cf03f5357a44c8142bfa456): mean events/s with 16 cores, divided by 16
here. The per-core figures issue 34 quotes (q0 ≈ 436 K, q5 ≈ 412 K, q7 ≈ 196 K, q9 ≈ 57 K, q16 ≈
51 K, q18–q20 ≈ 75–85 K) are this column / 16. q10 and q11 have no Feldera figure in that table
(the cells are empty; Feldera's blog of 2024-09, feldera.com/blog/nexmark-vs-flink, says it could
not run Flink's q10 and did not yet support session windows, q11).
"""

from __future__ import annotations

FLINK_SOURCE = ("github.com/nexmark/nexmark README.md, 'Nexmark Benchmark Result' (Flink 1.13, 100 M events, "
                "RocksDB incremental, checkpoints every 3 min), commit 0c6d9cf08c9c86485b062d6565cdc06024368558")
FELDERA_SOURCE = ("github.com/feldera/feldera benchmark/README.md, '16-core Nexmark Streaming Performance', "
                  "Feldera stream column / 16, commit 1eb7bb0a126737532cf03f5357a44c8142bfa456")

# query: (events, cores used, seconds, published throughput per core in events/s)
FLINK_RUNS = {
    "q0": (100_000_000, 8.45, 76.323, 155_020), "q1": (100_000_000, 8.26, 76.643, 157_940),
    "q2": (100_000_000, 8.23, 69.309, 175_210), "q3": (100_000_000, 8.59, 76.531, 152_120),
    "q4": (100_000_000, 12.85, 226.605, 34_330), "q5": (100_000_000, 10.8, 418.242, 22_140),
    "q7": (100_000_000, 14.21, 570.983, 12_330), "q8": (100_000_000, 9.42, 72.673, 146_140),
    "q9": (100_000_000, 16.11, 435.882, 14_240), "q10": (100_000_000, 8.09, 213.795, 57_810),
    "q11": (100_000_000, 10.6, 237.599, 39_700), "q12": (100_000_000, 13.69, 96.559, 75_670),
    "q13": (100_000_000, 8.24, 92.839, 130_730), "q14": (100_000_000, 8.28, 74.861, 161_230),
    "q15": (100_000_000, 8.73, 158.224, 72_420), "q16": (100_000_000, 11.51, 466.008, 18_650),
    "q17": (100_000_000, 9.24, 92.666, 116_800), "q18": (100_000_000, 12.49, 149.076, 53_700),
    "q19": (100_000_000, 21.38, 106.190, 44_040), "q20": (100_000_000, 17.27, 305.099, 18_980),
    "q21": (100_000_000, 8.33, 121.845, 98_490), "q22": (100_000_000, 8.25, 93.244, 129_960),
}
FLINK_MISSING = {"q6": "Flink's SQL cannot run q6 (FLINK-19059): no published figure"}

FELDERA_CORES = 16
# query: mean events/s of the 16-core streaming run
FELDERA_EVENTS_PER_SECOND = {
    "q0": 6_973_987, "q1": 6_595_871, "q2": 6_748_549, "q3": 6_608_075, "q4": 4_233_521, "q5": 6_589_786,
    "q6": 3_997_921, "q7": 3_136_763, "q8": 6_641_870, "q9": 910_680, "q12": 6_682_259, "q13": 3_675_255,
    "q14": 6_858_711, "q15": 3_539_322, "q16": 810_701, "q17": 3_870_269, "q18": 1_358_216, "q19": 1_201_216,
    "q20": 1_352_192, "q21": 6_634_820, "q22": 6_305_568,
}
FELDERA_MISSING = {"q10": "no Feldera figure published (its run left q10 out)",
                   "q11": "no Feldera figure published (no session windows in Feldera then)"}


def flink_per_core(query: str) -> float | None:
    """Flink's published events/s per core for `query` (events / (cores × seconds)), or None."""
    run = FLINK_RUNS.get(query)
    return None if run is None else run[0] / (run[1] * run[2])


def feldera_per_core(query: str) -> float | None:
    """Feldera's published 16-core events/s for `query`, per core, or None."""
    rate = FELDERA_EVENTS_PER_SECOND.get(query)
    return None if rate is None else rate / FELDERA_CORES


def missing(query: str) -> dict[str, str]:
    """Why an engine has no figure for `query`: {"Flink": why, "Feldera": why} for those without."""
    return {engine: why for engine, table in (("Flink", FLINK_MISSING), ("Feldera", FELDERA_MISSING))
            if (why := table.get(query))}
