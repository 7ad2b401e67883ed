"""The renewer's rounds keep a fixed rate: a round that starts late does not delay the next."""

from __future__ import annotations

import asyncio
import contextlib

from shardflow.clock import ManualClock
from shardflow.leases.renewer import LeaseRenewer
from shardflow.leases.settings import LeaseSettings

SETTINGS = LeaseSettings(failover_time=2.0)
LATE = 0.1  # how late the loop wakes the renewer, every time (a busy loop)


class LateClock(ManualClock):
    """A manual clock whose sleepers wake ``LATE`` seconds after they asked to."""

    async def sleep(self, seconds: float) -> None:
        await super().sleep(seconds + LATE)


class HeldLease:
    """What the renewer uses of a held lease; renewals are recorded, never fail."""

    def __init__(self, clock: ManualClock) -> None:
        self.lease_key = "shardId-000000000000"
        self.deadline = clock.monotonic() + 3600.0
        self.renewed_at: list[float] = []
        self._clock = clock

    def valid(self) -> bool:
        return True

    def mark_lost(self, why: str) -> None:
        raise AssertionError(f"lost: {why}")

    async def renew(self) -> str:
        self.renewed_at.append(self._clock.monotonic())
        return "renewed"


async def test_late_rounds_do_not_push_later_rounds_back() -> None:
    clock = LateClock()
    lease = HeldLease(clock)
    renewer = LeaseRenewer(
        {lease.lease_key: lease},  # type: ignore[dict-item]
        settings=SETTINGS,
        clock=clock,
    )
    started = clock.monotonic()
    task = asyncio.create_task(renewer.run())
    try:
        for _ in range(200):
            await clock.advance(0.05)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    interval = SETTINGS.renew_every
    rounds = len(lease.renewed_at)
    # 10 s of rounds every 0.642 s, each started 0.1 s late: on a fixed rate all 15 happen
    # (each 0.1 s after its slot); rescheduled from each late start, only 13 would.
    assert rounds == int(10.0 / interval)
    for index, when in enumerate(lease.renewed_at, start=1):
        assert when - (started + index * interval) <= LATE + 0.05 + 1e-9
