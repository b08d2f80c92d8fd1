"""A/B of two builds on the README-way per-row benchmarks, run alternately on one machine.

`python -m benchmarks.ab_per_row OLD_DIR NEW_DIR [rounds] [parallelism]` starts one long-lived process per
build (its own Spark session, `PYTHONPATH` = that build's directory, so the driver and the
Spark workers import that build), warms each up, then per round runs on each build in turn
— the first build alternating between rounds — `per_row.run_w1_readme(spark, 2_000_000, 1000,
2)` and `per_row.run_word_count(spark, 400_000, 2)` (parallelism 2 unless given), and prints the median of each per build
and the new/old ratio of the medians. Both builds run on the same shared machine minutes
apart: compare the ratio, not the absolute figures.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

W1_ROWS, W1_KEYS, SENTENCES = 2_000_000, 1000, 400_000

# Runs in each build's process (`python -c`, so sys.path[0] is that build's directory and
# nothing of this checkout is imported there): one command per stdin line, one JSON line back.
SERVE = f"""
import json, sys
from benchmarks import per_row, workloads
from streamsnap.cluster.spark_session import embedded_session
import streamsnap
spark = embedded_session(16)
print(json.dumps({{"ready": streamsnap.__file__}}), flush=True)
for line in sys.stdin:
    what, scale, p = line.split()
    scale, p = float(scale), int(p)
    if what == "w1":
        out = per_row.run_w1_readme(spark, int({W1_ROWS} * scale), {W1_KEYS}, p)
    else:
        out = per_row.run_word_count(spark, int({SENTENCES} * scale), p)
    workloads.cleanup()
    print(json.dumps({{"per_second": out["per_second"]}}), flush=True)
"""


class Build:
    def __init__(self, directory: str, parallelism: int):
        self.parallelism = parallelism
        self.directory = os.path.abspath(directory)
        env = {**os.environ, "PYTHONPATH": self.directory}
        self.proc = subprocess.Popen([sys.executable, "-c", SERVE], cwd=self.directory, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = json.loads(self._line())
        if not ready["ready"].startswith(self.directory):
            raise RuntimeError(f"{directory}: imported streamsnap from {ready['ready']}")

    def _line(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the benchmark process of {self.directory} ended (exit {self.proc.wait()})")
        return line

    def run(self, what: str, scale: float = 1.0) -> float:
        self.proc.stdin.write(f"{what} {scale} {self.parallelism}\n")
        self.proc.stdin.flush()
        return json.loads(self._line())["per_second"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main(old: str, new: str, rounds: int = 3, parallelism: int = 2) -> dict:
    builds = {"old": Build(old, parallelism), "new": Build(new, parallelism)}
    try:
        for build in builds.values():  # warm workers and imports
            build.run("w1", 0.1)
            build.run("wc", 0.1)
        rates: dict = {name: {"w1": [], "wc": []} for name in builds}
        for r in range(rounds):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for name in order:
                for what in ("w1", "wc"):
                    rates[name][what].append(builds[name].run(what))
                print(f"round {r + 1} {name}: W1 {rates[name]['w1'][-1] / 1e6:.3f} M/s, "
                      f"word count {rates[name]['wc'][-1] / 1e6:.3f} M words/s", flush=True)
    finally:
        for build in builds.values():
            build.close()
    out = {name: {what: statistics.median(v) for what, v in series.items()} for name, series in rates.items()}
    for what, label in (("w1", f"W1 per-row README p={parallelism} (events/s)"),
                        ("wc", f"word count p={parallelism} (words/s)")):
        print(f"{label}: old {out['old'][what] / 1e6:.3f} M, new {out['new'][what] / 1e6:.3f} M, "
              f"new/old {out['new'][what] / out['old'][what]:.3f} (runs old {rates['old'][what]}, "
              f"new {rates['new'][what]})")
    return {"medians": out, "runs": rates}


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python -m benchmarks.ab_per_row OLD_DIR NEW_DIR [rounds] [parallelism]")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 3,
         int(sys.argv[4]) if len(sys.argv) > 4 else 2)
