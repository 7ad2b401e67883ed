"""The fenced code blocks of the README and the docs, with the marks that say how to run them.

A block is marked by an HTML comment (invisible on the site) on the line just above its fence::

    <!-- docs-test: skip (why it cannot run as written) -->
    <!-- docs-test: file handlers.py -->        the block is that file's content
    <!-- docs-test: example examples/x.py -->   the block is that repository file, verbatim (a
                                                pip user has the docs, not the repository)
    <!-- docs-test: first-hour -->              run by tests/integration/test_first_hour.py
    <!-- docs-test: until-interrupted 6 -->     runs until Ctrl-C: interrupted after 6 s

Every ``python`` and ``sh`` block is run unless marked, each on its own (a Python block is a
program of its own: it needs no names of an earlier block); blocks of any other language
(``text``, ``json``...) are never run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE_LANGUAGES = frozenset({"python", "sh"})
KINDS = frozenset({"run", "skip", "file", "example", "first-hour", "until-interrupted"})

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>[^`]*)$")
_MARK = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<kind>[a-z-]+)\s*(?P<arg>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class DocBlock:
    """One fenced block: where it is, its language, its text and how it is to be run."""

    path: Path
    line: int
    language: str
    text: str
    kind: str = "run"
    argument: str = ""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.language in RUNNABLE_LANGUAGES


def documentation_files() -> list[Path]:
    """The README and every page of the site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def reading_order() -> list[Path]:
    """The README, then the site's pages in the order of its navigation (``mkdocs.yml``), then
    any page the navigation leaves out."""
    import yaml

    def pages(entry: object) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, dict):
            return [page for value in entry.values() for page in pages(value)]
        if isinstance(entry, list):
            return [page for item in entry for page in pages(item)]
        return []

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    ordered = [ROOT / "README.md", *(ROOT / "docs" / page for page in pages(nav))]
    return ordered + [path for path in documentation_files() if path not in ordered]


def blocks(path: Path) -> list[DocBlock]:
    """The fenced blocks of one Markdown file, in order."""
    lines = path.read_text().splitlines()
    found: list[DocBlock] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None or not opening["info"].strip():
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        language = opening["info"].strip().split()[0]
        body: list[str] = []
        end = index + 1
        while end < len(lines) and lines[end].strip() != fence:
            body.append(lines[end][indent:])
            end += 1
        kind, argument = _mark_above(lines, index)
        text = "\n".join(body) + "\n"
        found.append(DocBlock(path, index + 1, language, text, kind, argument))
        index = end + 1
    return found


def _mark_above(lines: list[str], index: int) -> tuple[str, str]:
    if index == 0:
        return "run", ""
    mark = _MARK.match(lines[index - 1])
    if mark is None:
        return "run", ""
    if mark["kind"] not in KINDS:
        raise ValueError(f"unknown docs-test mark {mark['kind']!r} above line {index + 1}")
    return mark["kind"], mark["arg"]
