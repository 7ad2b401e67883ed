"""The benchmark tables in README.md and docs/ are what bench/results/*.json renders to."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from support.bench import load_bench

ROOT = Path(__file__).resolve().parents[3]


tables = load_bench("tables")


def test_every_table_in_the_docs_matches_its_json() -> None:
    assert tables.stale(tables.documents()) == [], "run .venv/bin/python bench/tables.py"


def test_every_bench_has_its_table_somewhere() -> None:
    text = "\n".join(path.read_text() for path in tables.documents())
    for result in sorted((ROOT / "bench" / "results").glob("*.json")):
        name = result.stem.replace("-", "@", 1)  # handoff-64.json: the variant handoff@64
        assert f"<!-- bench:{name} -->" in text


def test_a_table_edited_by_hand_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    rendered = tables.render_document("<!-- bench:producer -->\n<!-- /bench:producer -->\n")
    page.write_text(rendered.replace("| boto3 put_records loop | ", "| boto3 put_records loop | 9"))
    assert tables.stale([page]) == [page]
    page.write_text(rendered)
    assert tables.stale([page]) == []


def test_a_changed_result_is_caught(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(ROOT / "bench" / "results", results)
    page = tmp_path / "page.md"
    page.write_text(tables.render_document("<!-- bench:producer -->\n<!-- /bench:producer -->"))
    producer = json.loads((results / "producer.json").read_text())
    producer["results"][0]["cpu_seconds"] *= 2
    (results / "producer.json").write_text(json.dumps(producer))
    assert tables.stale([page], results) == [page]


@pytest.mark.parametrize(
    "text",
    [
        "<!-- bench:producer -->\nno end",
        "<!-- bench:nosuchbench -->\n<!-- /bench:nosuchbench -->",
        "<!-- bench:producer.nosuchpart -->\n<!-- /bench:producer.nosuchpart -->",
    ],
)
def test_a_broken_marker_is_an_error(text: str) -> None:
    with pytest.raises(tables.TableError):
        tables.render_document(text)


def test_a_variant_marker_renders_its_own_json() -> None:
    """``handoff@64`` is bench/handoff.py's render of bench/results/handoff-64.json (a marker
    the pattern did not match stayed empty without a word)."""
    rendered = tables.render_document("<!-- bench:handoff@64 -->\n<!-- /bench:handoff@64 -->\n")
    assert "64 shards x" in rendered
    assert "| (a) rolling restart" in rendered
