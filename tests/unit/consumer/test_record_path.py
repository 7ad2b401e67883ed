"""docs/contributing.md's "path of a record" is short (at most 12 modules) and names real code:
every step's module exists and defines the name the step cites."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "src" / "shardflow"


def steps() -> list[tuple[str, list[str]]]:
    text = (ROOT / "docs" / "contributing.md").read_text()
    block = text.split("<!-- record-path -->")[1].split("<!-- /record-path -->")[0]
    found = []
    for item in re.split(r"\n(?=\d+\. )", block.strip()):
        module, *names = re.findall(r"`([^`]+)`", item)
        found.append((module, [name.split(".")[-1].removesuffix("()") for name in names]))
    return found


def test_the_path_of_a_record_has_at_most_twelve_modules_each_once() -> None:
    modules = [module for module, _ in steps()]
    assert 1 <= len(modules) <= 12
    assert len(set(modules)) == len(modules)


def test_every_step_names_code_that_exists() -> None:
    for module, names in steps():
        path = SOURCE / module
        assert path.is_file(), module
        source = path.read_text()
        for name in names:
            if name in ("Record", "ConsumedRecord"):
                continue  # types the step hands on, defined elsewhere
            assert re.search(rf"\b(class|def|async def) {re.escape(name)}\b", source), (
                f"{module} defines no {name}"
            )
