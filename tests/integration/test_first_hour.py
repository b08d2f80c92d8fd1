"""Small things a new user meets in their first hour (issue 30)."""

from __future__ import annotations

import time

import pytest

import streamsnap as ss

pytestmark = pytest.mark.spark


def test_finished_subtasks_say_so_and_name_no_pid_to_kill(spark):
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    (env.from_source(ss.sources.Generator(lambda i: {"k": i % 3, "v": i}, count=1_000), name="rows")
        .key_by("k").map(lambda r: r, name="same").sink_to(ss.sinks.Collect(), name="out"))
    client = env.execute_async("finishes")
    running = []
    while client.status() not in ("FINISHED", "FAILED", "CANCELED"):
        running += [s for s in client.subtasks() if s.state == "RUNNING"]
        time.sleep(0.02)
    result = client.wait()
    assert result.status == "FINISHED" and len(result.rows("out")) == 1_000
    ended = client.subtasks()
    assert len(ended) == 4 and {s.state for s in ended} == {"FINISHED"}
    assert all(s.pid is None for s in ended), ended       # their processes are idle Spark workers now
    assert all(s.pid for s in running)


def test_the_readme_word_count_prints_exact_final_counts_once_per_word(spark, capsys):
    """examples/word_count.py, the first thing anyone runs: one final count per word (an
    event-time timer at the end of input), each equal to a count done without streamsnap."""
    import importlib.util
    import os
    from collections import Counter

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "word_count.py")
    spec = importlib.util.spec_from_file_location("word_count_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    started = time.monotonic()
    example.main()              # on the active (the suite's) session, as on the embedded one
    elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    expected = Counter(w for i in range(example.SENTENCES) for w in example.sentence(i)["text"].split())
    header = next(line for line in out.splitlines() if line.startswith("word counts"))
    assert header == (f"word counts ({len(expected)} words, {sum(expected.values()):,} in all, each as counted "
                      f"without streamsnap):")
    printed = {line.split()[0]: int(line.split()[1].replace(",", ""))
               for line in out.split(header)[1].split("\n\n")[0].splitlines() if line.strip()}
    assert printed == dict(expected)
    assert "(exact:" not in out and "rounded" not in out
    assert "count                        parallelism 2   in    1,000,000  out           16" in out
    print(f"word count example: {elapsed:.1f} s on the suite's session")
