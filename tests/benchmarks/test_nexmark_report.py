"""The Nexmark table of the benchmark report (benchmarks/report.py) and the field's published
figures it sets beside streamsnap's (benchmarks/nexmark/field.py): pure logic on a small fake
results dict, plus the choices `python -m benchmarks run` refuses before starting Spark."""

from __future__ import annotations

import json

import pytest

from benchmarks import __main__ as suite
from benchmarks import report
from benchmarks.nexmark import bench, catalog, field, generator_speed, spark_queries
from streamsnap.connectors import nexmark


def _run(per_core: float, checkpoints: list[int], state: str) -> dict:
    return {"per_core": per_core, "events_per_second": 2 * per_core, "runs": [2 * per_core] * len(checkpoints),
            "checkpoints": checkpoints, "state": state, "events": 5_000_000, "interval": 10.0}


def _results() -> dict:
    return {"errors": {"nexmark q9 rocksdb": "RuntimeError: boom"},
            "nexmark": {"events": 5_000_000, "runs": 1, "states": ["rocksdb", "heap"], "interval": 10.0,
                        "cores": 2, "parallelism": 2,
                        "generator": {"events_per_cpu_second": 4_000_000, "batch": 8192, "seconds": 3.0},
                        "queries": {"q0": {"rocksdb": _run(1_000_000, [0], "rocksdb"),
                                           "heap": _run(1_200_000, [0], "heap")},
                                    "q5": {"rocksdb": _run(100_000, [2, 3], "rocksdb"),
                                           "heap": _run(200_000, [2], "heap")},
                                    "q6": {"rocksdb": _run(50_000, [4], "rocksdb")},
                                    "q9": {"heap": _run(80_000, [5], "heap")},
                                    "q11": {"rocksdb": _run(400_000, [1], "rocksdb")}},
                        "spark": {"q0": {"per_core": 200_000, "events_per_second": 400_000, "spark": "4.1.0"},
                                  "q5": {"per_core": 40_000, "events_per_second": 80_000, "spark": "4.1.0",
                                         "streamsnap": {"per_core": 160_000, "state": "rocksdb"}}}}}


def test_the_table_has_a_row_per_query_with_both_states_checkpoints_and_the_field():
    header, rows = report.nexmark_rows(_results())
    assert header == ("query", "streamsnap RocksDB /core", "streamsnap heap /core", "checkpoints (RocksDB / heap)",
                      "generator share", "streamsnap RocksDB /core on Spark's input", "Spark SS /core",
                      "Flink 1.13 /core (published)",
                      "Feldera /core (published)", "vs Flink (≥ 5×)", "vs Feldera (≥ 1×)", "vs Spark SS (≥ 3×)")
    by_query = {r[0]: dict(zip(header, r)) for r in rows}
    assert list(by_query) == ["q0", "q5", "q6", "q9", "q11"]   # catalog order; unmeasured queries left out
    q0 = by_query["q0"]
    assert (q0["streamsnap RocksDB /core"], q0["streamsnap heap /core"]) == ("1.00 M/s", "1.20 M/s")
    assert q0["checkpoints (RocksDB / heap)"] == "0 / 0"
    assert q0["generator share"] == "25% / 30%"          # 1.0 M and 1.2 M of 4 M events per CPU second
    assert q0["Flink 1.13 /core (published)"] == "155 K/s" and q0["Feldera /core (published)"] == "436 K/s"
    # 1 M / 155.06 K, 1 M / 435.9 K, 1 M / 200 K: every target met
    assert (q0["vs Flink (≥ 5×)"], q0["vs Feldera (≥ 1×)"], q0["vs Spark SS (≥ 3×)"]) == ("6.4× met", "2.3× met",
                                                                                         "5.0× met")
    assert q0["streamsnap RocksDB /core on Spark's input"] == "–"   # not measured: the ratio is of the main row
    q5 = by_query["q5"]
    assert q5["checkpoints (RocksDB / heap)"] == "2–3 / 2"   # runs that differ show the range
    # Spark's ratio is of streamsnap over Spark's own input (160 K / 40 K), not of the generator-fed row (100 K)
    assert q5["streamsnap RocksDB /core on Spark's input"] == "160 K/s"
    assert (q5["vs Flink (≥ 5×)"], q5["vs Feldera (≥ 1×)"], q5["vs Spark SS (≥ 3×)"]) == (
        "4.5× **missed**", "0.2× **missed**", "4.0× met")
    q6 = by_query["q6"]
    assert q6["streamsnap heap /core"] == "–" and q6["Flink 1.13 /core (published)"].startswith("– (Flink's SQL")
    assert q6["vs Flink (≥ 5×)"] == "–" and q6["vs Feldera (≥ 1×)"] == "0.2× **missed**"
    assert q6["Spark SS /core"] == f"not expressible: {spark_queries.NOT_EXPRESSIBLE['q6']}"
    q9 = by_query["q9"]   # the RocksDB run failed: said so, and no verdict from the heap row
    assert q9["streamsnap RocksDB /core"] == "failed" and q9["vs Flink (≥ 5×)"] == "–"
    assert by_query["q11"]["Feldera /core (published)"].startswith("– (no Feldera figure")
    assert by_query["q11"]["Spark SS /core"] == "not run"   # expressible, but Spark did not run here


def test_the_rendered_report_holds_the_table_the_note_and_the_sources(tmp_path, monkeypatch):
    # The plots need matplotlib, from the bench extra; the test extra has none, and they are not the point here.
    monkeypatch.setattr(report, "_plots", lambda results, directory, stem: [])
    results = {**_results(), "profile": "quick", "machine": "test machine", "seconds": 60}
    table = report.render_table(results)
    assert "| q5 | 100 K/s | 200 K/s | 2–3 / 2 |" in table
    assert field.FLINK_SOURCE in table and field.FELDERA_SOURCE in table
    assert "5,000,000 events" in table and "every 10 s" in table and "4.00 M events per CPU second" in table
    assert "| nexmark q9 rocksdb | failed: RuntimeError: boom |" in table
    written = (tmp_path / report.write(results, str(tmp_path))).read_text()
    assert "| q0 | 1.00 M/s | 1.20 M/s |" in written
    assert report.render_nexmark_table({"errors": {}}) == ""


def test_the_raw_figures_are_written_before_the_plots_so_a_plot_failure_keeps_them(tmp_path, monkeypatch):
    def no_matplotlib(results, directory, stem):
        raise ModuleNotFoundError("No module named 'matplotlib'")

    monkeypatch.setattr(report, "_plots", no_matplotlib)
    results = {**_results(), "profile": "quick", "machine": "test machine", "seconds": 60}
    with pytest.raises(ModuleNotFoundError):
        report.write(results, str(tmp_path))
    [raw] = tmp_path.glob("*.json")
    assert json.loads(raw.read_text())["nexmark"]["events"] == results["nexmark"]["events"]


def test_only_no_checkpoint_rows_have_no_checkpoint_column_and_no_verdicts():
    results = {"errors": {}, "nexmark": {"states": ["none"], "queries": {"q1": {"none": _run(900_000, [0], "none")}}}}
    header, rows = report.nexmark_rows(results)
    assert header[1] == "streamsnap no checkpoints /core" and not any(h.startswith("checkpoints") for h in header)
    assert rows[0][-3:] == ("–", "–", "–")   # the targets are judged on the RocksDB row only


def test_the_published_figures_are_the_sources_per_core_columns():
    # Flink's README prints Throughput/Cores beside events, cores and time: the derivation agrees
    for q, (events, cores, seconds, published) in field.FLINK_RUNS.items():
        assert field.flink_per_core(q) == pytest.approx(published, rel=2e-3), q
        assert events == 100_000_000
    # issue 34 quotes Feldera per core from its 16-core run: q0 ≈ 436 K, q5 ≈ 412 K, q7 ≈ 196 K,
    # q9 ≈ 57 K, q16 ≈ 51 K, q18-q20 ≈ 75-85 K
    for q, quoted in {"q0": 436e3, "q5": 412e3, "q7": 196e3, "q9": 57e3, "q16": 51e3}.items():
        assert field.feldera_per_core(q) == pytest.approx(quoted, rel=0.01), q
    assert all(75e3 <= field.feldera_per_core(q) <= 85e3 for q in ("q18", "q19", "q20"))


def test_every_query_has_a_figure_or_a_reason_for_each_engine_and_for_spark():
    for figures, gaps in ((field.FLINK_RUNS, field.FLINK_MISSING),
                          (field.FELDERA_EVENTS_PER_SECOND, field.FELDERA_MISSING)):
        assert set(figures) | set(gaps) == set(catalog.QUERIES) and not set(figures) & set(gaps)
    assert field.flink_per_core("q6") is None and set(field.missing("q6")) == {"Flink"}
    assert set(field.missing("q10")) == {"Feldera"} and field.missing("q0") == {}
    expressible, refused = set(spark_queries.SPARK_QUERIES), set(spark_queries.NOT_EXPRESSIBLE)
    assert expressible | refused == set(catalog.QUERIES) and not expressible & refused


def test_unknown_queries_or_states_are_refused_before_anything_runs(capsys):
    with pytest.raises(ValueError, match="unknown Nexmark query q99; choose from q0, q1"):
        bench.check_choice(["q0", "q99"], ["rocksdb"])
    with pytest.raises(ValueError, match="state must be one of"):
        bench.check_choice(["q0"], ["rocksdb", "disk"])
    with pytest.raises(ValueError, match="state must be one of"):
        bench.run_all(None, 10, 10, 1, {}, names=["q0"], states=[])
    assert suite.nexmark_options("q5, q0", None) == {"nexmark_queries": ["q5", "q0"],
                                                      "nexmark_states": ["rocksdb", "heap"]}
    assert suite.nexmark_options(None, "none")["nexmark_queries"] == list(catalog.QUERIES)
    with pytest.raises(SystemExit):    # parser.error, before the Spark session starts
        suite.main(["run", "--only", "nexmark", "--only-queries", "q0,q23"])
    assert "unknown Nexmark query q23" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        suite.main(["run", "--only", "nexmark", "--only-queries", "q4,q6", "--nexmark-spark-only"])
    assert "Spark SS expresses none of q4, q6; choose among q0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        suite.main(["run", "--only", "recovery", "--nexmark-spark-only"])
    assert "add nexmark to --only" in capsys.readouterr().err


def test_the_generator_cost_is_measured_in_events_per_cpu_second():
    measured = generator_speed.flat_stream(bench.CONFIG, batch=1024, seconds=0.3)
    assert measured["events_per_cpu_second"] > 0 and measured["batch"] == 1024
    with pytest.raises(ValueError, match="batch must be >= 1"):
        generator_speed.flat_stream(bench.CONFIG, batch=0)


@pytest.mark.spark
def test_run_all_measures_each_query_per_state_with_checkpoints_and_spark_beside(spark):
    """The plumbing on real Spark, tiny sizes (never speed): both states per query, checkpoints
    counted (0.2 s interval, so some complete), the generator's cost, Spark SS where expressible."""
    results: dict = {"errors": {}}
    bench.run_all(spark, 30_000, 16_000, 1, results, names=["q0", "q4"], interval=0.2, generator_seconds=0.3)
    nx = results["nexmark"]
    assert results["errors"] == {} and nx["generator"]["events_per_cpu_second"] > 0
    assert {q: sorted(per) for q, per in nx["queries"].items()} == {"q0": ["heap", "rocksdb"],
                                                                    "q4": ["heap", "rocksdb"]}
    for per in nx["queries"].values():
        for r in per.values():
            assert r["events"] == 30_000 and r["details"][0]["output_rows"] > 0
            assert r["checkpoints"] == [r["details"][0]["checkpoints"]]
    assert sum(r["checkpoints"][0] for per in nx["queries"].values() for r in per.values()) > 0
    assert list(nx["spark"]) == ["q0"] and nx["spark"]["q0"]["per_core"] > 0   # q4: Spark SS cannot express it
    # streamsnap over Spark's very files: every bid of the 4 000 events (16 000 / q0's divisor 4) out
    same = nx["spark"]["q0"]["streamsnap"]
    assert same["per_core"] > 0 and same["state"] == "rocksdb"
    generate = nexmark.events(bench.CONFIG)
    assert same["output_rows"] == sum(generate(i)["event_type"] == nexmark.BID for i in range(4_000))
    header, rows = report.nexmark_rows(results)
    q4 = dict(zip(header, rows[1]))
    assert q4["Spark SS /core"].startswith("not expressible") and q4["vs Flink (≥ 5×)"] != "–"
