"""bench/fleet_kit.py: what the fleet benches' parent processes share."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from support.bench import BENCH

PARENT = """
import sys, time
sys.path.insert(0, {bench!r})
from fleet_kit import stop_on_sigterm
stop_on_sigterm()
try:
    print("started", flush=True)
    time.sleep(60)
finally:
    open({marker!r}, "w").write("cleaned up")
"""


def test_a_bench_parent_stopped_with_sigterm_runs_its_cleanup(tmp_path: Path) -> None:
    # Without the handler, SIGTERM ends Python at once: the finally block that stops the
    # workers and emulators never runs and they are left behind.
    marker = tmp_path / "cleaned"
    code = PARENT.format(bench=str(BENCH), marker=str(marker))
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == "started"
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        if parent.poll() is None:
            parent.kill()
    deadline = time.monotonic() + 5
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.read_text() == "cleaned up"
