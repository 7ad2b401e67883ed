"""bench/multilang.py ``--variant NAME=REV``: another revision's daemon in the same run, its
source exported and checked to be what runs, its rows and ratios beside the checkout's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support.bench import load_bench

multilang = load_bench("multilang")


def test_a_variant_is_a_name_and_a_revision() -> None:
    assert multilang.parse_variant(" before = HEAD~1 ") == ("before", "HEAD~1")
    for bad in ("HEAD", "=HEAD", "name="):
        with pytest.raises(multilang.VariantError):
            multilang.parse_variant(bad)


def test_a_revision_is_exported_and_imports_from_its_own_source(tmp_path: Path) -> None:
    source, short = multilang.export_source("HEAD", tmp_path / "head")
    assert (source / "shardflow" / "__init__.py").is_file()
    assert source == tmp_path / "head" / "src"
    assert len(short) >= 7
    with pytest.raises(multilang.VariantError, match="no revision"):
        multilang.export_source("no-such-revision-anywhere", tmp_path / "none")


def daemon(rate: float, cpu: float, rss: float) -> dict[str, Any]:
    return {
        "error": None,
        "rounds": 3,
        "records_per_second": rate,
        "cpu_per_100k": cpu,
        "rss_mib": rss,
        "duplicates": 0,
    }


def test_variants_get_rows_and_ratios_of_their_own() -> None:
    result = {
        "args": {"records": 100_000, "size": 100, "repeat": 3},
        "commit": "abc1234",
        "medians": {
            multilang.SHARDFLOW: daemon(30_000, 1.0, 150),
            f"{multilang.SHARDFLOW} @ before": daemon(30_000, 1.0, 200),
            "KCL 2.5.8 MultiLangDaemon": daemon(15_000, 2.0, 500),
        },
        "first_record": {},
        "variants": {f"{multilang.SHARDFLOW} @ before": {"rev": "HEAD~1", "commit": "def5678"}},
    }
    table = multilang.render(result)
    assert "| vs KCL 2.5.8 MultiLangDaemon | 2.00x | 0.50x | 0.30x | - |" in table
    assert "| before vs KCL 2.5.8 MultiLangDaemon | 2.00x | 0.50x | 0.40x | - |" in table
    assert f"| {multilang.SHARDFLOW} @ before | HEAD~1 = def5678 |" in table
