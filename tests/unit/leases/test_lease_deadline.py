"""A held lease's writes are bounded by its deadline, and that deadline moves with every
successful write: a renewal queued behind a checkpoint write is not cut short by the deadline
the checkpoint write has just pushed back (under load this lost valid leases, issue 10)."""

from __future__ import annotations

import asyncio
import contextlib

from shardflow.clock import SYSTEM_CLOCK, Clock, ManualClock
from shardflow.errors import AwsError
from shardflow.leases import InMemoryLeaseStore, Lease
from shardflow.leases.owned import OwnedLease
from shardflow.leases.settings import LeaseSettings
from shardflow.leases.writes import LeaseWrite
from shardflow.records import ExtendedSequenceNumber


class SlowStore(InMemoryLeaseStore):
    """An in-memory lease table whose writes take ``delays[operation]`` seconds."""

    def __init__(self, delays: dict[str, float]) -> None:
        super().__init__("leases", create_table=True)
        self.delays = delays

    async def execute(self, write: LeaseWrite) -> Lease | None:
        await asyncio.sleep(self.delays.get(write.operation, 0.0))
        return await super().execute(write)


async def held(
    store: InMemoryLeaseStore,
    *,
    remaining: float,
    settings: LeaseSettings,
    clock: Clock = SYSTEM_CLOCK,
) -> OwnedLease:
    """A lease held by worker "a" whose deadline is ``remaining`` seconds away."""
    created = await store.create_if_absent(Lease("shardId-000000000000"))
    taken = await store.take(created, "a")
    acquired_at = clock.monotonic() + remaining - settings.usable_time
    return OwnedLease(
        taken,
        stream="s",
        store=store,
        worker_id="a",
        settings=settings,
        clock=clock,
        acquired_at=acquired_at,
    )


async def test_a_renewal_behind_a_checkpoint_write_follows_the_deadline_that_write_moved() -> None:
    settings = LeaseSettings(failover_time=2.0)  # usable 1.8 s after a write is sent
    # The checkpoint write (sent at once) lands after 0.3 s and moves the deadline to ~1.8 s;
    # the renewal waits for it, then takes 0.4 s itself: it ends at ~0.7 s, past the 0.5 s
    # deadline it started with, long before the one in force by then.
    store = SlowStore({"checkpoint": 0.3, "renew": 0.4})
    owned = await held(store, remaining=0.5, settings=settings)
    checkpoint = asyncio.create_task(owned.writer.write(ExtendedSequenceNumber("100")))
    await asyncio.sleep(0.01)
    outcome = await owned.renew()
    await checkpoint

    assert outcome == "renewed"
    assert not owned.lost.is_set()
    assert owned.valid()
    assert owned.remaining() > 1.0
    stored = (await store.list_leases())[0]
    assert stored.lease_owner == "a"
    assert stored.lease_counter == owned.lease.lease_counter


async def test_a_write_that_outlives_the_deadline_in_force_still_loses_the_lease() -> None:
    settings = LeaseSettings(failover_time=2.0)
    store = SlowStore({"renew": 0.6})
    owned = await held(store, remaining=0.3, settings=settings)
    assert await owned.renew() == "lost"
    assert owned.lost.is_set()
    assert owned.ended_why == "expired"
    assert not owned.valid()


async def test_a_lapse_says_the_renewal_was_unanswered_for_how_long() -> None:
    settings = LeaseSettings(failover_time=2.0)
    store = SlowStore({"renew": 5.0})
    owned = await held(store, remaining=0.4, settings=settings)
    await asyncio.sleep(0.1)
    assert await owned.renew() == "lost"
    lapse = owned.lapse
    assert lapse is not None
    assert lapse.in_flight is not None
    assert 0.25 <= lapse.in_flight <= 0.6
    assert lapse.failed is None
    assert "unanswered" in str(lapse)


class FailingStore(SlowStore):
    async def execute(self, write: LeaseWrite) -> Lease | None:
        if write.operation == "renew":
            raise AwsError("the table did not answer")
        return await super().execute(write)


async def test_a_lapse_after_failed_renewals_names_the_error_and_no_write_in_flight() -> None:
    settings = LeaseSettings(failover_time=2.0)
    owned = await held(FailingStore({}), remaining=0.2, settings=settings)
    assert await owned.renew() == "failed"
    await asyncio.sleep(0.25)
    assert await owned.renew() == "lost"
    assert owned.lapse is not None
    assert owned.lapse.failed == "AwsError"
    assert owned.lapse.in_flight is None


async def test_a_lapse_with_no_write_tried_says_so() -> None:
    # What a renewal scheduler that never sent the write would leave: the checker of the
    # chaos soak counts only the other kinds as the lease table's doing.
    settings = LeaseSettings(failover_time=2.0)
    owned = await held(SlowStore({}), remaining=0.05, settings=settings)
    await asyncio.sleep(0.1)
    owned.mark_lost("expired")
    assert owned.lapse is not None
    assert owned.lapse.in_flight is None
    assert owned.lapse.failed is None
    assert owned.lapse.since_write >= settings.usable_time
    assert str(owned.lapse).endswith("no write in flight")


class GatedStore(InMemoryLeaseStore):
    """An in-memory lease table whose checkpoint writes wait for ``gate``."""

    def __init__(self) -> None:
        super().__init__("leases", create_table=True)
        self.gate = asyncio.Event()

    async def execute(self, write: LeaseWrite) -> Lease | None:
        if write.operation == "checkpoint":
            await self.gate.wait()
        return await super().execute(write)


async def test_a_lease_seen_past_its_deadline_stays_lost_when_a_late_write_lands() -> None:
    # On a busy event loop a write's answer can be taken up after the deadline, before the
    # deadline's bound fires: its confirmation would move the deadline back into the future.
    # Whoever saw the lease invalid in between (a dispatcher lane that abandoned the records
    # it held) must never find it valid again.
    settings = LeaseSettings(failover_time=2.0)
    clock = ManualClock(100.0)
    store = GatedStore()
    owned = await held(store, remaining=0.5, settings=settings, clock=clock)
    writing = asyncio.create_task(owned.writer.write(ExtendedSequenceNumber("100")))
    await asyncio.sleep(0.01)  # sent, half a second before the deadline
    await clock.advance(1.0)
    assert not owned.valid()
    store.gate.set()  # the answer lands
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writing, 5)
    assert not owned.valid()
    assert owned.lost.is_set()
    assert owned.ended_why == "expired"


async def test_a_handler_thread_asking_past_the_deadline_only_latches() -> None:
    # A sync handler's thread asks right before its call; marking the lease lost there would
    # set asyncio events and start the coordinator's tasks off the event loop.
    settings = LeaseSettings(failover_time=2.0)
    clock = ManualClock(100.0)
    owned = await held(SlowStore({}), remaining=0.5, settings=settings, clock=clock)
    await clock.advance(1.0)
    assert await asyncio.to_thread(owned.valid) is False
    assert not owned.ended
    assert not owned.valid()  # on the loop: now marked
    assert owned.ended_why == "expired"
