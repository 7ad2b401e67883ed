"""Work that must run at interpreter exit while thread pools still accept work.

``atexit`` callbacks run after ``threading._shutdown()``, which has already told every
``concurrent.futures`` thread pool to refuse new work. An event loop's default executor is such
a pool (new connections resolve their host in it), so a producer flushed from an ``atexit``
callback fails every request with "cannot schedule new futures after interpreter shutdown".
Callbacks given to ``threading._register_atexit`` run inside ``threading._shutdown()`` itself,
newest first: one registered after ``concurrent.futures.thread`` was imported runs before the
pools are shut. Where that hook is missing (another Python), ``atexit`` is the fallback.

A forked child inherits the callbacks but none of the producers' loop threads they wait for:
each would hold the child at exit for its flush and close timeouts (35 s a producer, seen in
the test suite's forked helpers). The child forgets them.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401 - its exit hook must be registered before ours
import itertools
import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger("shardflow.producer")

_lock = threading.Lock()
_callbacks: dict[int, Callable[[], None]] = {}
_tokens = itertools.count()
_hooked = False


def run_at_exit(callback: Callable[[], None]) -> Callable[[], None]:
    """Run ``callback`` at interpreter exit, before thread pools shut down; returns a function
    that cancels it (call it once the work is done otherwise, e.g. on close)."""
    global _hooked
    with _lock:
        token = next(_tokens)
        _callbacks[token] = callback
        if not _hooked:
            _hooked = True
            _register(_run_all)
    return lambda: _cancel(token)


def _register(hook: Callable[[], None]) -> None:
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("threading._register_atexit is not available")
        register(hook)
    except RuntimeError:  # missing, or the interpreter is already shutting down
        atexit.register(hook)


def _cancel(token: int) -> None:
    with _lock:
        _callbacks.pop(token, None)


def _run_all() -> None:
    global _hooked
    with _lock:
        pending = list(_callbacks.values())[::-1]  # newest first, as atexit does
        _callbacks.clear()
        _hooked = False
    for callback in pending:
        try:
            callback()
        except Exception:
            log.exception("exit callback %r failed", callback)


def _forget_in_child() -> None:
    """After a fork, in the child: the parent's producers are not here (their threads were not
    copied), so there is nothing of theirs to flush. The lock may have been held by another
    thread at the fork: a fresh one."""
    global _lock
    _lock = threading.Lock()
    _callbacks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
