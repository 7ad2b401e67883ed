"""Waiting for the first of several things: a stop asked, a lease lost, a task done, a timer.

Every race in shardflow (handler call against a stop, records against a lease loss, a queue
against shutdown, an event read against its deadline) goes through :func:`first_of`, so the
clean-up of the losers is written once.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Coroutine
from typing import Any

Waitable = asyncio.Event | asyncio.Future[Any] | Coroutine[Any, Any, Any]
"""An Event (over once set), a Future or Task (over once done), or a coroutine (over once it
returned or raised)."""


async def first_of(*waits: Waitable, timeout: float | None = None) -> None:  # noqa: ASYNC109
    # (a timeout here ends the wait quietly, it raises nothing: not asyncio.timeout's job)
    """Return once the first of ``waits`` is over, or after ``timeout`` seconds (None: never).

    Returns at once when an Event is set or a Future done already. What it starts itself (a
    wait on each Event, a task for each coroutine) is cancelled when it returns or is
    cancelled, so a coroutine's result is not kept: pass a Task to read it afterwards. Futures
    and Tasks passed in are the caller's and are never cancelled here.
    """
    if any(_over(wait) for wait in waits):
        for wait in waits:
            if inspect.iscoroutine(wait):
                wait.close()  # never started: nothing to cancel, nothing left un-awaited
        return
    own: list[asyncio.Future[Any]] = []
    watched: list[asyncio.Future[Any]] = []
    for wait in waits:
        if isinstance(wait, asyncio.Event):
            future: asyncio.Future[Any] = asyncio.ensure_future(wait.wait())
            own.append(future)
        elif asyncio.isfuture(wait):
            future = wait
        else:
            future = asyncio.ensure_future(wait)
            own.append(future)
        watched.append(future)
    try:
        await asyncio.wait(watched, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in own:
            future.cancel()


def _over(wait: Waitable) -> bool:
    if isinstance(wait, asyncio.Event):
        return wait.is_set()
    return asyncio.isfuture(wait) and wait.done()
