"""Renewing every held lease each renew interval, with a fixed number of writes in flight.

A loop queues each held lease once per interval; a pool of ``renew_concurrency`` tasks renews
them, so a slow or failing lease delays only itself, and 1,000 leases cost 1 + pool tasks,
not one per lease. The loop also wakes at the earliest lease deadline, so that a lease which
could not be renewed in time is marked lost the moment it lapses, not a round later.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from shardflow.clock import Clock
from shardflow.leases.concurrency import run_bounded
from shardflow.leases.owned import OwnedLease
from shardflow.leases.settings import LeaseSettings

log = logging.getLogger("shardflow.leases")


class LeaseRenewer:
    """Keeps the leases of ``owned`` (a live map, changed by others) renewed."""

    def __init__(
        self,
        owned: Mapping[str, OwnedLease],
        *,
        settings: LeaseSettings,
        clock: Clock,
        on_renewed: Callable[[OwnedLease, float], None] | None = None,
        on_failed: Callable[[OwnedLease], None] | None = None,
        covered: Callable[[], bool] = lambda: False,
    ) -> None:
        """``on_failed``: a renewal failed for now (the table did not answer). ``covered``:
        True while this worker's heartbeat keeps its leases (the heartbeat lease mode): no
        lease is renewed on its own then, but each is still marked lost at its deadline."""
        self._owned = owned
        self._settings = settings
        self._clock = clock
        self._on_renewed = on_renewed
        self._on_failed = on_failed
        self._queue: asyncio.Queue[OwnedLease] = asyncio.Queue()
        self._queued: set[str] = set()
        self._covered = covered

    async def run(self) -> None:
        """Renew until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._schedule(), name="shardflow-lease-renew")
            for index in range(self._settings.renew_concurrency):
                group.create_task(self._work(), name=f"shardflow-lease-renew-{index}")

    async def renew_all(self) -> None:
        """Renew every held lease once, now."""
        await run_bounded(
            list(self._owned.values()), self._renew, concurrency=self._settings.renew_concurrency
        )

    def expire_lapsed(self) -> None:
        """Mark lost every held lease whose deadline has passed."""
        for owned in list(self._owned.values()):
            if not owned.valid():
                owned.mark_lost("expired")

    async def _schedule(self) -> None:
        interval = self._settings.renew_every
        next_round = self._clock.monotonic() + interval
        while True:
            self.expire_lapsed()
            now = self._clock.monotonic()
            if now >= next_round:
                # At a fixed rate, as the KCL schedules its renewer: a round that starts late
                # does not push every later round back (unless it is a whole interval late).
                next_round = max(next_round + interval, now + interval / 2)
                renewing = not self._covered()
                for key, owned in list(self._owned.items()) if renewing else ():
                    if key not in self._queued:  # still queued from the last round: once is enough
                        self._queued.add(key)
                        self._queue.put_nowait(owned)
            wake = min([next_round, *(owned.deadline for owned in self._owned.values())])
            await self._clock.sleep(max(wake - self._clock.monotonic(), 0.0))

    async def _work(self) -> None:
        while True:
            owned = await self._queue.get()
            self._queued.discard(owned.lease_key)
            try:
                await self._renew(owned)
            except Exception:
                # A bug or an unexpected answer must not stop the renewal of every other
                # lease; this one is tried again next round and lapses at its deadline.
                log.exception("renewing lease %s failed unexpectedly", owned.lease_key)

    async def _renew(self, owned: OwnedLease) -> None:
        started = self._clock.monotonic()
        outcome = await owned.renew()
        if outcome == "renewed" and self._on_renewed is not None:
            self._on_renewed(owned, self._clock.monotonic() - started)
        elif outcome == "failed" and self._on_failed is not None:
            self._on_failed(owned)
