"""The fault matrix's tally (benchmarks/fault_matrix.py) over a round's junit XML, and its
command line refusing what it cannot run."""

from __future__ import annotations

import subprocess
import sys

from benchmarks import fault_matrix
from tests.integration import fault_figures

ROUND = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.integration.test_hosts" name="{partition}">
  <system-out>cluster up
{marker} {{"scenario": "partition host-host", "faults": 1, "restarts": 1, "detection_s": 3.4}}
</system-out></testcase>
<testcase classname="tests.integration.test_hosts" name="{host}">
  <failure message="AssertionError: 12 rows missing">trace</failure>
  <system-out>{marker} {{"scenario": "host lost", "faults": 1, "restarts": 2, "detection_s": 1.0, "first_output_s": 6.5}}</system-out></testcase>
<testcase classname="tests.network.test_liveness" name="test_x"><skipped message="needs nft"/></testcase>
<testcase classname="tests.checkpoint.test_fencing" name="test_a[1]"/>
<testcase classname="tests.checkpoint.test_fencing" name="test_b"/>
</testsuite></testsuites>"""


def test_a_round_is_tallied_per_scenario(tmp_path):
    selected = {n: fault_matrix.SCENARIOS[n] for n in ("partition", "host", "liveness", "fencing")}
    xml = tmp_path / "round.xml"
    xml.write_text(ROUND.format(partition=selected["partition"][1], host=selected["host"][1],
                                marker=fault_figures.MARKER))
    tallies = {n: fault_matrix.Tally() for n in selected}
    fault_matrix.tally_round(1, str(xml), selected, tallies)
    fault_matrix.tally_round(2, str(xml), selected, tallies)
    partition, host = tallies["partition"], tallies["host"]
    assert (partition.runs, partition.exact, partition.faults, partition.restarts) == (2, 2, 2, [1, 1])
    assert partition.detection == [3.4, 3.4] and partition.first_output == []
    assert (host.runs, host.exact, host.failed, host.restarts, host.first_output) == (2, 0, 2, [2, 2], [6.5, 6.5])
    assert host.failures[0] == (1, selected["host"][1], "AssertionError: 12 rows missing")
    assert (tallies["liveness"].runs, tallies["liveness"].skipped) == (0, 2)
    assert (tallies["fencing"].runs, tallies["fencing"].exact) == (2, 2), "a file's tests count as one scenario"
    table = fault_matrix.table(tallies)
    assert "4/2" in table and "FAILED host round 2" in table


def test_the_marker_is_the_one_the_tests_print():
    assert fault_matrix.MARKER == fault_figures.MARKER


def test_unknown_scenarios_are_refused_naming_the_known_ones():
    done = subprocess.run([sys.executable, "-m", "benchmarks.fault_matrix", "--runs", "1", "--only", "host,floods"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown scenario(s) floods; choose from partition, driver-partition, host" in done.stderr
