"""Long stretches of work on the event loop, cut so that other tasks get their turn.

Lease renewals run on the same loop as intake and delivery; a renewal that waits a third of a
second behind a large chunk can cost the lease (its deadline is ``failover_time`` after the
last successful write). Work over many records calls :meth:`Turns.take` between records: it
yields to the loop once ``every`` seconds of work have passed since the last turn.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

SLICE_SECONDS: Final = 0.002
"""The most work between two turns of the event loop."""


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
        """Yield to the loop if the slice is used up."""
        if time.perf_counter() >= self._due:
            await asyncio.sleep(0)
            self._due = time.perf_counter() + self._every
