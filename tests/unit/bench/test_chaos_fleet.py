"""The chaos soak's fleet of worker processes: a rolling restart asks a slot who holds it at
its turn (a kill -9 may have replaced the process the restart saw when it began)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from support.bench import load_bench

chaos = load_bench("chaos")


def test_a_slot_is_held_by_its_latest_live_process_and_by_none_between_a_kill_and_its_restart(
    tmp_path: Path,
) -> None:
    fleet = chaos.Fleet(
        run_dir=tmp_path,
        command=lambda name: [sys.executable, "-c", "import time; time.sleep(30)"],
        env={},
    )
    try:
        first = fleet.start(0)
        assert fleet.current(0) is first
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(10)
        # The rolling restart saw `first` when it began; at slot 0's turn it must not SIGTERM
        # the dead process and start a second replacement beside the kill's.
        assert fleet.current(0) is None
        second = fleet.start(0)
        assert fleet.current(0) is second
        assert second.name == "w0.1"
        second.frozen = True
        assert fleet.current(0) is None, "a frozen worker is the SIGSTOP fault's, not a restart's"
    finally:
        fleet.kill_all()
