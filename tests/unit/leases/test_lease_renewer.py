"""The renewer keeps a fixed rate (a renewal that starts late does not delay the next) and
spreads renewals over the interval in slots (a lease's renewal waits for no other lease's)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
from collections.abc import Callable
from dataclasses import replace

import pytest

from shardflow.clock import ManualClock
from shardflow.leases.renewer import LeaseRenewer, RenewalSlots
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


# --- renewals spread over the interval (slots), not a burst per round ---------------------------

DEFAULTS = LeaseSettings()  # failover 10 s: renew every 3.308 s, usable 9 s


class TimedLease:
    """A held lease whose writes take ``write_time(now)`` on the manual clock; it keeps the
    deadline a real lease would (last successful write sent + usable_time)."""

    def __init__(self, key: str, clock: ManualClock, write_time: Callable[[float], float]) -> None:
        self.lease_key = key
        self.deadline = clock.monotonic() + DEFAULTS.usable_time
        self.sent: list[float] = []
        self.done: list[float] = []
        self._clock = clock
        self._write_time = write_time

    def valid(self) -> bool:
        return self._clock.monotonic() < self.deadline

    def mark_lost(self, why: str) -> None:
        raise AssertionError(f"{self.lease_key} lost: {why}")

    async def renew(self) -> str:
        sent = self._clock.monotonic()
        self.sent.append(sent)
        await self._clock.sleep(self._write_time(sent))
        self.deadline = max(self.deadline, sent + DEFAULTS.usable_time)
        self.done.append(self._clock.monotonic())
        return "renewed"


async def run_renewer(renewer: LeaseRenewer, clock: ManualClock, seconds: float) -> None:
    task = asyncio.create_task(renewer.run())
    try:
        for _ in range(round(seconds / 0.01)):
            await clock.advance(0.01)
            for _ in range(10):
                await asyncio.sleep(0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def lateness(leases: list[TimedLease], interval: float) -> list[float]:
    """As bench/consumer.py reads it: each gap between two renewals of a lease (as they
    completed) beyond the renew interval."""
    return [
        max(0.0, b - a - interval) for lease in leases for a, b in itertools.pairwise(lease.done)
    ]


async def test_a_slow_stretch_of_the_table_delays_only_the_renewals_sent_in_it() -> None:
    # 600 leases, 8 writes in flight. Writes take 10 ms, then for 4 s (more than an interval)
    # 30 ms: the table still keeps up with 181 renewals a second (8 / 30 ms = 267 a second),
    # but a round of all 600 at once takes 2.25 s instead of 0.75 s. Queued as one burst per
    # round (the renewer before slots), the leases at the burst's end came ~1.5 s late (p99
    # 1.5 s); spread over the interval each renewal waits for nobody and comes at most the
    # write time's change late.
    clock = ManualClock()
    start = clock.monotonic()

    def write_time(now: float) -> float:
        return 0.03 if start + 4.0 <= now < start + 8.0 else 0.01

    leases = [TimedLease(f"shardId-{i:012d}", clock, write_time) for i in range(600)]
    renewer = LeaseRenewer(
        {lease.lease_key: lease for lease in leases},  # type: ignore[misc]
        settings=replace(DEFAULTS, renew_concurrency=8),
        clock=clock,
    )
    await run_renewer(renewer, clock, 14.0)
    late = sorted(lateness(leases, DEFAULTS.renew_every))
    assert len(late) >= 600 * 2
    p99 = late[int(len(late) * 0.99)]
    assert p99 <= 0.1, f"renewal lateness p99 {p99:.3f} s"
    assert max(late) <= 0.25


async def test_leases_taken_at_once_are_renewed_spread_over_the_interval() -> None:
    # 1,000 leases taken in one instant: renewed ~300 a second, evenly, not 1,000 at once
    # every interval (which made the lease table's load, and each renewal's time, a burst).
    clock = ManualClock()
    leases = [TimedLease(f"shardId-{i:012d}", clock, lambda _: 0.001) for i in range(1000)]
    renewer = LeaseRenewer(
        {lease.lease_key: lease for lease in leases},  # type: ignore[misc]
        settings=DEFAULTS,
        clock=clock,
    )
    interval = DEFAULTS.renew_every
    start = clock.monotonic()
    await run_renewer(renewer, clock, 2 * interval)
    sends = [at for lease in leases for at in lease.sent]
    assert all(lease.sent for lease in leases), "every lease renewed"
    # Within one interval of being taken, and never sooner than a slot after it.
    assert all(start < lease.sent[0] <= start + interval + 0.1 for lease in leases)
    # Sixteenths of the second interval: each holds about its share (62.5), none a burst.
    window = [at for at in sends if start + interval <= at < start + 2 * interval]
    sixteenths = collections.Counter(
        int((at - start - interval) / (interval / 16)) for at in window
    )
    assert len(window) >= 990
    assert max(sixteenths.values()) <= 2 * len(window) / 16, sixteenths


def test_slots_fill_evenly_and_keep_their_phase() -> None:
    interval = 3.2
    slots = RenewalSlots(interval, epoch=0.0, slots=16)
    # Keys placed one after another at one instant spread over every slot.
    for index in range(100):
        when = slots.place(f"k{index}", now=1.0, latest=1.0 + interval)
        assert 1.0 < when <= 1.0 + interval
    assert max(slots.counts) - min(slots.counts) <= 1
    # A lease past its time is due at once; one just short of a slot start, at its latest.
    assert slots.place("late", now=2.0, latest=1.5) == 2.0
    assert slots.place("soon", now=2.01, latest=2.05) == 2.05
    # Popped late, a lease moves on to its own next time (fixed rate), not later.
    first = slots.due_at("k0")
    assert first is not None
    assert "k0" in slots.pop_due(first + 0.15)
    assert slots.due_at("k0") == first + interval
    # Popped more than an interval late, it skips to the next of its times after now.
    assert "k0" in slots.pop_due(first + 2.5 * interval)
    assert slots.due_at("k0") == pytest.approx(first + 3 * interval)
    slots.remove("k0")
    assert "k0" not in slots
    assert "k0" not in slots.pop_due(first + 10 * interval)
