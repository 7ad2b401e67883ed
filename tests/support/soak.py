"""Running a chaos soak script (bench/chaos.py, bench/chaos_spark.py) from a test: its output
to a log file, a bound on its time for a machine in trouble, its JSON read back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_soak(script: str, arguments: list[str], tmp_path: Path, bound_s: float) -> tuple[Any, str]:
    """Run ``bench/<script> <arguments> --results … --keep …``; (its JSON, the log's tail).
    Fails the test if it runs longer than ``bound_s`` or writes no JSON."""
    stem = Path(script).stem
    results = tmp_path / f"{stem}.json"
    log = tmp_path / f"{stem}.out"
    command = [sys.executable, str(BENCH / script), *arguments]
    command += ["--results", str(results), "--keep", str(tmp_path / "run")]
    with log.open("wb") as out, subprocess.Popen(command, stdout=out, stderr=out) as soak:
        try:
            soak.wait(bound_s)
        except subprocess.TimeoutExpired:
            soak.terminate()  # the script unwinds and stops every process it started
            soak.wait(60)
            pytest.fail(f"the soak did not end within {bound_s:.0f} s: {log.read_text()[-3000:]}")
    output = log.read_text()[-3000:]
    assert results.exists(), output
    return json.loads(results.read_text()), output
