"""The order the suite runs in, so that ``pytest -n N --dist loadgroup`` (``make test``) ends early.

xdist's ``loadgroup`` hands each worker the next unit of the queue when it is free; started
longest first, the long tests overlap one another and the short ones fill the gaps at the
end (longest-processing-time first). A unit is one test, or a group of tests that must share
one worker (:data:`GROUP_BY_NODE`, :data:`GROUP_BY_FIXTURE`, :data:`GROUP_BY_FILE`): its tests run one after the
other, in collection order.

How long a test takes comes from ``tests/durations.txt``: lines as pytest's ``--durations``
prints them (``12.34s call     tests/...::test_x``); the setup, call and teardown of one test
add up. A test not listed counts as quick and keeps its place after the listed ones. Refresh
the file from a run's ``--durations=60`` report when tests move or get much slower or faster.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parents[1] / "durations.txt"
_LINE = re.compile(r"^\s*(?P<seconds>[0-9.]+)s\s+(?:setup|call|teardown)\s+(?P<nodeid>\S+)")

#: Tests that share one worker, by a fixture they use or the file they are in.
SPARK = "spark"
#: A Spark JVM per worker would cost each worker a cold start (7-10 s) and, run at once on 2
#: cores, make every Spark test several times slower: one ``local[2]`` session (the ``spark``
#: fixture) for all of them, on one worker. The Spark Connect tests join them, run first as in
#: a plain run: their module-scoped server is started once, and their remote session (which
#: switches the process to Spark Connect until it is closed) never meets the local one.
GROUP_BY_FIXTURE = {"spark": SPARK}
#: Tests that start a system of their own (a fleet of worker processes with emulators, a
#: standalone Spark cluster with its executors) and hold it to timing bounds: one at a time.
#: Started longest first they all began together, and on a 2-core machine (load 12) a
#: Python worker of Spark missed its 10 s connect-back, a worker's lease writes waited
#: seconds on the lease table: failures of the machine, not of the code under test.
HEAVY = "heavy"
GROUP_BY_FILE = {
    "tests/integration/spark/test_connect.py": SPARK,
    # The pages of the docs run in reading order on one stack, as a reader runs them.
    "tests/integration/test_doc_blocks.py": "doc-pages",
    "tests/chaos/test_soak.py": HEAVY,
    "tests/chaos/test_spark_soak.py": HEAVY,
    "tests/integration/bench/test_bench_fleet.py": HEAVY,
    "tests/integration/spark/test_cluster.py": HEAVY,
    "tests/integration/leases/test_kcl3_fleet.py": HEAVY,
}
GROUP_BY_NODE = {
    "tests/integration/test_demo.py::test_spark_demo_verifies_every_event_end_to_end[cluster]": (
        HEAVY
    ),
}


def read_durations(lines: Iterable[str]) -> dict[str, float]:
    """Seconds per node id from ``--durations`` report lines (other lines are ignored)."""
    seconds: dict[str, float] = {}
    for line in lines:
        found = _LINE.match(line)
        if found:
            nodeid = found["nodeid"].split("@", 1)[0]  # without an xdist group suffix
            seconds[nodeid] = seconds.get(nodeid, 0.0) + float(found["seconds"])
    return seconds


def known_durations() -> dict[str, float]:
    if not DURATIONS.exists():
        return {}
    return read_durations(DURATIONS.read_text().splitlines())


def group_of(item: pytest.Item) -> str | None:
    if item.nodeid in GROUP_BY_NODE:
        return GROUP_BY_NODE[item.nodeid]
    for fixture in getattr(item, "fixturenames", ()):
        if fixture in GROUP_BY_FIXTURE:
            return GROUP_BY_FIXTURE[fixture]
    return GROUP_BY_FILE.get(item.nodeid.split("::", 1)[0])


def longest_first(items: list[pytest.Item], durations: dict[str, float]) -> list[pytest.Item]:
    """``items`` as units (a group's tests together, in their order), longest unit first;
    units of equal length keep their collection order."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(group_of(item) or item.nodeid, []).append(item)
    ranked = sorted(
        units.values(), key=lambda unit: -sum(durations.get(i.nodeid, 0.0) for i in unit)
    )
    return [item for unit in ranked for item in unit]
