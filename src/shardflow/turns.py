"""Long stretches of work on the event loop, cut so that other tasks get their turn.

Lease renewals run on the same loop as intake and delivery; a renewal that waits a third of a
second behind a large chunk can cost the lease (its deadline is ``failover_time`` after the
last successful write). Work over many records calls :meth:`Turns.take` between records: it
yields to the loop once ``every`` seconds of work have passed since the last turn.

Yielding alone is not enough when many tasks do such work at once: a plain ``sleep(0)`` puts
the task at the back of the loop's ready queue, behind every other bulk task, so one turn of
the loop holds one slice of each of them (16 shards' readers and workers: 30 ms and more), and
a lease write, which needs a dozen turns of the loop (lock, request, response, body), takes
most of a second. So slices of bulk work are rationed loop-wide: a task whose slice is used up
waits for its turn in a FIFO (:class:`_Gate`) that lets one slice through per turn of the loop.
Everything else (network I/O, timers, renewals) runs between two slices, as if the bulk work
were a single task.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from typing import Final

SLICE_SECONDS: Final = 0.002
"""The most work between two turns of the event loop."""


class _Gate:
    """One slice of bulk work per turn of the loop, to its waiters in FIFO order.

    A grant wakes one waiter and schedules the next grant with ``call_soon``: the loop runs
    that callback only in its next turn (after polling for I/O), and the woken task runs in
    the turn after the grant, so no turn holds more than one slice.
    """

    __slots__ = ("__weakref__", "_loop", "_scheduled", "_waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._scheduled = False

    async def turn(self) -> None:
        """Wait until this task may do its next slice."""
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._grant)
        await waiter  # a cancelled waiter is skipped by the grant

    def _grant(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break
        if waiters:
            self._loop.call_soon(self._grant)
        else:
            self._scheduled = False


_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Gate] = weakref.WeakKeyDictionary()


def _gate() -> _Gate:
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = _Gate(loop)
    return gate


class Turns:
    """Hands the loop a turn after every ``every`` seconds of work (see the module doc)."""

    __slots__ = ("_due", "_every")

    def __init__(self, every: float = SLICE_SECONDS) -> None:
        self._every = every
        self._due = time.perf_counter() + every

    @property
    def due(self) -> bool:
        """The slice is used up: the next :meth:`take` yields."""
        return time.perf_counter() >= self._due

    async def take(self) -> None:
        """Yield to the loop if the slice is used up, and wait for the next slice's turn. (On
        a per-record path, ask :attr:`due` first: calling a coroutine function makes an object,
        the check does not.)"""
        if time.perf_counter() >= self._due:
            await _gate().turn()
            self._due = time.perf_counter() + self._every
