"""``shardflow multilang`` starts its daemon without typer: the daemon lives for months, and
typer's imports (click, rich, the other commands, pydantic for its argument conversion) would
stay in its memory for nothing (issue 23). Anything but a plain run still goes through typer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Runs the console script's main() and reports, at exit, its status and what it imported.
RUN_MAIN = r"""
import atexit, json, sys
def report():
    heavy = sorted(m for m in ("typer", "click", "rich", "pydantic") if m in sys.modules)
    print("\n" + json.dumps({"imported": heavy}))
atexit.register(report)
sys.argv = ["shardflow", *sys.argv[1:]]
from shardflow.cli import main
main()
"""


def run_main(*args: str) -> tuple[int, list[str], str]:
    answer = subprocess.run(
        [sys.executable, "-c", RUN_MAIN, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report = json.loads(answer.stdout.strip().splitlines()[-1])
    return answer.returncode, report["imported"], answer.stderr


def properties(tmp_path: Path, executable: str) -> Path:
    path = tmp_path / "app.properties"
    path.write_text(
        f"executableName = {executable}\nstreamName = s\napplicationName = a\n"
        "regionName = us-east-1\nsomeKeyTheKclDoesNotHave = 1\n"
    )
    return path


def test_a_run_imports_neither_typer_nor_pydantic(tmp_path: Path) -> None:
    # A processor that cannot be started stops the daemon before any AWS call.
    path = properties(tmp_path, str(tmp_path / "missing-processor"))
    code, imported, stderr = run_main("multilang", "--properties-file", str(path))
    assert imported == []
    assert code == 1, stderr  # as the typer command exits on a failed run
    assert "someKeyTheKclDoesNotHave" in stderr  # the keys not honoured are still reported
    assert "error:" in stderr
    assert "missing-processor" in stderr


def test_check_and_help_go_through_typer(tmp_path: Path) -> None:
    path = properties(tmp_path, "/bin/cat")
    code, imported, stderr = run_main("multilang", "--check", str(path))
    assert code == 0, stderr
    assert "typer" in imported
    code, imported, _ = run_main("multilang", "--help")
    assert code == 0
    assert "typer" in imported


def test_arguments_the_small_parser_does_not_take_are_typer_s_to_report(tmp_path: Path) -> None:
    path = properties(tmp_path, "/bin/cat")
    code, imported, stderr = run_main("multilang", "-p", str(path), "--no-such-option")
    assert code == 2
    assert "typer" in imported
    assert "No such option" in stderr
