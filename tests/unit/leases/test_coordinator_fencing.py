"""Fencing: a worker that cannot renew stops using a lease before anyone else can take it, and
never checkpoints after that; the checkpoint writer's conditional writes and refusals."""

from __future__ import annotations

import asyncio

import pytest

from shardflow.clock import SYSTEM_CLOCK
from shardflow.consumer.checkpointing.checkpoint import Checkpointer
from shardflow.errors import ShardLeaseLostError, TransientError
from shardflow.events import LeaseAcquired, LeaseLost, LeaseReleased, LeaseRenewed
from shardflow.leases import InMemoryLeaseStore, Lease
from shardflow.leases.owned import OwnedLease
from shardflow.leases.settings import LeaseSettings
from shardflow.leases.writes import LeaseWrite
from shardflow.records import ExtendedSequenceNumber, Record
from support.coordinator_fakes import SETTINGS, run_for, settle, shard, sid, world


class Switch:
    """A fault for the in-memory store: fails chosen operations while on, and counts calls."""

    def __init__(self, *operations: str) -> None:
        self.operations = set(operations)
        self.on = False
        self.calls: list[str] = []

    def __call__(self, operation: str) -> None:
        self.calls.append(operation)
        if self.on and operation in self.operations:
            raise TransientError("injected", operation=operation, code="InternalServerError")


def esn(n: int) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(str(n))


async def test_a_worker_that_cannot_renew_loses_its_leases_before_another_can_take_them() -> None:
    async with world() as w:
        blocked = Switch("UpdateItem")
        a = await w.start("a", store=w.store(fault=blocked))
        # b scans often, so it takes each lease as soon as it has expired in its eyes.
        eager = LeaseSettings(
            max_leases_to_steal_at_once=0, take_interval=0.2, handoff=False, pickup="off"
        )
        await w.start("b", settings=eager)
        held = dict(a.owned())
        await run_for(4.0, w.clock)  # one successful renewal
        blocked.on = True
        await run_for(SETTINGS.failover_time + 2.0, w.clock, step=0.1)

        renewed_at = {e.lease_key: at for at, e in w.recorders["a"].times(LeaseRenewed)}
        lost_at = {e.lease_key: at for at, e in w.recorders["a"].times(LeaseLost)}
        taken_at = {e.lease_key: at for at, e in w.recorders["b"].times(LeaseAcquired)}
        assert set(lost_at) == set(held) == set(taken_at)
        for key in held:
            # The last successful renewal was sent at renewed_at (the manual clock stands
            # still during a write): usable until failover - margin after it.
            assert lost_at[key] <= renewed_at[key] + SETTINGS.usable_time + 0.1
            assert lost_at[key] < taken_at[key], "lost before the other worker took it"
            assert taken_at[key] <= renewed_at[key] + SETTINGS.failover_time + 0.5
            assert held[key].lost.is_set()
            assert not held[key].valid()
        assert {e.why for e in w.recorders["a"].of(LeaseLost)} == {"expired"}

        calls = len(blocked.calls)
        with pytest.raises(ShardLeaseLostError):
            await held[sid(0)].writer.write(esn(100))
        assert len(blocked.calls) == calls, "the refusal does not even reach the store"
        assert (await w.leases())[sid(0)].checkpoint.sequence_number == "TRIM_HORIZON"


async def test_a_renewal_that_fails_once_is_retried_and_the_lease_kept() -> None:
    async with world() as w:
        blocked = Switch("UpdateItem")
        a = await w.start("a", store=w.store(fault=blocked))
        blocked.on = True
        await run_for(SETTINGS.renew_every + 0.1, w.clock)
        blocked.on = False
        assert len(a.owned()) == 4, "one failed round is not a lost lease"
        await run_for(SETTINGS.renew_every, w.clock)
        assert all(owned.remaining() > SETTINGS.usable_time - 1.0 for owned in a.owned().values())
        assert not w.recorders["a"].of(LeaseLost)


async def test_the_writer_refuses_once_another_worker_took_the_lease() -> None:
    async with world([shard(0)]) as w:
        counted = Switch()
        a = await w.start("a", store=w.store(fault=counted))
        owned = a.owned()[sid(0)]
        await owned.writer.write(esn(10))
        stolen = await w.store().take((await w.leases())[sid(0)], "b")

        with pytest.raises(ShardLeaseLostError) as caught:
            await owned.writer.write(esn(20))
        assert caught.value.owner == "b"
        assert owned.lost.is_set()
        assert not owned.valid()
        assert not a.owned()
        (lost,) = w.recorders["a"].of(LeaseLost)
        assert (lost.why, lost.new_owner) == ("taken", "b")
        calls = len(counted.calls)
        with pytest.raises(ShardLeaseLostError):
            await owned.writer.write(esn(30))
        assert len(counted.calls) == calls, "refused without asking the store"
        current = (await w.leases())[sid(0)]
        assert current.checkpoint == esn(10)
        assert current.lease_counter == stolen.lease_counter


async def test_a_checkpointer_stops_for_good_after_the_lease_is_lost() -> None:
    async with world([shard(0)]) as w:
        a = await w.start("a")
        owned = a.owned()[sid(0)]
        checkpointer = Checkpointer(owned.writer, shard_id=sid(0), clock=w.clock)
        records = [Record(b"x", "k", str(100 + i), shard_id=sid(0)) for i in range(3)]
        for record in records:
            checkpointer.tracker.deliver(record)
        assert await checkpointer.checkpoint(records[0]) == esn(100)
        await w.store().take((await w.leases())[sid(0)], "b")
        with pytest.raises(ShardLeaseLostError):
            await checkpointer.checkpoint(records[1])
        with pytest.raises(ShardLeaseLostError):
            checkpointer.stage(records[2])
        assert (await w.leases())[sid(0)].checkpoint == esn(100)


async def test_a_checkpoint_proves_the_worker_alive_and_extends_the_deadline() -> None:
    async with world([shard(0)]) as w:
        a = await w.start("a", store=w.store(fault=Switch()))
        owned = a.owned()[sid(0)]
        first = owned.deadline
        await w.clock.advance(1.0)  # renewals not due yet
        await owned.writer.write(esn(5))
        assert owned.deadline == pytest.approx(first + 1.0)
        assert owned.checkpoint == esn(5)
        assert owned.lease.lease_counter == (await w.leases())[sid(0)].lease_counter


async def test_completed_state_is_stored_with_the_checkpoint_and_cleared_by_none() -> None:
    async with world([shard(0)]) as w:
        a = await w.start("a")
        owned = a.owned()[sid(0)]
        await owned.writer.write(esn(7), completed_state=b"\x01state")
        stored = (await w.leases())[sid(0)]
        assert stored.checkpoint == esn(7)
        assert stored.completed_state == b"\x01state"
        assert stored.pending_checkpoint is None  # not a prepared checkpoint (KCL would use it)
        assert owned.completed_state == b"\x01state"
        await owned.writer.write(esn(8))
        stored = (await w.leases())[sid(0)]
        assert stored.completed_state is None
        assert owned.completed_state is None


class LostAnswers(InMemoryLeaseStore):
    """Applies the next write but answers it with an error, as a timed-out request would."""

    lose_next = False

    async def execute(self, write: LeaseWrite) -> Lease | None:
        result = await super().execute(write)
        if self.lose_next:
            self.lose_next = False
            raise TransientError("read timeout", operation="UpdateItem", code="RequestTimeout")
        return result


async def test_a_lost_answer_to_our_own_write_is_recognised_as_ours() -> None:
    async with world([shard(0)]) as w:
        store = LostAnswers("app", tables=w.tables)
        a = await w.start("a", store=store)
        owned = a.owned()[sid(0)]
        store.lose_next = True
        assert await owned.renew() == "failed"
        store.lose_next = True
        with pytest.raises(TransientError):
            await owned.writer.write(esn(9))  # landed, but we cannot know
        await owned.writer.write(esn(10))
        assert owned.valid()
        assert (await w.leases())[sid(0)].checkpoint == esn(10)
        assert await owned.renew() == "renewed"
        assert not w.recorders["a"].of(LeaseLost)


async def test_the_same_picture_without_a_doubtful_write_is_a_lost_lease() -> None:
    # Another instance with our worker id renewed the lease: not our write, so not ours.
    async with world([shard(0)]) as w:
        a = await w.start("a")
        owned = a.owned()[sid(0)]
        await w.store().renew(owned.lease, "a")
        with pytest.raises(ShardLeaseLostError):
            await owned.writer.write(esn(9))
        assert owned.ended_why == "taken"


async def test_a_deleted_lease_is_lost() -> None:
    async with world([shard(0)]) as w:
        a = await w.start("a")
        owned = a.owned()[sid(0)]
        await w.store().delete(owned.lease)
        assert await owned.renew() == "lost"
        assert owned.ended_why == "deleted"


async def test_a_graceful_handoff_asks_to_give_up_and_release_passes_the_lease_on() -> None:
    async with world([shard(0)]) as w:
        a = await w.start("a")
        owned = a.owned()[sid(0)]
        await w.store().handoff(owned.lease, "a", "b")  # as a KCL 3.x leader would
        assert await owned.renew() == "handoff"
        assert owned.giving_up.is_set()
        assert owned.valid()
        assert await owned.renew() == "renewed", "the checkpoint owner keeps renewing"
        await owned.writer.write(esn(11))
        assert await a.release(owned, why="handoff")
        stored = (await w.leases())[sid(0)]
        assert (stored.lease_owner, stored.checkpoint_owner) == ("b", None)
        assert stored.checkpoint == esn(11)
        assert [e.why for e in w.recorders["a"].of(LeaseReleased)] == ["handoff"]
        assert owned.lost.is_set()
        with pytest.raises(ShardLeaseLostError):
            await owned.writer.write(esn(12))


async def test_release_of_a_lease_already_taken_writes_nothing() -> None:
    async with world([shard(0)]) as w:
        a = await w.start("a")
        owned = a.owned()[sid(0)]
        await w.store().take((await w.leases())[sid(0)], "b")
        assert not await a.release(owned)
        assert (await w.leases())[sid(0)].lease_owner == "b"
        assert owned.ended_why == "taken"


class HangingCheckpoints(InMemoryLeaseStore):
    """A store whose checkpoint writes never answer (a partitioned network)."""

    async def checkpoint(self, lease: Lease, owner: str, *args: object, **kwargs: object) -> Lease:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_checkpoint_write_never_outlives_the_deadline() -> None:
    store = HangingCheckpoints("app", create_table=True)
    lease = await store.take(await store.create_if_absent(Lease.new(sid(0))), "a")
    settings = LeaseSettings(failover_time=0.5, renew_interval=0.1, safety_margin=0.1)
    owned = OwnedLease(
        lease,
        stream="s",
        store=store,
        worker_id="a",
        settings=settings,
        clock=SYSTEM_CLOCK,
        acquired_at=SYSTEM_CLOCK.monotonic(),
    )
    with pytest.raises(ShardLeaseLostError):
        await asyncio.wait_for(owned.writer.write(esn(1)), timeout=2.0)
    assert owned.ended_why == "expired"
    assert SYSTEM_CLOCK.monotonic() >= owned.deadline


async def test_stop_without_release_leaves_leases_usable_until_their_deadline_only() -> None:
    async with world([shard(0)]) as w:
        a = await w.start("a")
        owned = a.owned()[sid(0)]
        await a.stop(release=False)
        assert owned.giving_up.is_set()
        await owned.writer.write(esn(3))  # a final checkpoint is still possible
        await run_for(SETTINGS.usable_time + 0.5, w.clock, step=0.5)
        assert not owned.valid()
        with pytest.raises(ShardLeaseLostError):
            await owned.writer.write(esn(4))
        await settle()
        stored = (await w.leases())[sid(0)]
        assert (stored.lease_owner, stored.checkpoint) == ("a", esn(3))
