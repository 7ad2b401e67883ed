"""Bumping the lease table's change marker, one bump for many writes at once.

In the heartbeat mode a writer bumps the marker (``changeCounter`` of the mode item, see
:mod:`~shardflow.leases.entities`) after each write its peers should notice soon, and lease
pick-up scans the whole table only when the marker moved. The bump must land after the write
it stands for (a reader that sees the new marker then scans and finds the write), so the writer
waits for it; writes that finish while a bump is in flight share the next one: a worker that
hands over 100 leases at once sends a handful of bumps, not 100.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("shardflow.leases")


class ChangeMarker:
    """Coalesces the bumps of one writer. ``send`` performs one bump and never raises (a
    bump is a hint: readers scan the whole table every renew interval anyway)."""

    def __init__(self, send: Callable[[], Awaitable[None]]) -> None:
        self._send = send
        self._wanted = 0
        """Writes that asked for a bump, counted."""
        self._done = 0
        """Writes covered by a bump that has landed (or failed)."""
        self._flight: asyncio.Future[None] | None = None
        self.bumps = 0
        """Bumps sent (for tests and the benches)."""

    async def touch(self) -> None:
        """Return once a bump sent after this call began has landed (or failed)."""
        loop = asyncio.get_running_loop()
        self._wanted += 1
        mine = self._wanted
        while self._done < mine:
            flight = self._flight
            if flight is None or flight.done() or flight.get_loop() is not loop:
                # A bump in flight was sent before this write finished: it does not cover
                # it, so a new one starts once that one is done (the loop comes back here).
                flight = self._flight = asyncio.ensure_future(self._bump())
            # Shielded: a cancelled writer must not cancel a bump others wait for.
            await asyncio.shield(flight)

    async def _bump(self) -> None:
        # It covers every write that finished before it is sent, not only those before it
        # was scheduled: writes finishing in one turn of the loop share it.
        covers = self._wanted
        self.bumps += 1
        try:
            await self._send()
        except Exception:
            # The write it follows succeeded; a failed hint must not make it look failed.
            log.exception("bumping the lease table's change marker failed")
        finally:
            self._done = max(self._done, covers)
