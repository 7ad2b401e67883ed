"""Starting, identifying and stopping server processes by PID."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

_POLL_SECONDS = 0.02
_KILL_WAIT_SECONDS = 5.0
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def spawn(
    command: Sequence[str], *, env: Mapping[str, str], log_path: Path, detach: bool
) -> subprocess.Popen[bytes]:
    """Start ``command`` with stdout and stderr appended to ``log_path``.

    A detached process gets its own session, so it outlives the caller and does not receive
    the terminal's Ctrl-C.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(command),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=detach,
        )


def is_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not finished (a zombie counts as finished).

    Does not reap: the owner of a child's ``Popen`` still gets its exit status.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, but belongs to someone else
    return not _is_zombie(pid)


def command_line(pid: int) -> list[str] | None:
    """The argument vector of process ``pid``, or None if it cannot be read.

    On systems without /proc the arguments are read from ``ps`` joined by spaces as one item.
    """
    proc_file = Path(f"/proc/{pid}/cmdline")
    if Path("/proc/self/cmdline").exists():
        try:
            raw = proc_file.read_bytes()
        except OSError:
            return None
        return [part.decode(errors="replace") for part in raw.split(b"\0") if part] or None
    result = subprocess.run(
        ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, check=False
    )
    line = result.stdout.strip()
    return [line] if result.returncode == 0 and line else None


def runs_command(pid: int, command: Sequence[str]) -> bool:
    """Whether ``pid`` is alive and still runs exactly ``command`` (guards against PID reuse)."""
    if not is_alive(pid):
        return False
    actual = command_line(pid)
    if actual is None:
        return False
    return actual == list(command) or (len(actual) == 1 and actual[0] == " ".join(command))


def terminate(pid: int, *, timeout: float) -> None:
    """Stop process ``pid``: SIGTERM, then SIGKILL if it is still alive after ``timeout`` s.

    Returns once the process is gone (or after a bounded wait following SIGKILL).
    """
    if not _signal(pid, signal.SIGTERM):
        return
    if _wait_gone(pid, timeout):
        return
    # kinesis-local may ignore SIGTERM once an enhanced fan-out subscription was served.
    if _signal(pid, signal.SIGKILL):
        _wait_gone(pid, _KILL_WAIT_SECONDS)


def log_tail(path: Path, *, lines: int = 20, max_bytes: int = 8192) -> str:
    """The last ``lines`` lines of a log file, without terminal colour codes ("" if unreadable)."""
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - max_bytes))
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(_ANSI_ESCAPE.sub("", text).splitlines()[-lines:])


def _signal(pid: int, signum: signal.Signals) -> bool:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return True
        time.sleep(_POLL_SECONDS)
    return not is_alive(pid)


def _is_zombie(pid: int) -> bool:
    if not Path("/proc/self/status").exists():
        result = subprocess.run(
            ["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True, check=False
        )
        return result.stdout.strip().startswith("Z")
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    fields = dict(line.partition(":")[::2] for line in status.splitlines())
    # A multi-threaded process whose main thread exited shows "Z" while its other threads still
    # run (and still hold its sockets): it is finished only when one thread is left.
    state, threads = fields.get("State", "").strip(), fields.get("Threads", "1").strip()
    return state.startswith("Z") and threads == "1"
