"""``shardflow multilang`` on the C library's malloc: the daemon gives a drain's memory back.

CPython serves objects of up to 512 bytes from its own allocator (pymalloc), in arenas of
1 MiB that go back to the system only once every object in them is freed. A drain moves
records through the daemon in batches of 10,000 small objects (a record's data, its partition
key, its sequence number, its arrival time, the record itself: ~490 B of them for 100 B of
data), interleaved with the few objects that outlive a batch, and each such object keeps its
arena: after a replay of a drain's batches (4 shards, 2 batches of 10,000 held per shard) 42
arenas stayed for 24 MiB of live objects, and the daemon's RSS stayed at its high-water mark.
With ``PYTHONMALLOC=malloc`` the same objects come from glibc's malloc, whose free pages
``malloc_trim`` gives back wherever they are (:func:`shardflow.multilang.memory.trim`, called
once processors checkpoint): the same replay ended at its starting RSS.

The allocator is chosen when the interpreter starts, so :func:`use_system_malloc` executes
the same command line again with ``PYTHONMALLOC=malloc`` (before anything heavy is imported:
a few milliseconds), and the new process takes both variables out of its environment again,
so that the record processors it starts get the environment the daemon was given. Nothing is
done when ``PYTHONMALLOC`` is already set (the user's choice wins), off Linux or glibc, or when
``main`` does not run as the process's own command line (a test calling it in-process).
"""

from __future__ import annotations

import os
import sys
from typing import Final

MARKER: Final = "SHARDFLOW_SET_PYTHONMALLOC"
"""Set, with ``PYTHONMALLOC=malloc``, for the process this module executes."""


def use_system_malloc() -> None:
    """Execute this command line again on glibc's malloc (does not return when it does);
    in the process so started, put the environment back as it was (see the module doc)."""
    if os.environ.pop(MARKER, None) is not None:
        os.environ.pop("PYTHONMALLOC", None)  # the processors get the daemon's environment
        return
    if "PYTHONMALLOC" in os.environ or not _on_glibc() or not _own_command_line():
        return
    env = {**os.environ, "PYTHONMALLOC": "malloc", MARKER: "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError:
        return  # runs on pymalloc: the same daemon, holding its high-water mark


def _on_glibc() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError):
        return False


def _own_command_line() -> bool:
    """Whether ``sys.argv`` is this process's command line (its arguments end it), so that
    executing ``sys.orig_argv`` again runs the same command."""
    if not sys.executable or len(sys.argv) < 2:
        return False
    arguments = sys.argv[1:]
    return sys.orig_argv[-len(arguments) :] == arguments
