"""Exit callbacks of the producer: a forked child does not run (nor wait for) the parent's."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from shardflow.producer.exit import run_at_exit


@pytest.mark.skipif(sys.platform == "win32" or not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_run_the_parents_exit_callbacks(tmp_path: Path) -> None:
    ran = tmp_path / "ran"

    def flush() -> None:  # a producer's flush would wait here for its loop thread
        ran.write_text(str(os.getpid()))
        time.sleep(5)

    cancel = run_at_exit(flush)
    try:
        began = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: exit the way an interpreter does (threading shutdown runs)
            os._exit(_exit_like_python())
        _, status = os.waitpid(pid, 0)
        took = time.monotonic() - began
    finally:
        cancel()
    assert os.waitstatus_to_exitcode(status) == 0
    assert not ran.exists(), "the child ran the parent's callback"
    assert took < 3.0


def _exit_like_python() -> int:
    """What the interpreter runs at exit before atexit: threading's shutdown hooks, where
    run_at_exit registers its callbacks."""
    import threading

    threading._shutdown()  # type: ignore[attr-defined]
    return 0
