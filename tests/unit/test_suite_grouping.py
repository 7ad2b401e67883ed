"""The suite's plan for 2 cores holds: tests of one group run on one pytest-xdist worker.

``make test`` keeps the Spark tests on one worker (one Spark session) and runs the heavy
tests one at a time (tests/support/ordering.py), through ``--dist loadgroup``. That rests on
pytest-xdist rewriting each grouped test's node id; pytest 9.2 stopped reading the attribute it
writes, and every group silently fell apart (each worker started its own Spark, the soaks ran
side by side, CI's run failed 4 tests of load). A run of a few grouped tests in a fresh pytest
says whether the installed pair still groups.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

GROUPED = """
import time
import pytest

@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("n", range(6))
def test_grouped(n):
    time.sleep(0.05)

@pytest.mark.parametrize("n", range(6))
def test_free(n):
    time.sleep(0.05)
"""


def test_tests_of_one_group_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--dist=loadgroup",
            "-v",
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, test in re.findall(r"\[(gw\d+)\].*PASSED \S*::(test_\w+)", done.stdout):
        workers[test].add(worker)
    assert sum(1 for line in done.stdout.splitlines() if "PASSED" in line) == 12, done.stdout
    assert len(workers["test_grouped"]) == 1, (dict(workers), done.stdout[-3000:])
    assert "@one" in done.stdout, "the group's tests should carry its name in their ids"
