"""Every job under examples/ runs on a small input and produces exactly its expected output
(issue 31), and every example has a test here and a page in the docs site.

Each example is loaded from its file and its `main(spark=..., ...)` is called with the suite's
one SparkSession (tests/conftest.py); the module is registered with cloudpickle to be pickled by
value, as it is when run as `python examples/NAME.py` (its functions live in `__main__` then).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs" / "examples"


def load(name: str):
    """The module of examples/NAME.py, pickled by value when Spark ships its functions."""
    from pyspark import cloudpickle

    module_name = f"streamsnap_example_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


# ---------------------------------------------------------------------------- the examples


@pytest.mark.spark
def test_sessionization(spark):
    out = load("sessionization").main(spark=spark)
    assert [(s["user"], s["start"], s["end"], s["clicks"], s["pages"]) for s in out["sessions"]] == [
        ("ann", "09:00:05", "09:07:00", 4, "/home > /search > /shoes > /cart"),
        ("ann", "09:25:00", "09:26:45", 2, "/home > /socks"),
        ("ann", "09:40:00", "09:41:10", 2, "/home > /checkout"),
        ("bob", "09:01:00", "09:09:40", 3, "/home > /hats > /checkout"),
        ("cid", "09:15:00", "09:21:30", 2, "/home > /sale"),
        ("cid", "09:33:00", "09:33:00", 1, "/sale"),
    ]
    # A session closes SESSION_GAP after its last click.
    assert [s["closes_at"] for s in out["sessions"]][:2] == ["09:17:00", "09:36:45"]
    assert out["late"] == [{"user": "bob", "at": "09:05:00", "page": "/hats"},
                           {"user": "cid", "at": "09:12:00", "page": "/home"}]


@pytest.mark.spark
def test_orders_payments_join(spark):
    example = load("orders_payments_join")
    out = example.main(spark=spark, orders=60)
    # Reference: every (order, payment) pair with 0 <= delay <= 15 min, in plain Python.
    orders, payments = example.inputs(60)
    by_id = {o["order"]: o for o in orders}
    expected = sorted((p["payment"], p["order"], (p["ts"] - by_id[p["order"]]["ts"]) // 1000)
                      for p in payments if 0 <= p["ts"] - by_id[p["order"]]["ts"] <= 15 * 60_000)
    assert [(m["payment"], m["order"], m["paid_after_s"]) for m in out["matches"]] == expected
    assert len(expected) == 42 and len(payments) == 62
    # Never paid (every tenth order), paid too late, or one instalment of two too late.
    assert out["unpaid"][:4] == ["o001", "o005", "o009", "o010"]
    assert len(out["unpaid"]) == 26


@pytest.mark.spark
def test_fraud_detection(spark):
    example = load("fraud_detection")
    alerts = example.main(spark=spark, transactions=240)
    # Reference: judge each card's transactions in time order by the rule versions in force.
    expected, history = [], {}
    for i in range(240):
        tx = example.transaction(i)
        minute = (tx["ts"] - example.START) / 60_000
        limit = 50_000 if minute < 30 else 30_000
        if tx["amount_cents"] > limit:
            expected.append((i, "max-amount"))
        recent = [t for t in history.get(tx["card"], []) if t > tx["ts"] - 60_000] + [tx["ts"]]
        history[tx["card"]] = recent
        if minute < 45 and len(recent) > 3:
            expected.append((i, "burst"))
    assert [(a["tx"], a["rule"]) for a in alerts] == sorted(expected)
    bursts = [a["tx"] for a in alerts if a["rule"] == "burst"]
    assert bursts == [3, 7, 8, 55, 103, 107, 108, 155]   # runs of four; none after the rule went off (tx 180)
    # Before the limit was tightened at +30 min (tx 120) only one large amount was over 500.00.
    assert [a["tx"] for a in alerts if a["rule"] == "max-amount"] == [85, 102, 119] + list(range(136, 240, 17))
    assert {a["detail"] for a in alerts if a["tx"] == 3} == {"4 transactions in 60 s"}


@pytest.mark.spark
def test_kafka_windowed_counts(spark, kafka_broker):
    example = load("kafka_windowed_counts")
    out = example.main(kafka_broker, spark=spark, views=1_200, partitions=2)
    # 1,200 views 250 ms apart: five minutes of 240 views over five pages.
    assert sum(out["counts"].values()) == 1_200
    assert {start for _, start in out["counts"]} == {example.START + m * 60_000 for m in range(5)}
    assert out["messages"] == len(out["counts"]) == 25
    from collections import Counter
    views = Counter((v["page"], v["ts"] // 60_000 * 60_000) for v in map(example.page_view, range(1_200)))
    assert out["counts"] == dict(views)


@pytest.mark.spark
def test_top_n(spark):
    example = load("top_n")
    top = example.main(spark=spark, views=3_000)
    assert [(r["window_end"] - example.START, r["rank"], r["product"], r["views"]) for r in top] == [
        (300_000, 1, "kettle", 292), (300_000, 2, "toaster", 262), (300_000, 3, "blender", 176),
        (600_000, 1, "toaster", 267), (600_000, 2, "blender", 258), (600_000, 3, "mixer", 202),
        (900_000, 1, "mixer", 269), (900_000, 2, "blender", 232), (900_000, 3, "grinder", 200),
    ]
    # The same from a plain Counter over the input.
    from collections import Counter
    counts = Counter((v["ts"] // 300_000 * 300_000 + 300_000, v["product"]) for v in map(example.view, range(3_000)))
    for r in top:
        assert counts[(r["window_end"], r["product"])] == r["views"]


@pytest.mark.spark
def test_deduplication(spark):
    example = load("deduplication")
    out = example.main(spark=spark, deliveries=3_000)
    assert out["payments"] == [f"pay-{n:05d}" for n in range(2_000)]     # each payment once
    assert out["duplicates"] == 1_000
    expected = {}
    for n in range(2_000):
        p = example.payment(n)
        expected[p["merchant"]] = expected.get(p["merchant"], 0) + p["amount_cents"]
    assert out["revenue"] == expected == {"bakery": 274_500, "books": 274_200, "garden": 273_700, "music": 274_100}


@pytest.mark.spark
def test_cdc_upserts(spark, tmp_path):
    example = load("cdc_upserts")
    out = example.main(spark=spark, changes=400, directory=str(tmp_path))
    # Reference: apply the feed (without its replays) to a dict.
    table, applied = {}, 0
    for change in example.change_feed(400):
        if change["lsn"] < 1_000 + applied:
            continue                                    # a replay
        applied += 1
        if change["op"] == "d":
            table.pop(change["id"])
        else:
            table[change["id"]] = {k: change[k] for k in ("id", "name", "email", "tier", "lsn")}
    assert applied == 400
    assert out["changelog_rows"] == 400
    assert out["table"] == [table[k] for k in sorted(table)]
    assert 20 < len(table) < 40       # some customers were deleted (and some created again)


@pytest.mark.spark
def test_dataframe_enrichment(spark):
    out = load("dataframe_enrichment").main(spark=spark, lines=600)
    assert out["revenue"] == {"books": 787_250, "garden": 389_800, "kitchen": 599_750, "toys": 539_800}
    assert out["enriched"] == 450 and out["unknown_lines"] == 150
    # Not in the catalog: sku-20..23, and the inactive sku-06 and sku-13 (filtered out by Spark).
    assert out["unknown_skus"] == ["sku-06", "sku-13", "sku-20", "sku-21", "sku-22", "sku-23"]


@pytest.mark.spark
def test_savepoint_rescale(spark):
    example = load("savepoint_rescale")
    out = example.main(spark=spark, transfers=6_000, rate=2_000)
    first, second = out["first"], out["second"]
    assert second.restored_checkpoint is not None
    assert 0 < len(first.rows()) < 6_000
    # One balance per transfer over both runs: none lost at the stop, none repeated after it.
    assert sorted(r["seq"] for r in out["rows"]) == list(range(6_000))
    expected = {}
    for i in range(6_000):
        t = example.transfer(i)
        expected[t["account"]] = expected.get(t["account"], 0) + t["cents"]
    assert out["final"] == expected
    assert ("ledger", "balance", "value") in out["operators"]
    assert second.operators["ledger"].parallelism == 3


@pytest.mark.spark
def test_read_state(spark):
    example = load("read_state")
    out = example.main(spark=spark, readings=1_200)
    assert out["output_rows"] == 1_200
    reference = {}
    for i in range(1_200):
        m = example.message(i)
        r = reference.setdefault(m["sensor"], {"count": 0, "min": 10**9, "max": -1, "sum": 0, "hours": set()})
        r["count"] += 1
        r["min"], r["max"], r["sum"] = min(r["min"], m["tenths"]), max(r["max"], m["tenths"]), r["sum"] + m["tenths"]
        r["hours"].add((m["ts"] - example.START) // example.HOUR)
    assert [(s["sensor"], s["readings"], s["min_c"], s["max_c"], s["mean_c"], s["hours"]) for s in out["summary"]] == [
        (k, r["count"], r["min"] / 10, r["max"] / 10, round(r["sum"] / r["count"] / 10, 2), len(r["hours"]))
        for k, r in sorted(reference.items())]
    # 1,200 readings 15 s apart: 240 an hour over five hours.
    assert out["per_hour"] == {0: 240, 1: 240, 2: 240, 3: 240, 4: 240}


@pytest.mark.spark
def test_word_count(capsys):
    """The README's main job (it checks its own counts against a plain Counter), on fewer sentences."""
    example = load("word_count")
    example.SENTENCES = 20_000
    example.main()
    printed = capsys.readouterr().out
    assert "word counts" in printed and "FINISHED" in printed
    from collections import Counter
    expected = Counter(w for i in range(20_000) for w in example.sentence(i)["text"].split())
    for word, count in expected.items():      # each word's line: its exact final count, once
        assert len(re.findall(rf"^  {word} +{count:,}$", printed, re.M)) == 1, word
    assert "(exact:" not in printed and "rounded" not in printed    # nothing that reads like a discrepancy


# ---------------------------------------------------------------------------- every example is covered

INCLUDE = re.compile(r'^--8<-- "(examples/[^"]+)"$')


def page_of(name: str) -> Path:
    return DOCS / f"{name.replace('_', '-')}.md"


def test_every_example_has_a_test_and_a_docs_page():
    import yaml

    names = sorted(p.stem for p in EXAMPLES.glob("*.py"))
    assert len(names) >= 10
    tests = {n[len("test_"):] for n in globals() if n.startswith("test_")}
    assert [n for n in names if n not in tests] == [], "examples without a test in tests/examples/test_examples.py"
    missing = [n for n in names if not page_of(n).exists()]
    assert missing == [], f"examples without a page under docs/examples/: {missing}"

    class Loader(yaml.SafeLoader):
        pass
    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)  # !!python/name:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)
    section = next(item["Examples"] for item in config["nav"] if isinstance(item, dict) and "Examples" in item)
    in_nav = {entry if isinstance(entry, str) else next(iter(entry.values())) for entry in section}
    for name in names:
        page = page_of(name)
        assert page.relative_to(ROOT / "docs").as_posix() in in_nav, f"{page} is not in mkdocs.yml's Examples nav"
        text = page.read_text(encoding="utf-8")
        assert f'--8<-- "examples/{name}.py"' in text, f"{page} does not include examples/{name}.py"
        assert f"python examples/{name}.py" in text or f"examples/{name}.py" in text


def test_included_code_fences_hold_only_includes_of_examples():
    """An ```example-python fence is not run by tests/docs: it may only include example files
    (which the tests above run), never hold code of its own."""
    for page in (ROOT / "docs").rglob("*.md"):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.strip() != "```example-python":
                continue
            body = []
            for following in lines[i + 1:]:
                if following.strip() == "```":
                    break
                body.append(following.strip())
            assert body and all(INCLUDE.match(b) and (ROOT / INCLUDE.match(b).group(1)).exists() for b in body), \
                f"{page}:{i + 1}: an example-python fence must only include files under examples/"
