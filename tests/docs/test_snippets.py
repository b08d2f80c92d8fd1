"""Every ```python block of README.md and docs/**/*.md runs (issue 31), so the docs cannot drift
from the API.

The blocks of one page run in order in one namespace, as a reader would paste them one after
the other; a page's later block may use what an earlier one defined. A page whose code mentions
Spark or a StreamEnvironment gets the suite's one SparkSession (`spark`, tests/conftest.py) —
snippets never start a session of their own. Blocks that need what the suite cannot give them (a
Kafka cluster, a remote Spark master) are marked `<!-- not-run: reason -->` and only compiled.
Each page runs in a temporary working directory.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.docs.snippets import SnippetSyntaxError, all_blocks, extract

PAGES = all_blocks()
RUNNABLE = {path: blocks for path, blocks in PAGES.items() if any(b.not_run is None for b in blocks)}
# Keep the exceptions few: a page that cannot run its example should say why, one by one.
MAX_NOT_RUN = 12
NEEDS_SPARK = ("StreamEnvironment", "spark")


@pytest.mark.parametrize("path", sorted(RUNNABLE))
def test_page_snippets_run(path, request, tmp_path, monkeypatch):
    blocks = PAGES[path]
    source = "".join(b.code for b in blocks if b.not_run is None)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__snippet__"}
    if any(word in source for word in NEEDS_SPARK):
        namespace["spark"] = request.getfixturevalue("spark")
    for block in blocks:
        code = compile(block.code, f"{block.path}:{block.line}", "exec")
        if block.not_run is not None:
            continue
        try:
            exec(code, namespace)
        except Exception as exc:  # name the block: the traceback's file name is "path:line" too
            raise AssertionError(f"the snippet at {block.path}:{block.line} failed: {exc!r}") from exc


def test_not_run_blocks_compile_and_are_few():
    marked = [b for blocks in PAGES.values() for b in blocks if b.not_run is not None]
    for block in marked:
        compile(block.code, f"{block.path}:{block.line}", "exec")
    assert len(marked) <= MAX_NOT_RUN, [f"{b.path}:{b.line} ({b.not_run})" for b in marked]


def test_the_readme_and_the_site_have_runnable_snippets():
    assert "README.md" in RUNNABLE
    assert sum(1 for path in RUNNABLE if path.startswith("docs/")) >= 10


def test_extract_finds_blocks_markers_and_bad_fences():
    text = textwrap.dedent("""\
        Intro.

        ```python
        a = 1
        ```

        <!-- not-run: needs a Kafka cluster -->

        ```python
        b = 2
        ```

        ```bash
        echo hi
        ```
        """)
    blocks = extract(text)
    assert [(b.line, b.code, b.not_run) for b in blocks] == [
        (3, "a = 1\n", None), (9, "b = 2\n", "needs a Kafka cluster")]
    with pytest.raises(SnippetSyntaxError, match="needs a reason"):
        extract("<!-- not-run: -->\n```python\nx = 1\n```\n")
    with pytest.raises(SnippetSyntaxError, match="write '```python'"):
        extract("```py\nx = 1\n```\n")
    with pytest.raises(SnippetSyntaxError, match="never closed"):
        extract("```python\nx = 1\n")
    # A marker applies to the next block only.
    assert [b.not_run for b in extract("<!-- not-run: r -->\n```python\n1\n```\n```python\n2\n```\n")] == ["r", None]
