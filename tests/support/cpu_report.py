"""CPU seconds per test, for deciding what the suite can afford (``SHARDFLOW_TEST_CPU=<file>``).

On a 2-core machine the suite's wall time is bounded below by its CPU: tests that start JVMs,
clusters and fleets of worker processes cost more than their wall time shows when they run
side by side. With the variable set, each test appends one line to the file: node id, wall
seconds, and CPU seconds of the xdist worker and every process it started (those still alive
at the end, those reaped during the test). Session-scoped servers count where they are reaped.
Nothing is measured without the variable.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from support.proc_table import processes


def _descendants_cpu(root: int) -> dict[int, float]:
    """CPU seconds (user + system, own only) of every live descendant of ``root``."""
    table = processes()
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for proc in table:
        children.setdefault(proc.parent, []).append(proc.pid)
        cpu[proc.pid] = proc.cpu
    found: dict[int, float] = {}
    frontier = [root]
    while frontier:
        for child in children.get(frontier.pop(), ()):
            if child not in found:
                found[child] = cpu[child]
                frontier.append(child)
    return found


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    target = os.environ.get("SHARDFLOW_TEST_CPU")
    if not target:
        yield
        return
    started, own = time.monotonic(), _own_cpu()
    before = _descendants_cpu(os.getpid())
    yield
    after = _descendants_cpu(os.getpid())
    # Live descendants: what they used during the test (all of it if they are new).
    live = sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())
    total = _own_cpu() - own + max(live, 0.0)
    with open(target, "a") as out:
        out.write(f"{item.nodeid}\t{time.monotonic() - started:.1f}\t{total:.1f}\n")
