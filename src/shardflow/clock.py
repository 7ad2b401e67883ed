"""Time as a dependency: components take a Clock so tests can drive time by hand."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for intervals and expiry)."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch (for timestamps shown to people or stored)."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM_CLOCK = SystemClock()


class ManualClock:
    """A clock that only moves when a test calls :meth:`advance`.

    Sleepers wake in deadline order as time passes them; ``advance`` yields to the event loop
    after each wake-up so woken tasks run before time moves on.
    """

    def __init__(self, start: float = 1_000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_offset
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), future))
        await future

    async def advance(self, seconds: float) -> None:
        target = self._now + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, future = heapq.heappop(self._sleepers)
            self._now = max(self._now, deadline)
            if not future.done():
                future.set_result(None)
            for _ in range(5):  # let woken tasks (and what they start) run
                await asyncio.sleep(0)
        self._now = target
        for _ in range(5):
            await asyncio.sleep(0)
