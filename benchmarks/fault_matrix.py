"""The fault matrix of issue 33, run N times with counts: each fault scenario's test (the `faults`
pytest marker: hosts lost, partitions host↔host and host↔driver, checkpoints on S3 with a slot
killed, a full checkpoint disk, fencing, liveness, object-store storage) run --runs times, one
pytest process a round (the Spark cluster and S3 server start once a round), and tallied per
scenario: runs, exact (the test passed — each asserts exact output and restarts == faults),
failed, skipped, restarts against faults injected, and — where the test records when its fault
struck (tests/integration/fault_figures.py) — the time the job took to notice the fault and to
put out its first row after it (median and max over the runs).

    python -m benchmarks.fault_matrix [--runs 10] [--only host,partition,s3,enospc,...]
                                      [--json PATH] [--keep DIR]

A round's tests run one after another (`-n 0`), so each fault's timings are its own (side by
side they also share the machine's two cores). Each round's junit XML and pytest output stay in
--keep (default: a temporary directory, its path printed). Needs root and nft for the partitions and the tmpfs; without them those tests
are counted as skipped, not run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "FAULT-FIGURES"     # tests/integration/fault_figures.MARKER

# scenario: (test file, test function or None for every faults test of the file)
SCENARIOS = {
    "partition": ("tests/integration/test_hosts.py",
                  "test_a_partition_between_two_hosts_is_noticed_failed_over_and_healed_exactly_once"),
    "driver-partition": ("tests/integration/test_hosts.py",
                         "test_a_partition_between_a_host_and_the_driver_is_noticed_and_failed_over_exactly_once"),
    "host": ("tests/integration/test_hosts.py",
             "test_a_lost_host_is_recovered_from_on_the_hosts_left_exactly_once"),
    "s3": ("tests/integration/test_storage_faults.py",
           "test_checkpoints_and_a_savepoint_on_s3_with_a_subtask_killed"),
    "enospc": ("tests/integration/test_storage_faults.py",
               "test_a_full_checkpoint_disk_fails_checkpoints_not_the_output"),
    "fencing": ("tests/checkpoint/test_fencing.py", None),
    "liveness": ("tests/network/test_liveness.py", None),
    "object-store": ("tests/checkpoint/test_object_store.py", None),
}


@dataclass
class Tally:
    runs: int = 0           # rounds in which the scenario's tests ran (not all skipped)
    exact: int = 0          # ... and all passed
    failed: int = 0
    skipped: int = 0
    faults: int = 0
    restarts: list = field(default_factory=list)        # per recorded run
    detection: list = field(default_factory=list)       # seconds from the fault to noticed
    first_output: list = field(default_factory=list)    # seconds from the fault to the first row after
    failures: list = field(default_factory=list)        # (round, test, message)


def scenario_of(classname: str, name: str, selected: dict) -> str | None:
    module_path = classname.replace(".", "/") + ".py"
    test = name.split("[", 1)[0]
    for scenario, (path, function) in selected.items():
        if path == module_path and (function is None or function == test):
            return scenario
    return None


def node_ids(selected: dict) -> list[str]:
    return [path if function is None else f"{path}::{function}" for path, function in selected.values()]


def run_round(number: int, selected: dict, directory: str) -> tuple[str, str]:
    """One pytest process over the selected scenarios; returns (junit XML path, output path)."""
    xml_path = os.path.join(directory, f"round-{number}.xml")
    log_path = os.path.join(directory, f"round-{number}.log")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(log_path, "w") as log:
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "faults", "-n", "0",
                        f"--junitxml={xml_path}", "-o", "junit_logging=system-out",
                        "-o", "junit_log_passing_tests=true", *node_ids(selected)],
                       cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if not os.path.exists(xml_path):
        raise RuntimeError(f"round {number}: pytest wrote no junit XML; its output is in {log_path}")
    return xml_path, log_path


def tally_round(number: int, xml_path: str, selected: dict, tallies: dict[str, Tally]) -> None:
    outcomes: dict[str, set] = {}
    for case in ElementTree.parse(xml_path).iter("testcase"):
        scenario = scenario_of(case.get("classname", ""), case.get("name", ""), selected)
        if scenario is None:
            continue
        tally = tallies[scenario]
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            outcome = "failed"
            tally.failures.append((number, case.get("name"), (problem.get("message") or "").split("\n")[0][:300]))
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        outcomes.setdefault(scenario, set()).add(outcome)
        out = case.findtext("system-out") or ""
        for line in out.splitlines():
            if line.startswith(MARKER):
                figures = json.loads(line[len(MARKER):])
                tally.faults += figures["faults"]
                tally.restarts.append(figures["restarts"])
                if "detection_s" in figures:
                    tally.detection.append(figures["detection_s"])
                if "first_output_s" in figures:
                    tally.first_output.append(figures["first_output_s"])
    for scenario, seen in outcomes.items():
        tally = tallies[scenario]
        if seen == {"skipped"}:
            tally.skipped += 1
            continue
        tally.runs += 1
        if "failed" in seen:
            tally.failed += 1
        else:
            tally.exact += 1


def spread(values: list) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} / {max(values):.1f}"


def table(tallies: dict[str, Tally]) -> str:
    lines = [f"{'scenario':<17}{'runs':>5}{'exact':>6}{'failed':>7}{'skipped':>8}  {'restarts/faults':<16}"
             f"{'detect s (p50/max)':<20}{'first output s (p50/max)'}"]
    for scenario, t in tallies.items():
        restarts = f"{sum(t.restarts)}/{t.faults}" if t.restarts else "-"
        lines.append(f"{scenario:<17}{t.runs:>5}{t.exact:>6}{t.failed:>7}{t.skipped:>8}  {restarts:<16}"
                     f"{spread(t.detection):<20}{spread(t.first_output)}")
    for scenario, t in tallies.items():
        for number, test, message in t.failures:
            lines.append(f"  FAILED {scenario} round {number} {test}: {message}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--only", default="", help=f"comma-separated scenarios of: {', '.join(SCENARIOS)}")
    parser.add_argument("--json", default=None, help="also write the tallies to this file")
    parser.add_argument("--keep", default=None, help="directory for each round's junit XML and output")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    selected = {n: SCENARIOS[n] for n in names}
    directory = args.keep or tempfile.mkdtemp(prefix="fault-matrix-")
    os.makedirs(directory, exist_ok=True)
    print(f"fault matrix: {args.runs} round(s) of {', '.join(names)}; junit XML and output in {directory}",
          flush=True)
    tallies = {n: Tally() for n in names}
    for number in range(1, args.runs + 1):
        started = time.monotonic()
        xml_path, _ = run_round(number, selected, directory)
        tally_round(number, xml_path, selected, tallies)
        failed = sum(1 for t in tallies.values() for f in t.failures if f[0] == number)
        print(f"round {number}/{args.runs}: {time.monotonic() - started:.0f} s, "
              f"{'all exact' if not failed else f'{failed} FAILED'}", flush=True)
        print(table(tallies), flush=True)       # the counts so far: an interrupted matrix still tells
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": args.runs, "scenarios": {n: t.__dict__ for n, t in tallies.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
