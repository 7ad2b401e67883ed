"""Bumping the lease table's change marker, one bump for many writes at once.

In the heartbeat mode a writer bumps the marker (``changeCounter`` of the mode item, see
:mod:`~shardflow.leases.entities`) after each write its peers should notice soon, and lease
pick-up scans the whole table only when the marker moved. The bump must land after the write
it stands for (a reader that sees the new marker then scans and finds the write): it is sent
once the write has returned. The writer does not wait for it: it goes out in the background,
one at a time, and writes that finish while one is in flight share the next one (a worker that
releases 1,000 leases at a stop sends a handful of bumps, and its stop took twice as long when
each release waited for one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("shardflow.leases")


class ChangeMarker:
    """Coalesces the bumps of one writer. ``send`` performs one bump (a failure is logged: a
    bump is a hint, readers scan the whole table every renew interval anyway)."""

    def __init__(self, send: Callable[[], Awaitable[None]]) -> None:
        self._send = send
        self._wanted = 0
        """Writes that asked for a bump, counted."""
        self._done = 0
        """Writes covered by a bump that has landed (or failed)."""
        self._flight: asyncio.Task[None] | None = None
        self.bumps = 0
        """Bumps sent (for tests and the benches)."""

    def note(self) -> None:
        """A write that peers should notice has returned: bump the marker after it, soon."""
        self._wanted += 1
        self._ensure_flight()

    async def settle(self) -> None:
        """Wait until every write noted so far is covered by a bump that landed (or failed)."""
        while self._done < self._wanted:
            # Shielded: a cancelled waiter must not cancel the bumps of other writes.
            await asyncio.shield(self._ensure_flight())

    def _ensure_flight(self) -> asyncio.Task[None]:
        """The task sending bumps while some are owed (a new one if none runs on this loop:
        a flight cancelled with its loop leaves its writes owed)."""
        loop = asyncio.get_running_loop()
        flight = self._flight
        if flight is None or flight.done() or flight.get_loop() is not loop:
            flight = self._flight = loop.create_task(
                self._bumps(), name="shardflow-lease-change-marker"
            )
        return flight

    async def _bumps(self) -> None:
        while self._done < self._wanted:
            # Covers every write that returned before it is sent.
            covers = self._wanted
            self.bumps += 1
            try:
                await self._send()
            except Exception:
                # The writes it follows succeeded; a failed hint must not surface anywhere.
                log.exception("bumping the lease table's change marker failed")
            # (Cancelled, with its loop: the writes stay owed a bump, see _ensure_flight.)
            self._done = max(self._done, covers)
