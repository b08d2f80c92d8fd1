"""Finds the fenced Python blocks of the README and the docs site (tests/docs/test_snippets.py).

A block is the text between a line "```python" at the start of a line and the next line that is
"```". A block is not run when the last non-blank line before its opening fence is an HTML
comment `<!-- not-run: <reason> -->`; the reason is required. Fences that look like Python but
are spelled otherwise ("```py", "```python3", "```pycon") are reported, so a snippet cannot
escape the test by its spelling.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_RUN = re.compile(r"^<!--\s*not-run:(.*?)-->\s*$")
OPEN = re.compile(r"^```\s*([A-Za-z0-9_+-]*)\s*$")
PYTHONISH = {"py", "python3", "py3", "pycon", "ipython", "Python"}


@dataclass(frozen=True)
class Block:
    path: str          # relative to the repository root
    line: int          # 1-based line of the opening fence
    code: str
    not_run: str | None   # the reason, when marked not-run


class SnippetSyntaxError(ValueError):
    pass


def extract(text: str, path: str = "<text>") -> list[Block]:
    """The ```python blocks of one Markdown text, in order."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    previous = ""           # the last non-blank line outside a block
    while i < len(lines):
        match = OPEN.match(lines[i])
        if not match:
            if lines[i].strip():
                previous = lines[i].strip()
            i += 1
            continue
        lang = match.group(1)
        if lang in PYTHONISH:
            raise SnippetSyntaxError(f"{path}:{i + 1}: fence '```{lang}': write '```python' so the snippet test runs it")
        start = i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise SnippetSyntaxError(f"{path}:{start + 1}: fence never closed")
        i += 1
        if lang == "python":
            marker = NOT_RUN.match(previous)
            reason = None
            if marker:
                reason = marker.group(1).strip()
                if not reason:
                    raise SnippetSyntaxError(f"{path}:{start + 1}: '<!-- not-run: -->' needs a reason")
            blocks.append(Block(path, start + 1, "\n".join(body) + "\n", reason))
        elif NOT_RUN.match(previous):
            raise SnippetSyntaxError(f"{path}:{start + 1}: a not-run marker before a non-Python block")
        previous = ""
    return blocks


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def all_blocks() -> dict[str, list[Block]]:
    """Every page's blocks, keyed by the page's path relative to the repository root."""
    pages = {}
    for file in markdown_files():
        rel = file.relative_to(ROOT).as_posix()
        pages[rel] = extract(file.read_text(encoding="utf-8"), rel)
    return pages
