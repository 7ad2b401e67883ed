"""The chaos soak's fleet of worker processes: a rolling restart asks a slot who holds it at
its turn (a kill -9 may have replaced the process the restart saw when it began)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

from support.bench import load_bench

chaos = load_bench("chaos")


def sleepers(run_dir: Path) -> Any:
    """A chaos fleet whose workers only sleep (30 s at most): slots, kills and claims alone."""
    return chaos.Fleet(
        run_dir=run_dir,
        command=lambda name: [sys.executable, "-c", "import time; time.sleep(30)"],
        env={},
    )


def test_a_slot_is_held_by_its_latest_live_process_and_by_none_between_a_kill_and_its_restart(
    tmp_path: Path,
) -> None:
    fleet = sleepers(tmp_path)
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


def test_two_faults_aiming_at_once_never_get_the_same_process_and_a_kill_restarts_only_its_own(
    tmp_path: Path,
) -> None:
    # The long schedule's two kills 2 s apart both waited for a handler call and both picked
    # w2.2: the second hit nothing and each started a replacement (two workers in slot 2, one
    # left running unwatched and later counted as "failed on its own").
    fleet = sleepers(tmp_path)
    try:
        first = fleet.start(0)
        other = fleet.start(1)
        assert fleet.claim(first)
        assert not fleet.claim(first), "a process held by one fault is not another's"
        assert fleet.claim(other)
        fleet.let_go(other)
        assert fleet.claim(other), "a SIGSTOP's victim may be chosen again once let go"
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(10)
        fleet.let_go(first)
        assert not fleet.claim(first), "a dead process is nobody's victim"
        # A rolling restart replaced slot 1 meanwhile: the kill must not start a second one.
        newer = fleet.start(1)
        assert fleet.replace(1, other) is None
        assert fleet.current(1) is newer
        replacement = fleet.replace(0, first)
        assert replacement is not None
        assert fleet.current(0) is replacement
    finally:
        fleet.kill_all()


def test_the_long_schedule_browns_out_kinesis_and_the_lease_table_from_one_aimed_moment() -> None:
    # Two actions at one second each aimed on their own: the lease-table one waited for a
    # handler call while Kinesis failed 90 % of reads, and began with none in flight.
    full = chaos.schedule_for(600.0, frozenset())
    at_540 = [action for at, action, _ in full if at == 540]
    assert at_540 == ["both_brownouts"]
    alone = chaos.schedule_for(600.0, frozenset({"kinesis_brownout"}))
    assert [a for at, a, _ in alone if at == 540] == ["dynamodb_brownout"]
    neither = chaos.schedule_for(600.0, frozenset({"kinesis_brownout", "dynamodb_brownout"}))
    assert [a for at, a, _ in neither if at == 540] == []
