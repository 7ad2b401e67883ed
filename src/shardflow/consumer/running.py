"""Handler calls of one shard that have not really ended, threads included.

Cancelling a wait for a plain handler's thread does not stop the thread: the call goes on
after the consumer stopped waiting for it. One shard, one running handler holds only if
whoever starts the shard again (this process after a lease taken back, the next owner after
a handoff) waits for those calls too, so every handler call of a shard is counted in its
:class:`RunningCalls` from the moment it is submitted until it has really returned:

- an ``async def`` call ends when its coroutine does (cancelled, returned or raised);
- a call in a thread ends when the thread leaves the handler. A call still queued in the
  executor when its wait is cancelled never starts (:class:`ThreadCall` sees to it) and ends
  at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class RunningCalls:
    """How many handler calls of one shard are running; use on the consumer's event loop."""

    def __init__(self) -> None:
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._when_idle: list[Callable[[], None]] = []

    @property
    def running(self) -> int:
        """Calls started and not ended."""
        return self._running

    @property
    def idle(self) -> bool:
        return self._running == 0

    def enter(self) -> Callable[[], None]:
        """A call starts; call what this returns once it has ended (more calls do nothing)."""
        self._running += 1
        self._idle.clear()
        done = False

        def ended() -> None:
            nonlocal done
            if done:
                return
            done = True
            self._running -= 1
            if self._running == 0:
                self._idle.set()
                callbacks, self._when_idle = self._when_idle, []
                for callback in callbacks:
                    callback()

        return ended

    async def wait_idle(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Wait until no call runs (at most ``timeout`` seconds); whether none runs."""
        if self._idle.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        return self._idle.is_set()

    def when_idle(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once no call runs (now, if none does)."""
        if self.idle:
            callback()
        else:
            self._when_idle.append(callback)


class ThreadCall:
    """One function call handed to an executor, told apart from the wait for it.

    :meth:`run` is what the executor runs; :meth:`abandon` is called when the wait is
    cancelled: if the call had not started it never will (True), otherwise it runs to its
    end. ``ended`` is called on ``loop`` once the call is over either way.
    """

    def __init__(self, ended: Callable[[], None], loop: asyncio.AbstractEventLoop) -> None:
        self._ended = ended
        self._loop = loop
        self._lock = threading.Lock()
        self._state = "queued"  # -> "running" -> "over", or "queued" -> "abandoned"

    def run(self, function: Callable[..., T], *args: Any) -> T | None:
        with self._lock:
            if self._state == "abandoned":
                return None  # nobody waits for it and it must not start any more
            self._state = "running"
        try:
            return function(*args)
        finally:
            with self._lock:
                self._state = "over"
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
                self._loop.call_soon_threadsafe(self._ended)

    def abandon(self) -> bool:
        """The wait for the call was cancelled; True (and ended) if the call never started."""
        with self._lock:
            if self._state != "queued":
                return False
            self._state = "abandoned"
        self._ended()
        return True


async def in_thread(
    executor: Any, calls: RunningCalls | None, function: Callable[..., T], *args: Any
) -> T:
    """``function(*args)`` in ``executor`` (None: the loop's), counted in ``calls`` until the
    thread has left it, whatever happens to this wait."""
    loop = asyncio.get_running_loop()
    if calls is None:
        return await loop.run_in_executor(executor, function, *args)
    call = ThreadCall(calls.enter(), loop)
    try:
        result = await loop.run_in_executor(executor, call.run, function, *args)
    except asyncio.CancelledError:
        call.abandon()
        raise
    return result  # type: ignore[return-value]  # None only for an abandoned call
