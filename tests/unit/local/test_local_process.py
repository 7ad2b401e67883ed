"""Starting, identifying and stopping processes by PID."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardflow.local.process import is_alive, log_tail, runs_command, spawn, terminate

IGNORES_SIGTERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ignoring SIGTERM', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test spawns; any still running at the end are killed."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def python(code: str, log: Path, started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    process = spawn([sys.executable, "-c", code], env={}, log_path=log, detach=False)
    started.append(process)
    return process


def wait_for_text(log: Path, text: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in log_tail(log):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {log}"
        time.sleep(0.02)


def test_spawned_process_is_alive_runs_its_command_and_terminates(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "logs" / "sleeper.log"
    process = python("import time; print('up', flush=True); time.sleep(60)", log, started)
    wait_for_text(log, "up")
    assert is_alive(process.pid)
    assert runs_command(process.pid, [sys.executable, "-c", process.args[2]])
    assert not runs_command(process.pid, [sys.executable, "-c", "something else"])
    terminate(process.pid, timeout=5)
    assert not is_alive(process.pid)
    assert not runs_command(process.pid, process.args)


def test_terminate_kills_a_process_that_ignores_sigterm(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "stubborn.log"
    process = python(IGNORES_SIGTERM, log, started)
    wait_for_text(log, "ignoring SIGTERM")
    began = time.monotonic()
    terminate(process.pid, timeout=0.3)
    assert not is_alive(process.pid)
    assert 0.3 <= time.monotonic() - began < 5
    assert process.wait(timeout=1) < 0  # ended by a signal (SIGKILL), not by exiting


def test_a_finished_child_is_not_alive(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    process = python("pass", tmp_path / "quick.log", started)
    deadline = time.monotonic() + 10
    while is_alive(process.pid):  # not reaped yet: a zombie, which counts as finished
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert process.wait(timeout=1) == 0  # is_alive did not steal the exit status
    terminate(process.pid, timeout=0.1)  # nothing left to stop: returns at once


def test_log_tail_keeps_the_last_lines_without_colour_codes(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {n}\n" for n in range(100)) + "\x1b[31mERROR\x1b[0m: boom\n")
    assert log_tail(log, lines=3) == "line 98\nline 99\nERROR: boom"
    assert log_tail(tmp_path / "missing.log") == ""
